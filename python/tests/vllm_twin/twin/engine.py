"""One vLLM engine in the twin: the scheduler (this process) and ``tp`` worker processes, stepped
like vLLM's ``EngineCore``: schedule, execute on every worker, aggregate, update from output.

Every step checks the workers' reports: any wrong KV byte in a scheduled request's computed
tokens, or a broken connector contract, raises :class:`~.checks.TwinAssertionError`, as do
vLLM's own assertions in the scheduler. :meth:`TwinEngine.close` checks what must hold at the
end: no request left, no block held, nothing half-reported in the aggregator.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable

from vllm import _twin
from vllm.config import (
    CacheConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MLAAttentionSpec
from vllm.v1.request import Request, RequestStatus

from tests.engine_kit.faults import arm, time_calls

from .block_pool import block_hashes
from .checks import TwinAssertionError, check
from .executor import WorkerPool
from .scheduler import Scheduler
from .scheduler_update import EngineCoreOutput


@dataclass
class EngineSpec:
    """What an engine is: model shape, KV cache, vLLM settings and kvtier's extra config."""

    endpoint: str
    version: str = _twin.FIXTURE
    model: str = "twin-model"
    layers: int = 2
    kv_heads: int = 4
    head_dim: int = 8
    mla: bool = False
    dtype: str = "float16"
    backend: str = "flash_attn"
    block_size: int = 4
    num_blocks: int = 96
    chunk_size: int = 16
    tp: int = 2
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 256
    kv_role: str = "kv_both"
    kv_load_failure_policy: str = "recompute"
    disable_hybrid_kv_cache_manager: bool = True
    kv_cache_groups: list | None = None
    reverse_blocks: bool = False
    enable_prefix_caching: bool = True
    extra: dict = field(default_factory=dict)
    #: Layout the attention backend forces in the workers (``set_kv_cache_layout``), if any.
    backend_layout_override: str | None = None
    #: Ranks whose KV cache file the sidecar cannot open (their REGISTER fails).
    unopenable_ranks: tuple = ()
    #: Environment of the workers while the engine lives (the scheduler's is the test's own).
    env: dict = field(default_factory=dict)
    #: A sidecar fault to start at a connector call: ``(role, method, action)``, role
    #: ``scheduler`` or ``worker`` (rank 0), see :mod:`tests.engine_kit.faults`.
    fault_at: tuple | None = None
    #: kvtier's own defaults for every setting but the endpoint and chunk size (as a deployment
    #: has them); else short timeouts for fault scenarios and the prefill-rate rule off.
    default_settings: bool = False
    engine_id: str = field(default_factory=lambda: f"twin-{uuid.uuid4().hex[:8]}")

    def vllm_config(self) -> VllmConfig:
        short = {
            "lookup_timeout_ms": 3000,
            "request_timeout_ms": 5000,
            "liveness_timeout_ms": 300,
            "heartbeat_interval_ms": 200,
            "shutdown_timeout_ms": 3000,
            # the twin's steps are not a model's: its learned rate would decline what tests load
            "prefill_tokens_per_s": "off",
        }
        extra = {
            "endpoint": self.endpoint,
            "chunk_size": self.chunk_size,
            **({} if self.default_settings else short),
            **self.extra,
        }
        return VllmConfig(
            model_config=ModelConfig(self.model, self.dtype, self.layers, self.kv_heads, self.head_dim, use_mla=self.mla),
            cache_config=CacheConfig(block_size=self.block_size, enable_prefix_caching=self.enable_prefix_caching, num_gpu_blocks=self.num_blocks),
            parallel_config=ParallelConfig(tensor_parallel_size=self.tp),
            scheduler_config=SchedulerConfig(
                max_num_seqs=self.max_num_seqs,
                max_num_batched_tokens=self.max_num_batched_tokens,
                disable_hybrid_kv_cache_manager=self.disable_hybrid_kv_cache_manager,
            ),
            kv_transfer_config=KVTransferConfig(
                kv_connector="KvtierConnector",
                kv_connector_module_path="kvtier_vllm.connector",
                kv_role=self.kv_role,
                engine_id=self.engine_id,
                kv_load_failure_policy=self.kv_load_failure_policy,
                kv_connector_extra_config=extra,
            ),
        )

    def kv_cache_config(self) -> KVCacheConfig:
        names = [f"model.layers.{i}.self_attn.attn" for i in range(self.layers)]
        groups = self.kv_cache_groups
        if groups is None:
            spec_cls = MLAAttentionSpec if self.mla else FullAttentionSpec
            groups = [KVCacheGroupSpec(names, spec_cls(self.block_size, 1 if self.mla else self.kv_heads, self.head_dim, self.dtype))]
        return KVCacheConfig(num_blocks=self.num_blocks, kv_cache_groups=groups)


@dataclass
class EngineStats:
    steps: int = 0
    loaded_blocks_compared: int = 0
    aborts: int = 0
    finished: int = 0
    #: The longest call of each scheduler-side connector method, seconds.
    scheduler_call_s: dict = field(default_factory=dict)
    #: The longest call of each worker-side connector method over the ranks, seconds.
    worker_call_s: dict = field(default_factory=dict)


#: Scheduler-side connector methods timed (those the connector has).
SCHEDULER_CALLS = (
    "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
    "update_connector_output", "request_finished", "request_finished_all_groups", "take_events",
    "shutdown",
)


def _merge_longest(into: dict, calls: dict) -> None:
    for name, dt in calls.items():
        if dt > into.get(name, 0.0):
            into[name] = dt


class TwinEngine:
    def __init__(self, spec: EngineSpec, pool: WorkerPool) -> None:
        check(spec.tp <= len(pool.conns), f"tp={spec.tp} needs {spec.tp} worker processes")
        _twin.use(spec.version)
        self.spec = spec
        self.pool = pool
        self.config = spec.vllm_config()
        self.kv_cache_config = spec.kv_cache_config()
        self.ranks = list(range(spec.tp))
        self.closed = False
        self.stats = EngineStats()
        self.outputs: list[EngineCoreOutput] = []
        self.finished: dict[str, EngineCoreOutput] = {}
        with set_current_vllm_config(self.config):
            self.scheduler = Scheduler(self.config, self.kv_cache_config, reverse_blocks=spec.reverse_blocks)
        connector = self.scheduler.connector
        time_calls(connector, [n for n in SCHEDULER_CALLS if hasattr(connector, n)], self.stats.scheduler_call_s)
        if spec.fault_at is not None and spec.fault_at[0] == "scheduler":
            arm(connector, spec.fault_at[1], spec.fault_at[2])
        worker_spec = {
            "version": spec.version,
            "vllm_config": self.config,
            "kv_cache_config": self.kv_cache_config,
            "backend": "mla" if spec.mla else spec.backend,
            "dtype": spec.dtype,
            "backend_layout_override": spec.backend_layout_override,
            "unopenable_ranks": tuple(spec.unopenable_ranks),
            "env": dict(spec.env),
            "fault_at": spec.fault_at,
        }
        try:
            self.worker_info = pool.call_all("init", spec.engine_id, [worker_spec] * spec.tp)
        except BaseException:
            self.scheduler.connector.shutdown()
            raise
        self.aggregator = KVOutputAggregator(spec.tp)

    # ------------------------------------------------------------------ requests

    def add_request(self, request_id: str, prompt: list[int], max_tokens: int = 4) -> Request:
        req = Request(request_id, prompt, max_tokens)
        # vLLM's request carries its prompt blocks' hashes (its block hasher runs at creation).
        req.block_hashes = block_hashes(req.prompt_token_ids, self.spec.block_size)
        self.scheduler.add_request(req)
        return req

    def abort(self, request_ids: Iterable[str]) -> None:
        done = self.scheduler.finish_requests(list(request_ids), RequestStatus.FINISHED_ABORTED)
        self.stats.aborts += len(done)
        for req in done:
            out = EngineCoreOutput(req.request_id, [], req.get_finished_reason(), req.kv_transfer_params)
            self.outputs.append(out)
            self.finished[req.request_id] = out

    def provide(self, request_id: str, per_rank_values: list) -> None:
        """Hands each worker the KV its forward pass writes for this request."""
        for rank, values in zip(self.ranks, per_rank_values):
            self.pool.call(rank, "provide", self.spec.engine_id, (request_id, values))

    def worker_stats(self) -> list[dict]:
        """Each worker connector's counters."""
        return self.pool.call_all("stats", self.spec.engine_id, [None] * self.spec.tp)

    # ------------------------------------------------------------------ stepping

    def step(self, before_execute=None) -> list[EngineCoreOutput]:
        """One engine step; ``before_execute(scheduler_output)`` runs between scheduling and the
        workers (a fault a scenario injects there)."""
        _twin.use(self.spec.version)
        so = self.scheduler.schedule()
        if before_execute is not None:
            before_execute(so)
        results = self.pool.call_all("step", self.spec.engine_id, [so] * self.spec.tp)
        problems = []
        for _, report in results:
            problems += report.mismatches + report.contract
            self.stats.loaded_blocks_compared += report.loaded_blocks_compared
            _merge_longest(self.stats.worker_call_s, report.call_s)
        if problems:
            raise TwinAssertionError("; ".join(problems))
        merged = self.aggregator.aggregate([out for out, _ in results])
        outs = self.scheduler.update_from_output(so, merged)
        self.stats.steps += 1
        for o in outs:
            self.outputs.append(o)
            if o.finish_reason is not None:
                self.finished[o.request_id] = o
                self.stats.finished += 1
        if so.total_num_scheduled_tokens == 0:
            time.sleep(0.005)  # only transfers or lookups in flight: give them a moment
        return outs

    def busy(self) -> bool:
        return bool(self.scheduler.requests)

    def run(self, max_steps: int = 2000) -> None:
        """Steps until every request has finished and been freed; raises past ``max_steps``."""
        for _ in range(max_steps):
            if not self.busy():
                return
            self.step()
        left = sorted(self.scheduler.requests.values(), key=lambda r: r.request_id)
        raise TwinAssertionError(f"requests not finished within {max_steps} steps: {left[:6]}")

    # ------------------------------------------------------------------ end

    def close(self, check_leaks: bool = True) -> list[dict]:
        """Shuts the connectors down (workers first) and checks nothing is held."""
        if self.closed:
            return []
        self.closed = True
        _twin.use(self.spec.version)
        infos = self.pool.call_all("close", self.spec.engine_id, [None] * self.spec.tp)
        for info in infos:
            _merge_longest(self.stats.worker_call_s, info.get("call_s", {}))
        self.scheduler.connector.shutdown()
        if check_leaks:
            sched = self.scheduler
            check(not sched.requests, f"requests still held by the scheduler: {list(sched.requests)}")
            leaked = sched.kv_cache_manager.leaked()
            check(not leaked, f"blocks still referenced at the end: {leaked[:8]}")
            sending, recving = self.aggregator.pending()
            check(not sending and not recving, f"transfers reported by some workers only: {sending} {recving}")
            for info in infos:
                check(info.get("in_flight", 0) == 0, f"worker transfers still in flight at shutdown: {info}")
        return infos
