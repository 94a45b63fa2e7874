"""The scheduler's connector paths, as vLLM's ``Scheduler.schedule`` runs them (read from
``vllm/v1/core/sched/scheduler.py`` at the fixture revision, see ``stub/vllm/_twin.py``).

Running requests first: each gets slots for its next tokens, and when the pool is full the last
running request is preempted (blocks freed, computed tokens back to 0, to the front of the
waiting queue) until it fits. Then, when nothing was preempted, waiting requests: a request in
``WAITING_FOR_REMOTE_KVS`` is promoted once its load is reported finished; a request with no
computed tokens asks the local prefix cache and then the connector (``None``: skipped, asked
again next step); slots are allocated for the local and external tokens (blocks of an
asynchronous load are cached only once it finished), ``update_state_after_alloc`` follows, and
an asynchronously loading request waits in ``WAITING_FOR_REMOTE_KVS``. The step ends with
``build_connector_meta``. What happens with the workers' answers is in
:mod:`.scheduler_update`.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.request import Request, RequestStatus

from .block_pool import KVCacheManager
from .checks import check
from .scheduler_update import SchedulerUpdates


class Scheduler(SchedulerUpdates):
    def __init__(self, vllm_config: Any, kv_cache_config: Any, *, reverse_blocks: bool = False) -> None:
        self.vllm_config = vllm_config
        sc = vllm_config.scheduler_config
        self.max_num_running_reqs = sc.max_num_seqs
        self.max_num_scheduled_tokens = sc.max_num_batched_tokens
        self.block_size = vllm_config.cache_config.block_size
        self.kv_cache_config = kv_cache_config
        self.connector = KVConnectorFactory.create_connector(
            config=vllm_config, role=KVConnectorRole.SCHEDULER, kv_cache_config=kv_cache_config
        )
        policy = vllm_config.kv_transfer_config.kv_load_failure_policy
        self.recompute_kv_load_failures = policy == "recompute"
        self.kv_cache_manager = KVCacheManager(
            kv_cache_config.num_blocks,
            self.block_size,
            enable_caching=vllm_config.cache_config.enable_prefix_caching,
            reverse=reverse_blocks,
        )
        self.requests: dict[str, Request] = {}
        #: The connector's KV cache events, in the order vLLM would publish them.
        self.kv_events: list = []
        self.waiting: deque[Request] = deque()
        self.skipped_waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        self.reset_preempted_req_ids: set[str] = set()
        self.finished_recving_kv_req_ids: set[str] = set()
        self.failed_recving_kv_req_ids: set[str] = set()
        self.prev_step_scheduled_req_ids: set[str] = set()
        #: (request id, tokens the connector offered, asynchronous) per admission: what the
        #: scenarios read to see what the connector claimed.
        self.admissions: list[tuple[str, int, bool]] = []
        self.num_preemptions = 0

    def add_request(self, request: Request) -> None:
        check(request.request_id not in self.requests, f"duplicate request id {request.request_id}")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    # ------------------------------------------------------------------ schedule

    def schedule(self) -> SchedulerOutput:
        new_reqs: list[Request] = []
        resumed_reqs: list[Request] = []
        running_reqs: list[Request] = []
        preempted: list[Request] = []
        new_blocks_of: dict[str, Any] = {}
        num_scheduled: dict[str, int] = {}
        budget = self.max_num_scheduled_tokens
        kvm = self.kv_cache_manager

        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            if n <= 0:
                i += 1
                continue
            while True:
                new_blocks = kvm.allocate_slots(request, n)
                if new_blocks is not None:
                    break
                victim = self.running.pop()
                self._preempt_request(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if new_blocks is None:
                break
            running_reqs.append(request)
            new_blocks_of[request.request_id] = new_blocks
            num_scheduled[request.request_id] = n
            budget -= n
            i += 1

        if not preempted:
            step_skipped: deque[Request] = deque()
            while (self.waiting or self.skipped_waiting) and budget > 0:
                if len(self.running) >= self.max_num_running_reqs:
                    break
                queue = self.skipped_waiting or self.waiting
                request = queue[0]
                if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS and not self._try_promote(request):
                    queue.popleft()
                    step_skipped.appendleft(request)
                    continue
                num_external = 0
                load_async = False
                if request.num_computed_tokens == 0:
                    computed_blocks, num_local = kvm.get_computed_blocks(request)
                    ext, load_async = self.connector.get_num_new_matched_tokens(request, num_local)
                    if ext is None:
                        queue.popleft()
                        step_skipped.appendleft(request)
                        continue
                    check(isinstance(ext, int) and ext >= 0, f"get_num_new_matched_tokens answered {ext!r}")
                    num_external = ext
                    num_computed = num_local + num_external
                    check(num_computed <= request.num_tokens, "num_computed_tokens <= request.num_tokens")
                else:
                    computed_blocks, num_local = kvm.empty_kv_cache_blocks, 0
                    num_computed = request.num_computed_tokens
                if load_async:
                    check(num_external > 0, "an asynchronous load of 0 tokens (load_kv_async needs external tokens)")
                    n = 0
                else:
                    n = min(request.num_tokens - num_computed, budget)
                    check(n > 0, f"nothing left to compute for {request.request_id}")
                new_blocks = kvm.allocate_slots(
                    request,
                    n,
                    num_new_computed_tokens=num_local,
                    new_computed_blocks=computed_blocks,
                    num_external_computed_tokens=num_external,
                    delay_cache_blocks=load_async,
                )
                if new_blocks is None:
                    break
                self.connector.update_state_after_alloc(request, kvm.get_blocks(request.request_id), num_external)
                if request.num_computed_tokens == 0:
                    self.admissions.append((request.request_id, num_external, load_async))
                queue.popleft()
                if load_async:
                    request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                    step_skipped.appendleft(request)
                    request.num_computed_tokens = num_computed
                    continue
                self.running.append(request)
                if request.status == RequestStatus.WAITING:
                    new_reqs.append(request)
                elif request.status == RequestStatus.PREEMPTED:
                    resumed_reqs.append(request)
                else:
                    raise RuntimeError(f"Invalid request status: {request.status}")
                new_blocks_of[request.request_id] = kvm.get_blocks(request.request_id)
                num_scheduled[request.request_id] = n
                budget -= n
                request.status = RequestStatus.RUNNING
                request.num_computed_tokens = num_computed
            self.skipped_waiting.extendleft(reversed(step_skipped))

        check(len(self.running) <= self.max_num_running_reqs, "too many running requests")
        out = SchedulerOutput(
            scheduled_new_reqs=[
                NewRequestData.from_request(r, new_blocks_of[r.request_id].get_block_ids()) for r in new_reqs
            ],
            scheduled_cached_reqs=self._cached_request_data(running_reqs, resumed_reqs, new_blocks_of),
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            finished_req_ids=self.finished_req_ids,
            preempted_req_ids=self.reset_preempted_req_ids,
        )
        out.kv_connector_metadata = self.connector.build_connector_meta(out)
        self.prev_step_scheduled_req_ids = set(num_scheduled)
        for rid, n in num_scheduled.items():
            self.requests[rid].num_computed_tokens += n
        self.finished_req_ids = set()
        self.reset_preempted_req_ids = set()
        return out

    def _cached_request_data(self, running: list[Request], resumed: list[Request], blocks: dict) -> CachedRequestData:
        data = CachedRequestData.make_empty()
        for idx, req in enumerate(running + resumed):
            rid = req.request_id
            data.req_ids.append(rid)
            if idx >= len(running):
                data.resumed_req_ids.add(rid)
            if rid not in self.prev_step_scheduled_req_ids:
                data.all_token_ids[rid] = list(req.all_token_ids)
            data.new_block_ids.append(blocks[rid].get_block_ids())
            data.num_computed_tokens.append(req.num_computed_tokens)
            data.num_output_tokens.append(req.num_output_tokens)
        return data

    def _preempt_request(self, request: Request) -> None:
        check(request.status == RequestStatus.RUNNING, "Only running requests can be preempted")
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        self.reset_preempted_req_ids.add(request.request_id)

    def preempt(self, request_id: str) -> bool:
        """Preempts one running request between steps, as a full pool or a priority request
        would. False when it is not running."""
        req = self.requests.get(request_id)
        if req is None or req.status != RequestStatus.RUNNING:
            return False
        self.running.remove(req)
        self._preempt_request(req)
        return True
