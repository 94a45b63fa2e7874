"""What a frozen sidecar costs the engine step at the two other vLLM revisions the twin models:
the sidecar is frozen (SIGSTOP) at each connector call site in turn and held so for ``HOLD_S``
seconds while a workload loads a prefix, saves, has a request preempted while its saves are in
flight, delays frees and shuts down, with kvtier's default settings. Every connector call the
scheduler and the workers make is timed: none may wait for the sidecar (the measured worst
waits under vLLM's own code are ``npm run bench:stall``'s). The twin checks every computed
token's KV and ends with nothing held and no pin on the sidecar."""

from __future__ import annotations

import sys
import time

import pytest

from vllm import _twin

from tests.engine_kit.faults import CALL_SITES, SidecarFault
from tests.vllm_twin.twin.helpers import prompt, serve

HOLD_S = 2.0

CASES = [(v, s) for v in _twin.VERSIONS for s in CALL_SITES]


def _method(version: str, site: tuple[str, str]) -> str:
    if site[1] != "get_finished":
        return site[1]
    _twin.use(version)
    return "get_transfer_results" if _twin.is_current() else "get_finished"


@pytest.mark.parametrize(
    "version,site", CASES, ids=[f"{'current' if v != _twin.FIXTURE else 'fixture'}-{m}" for v, (_, m) in CASES]
)
def test_no_connector_call_waits_for_a_frozen_sidecar(twin, sidecar, capsys, version, site):
    method = _method(version, site)
    a = twin(sidecar=sidecar, version=version, default_settings=True)
    seed = prompt(71, 60)
    serve(a, "seed", seed)
    a.close()
    fault = SidecarFault(sidecar, "frozen", HOLD_S)
    b = twin(
        sidecar=sidecar,
        version=version,
        model=a.spec.model,
        enable_prefix_caching=False,
        max_num_batched_tokens=32,
        fault_at=(site[0], method, fault.action()),
        default_settings=True,
    )
    b.add_request("x", seed + [1], max_tokens=4)  # loads the seed's three chunks
    b.add_request("low", prompt(73, 96), max_tokens=20)  # prefills in 32-token steps, saving
    preempted = False
    deadline = time.monotonic() + 120
    try:
        while b.busy() or (fault.fired_at is not None and not fault.ended and method != "shutdown"):
            assert time.monotonic() < deadline, "the run did not end in 2 minutes"
            fault.poll()
            b.step()
            low = b.scheduler.requests.get("low")
            if not preempted and low is not None and low.num_computed_tokens >= 48:
                # a step after its first chunks' saves were sent: they may still be in flight
                preempted = b.scheduler.preempt("low")
        fault.poll()
        b.close()
        fault.poll()
        fired = fault.fired_at is not None
    finally:
        fault.end()
    assert fired, f"the fault never started at {method}"
    assert preempted, "the request with saves in flight was preempted"
    calls = {f"scheduler {m}": s for m, s in b.stats.scheduler_call_s.items()}
    calls.update({f"worker {m}": s for m, s in b.stats.worker_call_s.items()})
    worst = max(calls.items(), key=lambda kv: kv[1])
    with capsys.disabled():
        print(f"\ntwin stall ({version[:8]}): frozen at {method}: worst call {worst[0]} {worst[1] * 1000:.1f} ms", file=sys.stderr)
    slow = {m: round(s, 3) for m, s in calls.items() if s >= HOLD_S / 2}
    assert not slow, f"calls that waited for the frozen sidecar (seconds): {slow}"
