"""Never slower than recomputing" under vLLM's own scheduler (docs/vllm.md): the default learns
the engine's prefill rate from vLLM's steps and every lookup then carries it; a configured rate
bounds how long a request's lookup may hold it back; a rate no tier loses to loads from the disk
tier as before. KV loaded is compared bit for bit (the ``engine`` fixture)."""

from __future__ import annotations

import time

import pytest

from kvtier_vllm.client import KvtierClient
from tests.vllm_real.harness.helpers import offered, prompt, serve


def _scheduler(engine):
    return engine.scheduler.connector._scheduler


def test_the_default_learns_the_rate_from_vllms_steps_and_lookups_carry_it(engine):
    e = engine(default_timeouts=True)  # kvtier's defaults: prefill_tokens_per_s "auto"
    sched = _scheduler(e)
    assert sched.prefill_tokens_per_s is None, "nothing learned before a step ran"
    for i in range(4):  # prefill steps of 100 tokens (3 chunks of 32 or more each)
        serve(e, f"warm{i}", prompt(60 + i, 100), max_tokens=3)
    rate = sched.prefill_tokens_per_s
    assert rate is not None and rate > 0, "learned from vLLM's own prefill steps"
    bounded = sched.rule_stats()["lookups_bounded"]
    serve(e, "asks", prompt(70, 100), max_tokens=1)
    assert sched.rule_stats()["lookups_bounded"] == bounded + 1, "the lookup named the learned rate"


def test_a_frozen_sidecar_holds_a_request_back_no_longer_than_computing_it_would_take(engine, real_sidecar):
    """lookup_timeout_ms is a minute; at 2,000 tokens/s the 96 claimable tokens compute in
    48 ms, so the lookup of a frozen sidecar gives up after 48 ms and vLLM computes them."""
    e = engine(extra={"prefill_tokens_per_s": 2000, "lookup_timeout_ms": 60_000})
    real_sidecar.pause()
    try:
        started = time.monotonic()
        serve(e, "frozen", prompt(80, 100), max_tokens=1)
        took = time.monotonic() - started
    finally:
        real_sidecar.resume()
    assert offered(e, "frozen") == [0], "computed, nothing claimed from a sidecar that did not answer"
    assert took < 30, f"held for {took:.1f} s: the lookup waited out lookup_timeout_ms, not the rate's bound"
    assert _scheduler(e).rule_stats()["lookups_bounded"] == 1


@pytest.mark.sidecar_options(disk=True)
def test_a_tier_any_engine_loses_to_is_loaded_from_disk(engine, sidecar):
    """At one token a second no tier is slower than computing: a prefix only on the disk tier
    (host memory emptied by a restart) is claimed and loaded."""
    a = engine(sidecar=sidecar)
    p = prompt(90, 100)
    serve(a, "a", p)
    on_disk = 3 * a.spec.tp  # three chunks per rank (each rank has its own namespace)
    _wait_disk_chunks(sidecar, on_disk, "the saved chunks never reached the disk tier")
    sidecar.restart()
    _wait_disk_chunks(sidecar, on_disk, "the restarted disk tier did not come back with its chunks")
    b = engine(sidecar=sidecar, model_id=a.spec.model_id, extra={"prefill_tokens_per_s": 1})
    serve(b, "b", p + [3], max_tokens=1)
    assert offered(b, "b") == [96]
    assert b.stats.loaded_blocks_compared == 2 * 6, "both ranks' six loaded blocks were read by attention"


def _wait_disk_chunks(sidecar, n: int, why: str) -> None:
    admin = KvtierClient(sidecar.endpoint, request_timeout_ms=5000)
    try:
        deadline = time.monotonic() + 30
        while admin.stats()["tiers"][1]["chunks"] < n:
            assert time.monotonic() < deadline, why
            time.sleep(0.05)
    finally:
        admin.close()
