"""What a sidecar fault costs vLLM's engine step: one run of a workload that exercises every
connector call (a load, saves, vLLM's own preemption of a request whose saves are in flight,
delayed frees, shutdown), with the sidecar faulted from a call site on; every connector call's
longest duration measured, on the scheduler and on the workers. Used by test_stall.py (each
call returns long before the fault ends) and by ``npm run bench:stall`` (the worst wait per call
under each fault, beside a healthy run)."""

from __future__ import annotations

import time
from typing import Any, Callable

from tests.engine_kit.faults import CALL_SITES, SidecarFault
from .helpers import prompt, serve

#: Where a fault starts: (role, method).
SITES = CALL_SITES


def stall_run(
    make_engine: Callable[..., Any],
    sidecar: Any,
    site: tuple[str, str] | None,
    kind: str | None,
    hold_s: float,
    stall_file: str | None = None,
    async_scheduling: bool = False,
) -> dict:
    """One run; ``site``/``kind`` None: healthy. Returns ``{"calls": {"<role> <method>":
    seconds}, "fired": bool, "steps": n, "loaded_blocks": n, "preempted": n}`` (preemptions of
    the low-priority request)."""
    a = make_engine(sidecar=sidecar, async_scheduling=async_scheduling, default_timeouts=True)
    seed = prompt(71, 100)
    serve(a, "seed", seed)
    a.close()
    if stall_file is not None:
        # Host memory gone: the load finds the prefix in the lower (stalling) tier only.
        sidecar.restart()
    fault = None if kind is None else SidecarFault(sidecar, kind, hold_s, stall_file)
    # Tight blocks, admission on the first chunk and the priority policy: the low-priority
    # request is preempted while it prefills (its chunks' saves in flight), the others run on.
    b = make_engine(
        sidecar=sidecar,
        async_scheduling=async_scheduling,
        model_id=a.spec.model_id,
        policy="priority",
        num_blocks=17,
        reserve_full_isl=False,
        enable_prefix_caching=False,
        max_num_batched_tokens=48,
        fault_at=None if fault is None else (site[0], site[1], fault.action()),
        default_timeouts=True,
    )
    b.add_request("x", seed + [1], max_tokens=4, priority=0)
    b.add_request("high", prompt(72, 96), max_tokens=120, priority=0)
    b.add_request("low", prompt(73, 192), max_tokens=24, priority=1)
    steps = preempted = 0
    deadline = time.monotonic() + 300
    while b.busy() or (fault is not None and fault.fired_at is not None and not fault.ended and site[1] != "shutdown"):
        assert time.monotonic() < deadline, "the run did not end in 5 minutes"
        if fault is not None:
            fault.poll()
        b.step()
        steps += 1
        low = b.scheduler.requests.get("low")
        preempted = max(preempted, 0 if low is None else low.num_preemptions)
    if fault is not None:
        fault.poll()
    b.close()
    if fault is not None:
        fault.poll()
        fired = fault.fired_at is not None
        fault.end()
    else:
        fired = False
    calls = {f"scheduler {m}": s for m, s in b.stats.scheduler_call_s.items()}
    calls.update({f"worker {m}": s for m, s in b.stats.worker_call_s.items()})
    return {
        "calls": calls,
        "fired": fired,
        "steps": steps,
        "loaded_blocks": b.stats.loaded_blocks_compared,
        "preempted": preempted,
    }
