"""What vLLM's scheduler does with the workers' answers and with finished requests (read from
``vllm/v1/core/sched/scheduler.py`` at the fixture revision).

* Invalid blocks: requests loading asynchronously (evict nothing) and running ones are cut back
  to the first invalid block; with ``kv_load_failure_policy = "fail"`` they finish with an error,
  with ``"recompute"`` they compute from there (a failed asynchronous load keeps its valid blocks
  cached, or frees them all and asks the connector again).
* ``finished_recving``: a loading request is promoted next step; a finished one is freed.
* ``finished_sending``: the request must still be known (``assert req_id in self.requests``),
  and is freed.
* Finish and abort: ``request_finished`` decides whether the free is delayed; a request aborted
  while ``WAITING_FOR_REMOTE_KVS`` is kept by the scheduler itself until its load is reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from vllm.distributed.kv_transfer.kv_connector.v1 import SupportsHMA
from vllm.v1.request import Request, RequestStatus

from .checks import check


@dataclass
class EngineCoreOutput:
    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    kv_transfer_params: dict | None = None


class SchedulerUpdates:
    """Mixed into :class:`~.scheduler.Scheduler`."""

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> list[EngineCoreOutput]:
        kv_out = model_runner_output.kv_connector_output
        failed: set[str] = set()
        if kv_out and kv_out.invalid_block_ids:
            failed = self._handle_invalid_blocks(set(kv_out.invalid_block_ids), scheduler_output.num_scheduled_tokens)
        outputs: list[EngineCoreOutput] = []
        stopped: list[Request] = []
        for rid in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(rid)
            if rid in failed:
                continue
            if request is None or request.is_finished():
                continue
            idx = model_runner_output.req_id_to_index[rid]
            new_tokens = list(model_runner_output.sampled_token_ids[idx])
            finished = False
            for t in new_tokens:
                request.append_output_token_ids(t)
                if request.num_output_tokens >= request.max_tokens:
                    request.status = RequestStatus.FINISHED_LENGTH_CAPPED
                    finished = True
                    break
            params = None
            if finished:
                params = self._free_request(request)
                stopped.append(request)
            if new_tokens or finished:
                outputs.append(EngineCoreOutput(rid, new_tokens, request.get_finished_reason() if finished else None, params))
        if stopped:
            self.running = [r for r in self.running if r not in stopped]
        if failed and not self.recompute_kv_load_failures:
            for req in self.finish_requests(failed, RequestStatus.FINISHED_ERROR):
                outputs.append(EngineCoreOutput(req.request_id, [], req.get_finished_reason(), req.kv_transfer_params))
        if kv_out:
            self._update_from_kv_xfer_finished(kv_out)
        # What vLLM's scheduler hands its KV event publisher each step (its own events aside).
        self.kv_events.extend(self.connector.take_events() or ())
        return outputs

    # ------------------------------------------------------------------ invalid blocks

    def _update_requests_with_invalid_blocks(
        self, requests: Iterable[Request], invalid: set[int], num_scheduled: dict[str, int], evict_blocks: bool
    ) -> tuple[set[str], set[int]]:
        affected: set[str] = set()
        to_evict: set[int] = set()
        marked: set[int] = set()
        for request in requests:
            (block_ids,) = self.kv_cache_manager.get_block_ids(request.request_id)
            computed = request.num_computed_tokens - num_scheduled.get(request.request_id, 0)
            n_blocks = -(-computed // self.block_size)
            hit = False
            marked_here = False
            for idx, bid in zip(range(n_blocks), block_ids):
                if bid not in invalid:
                    continue
                hit = True
                if bid in marked:
                    continue
                marked.add(bid)
                if marked_here:
                    continue
                marked_here = True
                request.num_computed_tokens = idx * self.block_size
                if evict_blocks:
                    to_evict.update(block_ids[idx:])
            if hit:
                if not marked_here:
                    request.num_computed_tokens = computed
                affected.add(request.request_id)
        return affected, to_evict

    def _handle_invalid_blocks(self, invalid: set[int], num_scheduled: dict[str, int]) -> set[str]:
        loading = [r for r in self.skipped_waiting if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS]
        async_failed, _ = self._update_requests_with_invalid_blocks(loading, invalid, num_scheduled, False)
        sync_failed, evict = self._update_requests_with_invalid_blocks(self.running, invalid, num_scheduled, True)
        if not async_failed and not sync_failed:
            return set()
        if evict and not self.recompute_kv_load_failures:
            self.kv_cache_manager.evict_blocks(evict)
        if not self.recompute_kv_load_failures:
            return async_failed | sync_failed
        self.failed_recving_kv_req_ids |= async_failed
        return sync_failed

    # ------------------------------------------------------------------ loads finishing

    def _update_waiting_for_remote_kv(self, request: Request) -> None:
        kvm = self.kv_cache_manager
        if request.request_id in self.failed_recving_kv_req_ids:
            if request.num_computed_tokens:
                kvm.cache_blocks(request, request.num_computed_tokens)
            else:
                kvm.free(request)
            self.failed_recving_kv_req_ids.remove(request.request_id)
        else:
            kvm.cache_blocks(request, request.num_computed_tokens)
            if request.num_computed_tokens == request.num_tokens:
                request.num_computed_tokens = request.num_tokens - 1
        self.finished_recving_kv_req_ids.remove(request.request_id)

    def _try_promote(self, request: Request) -> bool:
        if request.request_id not in self.finished_recving_kv_req_ids:
            return False
        self._update_waiting_for_remote_kv(request)
        request.status = RequestStatus.PREEMPTED if request.num_preemptions else RequestStatus.WAITING
        return True

    def _update_from_kv_xfer_finished(self, kv_out: Any) -> None:
        self.connector.update_connector_output(kv_out)
        for rid in kv_out.finished_recving or ():
            check(rid in self.requests, f"assert req_id in self.requests (finished_recving {rid})")
            req = self.requests[rid]
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.finished_recving_kv_req_ids.add(rid)
            else:
                check(RequestStatus.is_finished(req.status), f"assert RequestStatus.is_finished (finished_recving {rid}, {req.status.name})")
                self._free_blocks(req)
        for rid in kv_out.finished_sending or ():
            check(rid in self.requests, f"assert req_id in self.requests (finished_sending {rid})")
            self._free_blocks(self.requests[rid])

    # ------------------------------------------------------------------ finishing

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """Finish or abort from outside the scheduler (the API server's abort)."""
        check(RequestStatus.is_finished(status), "finish_requests needs a finished status")
        valid = []
        for rid in set(request_ids):
            req = self.requests.get(rid)
            if req is None or req.is_finished():
                continue
            valid.append(req)
            if req.status == RequestStatus.RUNNING:
                self.running.remove(req)
            else:
                for q in (self.waiting, self.skipped_waiting):
                    if req in q:
                        q.remove(req)
        for req in valid:
            delay = False
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                delay = req.request_id not in self.finished_recving_kv_req_ids
                self.finished_recving_kv_req_ids.discard(req.request_id)
                self.failed_recving_kv_req_ids.discard(req.request_id)
            req.status = status
            req.kv_transfer_params = self._free_request(req, delay_free_blocks=delay)
        return valid

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> dict | None:
        check(request.is_finished(), "assert request.is_finished()")
        delay, params = self._connector_finished(request)
        check(isinstance(delay, bool), f"request_finished answered delay_free_blocks={delay!r}")
        self.finished_req_ids.add(request.request_id)
        if not (delay or delay_free_blocks):
            self._free_blocks(request)
        return params

    def _connector_finished(self, request: Request) -> tuple[bool, dict | None]:
        block_ids = self.kv_cache_manager.get_block_ids(request.request_id)
        if not isinstance(self.connector, SupportsHMA):
            check(len(self.kv_cache_config.kv_cache_groups) == 1, "a connector without SupportsHMA needs one KV cache group")
            return self.connector.request_finished(request, block_ids[0])
        return self.connector.request_finished_all_groups(request, block_ids)

    def _free_blocks(self, request: Request) -> None:
        check(request.is_finished(), "assert request.is_finished()")
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
