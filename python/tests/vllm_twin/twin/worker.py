"""A tensor-parallel worker's model runner: builds kvtier's connector through vLLM's factory and
calls it in the model runner's order each step, around a stand-in forward pass that writes
each scheduled token's KV (:mod:`tests.engine_kit.kv_content`, or KV a test hands in) into the paged cache.

Order per step (``vllm/v1/worker/kv_connector_model_runner_mixin.py``): ``handle_preemptions``,
``bind_connector_metadata``; at the fixture revision ``start_load_kv`` before the forward pass,
at the current one after it (asynchronous loads only); per layer ``wait_for_layer_load``, the
layer's KV writes and ``save_kv_layer``; then ``wait_for_save``, ``get_finished`` (current:
``get_transfer_results``), ``get_block_ids_with_load_errors``, ``clear_connector_metadata``.

After the forward pass's writes every scheduled request's computed tokens are compared with the
KV they must hold, bit for bit (what its attention read); blocks that kvtier loaded are counted
as they are first compared.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from vllm import _twin
from vllm.config import set_current_vllm_config
from vllm.distributed import parallel_state
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.v1.attention.backends.utils import get_kv_cache_layout, set_kv_cache_layout
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

from tests.engine_kit.faults import arm, time_calls
from tests.engine_kit.kv_content import PrefixHashes, next_token, token_kv
from tests.engine_kit.paged_kv import PagedKv


@dataclass
class _Req:
    tokens: PrefixHashes
    table: list[int]
    #: The KV a test handed in for every token of the request (else :mod:`tests.engine_kit.kv_content`'s).
    provided: np.ndarray | None = None
    expected: np.ndarray | None = None
    verified_blocks: set[int] = field(default_factory=set)


@dataclass
class WorkerReport:
    """The twin's view of one worker step, besides vLLM's ``ModelRunnerOutput``."""

    mismatches: list[str] = field(default_factory=list)
    loaded_blocks_compared: int = 0
    contract: list[str] = field(default_factory=list)
    #: The longest call of each connector method this step, seconds.
    call_s: dict[str, float] = field(default_factory=dict)


#: Worker-side connector methods timed (those the revision's connector has).
WORKER_CALLS = (
    "handle_preemptions", "bind_connector_metadata", "start_load_kv", "wait_for_layer_load",
    "save_kv_layer", "wait_for_save", "get_finished", "get_transfer_results",
    "get_block_ids_with_load_errors", "get_kv_connector_kv_cache_events", "clear_connector_metadata",
    "shutdown",
)


class TwinWorker:
    def __init__(self, rank: int, spec: dict) -> None:
        _twin.use(spec["version"])
        self.rank = rank
        self.spec = spec
        cfg = spec["vllm_config"]
        tp = cfg.parallel_config.tensor_parallel_size
        mc = cfg.model_config
        self.mla = mc.use_mla
        self.heads = 1 if self.mla else mc.num_kv_heads // tp
        self.head_lo = 0 if self.mla else rank * self.heads
        self.layers = mc.num_hidden_layers
        self.block_size = cfg.cache_config.block_size
        self.salt = spec.get("kv_salt", 0)
        # What vLLM's start-up establishes in the worker: the parallel groups, the environment,
        # and the layout the attention backend picks (an override it sets, e.g. FlashInfer on
        # some GPUs, else vLLM's layout helper; None: the backend default).
        parallel_state.initialize_model_parallel(rank, tp)
        env = spec.get("env", {})
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        set_kv_cache_layout(spec.get("backend_layout_override"))
        try:
            with set_current_vllm_config(cfg):
                self.in_block = get_kv_cache_layout() or "NHD"
                self.kv = PagedKv(
                    f"/dev/shm/kvtier-twin-{uuid.uuid4().hex[:10]}-r{rank}",
                    backend=spec["backend"],
                    in_block=self.in_block,
                    dtype=spec["dtype"],
                    num_layers=self.layers,
                    num_blocks=spec["kv_cache_config"].num_blocks,
                    block_size=self.block_size,
                    heads=self.heads,
                    head_dim=mc.head_size,
                )
                self.connector = KVConnectorFactory.create_connector(
                    config=cfg, role=KVConnectorRole.WORKER, kv_cache_config=spec["kv_cache_config"]
                )
                if rank in spec.get("unopenable_ranks", ()):
                    # The sidecar cannot open what it is told: the file is gone for other processes.
                    os.unlink(self.kv.path)
                self.connector.register_kv_caches(self.kv.layers)
        finally:
            set_kv_cache_layout(None)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        self.calls: dict[str, float] = {}
        time_calls(self.connector, [n for n in WORKER_CALLS if hasattr(self.connector, n)], self.calls)
        fault = spec.get("fault_at")
        if fault is not None and fault[0] == "worker" and rank == 0:
            arm(self.connector, fault[1], fault[2])
        self.reqs: dict[str, _Req] = {}
        self.finished_seen: set[str] = set()
        self.provided: dict[str, np.ndarray] = {}
        self.loaded_blocks: set[int] = set()

    # ------------------------------------------------------------------ requests

    def _update_states(self, so: Any) -> None:
        for rid in so.finished_req_ids:
            self.reqs.pop(rid, None)
            self.provided.pop(rid, None)
            self.finished_seen.add(rid)
        for nr in so.scheduled_new_reqs:
            ph = PrefixHashes(self.salt)
            ph.extend(nr.prompt_token_ids)
            self.reqs[nr.req_id] = _Req(ph, list(nr.block_ids[0]), self.provided.get(nr.req_id))
        c = so.scheduled_cached_reqs
        for i, rid in enumerate(c.req_ids):
            r = self.reqs.get(rid)
            if rid in c.all_token_ids or r is None:
                ph = PrefixHashes(self.salt)
                ph.extend(c.all_token_ids[rid])
                r = self.reqs[rid] = _Req(ph, [] if r is None else r.table, self.provided.get(rid))
            new = list(c.new_block_ids[i][0]) if c.new_block_ids[i] is not None else []
            if rid in c.resumed_req_ids:
                r.table = new
                r.verified_blocks = set()
            else:
                r.table += new

    def _expected(self, r: _Req, upto: int) -> np.ndarray:
        if r.expected is None and r.provided is not None:
            r.expected = r.provided  # tokens past the provided ones (generated) get the stand-in's
        have = 0 if r.expected is None else r.expected.shape[0]
        if have < upto:
            more = token_kv(r.tokens.hashes[have:upto], self.layers, 1 if self.mla else 2,
                            (self.head_lo, self.head_lo + self.heads), self.kv.head_dim)
            r.expected = more if r.expected is None else np.concatenate([r.expected, more])
        return r.expected[:upto]

    def _verify(self, so: Any, loaded: set[int], report: WorkerReport) -> None:
        computed = dict(zip(so.scheduled_cached_reqs.req_ids, so.scheduled_cached_reqs.num_computed_tokens))
        for nr in so.scheduled_new_reqs:
            computed[nr.req_id] = nr.num_computed_tokens
        for rid, n in computed.items():
            r = self.reqs[rid]
            if n == 0:
                continue
            got = self.kv.read(r.table, 0, n).numpy()
            want = self._expected(r, n)
            bad = np.nonzero((got != want).reshape(n, -1).any(axis=1))[0]
            if bad.size:
                blocks = sorted({r.table[p // self.block_size] for p in bad.tolist()})
                report.mismatches.append(
                    f"rank {self.rank}: request {rid} holds wrong KV at {bad.size} of {n} computed tokens "
                    f"(first at token {int(bad[0])}; blocks {blocks[:8]})"
                )
            for j in range(-(-n // self.block_size)):
                b = r.table[j]
                if b in loaded and b not in r.verified_blocks:
                    report.loaded_blocks_compared += 1
                    r.verified_blocks.add(b)

    # ------------------------------------------------------------------ one step

    def provide(self, request_id: str, values: np.ndarray) -> None:
        """KV (int16 ``[tokens, layers, 2, my heads, dim]``) the forward pass writes for this
        request instead of the stand-in's."""
        self.provided[request_id] = np.asarray(values)

    def execute(self, so: Any) -> tuple[ModelRunnerOutput, WorkerReport]:
        report = WorkerReport()
        meta = so.kv_connector_metadata
        _twin.use(self.spec["version"])
        self._update_states(so)
        for load in getattr(getattr(meta, "meta", None), "loads", ()):
            self.loaded_blocks.update(load.block_ids)
        c = self.connector
        c.handle_preemptions(meta)
        current = _twin.is_current()
        c.bind_connector_metadata(meta)
        if not current:
            c.start_load_kv(None)
        sampled = self._forward(so)
        # What attention read this step: each scheduled request's computed tokens, once the
        # step's KV writes are in (a local prefix hit may name blocks another request of the
        # same step computes).
        self._verify(so, self.loaded_blocks, report)
        if current:
            c.start_load_kv(None)
        c.wait_for_save()
        if current:
            res = c.get_transfer_results(so.finished_req_ids)
            sending, recving, failed = res.finished_sending, res.finished_recving, res.failed_recving
        else:
            sending, recving = c.get_finished(so.finished_req_ids)
            failed = set()
        invalid = c.get_block_ids_with_load_errors()
        events = c.get_kv_connector_kv_cache_events()
        c.clear_connector_metadata()
        self.finished_seen |= set(so.finished_req_ids)
        stray = set(sending or ()) - self.finished_seen
        if stray:
            report.contract.append(f"rank {self.rank}: finished_sending {sorted(stray)} never passed to get_finished")
        self.loaded_blocks -= set(invalid)
        report.call_s = dict(self.calls)
        self.calls.clear()
        ids = list(so.num_scheduled_tokens)
        out = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=[sampled.get(rid, []) for rid in ids],
            kv_connector_output=KVConnectorOutput(
                finished_sending=set(sending or ()) or None,
                finished_recving=set(recving or ()) or None,
                invalid_block_ids=set(invalid),
                failed_recving=set(failed),
                kv_cache_events=events,
            ),
        )
        return out, report

    def _forward(self, so: Any) -> dict[str, list[int]]:
        computed = dict(zip(so.scheduled_cached_reqs.req_ids, so.scheduled_cached_reqs.num_computed_tokens))
        for nr in so.scheduled_new_reqs:
            computed[nr.req_id] = nr.num_computed_tokens
        names = list(self.kv.layers)
        for name in names:
            self.connector.wait_for_layer_load(name)
        sampled: dict[str, list[int]] = {}
        for rid, n in so.num_scheduled_tokens.items():
            r = self.reqs[rid]
            start = computed[rid]
            vals = self._expected(r, start + n)[start:]
            self.kv.write(r.table, start, vals)
            if start + n >= len(r.tokens.tokens):
                t = next_token(r.tokens.hashes[-1])
                r.tokens.extend([t])
                sampled[rid] = [t]
        for name in names:
            self.connector.save_kv_layer(name, self.kv.layers[name], None)
        return sampled

    def connector_stats(self) -> dict:
        """The worker connector's counters (loads and saves started, failed, ...)."""
        w = getattr(self.connector, "_worker", None)
        return {} if w is None else vars(w.stats())

    def gather(self, block_ids: list[int], num_tokens: int) -> np.ndarray:
        """The KV of a request's first ``num_tokens`` tokens in these blocks (int16)."""
        return self.kv.read(block_ids, 0, num_tokens).numpy()

    def close(self) -> dict:
        _twin.use(self.spec["version"])
        info = {"in_block": self.in_block}
        w = getattr(self.connector, "_worker", None)
        if w is not None:
            info["in_flight"] = w.in_flight()
            info["stats"] = vars(w.stats())
        self.calls.clear()
        self.connector.shutdown()
        info["call_s"] = dict(self.calls)
        self.kv.close()
        return info
