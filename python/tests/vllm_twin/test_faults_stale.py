"""A sidecar frozen while a SAVE is on its way reads it after the worker gave up: the blocks
may hold another request's KV by then, and must never be stored under the saved chunks'
hashes."""

from __future__ import annotations

import time

import pytest
from vllm import _twin

from kvtier_vllm.client import KvtierClient
from tests.vllm_twin.twin.helpers import offered, prompt, serve, step_until

VERSIONS = pytest.mark.parametrize("version", _twin.VERSIONS, ids=["fixture", "current"])


def _handled(sidecar) -> int:
    c = KvtierClient(sidecar.endpoint, request_timeout_ms=5000)
    try:
        return c.stats()["dataPlane"]["saves"]
    finally:
        c.close()


def _wait_quiet(sidecar, quiet_s: float = 1.0, timeout_s: float = 30.0) -> int:
    """Until the thawed sidecar has worked through what it had queued: no request in flight and
    no SAVE handled for ``quiet_s``. Returns the SAVEs it handled."""
    c = KvtierClient(sidecar.endpoint, request_timeout_ms=5000)
    try:
        deadline = time.monotonic() + timeout_s
        last, since = -1, time.monotonic()
        while True:
            stats = c.stats()
            handled, busy = stats["dataPlane"]["saves"], stats["server"]["inflight"]
            now = time.monotonic()
            if handled != last or busy:
                last, since = handled, now
            elif now - since >= quiet_s:
                return handled
            assert now < deadline, "the sidecar never went quiet"
            time.sleep(0.1)
    finally:
        c.close()


@VERSIONS
def test_save_read_after_the_worker_gave_up_stores_nothing(twin, sidecar, version):
    e = twin(
        sidecar=sidecar,
        version=version,
        num_blocks=30,
        max_num_batched_tokens=16,
        extra={"request_timeout_ms": 1500},
    )
    p = prompt(41, 64)
    e.add_request("r1", p + [1], max_tokens=2)
    # The first two chunks are computed and saved while the sidecar runs; then it freezes.
    step_until(e, lambda: e.scheduler.requests["r1"].num_computed_tokens >= 32)
    sent = sum(s["saves_started"] for s in e.worker_stats())
    deadline = time.monotonic() + 30
    while _handled(sidecar) < sent:
        assert time.monotonic() < deadline, "the running sidecar never handled the first SAVEs"
        time.sleep(0.02)
    sidecar.pause()
    e.run(2000)  # r1 ends; the worker gives up on its saves and vLLM frees the blocks
    e.add_request("r2", prompt(42, 100), max_tokens=2)
    e.run(2000)  # r2's KV now fills blocks r1's stuck SAVEs name
    sidecar.resume()
    _wait_quiet(sidecar)
    # Another engine looks the prompt up: whatever it loads must be r1's KV.
    f = twin(sidecar=sidecar, version=version, model=e.spec.model, reverse_blocks=True)
    serve(f, "r3", p + [2])
    assert offered(f, "r3") == [32], "the chunks saved before the freeze, and none read after it"
