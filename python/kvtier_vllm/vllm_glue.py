"""The pure part of the vLLM adapter: converting vLLM's objects into the connectors' inputs.

Nothing here imports vLLM; everything reads vLLM's objects by attribute (duck typing), so it is
tested here with stand-ins shaped like vLLM's ``Request``, ``SchedulerOutput``
(``scheduled_new_reqs`` / ``scheduled_cached_reqs``), ``KVCacheBlocks`` and ``VllmConfig``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from .config import KvtierConfig
from .connector_types import ConnectorRequest, ScheduledRequest
from .errors import ConfigError
from .kv_caches import layout_version
from .namespace import derive_namespace, head_covers
from .rank_lookup import rank_index, rank_suffix

__all__ = [
    "check_kv_cache_groups",
    "connector_request",
    "is_aborted",
    "first_group",
    "BlockTables",
    "pp_layer_range",
    "ModelShape",
    "model_shape",
    "rank_namespace",
    "rank_covers",
    "all_rank_namespaces",
]


#: KV cache specs whose KV kvtier stores: every token's KV for the whole prefix.
_FULL_SPECS = ("FullAttentionSpec", "MLAAttentionSpec")
#: Specs that vLLM folds into full attention when the hybrid KV cache manager is off.
_WINDOW_SPECS = ("SlidingWindowSpec", "ChunkedLocalAttentionSpec", "SlidingWindowMLASpec")


def check_kv_cache_groups(kv_cache_config: Any) -> None:
    """Refuses a KV cache kvtier cannot store, saying what to do (vLLM's ``KVCacheConfig``;
    None, from vLLM that does not pass it, is not checked).

    kvtier stores and loads whole-prefix KV of one group of full-attention (or MLA) layers.
    Models that mix sliding-window or chunked-local attention with full attention get one
    group per kind from vLLM's hybrid KV cache manager; with
    ``--disable-hybrid-kv-cache-manager`` vLLM keeps every layer's KV in one full-attention
    group and kvtier serves them. Models with Mamba or other state layers cannot be put in one
    group: kvtier cannot serve them.

    :raises ConfigError: for more than one group or a group kvtier cannot store.
    """
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or ())
    kinds = [type(getattr(g, "kv_cache_spec", None)).__name__ for g in groups]
    if all(k in _FULL_SPECS for k in kinds) and len(groups) <= 1:
        return
    listed = ", ".join(kinds)
    if all(k in _FULL_SPECS or k in _WINDOW_SPECS for k in kinds):
        raise ConfigError(
            f"kvtier stores full-attention KV of one KV cache group; this model's KV cache has {len(groups)} groups "
            f"({listed}) because vLLM's hybrid KV cache manager is on. Start vLLM with "
            "--disable-hybrid-kv-cache-manager: every layer then keeps full-attention KV in one group and kvtier "
            "serves the model (models mixing sliding-window or chunked-local attention with full attention)"
        )
    raise ConfigError(
        f"kvtier cannot store this model's KV cache ({listed}): Mamba, linear-attention or other state layers "
        "have no per-token KV that a prefix can be loaded from, and vLLM cannot put them in one group with "
        "--disable-hybrid-kv-cache-manager either. Serve this model without kvtier (remove --kv-transfer-config)"
    )


def is_aborted(request: Any) -> bool:
    """True when a vLLM request ended by abort (``RequestStatus.FINISHED_ABORTED``)."""
    status = getattr(request, "status", None)
    name = getattr(status, "name", None) or str(status)
    return name.endswith("FINISHED_ABORTED")


def _mm_spans(request: Any) -> list[tuple[str, int, int]]:
    spans: list[tuple[str, int, int]] = []
    for f in getattr(request, "mm_features", None) or ():
        ident = getattr(f, "mm_hash", None) or getattr(f, "identifier", None)
        pos = getattr(f, "mm_position", None)
        if ident and pos is not None and int(pos.length) > 0:
            spans.append((str(ident), int(pos.offset), int(pos.length)))
    if spans:
        return spans
    # Older vLLM: parallel lists of hashes and placeholder ranges.
    hashes = getattr(request, "mm_hashes", None) or ()
    positions = getattr(request, "mm_positions", None) or ()
    for h, pos in zip(hashes, positions):
        if h and int(pos.length) > 0:
            spans.append((str(h), int(pos.offset), int(pos.length)))
    return spans


def connector_request(request: Any, aborted: bool | None = None) -> ConnectorRequest:
    """A :class:`ConnectorRequest` from a vLLM ``Request`` (id, prompt tokens, cache salt, LoRA
    name, multimodal spans, aborted). A request without prompt token ids (prompt embeddings)
    gets an empty prompt: kvtier claims nothing for it."""
    lora = getattr(request, "lora_request", None)
    return ConnectorRequest(
        request_id=str(request.request_id),
        prompt_token_ids=tuple(getattr(request, "prompt_token_ids", None) or ()),
        cache_salt=getattr(request, "cache_salt", None),
        lora=None if lora is None else (getattr(lora, "lora_name", None) or None),
        mm=tuple(_mm_spans(request)),
        aborted=is_aborted(request) if aborted is None else aborted,
    )


def first_group(blocks: Any) -> list[int]:
    """Block ids of the first KV cache group, from ``KVCacheBlocks`` (``get_block_ids()``), a
    tuple of per-group lists, or a flat list."""
    if blocks is None:
        return []
    get = getattr(blocks, "get_block_ids", None)
    if callable(get):
        blocks = get()
    blocks = list(blocks)
    if blocks and isinstance(blocks[0], (list, tuple)):
        return [int(b) for b in blocks[0]]
    return [int(b) for b in blocks]


class BlockTables:
    """Each running request's whole block table, rebuilt from the scheduler outputs (vLLM sends
    new requests' tables once and then only the blocks added each step)."""

    def __init__(self, block_size: int) -> None:
        self._block = block_size
        self._tables: dict[str, list[int]] = {}
        self._requests: dict[str, ConnectorRequest] = {}

    def remember(self, request: ConnectorRequest, table: Sequence[int] | None = None) -> None:
        """Records a request seen by the scheduler hooks (and its table after an allocation)."""
        self._requests[request.request_id] = request
        if table is not None:
            self._tables[request.request_id] = list(table)

    def request(self, request_id: str) -> ConnectorRequest | None:
        return self._requests.get(request_id)

    def table(self, request_id: str) -> list[int]:
        return list(self._tables.get(request_id, ()))

    def drop(self, request_id: str) -> None:
        self._tables.pop(request_id, None)
        self._requests.pop(request_id, None)

    def scheduled(self, scheduler_output: Any) -> list[ScheduledRequest]:
        """The step's scheduled requests with whole block tables (vLLM ``SchedulerOutput``)."""
        counts: Mapping[str, int] = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
        out: list[ScheduledRequest] = []
        for nr in getattr(scheduler_output, "scheduled_new_reqs", None) or ():
            rid = str(nr.req_id)
            table = first_group(nr.block_ids)
            known = self._tables.get(rid)
            if known and len(known) > len(table) and known[len(known) - len(table) :] == table:
                table = list(known)  # only the blocks allocated this step were sent
            self._tables[rid] = table
            req = self._requests.get(rid)
            if req is None:
                lora = getattr(nr, "lora_request", None)
                req = ConnectorRequest(
                    rid,
                    tuple(getattr(nr, "prompt_token_ids", None) or ()),
                    lora=None if lora is None else getattr(lora, "lora_name", None),
                )
                self._requests[rid] = req
            out.append(ScheduledRequest(req, table, int(nr.num_computed_tokens), int(counts.get(rid, 0))))
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        if cached is None:
            return out
        resumed_set = set(getattr(cached, "resumed_req_ids", None) or ())
        resumed_flags = getattr(cached, "resumed_from_preemption", None)  # older vLLM
        new_ids = getattr(cached, "new_block_ids", None) or ()
        computed = getattr(cached, "num_computed_tokens", None) or ()
        for i, rid in enumerate(getattr(cached, "req_ids", None) or ()):
            rid = str(rid)
            new = first_group(new_ids[i]) if i < len(new_ids) else []
            resumed = rid in resumed_set or bool(resumed_flags and i < len(resumed_flags) and resumed_flags[i])
            table = new if resumed else self._tables.get(rid, []) + new
            self._tables[rid] = table
            req = self._requests.get(rid)
            if req is None:
                continue  # never seen by the connector (no prompt known): nothing to save
            out.append(ScheduledRequest(req, table, int(computed[i]), int(counts.get(rid, 0))))
        return out


def pp_layer_range(num_layers: int, pp_rank: int, pp_size: int, partition: str | None = None) -> tuple[int, int]:
    """``[start, end)`` of a pipeline stage's layers, as vLLM's ``get_pp_indices`` splits them:
    ``partition`` is ``VLLM_PP_LAYER_PARTITION`` (comma-separated layer counts) when set; else
    equal shares with the remainder going one each to the stages before the last, from the back."""
    if partition:
        parts = [int(p) for p in partition.split(",")]
        if len(parts) != pp_size or sum(parts) != num_layers:
            raise ConfigError(f"VLLM_PP_LAYER_PARTITION {partition!r} does not split {num_layers} layers into {pp_size} stages")
    else:
        parts = [num_layers // pp_size] * pp_size
        for i in range(2, num_layers % pp_size + 2):
            parts[-i] += 1
    start = sum(parts[:pp_rank])
    return start, start + parts[pp_rank]


@dataclass(frozen=True)
class ModelShape:
    """What the namespaces of an engine's ranks are derived from."""

    model_id: str
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    tp_size: int
    pp_size: int
    mla: bool
    layout_version: int
    pp_partition: str | None = None

    @property
    def world(self) -> int:
        return self.tp_size * self.pp_size


def _dtype_name(d: Any) -> str:
    s = str(d)
    return s[len("torch.") :] if s.startswith("torch.") else s


def model_shape(vllm_config: Any, cfg: KvtierConfig, kv_layout: str | None = None, pp_partition: str | None = None) -> ModelShape:
    """Reads the namespace inputs from a ``VllmConfig`` (``model_config``, ``cache_config``,
    ``parallel_config``). ``kv_layout`` is vLLM's KV cache layout (``NHD``/``HND``) when the
    config does not set one.

    :raises ConfigError: when a value cannot be resolved (e.g. ``cache_dtype`` and model dtype).
    """
    mc = vllm_config.model_config
    cc = vllm_config.cache_config
    pc = vllm_config.parallel_config
    mla = bool(getattr(mc, "use_mla", False))
    cache_dtype = getattr(cc, "cache_dtype", "auto") or "auto"
    dtype = _dtype_name(mc.dtype) if cache_dtype == "auto" else str(cache_dtype)
    if cfg.num_layers is not None:
        layers = cfg.num_layers
    elif callable(getattr(mc, "get_total_num_hidden_layers", None)):
        layers = int(mc.get_total_num_hidden_layers())
    else:
        layers = int(mc.hf_text_config.num_hidden_layers)
    heads = 1 if mla else int(mc.get_total_num_kv_heads())
    layout = cfg.kv_layout or kv_layout or "NHD"
    return ModelShape(
        model_id=cfg.model_id or str(mc.model),
        dtype=dtype,
        num_layers=layers,
        num_kv_heads=heads,
        head_dim=int(mc.get_head_size()),
        block_size=int(cc.block_size),
        tp_size=int(getattr(pc, "tensor_parallel_size", 1)),
        pp_size=int(getattr(pc, "pipeline_parallel_size", 1)),
        mla=mla,
        layout_version=1 if mla else layout_version(layout),
        pp_partition=pp_partition,
    )


def rank_namespace(shape: ModelShape, tp_rank: int, pp_rank: int) -> bytes:
    """The namespace id (16 bytes) of one rank."""
    start, end = pp_layer_range(shape.num_layers, pp_rank, shape.pp_size, shape.pp_partition)
    return derive_namespace(
        model_id=shape.model_id,
        dtype=shape.dtype,
        num_layers=end - start,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        block_size=shape.block_size,
        tp_size=shape.tp_size,
        tp_rank=tp_rank,
        mla=shape.mla,
        layout_version=shape.layout_version,
        pp_size=shape.pp_size,
        pp_rank=pp_rank,
        pp_first_layer=start,
    ).id


def rank_covers(shape: ModelShape, tp_rank: int, pp_rank: int) -> list[list[bytes]]:
    """The namespace ids of each cover of one rank's KV heads (chunks saved by engines of the
    model at other TP sizes, :func:`~kvtier_vllm.namespace.head_covers`); empty for MLA."""
    if shape.mla:
        return []
    start, end = pp_layer_range(shape.num_layers, pp_rank, shape.pp_size, shape.pp_partition)
    covers = head_covers(
        model_id=shape.model_id,
        dtype=shape.dtype,
        num_layers=end - start,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        block_size=shape.block_size,
        tp_size=shape.tp_size,
        tp_rank=tp_rank,
        mla=False,
        layout_version=shape.layout_version,
        pp_size=shape.pp_size,
        pp_rank=pp_rank,
        pp_first_layer=start,
    )
    return [[n.id for _, _, n in shards] for _, shards in covers]


def all_rank_namespaces(shape: ModelShape) -> list[tuple[int, bytes, str]]:
    """``(rank index, namespace id, lookup-id suffix)`` of every KV rank of the engine."""
    out = []
    for pp in range(shape.pp_size):
        for tp in range(shape.tp_size):
            k = rank_index(tp, pp, shape.tp_size)
            out.append((k, rank_namespace(shape, tp, pp), rank_suffix(k, shape.world)))
    return out


_INT = re.compile(r"\d+")


def layer_indices(names: Iterable[str]) -> list[int]:
    """The model layer index in each vLLM layer name (``model.layers.<i>.self_attn.attn``)."""
    out = []
    for n in names:
        nums = _INT.findall(n)
        out.append(int(nums[0]) if len(nums) == 1 else -1)
    return out
