"""One vLLM engine over kvtier: vLLM's own ``Scheduler`` or ``AsyncScheduler`` in this process,
two worker processes (:mod:`.workers`, :mod:`.model_runner`), vLLM's ``KVOutputAggregator``
between them, stepped like vLLM's ``EngineCore``: ``step`` (schedule, execute, update from the
output) or, with asynchronous scheduling, ``step_with_batch_queue`` (the next step is scheduled
while the workers run the current one; a queue of two).

Requests are vLLM ``Request`` objects with vLLM's block hasher (``sha256``, the default
``prefix_caching_hash_algo``). Every step raises on a wrong KV byte in any scheduled request's
computed tokens (the workers compare what attention reads) and on any assertion of vLLM's own
code. :meth:`RealEngine.close` flushes the last finished requests to the workers, shuts the
connectors down as vLLM does, and checks with vLLM's own ``assert_scheduler_empty`` (from its
test utilities) that no request and no block is held.
"""

from __future__ import annotations

import importlib.util
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from tests.engine_kit.faults import arm
from .model import EngineSpec
from .workers import WorkerPair


class EngineAssertionError(AssertionError):
    """A broken invariant of the run: wrong KV bytes, a leak, a request that never finishes."""


def _vllm_test_utils() -> Any:
    """vLLM's ``tests/v1/kv_connector/unit/utils.py`` (its ``assert_scheduler_empty``), loaded by
    path: this repository's own ``tests`` package would shadow vLLM's."""
    import vllm

    path = Path(vllm.__file__).resolve().parents[1] / "tests" / "v1" / "kv_connector" / "unit" / "utils.py"
    spec = importlib.util.spec_from_file_location("vllm_kv_connector_test_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_UTILS: Any = None


def assert_scheduler_empty(scheduler: Any) -> None:
    global _UTILS
    if _UTILS is None:
        _UTILS = _vllm_test_utils()
    _UTILS.assert_scheduler_empty(scheduler)


@dataclass
class EngineStats:
    steps: int = 0
    loaded_blocks_compared: int = 0
    #: Tokens computed that the model could not compute (see ``provide``): a load that failed.
    forbidden_computes: int = 0
    aborts: int = 0
    finished: int = 0
    #: Scheduler-side connector method -> the longest call, seconds.
    scheduler_call_s: dict = field(default_factory=dict)
    #: Worker-side connector method -> the longest call on any rank, seconds.
    worker_call_s: dict = field(default_factory=dict)


#: The connector methods vLLM's scheduler calls (their durations are recorded).
SCHEDULER_CALLS = (
    "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
    "update_connector_output", "request_finished", "request_finished_all_groups", "take_events",
    "reset_cache", "shutdown",
)


def _longest(into: dict, name: str, dt: float) -> None:
    if dt > into.get(name, 0.0):
        into[name] = dt


class RealEngine:
    def __init__(self, spec: EngineSpec, pair: WorkerPair) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.attention.backends.utils import set_kv_cache_layout
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager

        if pair.busy:
            raise EngineAssertionError("a worker pair serves one engine at a time")
        self.spec = spec
        self.pair = pair
        self.config = spec.vllm_config()
        self.kv_cache_config = spec.kv_cache_config(self.config)
        self.stats = EngineStats()
        #: (request id, tokens kvtier's connector offered and vLLM allocated for).
        self.admissions: list[tuple[str, int]] = []
        #: Request id -> its block table at its last admission.
        self.tables: dict[str, list[int]] = {}
        self.outputs: list[Any] = []
        self.finished: dict[str, Any] = {}
        self.closed = False
        hash_fn = get_hash_fn_by_name(self.config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self._block_hasher = get_request_block_hasher(spec.block_size, hash_fn)
        cls = AsyncScheduler if spec.async_scheduling else Scheduler
        # Each engine is a fresh vLLM process: nothing an earlier engine cached (the layout).
        set_kv_cache_layout(None)
        with set_current_vllm_config(self.config):
            self.scheduler = cls(
                vllm_config=self.config,
                kv_cache_config=self.kv_cache_config,
                structured_output_manager=StructuredOutputManager(self.config),
                block_size=spec.block_size,
                log_stats=True,
            )
        self._instrument(self.scheduler.connector)
        if spec.fault_at is not None and spec.fault_at[0] == "scheduler":
            arm(self.scheduler.connector, spec.fault_at[1], spec.fault_at[2])
        worker_spec = {
            "vllm_config": self.config,
            "kv_cache_config": self.kv_cache_config,
            "backend": spec.backend,
            "dtype": spec.dtype,
            "unopenable_ranks": tuple(spec.unopenable_ranks),
            "env": dict(spec.env),
            "fault_at": spec.fault_at,
            "in_process_kv": spec.in_process_kv,
        }
        try:
            self.worker_info = pair.call_all("init", worker_spec)
        except BaseException:
            self.scheduler.shutdown()
            raise
        pair.busy = True
        self.aggregator = KVOutputAggregator.from_connector(self.scheduler.connector, spec.tp)
        self._queue: deque = deque()
        #: Tokens the last step taken in computed.
        self.last_scheduled_tokens = 0

    def _instrument(self, connector: Any) -> None:
        calls = self.stats.scheduler_call_s
        asked: set[str] = set()
        for name in SCHEDULER_CALLS:
            fn = getattr(connector, name)

            def wrapper(*args: Any, __fn=fn, __name=name, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    out = __fn(*args, **kwargs)
                finally:
                    _longest(calls, __name, time.perf_counter() - t0)
                rid = str(getattr(args[0], "request_id", "")) if args else ""
                if __name == "get_num_new_matched_tokens":
                    asked.add(rid)
                elif __name == "update_state_after_alloc" and rid in asked:
                    # An admission: vLLM allocated after asking. (A request whose load finished
                    # is allocated again with 0 external tokens, without asking.)
                    asked.discard(rid)
                    self.admissions.append((rid, int(args[2])))
                    self.tables[rid] = list(args[1].get_block_ids()[0])
                return out

            setattr(connector, name, wrapper)

    # ------------------------------------------------------------------ requests

    def add_request(
        self, request_id: str, prompt: list[int], max_tokens: int = 4, cache_salt: str | None = None, priority: int = 0
    ) -> Any:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        req = Request(
            request_id=request_id,
            prompt_token_ids=list(prompt),
            sampling_params=params,
            pooling_params=None,
            cache_salt=cache_salt,
            priority=priority,
            block_hasher=self._block_hasher,
        )
        self.scheduler.add_request(req)
        return req

    def abort(self, request_ids: Iterable[str]) -> None:
        from vllm.v1.request import RequestStatus

        ids = [r for r in request_ids if r in self.scheduler.requests]
        self.scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)
        self.stats.aborts += len(ids)
        for rid in ids:
            self.finished.setdefault(rid, "abort")

    def provide(self, request_id: str, per_rank_values: list, compute_from: int = 0) -> None:
        """Hands each worker the KV its forward pass writes for this request (and the first
        position it can compute, see ``StandInModelRunner.provide``)."""
        self._settle()
        for rank, values in enumerate(per_rank_values):
            self.pair.call(rank, "provide", (request_id, values, compute_from))

    def worker_stats(self) -> list[dict]:
        self._settle()
        return self.pair.call_all("stats", None)

    def gather(self, request_id: str, num_tokens: int) -> list:
        """Each rank's KV of the request's first ``num_tokens`` tokens, read from its blocks."""
        self._settle()
        table = self.scheduler.kv_cache_manager.get_block_ids(request_id)[0]
        return self.pair.call_all("gather", (table, num_tokens))

    def _settle(self) -> None:
        """Takes in the outputs of every step still queued (asynchronous scheduling), so that a
        call to the workers gets its own answer."""
        while self._queue:
            so = self._queue.pop()
            self._take(so, self.pair.collect())

    # ------------------------------------------------------------------ stepping

    def _take(self, so: Any, results: list) -> list:
        problems = []
        for _, report in results:
            problems += report.mismatches
            self.stats.loaded_blocks_compared += report.loaded_blocks_compared
            self.stats.forbidden_computes += report.forbidden_computes
            for name, dt in report.call_s.items():
                _longest(self.stats.worker_call_s, name, dt)
        if problems:
            raise EngineAssertionError("; ".join(problems))
        merged = self.aggregator.aggregate([out for out, _ in results])
        outs = self.scheduler.update_from_output(so, merged)
        self.last_scheduled_tokens = so.total_num_scheduled_tokens
        self.stats.steps += 1
        done = []
        for eco in outs.values():
            for o in eco.outputs:
                self.outputs.append(o)
                if o.finish_reason is not None:
                    self.finished[o.request_id] = str(o.finish_reason)
                    self.stats.finished += 1
                    done.append(o)
        return done

    def step(self, before_execute: Callable[[Any], None] | None = None) -> list:
        """One engine step (``EngineCore.step``, or ``step_with_batch_queue`` with asynchronous
        scheduling); ``before_execute(scheduler_output)`` runs between scheduling and the workers
        (a fault a scenario injects there)."""
        if self.spec.async_scheduling:
            return self._step_async(before_execute)
        so = self.scheduler.schedule()
        if before_execute is not None:
            before_execute(so)
        done = self._take(so, self.pair.call_all("step", so))
        if so.total_num_scheduled_tokens == 0:
            time.sleep(0.002)  # only transfers or lookups in flight: give them a moment
        return done

    def _step_async(self, before_execute: Callable[[Any], None] | None) -> list:
        executed = False
        if self.scheduler.requests or self.scheduler.has_requests():
            so = self.scheduler.schedule()
            if before_execute is not None:
                before_execute(so)
            self.pair.send_all("step", so)
            self._queue.appendleft(so)
            executed = so.total_num_scheduled_tokens > 0
            if executed and len(self._queue) < 2 and not self.pair.ready():
                return []
        elif not self._queue:
            time.sleep(0.002)  # an idle engine: vLLM's would wait for requests
            return []
        so = self._queue.pop()
        done = self._take(so, self.pair.collect())
        if not executed:
            time.sleep(0.002)
        return done

    def busy(self) -> bool:
        """True while any request is held: unfinished, finished but not yet sent to the workers,
        or finished with its free delayed (vLLM's engine steps then only when other requests
        arrive; here it steps until the workers report the transfers over)."""
        return bool(self.scheduler.requests) or self.scheduler.has_requests() or bool(self._queue)

    def run(self, max_steps: int = 2000, idle_s: float = 120.0) -> None:
        """Steps until every request has finished and been freed. Raises past ``max_steps``
        steps that computed tokens, or after ``idle_s`` seconds in a row of steps that computed
        none (requests waiting only for lookups or transfers: bounded by time, not by a step
        count a busy machine would exhaust)."""
        steps, idle_since = 0, None
        while self.busy():
            self.step()
            if self.last_scheduled_tokens:
                steps, idle_since = steps + 1, None
                if steps > max_steps:
                    raise EngineAssertionError(f"requests not finished within {max_steps} steps: {sorted(self.scheduler.requests)[:6]}")
            else:
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > idle_s:
                    raise EngineAssertionError(
                        f"requests waiting {idle_s} s without a step: {self._describe_held()}"
                    )

    def _describe_held(self) -> str:
        return ", ".join(f"{rid} {r.status.name}" for rid, r in sorted(self.scheduler.requests.items())[:6])

    # ------------------------------------------------------------------ end

    def close(self, check_leaks: bool = True) -> list[dict]:
        """Flushes, shuts the connectors down (workers first) and checks nothing is held."""
        if self.closed:
            return []
        self.closed = True
        try:
            self._settle()
            if check_leaks:
                self.run()
                # The last finished requests reach the workers with the next schedule.
                so = self.scheduler.schedule()
                self._take(so, self.pair.call_all("step", so))
        finally:
            # After a failure, steps may still be queued: their answers are read and dropped.
            while self._queue:
                self._queue.pop()
                self.pair.collect_raw()
            infos = self.pair.call_all("close", None)
            self.pair.busy = False
            for info in infos:
                for name, dt in info.get("call_s", {}).items():
                    _longest(self.stats.worker_call_s, name, dt)
            self.scheduler.shutdown()
        if check_leaks:
            assert_scheduler_empty(self.scheduler)
            for info in infos:
                assert info.get("in_flight", 0) == 0, f"worker transfers still in flight at shutdown: {info}"
        return infos
