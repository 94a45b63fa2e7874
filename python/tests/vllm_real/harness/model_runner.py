"""One tensor-parallel worker of a vLLM engine, with vLLM's own code around kvtier's connector.

The connector is built by vLLM's ``ensure_kv_transfer_initialized`` (its connector factory, the
engine id synced over the tensor-parallel group) and driven by vLLM's
``KVConnectorModelRunnerMixin`` in the order of ``GPUModelRunner.execute_model`` at the vendored
commit: ``handle_preemptions``; the request states; ``kv_connector_no_forward`` for a step with
nothing to compute, else the forward pass inside ``set_forward_context`` and
``maybe_get_kv_connector_output`` (``bind_connector_metadata``, ``start_load_kv``, and after the
forward ``wait_for_save``, ``get_finished``, ``get_block_ids_with_load_errors``, the KV cache
events, ``clear_connector_metadata``). Each attention layer is a function decorated with vLLM's
``maybe_transfer_kv_layer``, so ``wait_for_layer_load`` and ``save_kv_layer`` are called by vLLM.

The forward pass is a stand-in: per layer it writes the scheduled tokens' KV, then compares, bit
for bit, the KV that attention reads (every scheduled request's computed tokens) with what the
model computes for those tokens (:mod:`tests.engine_kit.kv_content`). Blocks that a
kvtier LOAD wrote are counted as they are first compared, so a test can tell loaded KV from
recomputed KV. Every connector call's duration is measured.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tests.engine_kit.kv_content import PrefixHashes, next_token, token_kv
from tests.engine_kit.paged_kv import PagedKv

from tests.engine_kit.faults import arm, time_calls
from .model import LAYER_NAME

#: The connector methods whose durations a worker reports (vLLM's worker-side calls).
WORKER_CALLS = (
    "handle_preemptions", "bind_connector_metadata", "start_load_kv", "wait_for_layer_load",
    "save_kv_layer", "wait_for_save", "get_finished", "get_block_ids_with_load_errors",
    "get_kv_connector_kv_cache_events", "clear_connector_metadata", "shutdown",
)


#: What the model writes for a token it cannot compute (a NaN pattern in fp16 and bf16).
POISON = 0x7E7E


@dataclass
class _Req:
    tokens: PrefixHashes
    table: list[int]
    provided: np.ndarray | None = None
    #: Positions below this the model cannot compute (their KV must come from a load).
    compute_from: int = 0
    expected: np.ndarray | None = None
    verified_blocks: set[int] = field(default_factory=set)


@dataclass
class StepReport:
    """What the engine learns from a worker besides vLLM's ``ModelRunnerOutput``."""

    mismatches: list[str] = field(default_factory=list)
    loaded_blocks_compared: int = 0
    #: Tokens the forward pass had to compute below a request's ``compute_from``.
    forbidden_computes: int = 0
    #: Connector method -> the longest call of this step, seconds.
    call_s: dict[str, float] = field(default_factory=dict)


class _AttentionLayer:
    """What vLLM's forward context holds per attention layer (``kv_cache``)."""

    def __init__(self, kv_cache: Any) -> None:
        self.kv_cache = kv_cache


class _AttnMetadata:
    """Non-None attention metadata: vLLM's layer hooks run only with metadata."""


class StandInModelRunner:
    """The worker-side engine (see the module). ``spec`` is a dict: ``vllm_config``,
    ``kv_cache_config``, ``backend``, ``dtype``, ``unopenable``, ``env``, ``rank``."""

    def __init__(self, spec: dict) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.distributed.kv_transfer import get_kv_transfer_group
        from vllm.distributed.kv_transfer.kv_connector.utils import copy_kv_blocks
        from vllm.distributed.kv_transfer.kv_transfer_state import ensure_kv_transfer_initialized
        from vllm.v1.attention.backends.utils import get_kv_cache_layout, set_kv_cache_layout
        from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin

        self.mixin = KVConnectorModelRunnerMixin
        self.cfg = cfg = spec["vllm_config"]
        self.rank = rank = spec["rank"]
        tp = cfg.parallel_config.tensor_parallel_size
        mc = cfg.model_config
        self.mla = bool(mc.use_mla)
        self.layers = mc.get_num_layers(cfg.parallel_config)
        self.heads = 1 if self.mla else mc.get_num_kv_heads(cfg.parallel_config)
        self.head_lo = 0 if self.mla else rank * self.heads
        self.block_size = cfg.cache_config.block_size
        self.calls: dict[str, float] = {}
        saved_env = {k: os.environ.get(k) for k in spec.get("env", {})}
        os.environ.update(spec.get("env", {}))
        set_kv_cache_layout(None)  # drops the layout an earlier engine of this process cached
        try:
            with set_current_vllm_config(cfg):
                ensure_kv_transfer_initialized(cfg, spec["kv_cache_config"])
                self.connector = get_kv_transfer_group()
                time_calls(self.connector, WORKER_CALLS, self.calls)
                fault = spec.get("fault_at")
                if fault is not None and fault[0] == "worker" and rank == 0:
                    arm(self.connector, fault[1], fault[2])
                self.in_block = get_kv_cache_layout() or "NHD"
                self.kv = PagedKv(
                    f"/dev/shm/kvtier-vllm-{uuid.uuid4().hex[:10]}-r{rank}",
                    backend="mla" if self.mla else spec["backend"],
                    in_block=self.in_block,
                    dtype=spec["dtype"],
                    num_layers=self.layers,
                    num_blocks=spec["kv_cache_config"].num_blocks,
                    block_size=self.block_size,
                    heads=self.heads,
                    head_dim=mc.get_head_size(),
                    in_process=spec.get("in_process_kv", False),
                )
                if spec.get("unopenable"):
                    os.unlink(self.kv.path)  # the sidecar cannot open what the worker registers
                self.connector.register_kv_caches(self.kv.layers)
                self.connector.set_host_xfer_buffer_ops(copy_kv_blocks)
        finally:
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        # What vLLM's model registers in its forward context, per attention layer.
        static = cfg.compilation_config.static_forward_context
        for name, tensor in self.kv.layers.items():
            static[name] = _AttentionLayer(tensor)
        self.names = list(self.kv.layers)
        self.reqs: dict[str, _Req] = {}
        self.provided: dict[str, np.ndarray] = {}
        self.loaded_blocks: set[int] = set()
        #: Block id -> the last writes into it, "<request> <what> @<step>" (diagnostics).
        self.writers: dict[int, list[str]] = {}
        self.steps = 0
        self.closed = False

    # ------------------------------------------------------------------ request states

    def provide(self, request_id: str, values: np.ndarray, compute_from: int = 0) -> None:
        """KV (int16 ``[tokens, layers, kv, my heads, dim]``) the forward pass writes for this
        request instead of the stand-in's. With ``compute_from``, the model cannot compute the
        tokens before it: their KV must be loaded; computing one writes a poison value (which
        the comparison then reports) and is counted."""
        self.provided[request_id] = (np.asarray(values), compute_from)

    def _update_states(self, so: Any) -> None:
        for rid in so.finished_req_ids:
            self.reqs.pop(rid, None)
            self.provided.pop(rid, None)
        for nr in so.scheduled_new_reqs:
            ph = PrefixHashes()
            ph.extend(nr.prompt_token_ids)
            self.reqs[nr.req_id] = self._new_req(nr.req_id, ph, list(nr.block_ids[0]))
        c = so.scheduled_cached_reqs
        for i, rid in enumerate(c.req_ids):
            r = self.reqs.get(rid)
            # vLLM sends a request's tokens when it was not scheduled in the previous step (a
            # resumed one included): they are the truth (tokens of steps a preemption discarded
            # are gone from them).
            tokens = c.all_token_ids.get(rid)
            if r is None or (tokens is not None and list(tokens) != r.tokens.tokens):
                ph = PrefixHashes()
                ph.extend(tokens if tokens is not None else [])
                r = self.reqs[rid] = self._new_req(rid, ph, [] if r is None else r.table)
            new = list(c.new_block_ids[i][0]) if c.new_block_ids[i] is not None else []
            if rid in c.resumed_req_ids:
                r.table = new
                r.verified_blocks = set()
            else:
                r.table += new

    def _new_req(self, rid: str, tokens: PrefixHashes, table: list[int]) -> _Req:
        values, compute_from = self.provided.get(rid, (None, 0))
        return _Req(tokens, table, values, compute_from)

    def _expected(self, r: _Req, upto: int) -> np.ndarray:
        if r.expected is None and r.provided is not None:
            r.expected = r.provided
        have = 0 if r.expected is None else r.expected.shape[0]
        if have < upto:
            more = token_kv(r.tokens.hashes[have:upto], self.layers, 1 if self.mla else 2,
                            (self.head_lo, self.head_lo + self.heads), self.kv.head_dim)
            r.expected = more if r.expected is None else np.concatenate([r.expected, more])
        return r.expected[:upto]

    # ------------------------------------------------------------------ one step

    def execute_model(self, so: Any) -> tuple[Any, StepReport]:
        """``GPUModelRunner.execute_model`` with a stand-in forward pass (see the module)."""
        from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group
        from vllm.forward_context import set_forward_context
        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

        self.calls.clear()
        self.steps += 1
        report = StepReport()
        meta = so.kv_connector_metadata
        for load in getattr(getattr(meta, "meta", None), "loads", ()):
            self.loaded_blocks.update(load.block_ids)
            for b in load.block_ids:
                self._wrote(b, f"{load.request_id} kvtier LOAD")
        if has_kv_transfer_group():
            assert meta is not None
            get_kv_transfer_group().handle_preemptions(meta)
        self._update_states(so)
        if so.new_block_ids_to_zero:
            self.kv.zero_blocks(list(so.new_block_ids_to_zero))
        if not so.total_num_scheduled_tokens:
            out = self.mixin.kv_connector_no_forward(so, self.cfg) if has_kv_transfer_group() else EMPTY_MODEL_RUNNER_OUTPUT
            report.call_s = dict(self.calls)
            return out, report
        computed = {nr.req_id: nr.num_computed_tokens for nr in so.scheduled_new_reqs}
        computed.update(zip(so.scheduled_cached_reqs.req_ids, so.scheduled_cached_reqs.num_computed_tokens))
        step = _Forward(self, so, computed, report)
        attn_metadata = {name: _AttnMetadata() for name in self.names}
        with (
            set_forward_context(attn_metadata, self.cfg, slot_mapping={}),
            self.mixin.maybe_get_kv_connector_output(so) as kv_output,
        ):
            for name in self.names:
                _attention(step, name)
        invalid = set(kv_output.invalid_block_ids or ())
        self.loaded_blocks -= invalid
        # A synchronous (layer-wise) load that failed left its blocks unwritten while this
        # step's attention read them: vLLM discards such a request's output and rewinds it to
        # its first invalid block, so only reads of other blocks are wrong KV.
        for blocks, message in step.suspect:
            if not blocks <= invalid:
                report.mismatches.append(message)
        for r, b in step.read_loaded:
            if b not in invalid and b not in r.verified_blocks:
                report.loaded_blocks_compared += 1
                r.verified_blocks.add(b)
        sampled = step.sample(invalid)
        ids = list(so.num_scheduled_tokens)
        out = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=[sampled.get(rid, []) for rid in ids],
            kv_connector_output=kv_output,
        )
        report.call_s = dict(self.calls)
        return out, report

    def _wrote(self, block: int, what: str) -> None:
        w = self.writers.setdefault(block, [])
        w.append(f"{what} @{self.steps}")
        del w[:-4]

    def gather(self, block_ids: list[int], num_tokens: int) -> np.ndarray:
        """The KV of a request's first ``num_tokens`` tokens in these blocks (int16)."""
        return self.kv.read(block_ids, 0, num_tokens).numpy()

    def connector_stats(self) -> dict:
        """The worker connector's counters, and what it has in flight (``in_flight``: kind and
        request of each transfer not settled)."""
        w = getattr(self.connector, "_worker", None)
        if w is None:
            return {}
        return {**vars(w.stats()), "in_flight": [(t.kind, t.request_id) for t in w._transfers]}

    def close(self) -> dict:
        """vLLM's worker shutdown (``ensure_kv_transfer_shutdown``); what was still in flight."""
        from vllm.distributed.kv_transfer.kv_transfer_state import ensure_kv_transfer_shutdown

        if self.closed:
            return {}
        self.closed = True
        info: dict = {"in_block": self.in_block}
        w = getattr(self.connector, "_worker", None)
        if w is not None:
            info["in_flight"] = w.in_flight()
            info["stats"] = vars(w.stats())
        self.calls.clear()
        ensure_kv_transfer_shutdown()
        info["call_s"] = dict(self.calls)
        static = self.cfg.compilation_config.static_forward_context
        for name in self.names:
            static.pop(name, None)
        self.kv.close()
        return info


class _Forward:
    """One forward pass: per layer, what attention reads is compared, then the new KV written."""

    def __init__(self, runner: StandInModelRunner, so: Any, computed: dict[str, int], report: StepReport) -> None:
        self.runner, self.so, self.computed, self.report = runner, so, computed, report
        #: Wrong reads of blocks a load of this step wrote: (blocks, message), judged once the
        #: step's invalid blocks are known.
        self.suspect: list[tuple[set[int], str]] = []
        #: Loaded blocks attention read in every layer: (request, block), counted as compared
        #: once the step's invalid blocks are known (a failed load's blocks are not loaded KV).
        self.read_loaded: list[tuple[Any, int]] = []
        self.loading = {b for load in getattr(getattr(so.kv_connector_metadata, "meta", None), "loads", ()) if getattr(load, "layerwise", False) for b in load.block_ids}

    def attend(self, layer_name: str) -> None:
        """One attention layer as vLLM runs it: the batch's new KV is written into the cache
        first, then attention reads every request's tokens (a request's prefix-cache hit may
        name blocks another request of the same step computes)."""
        r_ = self.runner
        layer = r_.names.index(layer_name)
        only = range(layer, layer + 1)
        bs = r_.block_size
        for rid, n in self.computed.items():
            r = r_.reqs[rid]
            s = self.so.num_scheduled_tokens[rid]
            vals = r_._expected(r, n + s)[n:]
            if n < r.compute_from:
                vals = vals.copy()
                vals[: r.compute_from - n] = POISON
                if layer == 0:
                    self.report.forbidden_computes += min(s, r.compute_from - n)
            r_.kv.write(r.table, n, vals, only)
            if layer == 0 and s:
                for j in range(n // bs, -(-(n + s) // bs)):
                    r_._wrote(r.table[j], f"{rid} tokens {max(n, j * bs)}..{min(n + s, (j + 1) * bs) - 1}")
        for rid, n in self.computed.items():
            if n > 0:
                self._compare(rid, n, layer, layer_name)

    def _compare(self, rid: str, n: int, layer: int, layer_name: str) -> None:
        """What attention reads of the request's first ``n`` tokens, against the model's KV."""
        r_ = self.runner
        r = r_.reqs[rid]
        got = r_.kv.read(r.table, 0, n, range(layer, layer + 1)).numpy()
        want = r_._expected(r, n)[:, layer : layer + 1]
        bad = np.nonzero((got != want).reshape(n, -1).any(axis=1))[0]
        if bad.size:
            blocks = sorted({r.table[p // r_.block_size] for p in bad.tolist()})
            message = (
                f"rank {r_.rank} {layer_name}: request {rid} holds wrong KV at {bad.size} of {n} "
                f"computed tokens (first at token {int(bad[0])}; blocks {blocks[:8]}; last writes "
                f"{ {b: r_.writers.get(b) for b in blocks[:3]} })"
            )
            if set(blocks) <= self.loading:
                self.suspect.append((set(blocks), message))
            else:
                self.report.mismatches.append(message)
        if layer == r_.layers - 1:
            for j in range(-(-n // r_.block_size)):
                b = r.table[j]
                if b in r_.loaded_blocks and b not in r.verified_blocks:
                    self.read_loaded.append((r, b))

    def sample(self, invalid: set[int] = frozenset()) -> dict[str, list[int]]:
        """The stand-in model's next token for requests whose prompt this step completed; none
        for a request that read a block of ``invalid`` (vLLM discards its output and rewinds it,
        so no token is appended)."""
        out: dict[str, list[int]] = {}
        bs = self.runner.block_size
        for rid, s in self.so.num_scheduled_tokens.items():
            r = self.runner.reqs[rid]
            if invalid and invalid.intersection(r.table[: -(-self.computed[rid] // bs)]):
                continue
            if self.computed[rid] + s >= len(r.tokens.tokens):
                t = next_token(r.tokens.hashes[-1])
                r.tokens.extend([t])
                out[rid] = [t]
        return out


def _attention(step: _Forward, layer_name: str) -> None:
    step.attend(layer_name)


def install_layer_hooks() -> None:
    """Wraps the stand-in attention in vLLM's ``maybe_transfer_kv_layer`` (imported late: it
    imports vLLM's attention layer)."""
    global _attention
    from vllm.model_executor.layers.attention.kv_transfer_utils import maybe_transfer_kv_layer

    if not getattr(_attention, "__wrapped__", None):
        _attention = maybe_transfer_kv_layer(_attention)
