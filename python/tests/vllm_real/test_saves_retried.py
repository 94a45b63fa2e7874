"""Saves that did not happen are made again the next time the engine has the blocks, under
vLLM's own code: a running request whose saves a frozen sidecar never answered (cancelled after
``save_timeout_ms``) saves those chunks again once the sidecar is back, and a request preempted
with its saves in flight (cancelled by ``handle_preemptions``) saves them again when it computes
them again. Another engine then loads the whole prefix."""

from __future__ import annotations

import time

from kvtier_vllm.client import KvtierClient
from tests.engine_kit.faults import SidecarFault
from tests.vllm_real.harness.helpers import offered, prompt, serve, step_until


def _stored_chunks(sidecar) -> int:
    c = KvtierClient(sidecar.endpoint, request_timeout_ms=5000)
    try:
        return sum(int(t.get("chunks", 0)) for t in c.stats()["tiers"])
    finally:
        c.close()


def test_saves_a_frozen_sidecar_never_answered_are_made_again(engine, sidecar):
    fault = SidecarFault(sidecar, "frozen", hold_s=2.5)
    e = engine(sidecar=sidecar, default_timeouts=True, num_blocks=256, fault_at=("worker", "wait_for_save", fault.action()))
    p = prompt(61, 100)
    e.add_request("r", p, max_tokens=3000)  # decodes long after the sidecar is back
    fault.wait_fired(e.step)
    step_until(e, lambda: (fault.poll() or fault.ended), max_steps=100_000)
    stats = e.worker_stats()
    assert all(s["saves_cancelled"] >= 1 for s in stats), f"the frozen sidecar's saves were cancelled: {stats}"
    # The sidecar is back: the scheduler saves the chunks again from r's blocks while r runs.
    step_until(e, lambda: _stored_chunks(sidecar) >= 2 * 3, max_steps=100_000)
    assert "r" in e.scheduler.requests, "saved again while the request still ran"
    e.abort(["r"])
    f = engine(sidecar=sidecar, model_id=e.spec.model_id)
    serve(f, "s", p + [1])
    assert offered(f, "s") == [96]


def test_a_preempted_request_saves_again_what_its_preemption_cancelled(engine, sidecar):
    """Frozen from a SAVE of the low-priority request on, vLLM preempts it with saves in flight
    (cancelled); thawed, it runs again, saves its chunks again, and another engine loads them."""
    fault = SidecarFault(sidecar, "frozen", hold_s=1.0)
    e = engine(
        sidecar=sidecar,
        default_timeouts=True,
        policy="priority",
        num_blocks=17,
        reserve_full_isl=False,
        enable_prefix_caching=False,
        max_num_batched_tokens=48,
        fault_at=("worker", "wait_for_save", fault.action()),
    )
    low = prompt(62, 192)
    e.add_request("low", low, max_tokens=8, priority=1)
    e.add_request("high", prompt(63, 96), max_tokens=80, priority=0)
    preempted = 0
    deadline = time.monotonic() + 300
    while e.busy():
        assert time.monotonic() < deadline
        fault.poll()
        e.step()
        r = e.scheduler.requests.get("low")
        preempted = max(preempted, 0 if r is None else r.num_preemptions)
    fault.end()
    assert fault.fired_at is not None and preempted >= 1
    f = engine(sidecar=sidecar, model_id=e.spec.model_id)
    serve(f, "s", low + [1])
    assert offered(f, "s") == [192], "all six chunks of the preempted request were saved in the end"
