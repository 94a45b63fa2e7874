"""vLLM adapter: ``KvtierConnector(KVConnectorBase_V1)``, the only module that imports vLLM.

Load it with::

    --kv-transfer-config '{"kv_connector":"KvtierConnector",
      "kv_connector_module_path":"kvtier_vllm.connector","kv_role":"kv_both",
      "kv_connector_extra_config":{"endpoint":"tcp://127.0.0.1:5555"}}'

A thin delegation layer: the scheduler role runs a :class:`~kvtier_vllm.scheduler.SchedulerConnector`
over one lookup per rank (:class:`~kvtier_vllm.rank_lookup.RankLookup`), the worker role a
:class:`~kvtier_vllm.worker.WorkerConnector`; conversions of vLLM's objects live in
:mod:`kvtier_vllm.vllm_glue` (vLLM-free, tested without vLLM). Signatures follow
``vllm/distributed/kv_transfer/kv_connector/v1/base.py`` (checked against vLLM commit
003df2961dd8830c317a61f9745ccd557da9fa06; see python/tests/fixtures/vllm_abstract_methods.json).
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

try:  # vLLM with the hybrid KV cache manager's connector interface
    from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA
except ImportError:  # older vLLM: nothing to declare
    class SupportsHMA:  # type: ignore[no-redef]
        pass

try:  # vLLM whose connectors report KV cache events (KVConnectorKVEvents)
    from vllm.distributed.kv_events import (
        BlockRemoved,
        BlockStored,
        KVConnectorKVEvents,
    )
except ImportError:  # older vLLM: kv_events cannot be reported
    KVConnectorKVEvents = None  # type: ignore[assignment,misc]

from .client import KvtierClient
from .config import KvtierConfig
from .curve import CurveKeys, load_client_keys
from .errors import ConfigError
from .connector_types import ConnectorMeta, ConnectorOutput
from .cover_lookup import CoverLookupClient
from .handoff import HandoffRole
from .kv_caches import build_registration, order_layers
from .kv_events import BlockEventMapper, ChunkTransitions, block_extra_keys, event_fields, open_worker_events
from .rank_lookup import RankLookup, rank_index, rank_suffix
from .save_fence import SaveFences
from .scheduler import SchedulerConnector
from .vllm_glue import (
    BlockTables,
    all_rank_namespaces,
    check_kv_cache_groups,
    connector_request,
    first_group,
    layer_indices,
    model_shape,
    pp_layer_range,
    rank_covers,
    rank_namespace,
)
from .worker import WorkerConnector

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = ["KvtierConnector", "KvtierConnectorMetadata"]

_log = logging.getLogger("kvtier_vllm.connector")

#: The longest vLLM's start-up waits for the sidecar's answer to a worker's REGISTER.
REGISTER_WAIT_MS = 5000


if KVConnectorKVEvents is not None:

    class KvtierKVEvents(ChunkTransitions, KVConnectorKVEvents):  # type: ignore[misc,valid-type]
        """A worker's chunk transitions in vLLM's container (merged by its output aggregator)."""


try:  # how vLLM's own events name a block hash (bytes, or an int with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash as _block_hash
except ImportError:  # a vLLM without it names blocks by their hash bytes

    def _block_hash(h: Any) -> Any:
        return h


try:  # the extra keys vLLM hashes into a block (LoRA name, multimodal identifiers, cache salt)
    from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys as _vllm_extra_keys
except ImportError:  # derived the same way by kvtier (kv_events.block_extra_keys)
    _vllm_extra_keys = None

_FIELDS: dict[type, frozenset | None] = {}


def _fields_of(cls: type) -> frozenset | None:
    """The fields ``cls`` (a vLLM event class: a msgspec struct, or a dataclass) accepts; None
    when it does not say."""
    if cls not in _FIELDS:
        names = getattr(cls, "__struct_fields__", None)
        if names is None:
            import dataclasses

            names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else None
        _FIELDS[cls] = frozenset(names) if names is not None else None
    return _FIELDS[cls]


def _vllm_event(ev: Any, block_size: int, group: dict) -> Any:
    """A vLLM ``BlockStored``/``BlockRemoved`` of a :class:`~kvtier_vllm.kv_events.BlockEvent`,
    with every field this vLLM's class has (older ones lack ``lora_name``, ``extra_keys``,
    ``group_idx``)."""
    name, kw = event_fields(ev, block_size, **group)
    cls = BlockStored if name == "BlockStored" else BlockRemoved
    accepted = _fields_of(cls)
    if accepted is not None:
        kw = {k: v for k, v in kw.items() if k in accepted}
    return cls(**kw)


def _event_group(kv_cache_config: Any) -> dict:
    """What vLLM's own events say of the KV cache group (kvtier serves one: group 0): its index,
    and on ``BlockStored`` its kind and sliding window as vLLM's KV cache manager computes them."""
    out: dict = {"group_idx": 0}
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or ())
    if not groups:
        return out
    spec = getattr(groups[0], "kv_cache_spec", None)
    try:
        from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind, get_kv_cache_spec_sliding_window

        out["kv_cache_spec_kind"] = get_kv_cache_spec_kind(spec).value
        out["kv_cache_spec_sliding_window"] = get_kv_cache_spec_sliding_window(spec)
    except Exception:  # a vLLM without them: the events carry neither
        pass
    return out


def _request_keys(request: Any, req: Any, num_blocks: int, block_size: int) -> tuple[list | None, tuple | None]:
    """The request's blocks' extra keys (vLLM's own where it can compute them; None when no block
    has any) and its LoRA as vLLM's events name it (``(adapter id, name)``, or None)."""
    lora_req = getattr(request, "lora_request", None)
    lora = None
    if lora_req is not None:
        lora_id = getattr(lora_req, "adapter_id", None)
        if lora_id is None:
            lora_id = getattr(lora_req, "lora_int_id", None)
        lora = (lora_id, getattr(lora_req, "lora_name", None) or req.lora)
    embeds = getattr(request, "prompt_embeds", None) is not None
    if not (lora_req is not None or req.cache_salt or req.mm or embeds):
        return None, lora
    if _vllm_extra_keys is not None:
        keys, mm = [], 0
        for i in range(num_blocks):
            k, mm = _vllm_extra_keys(request, i * block_size, (i + 1) * block_size, mm)
            keys.append(k)
        return keys, lora
    return block_extra_keys(num_blocks, block_size, lora_name=req.lora, cache_salt=req.cache_salt, mm=req.mm), lora


try:  # vLLM whose workers send metadata back to the scheduler's connector
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata
except ImportError:  # older vLLM: a save that failed is saved again only by a later request
    KVConnectorWorkerMetadata = None  # type: ignore[assignment,misc]

if KVConnectorWorkerMetadata is not None:

    class KvtierWorkerMetadata(KVConnectorWorkerMetadata):  # type: ignore[misc,valid-type]
        """Saves that did not happen, from the workers to the scheduler: request id -> first
        chunk not saved (merged over ranks: the earliest)."""

        def __init__(self, failed_saves: dict[str, int]) -> None:
            self.failed_saves = dict(failed_saves)

        def aggregate(self, other: "KvtierWorkerMetadata") -> "KvtierWorkerMetadata":
            merged = dict(self.failed_saves)
            for rid, chunk in getattr(other, "failed_saves", {}).items():
                merged[rid] = min(chunk, merged.get(rid, chunk))
            return KvtierWorkerMetadata(merged)


class KvtierConnectorMetadata(KVConnectorMetadata):
    """One step's loads, saves and ended requests, shipped from the scheduler to the workers."""

    def __init__(self, meta: ConnectorMeta | None = None) -> None:
        self.meta = meta if meta is not None else ConnectorMeta()


def _layout_name(value: Any) -> str | None:
    name = str(value).upper() if value is not None else None
    return name if name in ("NHD", "HND") else None


def _kv_layout() -> str | None:
    """The KV cache layout (NHD/HND) vLLM's attention backends build their caches in, as far as
    this process can tell: the backends' own helper (an override a backend set,
    ``VLLM_KV_CACHE_LAYOUT``, else what the connector helper answers), else the connector
    helper. None when neither says (newer vLLM answers None when no connector requires a
    layout): the backends' default, NHD. The workers register the layout their tensors have."""
    try:
        from vllm.v1.attention.backends.utils import get_kv_cache_layout

        return _layout_name(get_kv_cache_layout())
    except Exception:
        pass
    try:
        from vllm.distributed.kv_transfer.kv_connector.utils import get_kv_connector_cache_layout

        return _layout_name(get_kv_connector_cache_layout())
    except Exception:  # vLLM without either helper
        return None


def _into_shared_memory(kv_caches: dict[str, torch.Tensor], directory: str = "/dev/shm") -> list:
    """vLLM's CPU backend keeps the KV cache in process memory, where the sidecar cannot reach
    it: each such storage is moved into a shared-memory file, and every tensor vLLM handed over
    is pointed at the new storage in place (``Tensor.set_``), so vLLM's attention layers, which
    hold these very tensors and take their views from them each step, use the shared copy. Views
    of one storage keep sharing it. Returns what keeps the files declared (hold it while the KV
    cache is in use; the files are removed at shutdown): ``(path, tensor)`` pairs; nothing for
    caches already in shared memory or on a GPU."""
    import uuid

    from .host_memory import describe_host_tensor, register_shared_file

    by_storage: dict[int, list[torch.Tensor]] = {}
    for t in kv_caches.values():
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            return []
        try:
            describe_host_tensor(t)
            continue  # already in a shared file
        except Exception:
            by_storage.setdefault(t.untyped_storage().data_ptr(), []).append(t)
    keep = []
    for views in by_storage.values():
        old = views[0].untyped_storage()
        path = os.path.join(directory, f"kvtier-kv-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, old.nbytes())
        finally:
            os.close(fd)
        shm = torch.UntypedStorage.from_file(path, shared=True, nbytes=old.nbytes())
        shm.copy_(old)
        for t in views:
            t.set_(shm, t.storage_offset(), t.size(), t.stride())
        whole = torch.empty(0, dtype=torch.uint8).set_(shm)
        register_shared_file(path, whole)
        keep.append((path, whole))
        _log.info("kvtier: vLLM's KV cache (%d MiB) moved into shared memory %s", old.nbytes() >> 20, path)
    return keep


def _save_fences() -> SaveFences | None:
    """The worker's state file of save fences, in shared memory; None (saves go without fences,
    their blocks kept until their not-after time) where it cannot be made."""
    try:
        return SaveFences()
    except OSError as err:
        _log.warning("kvtier: no state file for save fences (%s); a frozen sidecar can then hold preempted blocks", err)
        return None


def _ranks(vllm_config: Any) -> tuple[int, int]:
    """This worker's (tp_rank, pp_rank)."""
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        return int(get_tp_group().rank_in_group), int(get_pp_group().rank_in_group)
    except Exception:
        pc = vllm_config.parallel_config
        tp = int(getattr(pc, "tensor_parallel_size", 1))
        rank = int(getattr(pc, "rank", 0))
        return rank % tp, rank // tp


class KvtierConnector(KVConnectorBase_V1, SupportsHMA):
    """kvtier as a vLLM KV connector (scheduler and worker roles).

    It declares ``SupportsHMA`` so vLLM may keep the hybrid KV cache manager on, and serves
    models whose KV cache is one full-attention (or MLA) group; a model that needs several
    groups is refused at start-up with what to do (:func:`~kvtier_vllm.vllm_glue.check_kv_cache_groups`).
    """

    def __init__(
        self,
        vllm_config: "VllmConfig",
        role: KVConnectorRole,
        kv_cache_config: "KVCacheConfig | None" = None,
    ) -> None:
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        except TypeError:  # vLLM before kv_cache_config was passed to connectors
            super().__init__(vllm_config, role)
        check_kv_cache_groups(kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        self._cfg = KvtierConfig.from_extra(getattr(ktc, "kv_connector_extra_config", None))
        kv_role = getattr(ktc, "kv_role", "kv_both")
        self._load = self._cfg.load if self._cfg.load is not None else kv_role != "kv_producer"
        self._save = self._cfg.save if self._cfg.save is not None else kv_role != "kv_consumer"
        # Disaggregated prefill: a save-only engine names what it saved in the request's output.
        self._produces = self._save and (kv_role == "kv_producer" or not self._load)
        self._shape = model_shape(vllm_config, self._cfg, _kv_layout(), os.environ.get("VLLM_PP_LAYER_PARTITION"))
        self._vllm_config = vllm_config
        self._scheduler: SchedulerConnector | None = None
        self._worker: WorkerConnector | None = None
        self._tables = BlockTables(self._shape.block_size)
        # Shared-memory copies of a KV cache vLLM kept in process memory (the CPU backend).
        self._shared: list = []
        # Set when the registered KV caches are CUDA tensors: saves then carry a CUDA event.
        self._kv_on_cuda = False
        # Layer name -> index in the registration, with layerwise_loads (wait_for_layer_load).
        self._layer_index: dict[str, int] = {}
        self._save_event: Any = None
        self._save_event_handle: bytes | None = None
        # KV cache events (docs/events.md): the workers follow the sidecar's stream, the scheduler
        # maps chunks to the engine's block hashes.
        self._events_on = self._cfg.kv_events and KVConnectorKVEvents is not None
        if self._cfg.kv_events and not self._events_on:
            _log.error("kvtier: kv_events needs a vLLM with KVConnectorKVEvents; no events are reported")
        self._worker_events: Any = None
        self._events_retry_at = 0.0
        self._event_map = (
            BlockEventMapper(
                self._shape.world,
                self._cfg.chunk_size // self._shape.block_size,
                self._cfg.kv_events_max_chunks,
                block_size=self._shape.block_size,
                prefix_closed=True,
            )
            if self._events_on and role == KVConnectorRole.SCHEDULER
            else None
        )
        self._event_group = _event_group(kv_cache_config)
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = self._make_scheduler()
        else:
            self._worker = self._make_worker()

    # kvtier is a best-effort cache: a dropped save is a future miss, never a lost hand-off.
    @property
    def requires_kv_delivery(self) -> bool:
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: "VllmConfig") -> str | None:
        # A configured kv_layout is what the attention backends must build, so the caches the
        # workers register and the namespaces the scheduler looks up agree by construction.
        ktc = getattr(vllm_config, "kv_transfer_config", None)
        extra = getattr(ktc, "kv_connector_extra_config", None) or {}
        layout = extra.get("kv_layout") if isinstance(extra, dict) else None
        return _layout_name(layout)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        # wait_for_layer_load runs Python between the layers, which a captured graph would skip.
        return isinstance(extra_config, dict) and extra_config.get("layerwise_loads") is True

    def _endpoint(self, index: int) -> str:
        eps = self._cfg.rank_endpoints
        return eps[index] if index < len(eps) else self._cfg.endpoint

    def _client(self, endpoint: str) -> KvtierClient:
        return KvtierClient(
            endpoint,
            lookup_timeout_ms=self._cfg.lookup_timeout_ms,
            request_timeout_ms=self._cfg.request_timeout_ms,
            liveness_timeout_ms=self._cfg.liveness_timeout_ms,
            curve=self._curve_keys(),
        )

    def _curve_keys(self) -> CurveKeys | None:
        cfg = self._cfg
        if cfg.server_public_key is None or cfg.client_secret_key_file is None:
            return None
        return load_client_keys(cfg.server_public_key, cfg.client_secret_key_file)

    def _make_scheduler(self) -> SchedulerConnector:
        clients: dict[str, KvtierClient] = {}
        targets = []
        for k, ns, sfx in all_rank_namespaces(self._shape):
            ep = self._endpoint(k)
            client = clients.get(ep) or clients.setdefault(ep, self._client(ep))
            # chunks saved at other TP sizes: the heads' covers are asked about too
            covers = rank_covers(self._shape, k % self._shape.tp_size, k // self._shape.tp_size)
            targets.append((CoverLookupClient(client, covers) if covers else client, ns, sfx))
        ktc = self._vllm_config.kv_transfer_config
        handoff = HandoffRole(
            produces=self._produces,
            namespace=targets[0][1],
            chunk_size=self._cfg.chunk_size,
            sidecar=self._endpoint(0),
            engine_id=str(getattr(ktc, "engine_id", None) or "vllm"),
            wait_ms=self._cfg.handoff_wait_ms if self._load else 0,
            producers=self._cfg.handoff_producers,
        )
        return SchedulerConnector(
            RankLookup(targets),
            block_size=self._shape.block_size,
            chunk_size=self._cfg.chunk_size,
            salt=self._cfg.salt,
            prefill_tokens_per_s=None if self._cfg.prefill_tokens_per_s == "off" else self._cfg.prefill_tokens_per_s,
            handoff=handoff,
            layerwise_loads=self._cfg.layerwise_loads,
        )

    def _make_worker(self) -> WorkerConnector:
        tp_rank, pp_rank = _ranks(self._vllm_config)
        self._tp_rank, self._pp_rank = tp_rank, pp_rank
        k = rank_index(tp_rank, pp_rank, self._shape.tp_size)
        ep = self._endpoint(k)
        return WorkerConnector(
            self._client(ep),
            load_timeout_ms=self._cfg.load_timeout_ms,
            lookup_suffix=rank_suffix(k, self._shape.world),
            heartbeat_client_factory=lambda: self._client(ep),
            heartbeat_interval_s=self._cfg.heartbeat_interval_ms / 1000,
            save_fences=_save_fences(),
            preemption_wait_s=self._cfg.preemption_wait_ms / 1000,
            save_timeout_s=self._cfg.save_timeout_ms / 1000,
        )

    # ==============================
    # Worker-side methods
    # ==============================

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        assert self._worker is not None
        s = self._shape
        names = list(kv_caches)
        idx = [i for i in layer_indices(names) if i >= 0]
        start, end = pp_layer_range(s.num_layers, self._pp_rank, s.pp_size, s.pp_partition)
        first = min(idx) if idx else start
        if len(names) != end - start or first != start:
            _log.error(
                "kvtier: this stage has %d KV layers from layer %d but the scheduler assumes %d from %d; "
                "set kv_connector_extra_config.num_layers so both derive the same namespace",
                len(names), first, end - start, start,
            )
        if self._cfg.layerwise_loads:
            # The layers' indices as the registration lists them (what a LOAD's progress counts).
            self._layer_index = {name: i for i, (name, _) in enumerate(order_layers(kv_caches))}
        engine_id = f"{getattr(self._vllm_config.kv_transfer_config, 'engine_id', None) or 'vllm'}-pp{self._pp_rank}-tp{self._tp_rank}"
        try:
            self._shared = _into_shared_memory(kv_caches)
            reg = self._registration_for(kv_caches, engine_id, first)
        except Exception as err:  # e.g. expandable segments: serve without kvtier, loudly
            _log.error("kvtier: cannot hand the KV caches to the sidecar: %s; kvtier is off for this worker", err)
            return
        self._kv_on_cuda = reg.get("device") == "cuda"
        try:
            # vLLM's start-up waits on this: a sidecar that does not answer (frozen, not kvtier)
            # costs it 5 s at most; the heartbeat thread registers once the sidecar answers.
            result = self._worker.register_kv_caches(reg, timeout_ms=min(self._cfg.request_timeout_ms, REGISTER_WAIT_MS))
        except Exception as err:  # sidecar down or refusing: the heartbeat thread registers later
            _log.error("kvtier: REGISTER failed (%s); requests recompute until the sidecar is back", err)
            return
        expected = rank_namespace(s, self._tp_rank, self._pp_rank)
        if bytes(result.namespace) != expected:
            _log.error(
                "kvtier: the sidecar derived namespace %s but the scheduler looks up %s; no hits will be found. "
                "The workers registered model %r, dtype %s, %s KV heads of dim %s, block size %s; set "
                "kv_connector_extra_config's model_id and num_layers so both sides derive the same namespace",
                bytes(result.namespace).hex(), expected.hex(), reg.get("modelId"), reg.get("dtype"),
                reg.get("numKvHeads"), reg.get("headDim"), reg.get("blockSize"),
            )

    def _registration_for(self, kv_caches: dict[str, torch.Tensor], engine_id: str, first: int) -> dict:
        s = self._shape
        return build_registration(
            kv_caches,
            engine_id=engine_id,
            model_id=s.model_id,
            dtype=s.dtype,
            num_kv_heads=s.num_kv_heads,
            head_dim=s.head_dim,
            block_size=s.block_size,
            tp_size=s.tp_size,
            tp_rank=self._tp_rank,
            mla=s.mla,
            chunk_size=self._cfg.chunk_size,
            layout=self._cfg.tensor_layout,
            kv_layout=None,  # the layout the tensors have (the attention backend's), never a guess
            pp_size=s.pp_size,
            pp_rank=self._pp_rank,
            pp_first_layer=first,
            state_file=self._worker.state_file,
        )

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata):
        if self._worker is None:
            return
        if isinstance(kv_connector_metadata, KvtierConnectorMetadata):
            ids = kv_connector_metadata.meta.preempted()
        else:  # older vLLM passed the preempted request ids
            ids = [str(r) for r in (kv_connector_metadata or ())]
        self._worker.handle_preemptions(ids, timeout_s=self._cfg.request_timeout_ms / 1000)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        if self._worker is None:
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtierConnectorMetadata)
        if not self._worker.registered:
            # The sidecar never answered a REGISTER (down, frozen, not kvtier): loads fail at once
            # (recompute) and saves are dropped, never sent to wait for an answer.
            self._worker.drop_meta(meta.meta)
            return
        self._worker.start_load_kv(meta.meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Asynchronous loads (the default) finish before the request is scheduled; layer-wise
        # ones (layerwise_loads) are waited for here, one layer at a time.
        if self._worker is None or not self._layer_index:
            return
        layer = self._layer_index.get(layer_name)
        if layer is not None:
            self._worker.wait_for_layer_load(layer)

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: Any,
        **kwargs: Any,
    ) -> None:
        return  # saves gather every layer of a chunk at once, in wait_for_save

    def wait_for_save(self):
        if self._worker is None or not self._worker.registered:
            return
        # The sidecar reads the blocks from another process, after this step's KV writes: on a
        # GPU its copies wait for an event recorded here, so the CPU does not wait for the GPU.
        if self._kv_on_cuda and torch.cuda.is_available():
            self._worker.wait_for_save(cuda_event=self._record_save_event)
        else:
            self._worker.wait_for_save()

    def _record_save_event(self) -> bytes:
        """Records the interprocess event on the current stream; its (unchanging) IPC handle."""
        if self._save_event is None:
            self._save_event = torch.cuda.Event(interprocess=True)
        self._save_event.record(torch.cuda.current_stream())
        if self._save_event_handle is None:
            self._save_event_handle = bytes(self._save_event.ipc_handle())
        return self._save_event_handle

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self._worker is None:
            return None, None
        sending, recving = self._worker.get_finished(finished_req_ids)
        return (sending or None), (recving or None)

    def get_block_ids_with_load_errors(self) -> set[int]:
        if self._worker is None:
            return set()
        return self._worker.get_block_ids_with_load_errors()

    def build_connector_worker_meta(self) -> Any:
        if self._worker is None or KVConnectorWorkerMetadata is None:
            return None
        failed = self._worker.take_failed_saves()
        return KvtierWorkerMetadata(failed) if failed else None

    def get_kv_connector_kv_cache_events(self) -> Any:
        if not self._events_on or self._worker is None:
            return None
        if self._worker_events is None:
            result = self._worker.registration_result
            if result is None or time.monotonic() < self._events_retry_at:
                return None
            try:
                self._worker_events = open_worker_events(
                    self._worker._client,
                    bytes(result.namespace),
                    rank_index(self._tp_rank, self._pp_rank, self._shape.tp_size),
                    endpoint=self._cfg.events_endpoint,
                    replay_endpoint=self._cfg.events_replay_endpoint,
                    max_chunks=self._cfg.kv_events_max_chunks,
                    curve=self._curve_keys(),
                )
            except ConfigError as err:  # the sidecar publishes no stream
                _log.error("kvtier: %s; no KV events are reported", err)
                self._events_on = False
                return None
            except Exception as err:  # sidecar unreachable for now: asked again 10 s later
                _log.warning("kvtier: cannot reach the sidecar's event stream yet (%s)", err)
                self._events_retry_at = time.monotonic() + 10
                return None
        return self._worker_events.take(KvtierKVEvents)

    def shutdown(self):
        timeout_s = self._cfg.shutdown_timeout_ms / 1000
        if self._worker_events is not None:
            self._worker_events.close()
        if self._worker is not None:
            self._worker.close(timeout_s)
        for path, _ in self._shared:
            try:
                os.unlink(path)  # the mappings outlive the name
            except FileNotFoundError:
                pass
        self._shared = []
        if self._scheduler is not None:
            self._scheduler.close()

    # ==============================
    # Scheduler-side methods
    # ==============================

    def get_num_new_matched_tokens(
        self,
        request: "Request",
        num_computed_tokens: int,
    ) -> tuple[int | None, bool]:
        assert self._scheduler is not None
        if not self._load:
            return 0, False
        req = connector_request(request)
        self._tables.remember(req)
        return self._scheduler.get_num_new_matched_tokens(
            req, num_computed_tokens, getattr(request, "kv_transfer_params", None)
        )

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        assert self._scheduler is not None
        req = self._tables.request(request.request_id) or connector_request(request)
        table = first_group(blocks)
        self._tables.remember(req, table)
        self._scheduler.update_state_after_alloc(req, table, num_external_tokens)
        if self._event_map is not None:
            hashes = [_block_hash(h) for h in getattr(request, "block_hashes", None) or ()]
            tokens = getattr(request, "all_token_ids", None) or req.prompt_token_ids
            chunks = self._scheduler.chunk_hashes(req.request_id)
            blocks = min(len(hashes), len(chunks) * (self._cfg.chunk_size // self._shape.block_size))
            extra, lora = _request_keys(request, req, blocks, self._shape.block_size)
            self._event_map.remember(chunks, hashes, tokens, extra, lora)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        assert self._scheduler is not None
        for rid in getattr(scheduler_output, "preempted_req_ids", None) or ():
            self._scheduler.request_preempted(str(rid))
        per_request = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
        self._scheduler.engine_step(
            int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0), (str(r) for r in per_request)
        )
        scheduled = self._tables.scheduled(scheduler_output) if self._save else []
        return KvtierConnectorMetadata(self._scheduler.build_connector_meta(scheduled))

    def update_connector_output(self, connector_output: "KVConnectorOutput"):
        if self._scheduler is None:
            return
        events = getattr(connector_output, "kv_cache_events", None)
        if self._event_map is not None and isinstance(events, ChunkTransitions):
            self._event_map.apply(events.get_all_events())
        for rid, chunk in (getattr(getattr(connector_output, "kv_connector_worker_meta", None), "failed_saves", None) or {}).items():
            self._scheduler.saves_failed(rid, chunk)
        self._scheduler.update_connector_output(
            ConnectorOutput(
                finished_sending=getattr(connector_output, "finished_sending", None) or (),
                finished_recving=getattr(connector_output, "finished_recving", None) or (),
                invalid_block_ids=getattr(connector_output, "invalid_block_ids", None) or (),
            )
        )

    def request_finished(
        self,
        request: "Request",
        block_ids: list[int],
    ) -> tuple[bool, dict[str, Any] | None]:
        assert self._scheduler is not None
        req = connector_request(request)
        self._tables.drop(req.request_id)
        return self._scheduler.request_finished(req, block_ids)

    def request_finished_all_groups(
        self,
        request: "Request",
        block_ids: tuple[list[int], ...],
    ) -> tuple[bool, dict[str, Any] | None]:
        # One KV cache group (checked at start-up): its blocks are the request's.
        return self.request_finished(request, list(block_ids[0]) if block_ids else [])

    def take_events(self):
        if self._event_map is None:
            return ()
        return [_vllm_event(ev, self._shape.block_size, self._event_group) for ev in self._event_map.take_records()]

    def reset_cache(self) -> bool | None:
        if self._scheduler is None:
            return None
        return self._scheduler.reset_cache()
