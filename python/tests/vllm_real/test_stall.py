"""What a misbehaving sidecar can cost vLLM's engine step: the sidecar is frozen (SIGSTOP) at each
connector call site in turn (and killed, and overloaded, at some), and held so for
``HOLD_S`` seconds while a workload runs that loads, saves, has vLLM preempt a request whose
saves are in flight, delays frees and shuts down. Every connector call vLLM's scheduler and
workers make is timed: none may wait for the sidecar, so every one returns long before the
fault ends (the measured worst waits, against the 50 ms goal, are ``npm run bench:stall``'s).
vLLM's own assertions run throughout, every computed token's KV is compared, and the engine ends
with its scheduler empty and no pin left on the sidecar."""

from __future__ import annotations

import sys

import pytest

from tests.vllm_real.harness.stall import SITES, stall_run

HOLD_S = 2.0

CASES = [("frozen", site) for site in SITES] + [
    ("killed", ("worker", "wait_for_save")),
    ("killed", ("scheduler", "get_num_new_matched_tokens")),
    ("overloaded", ("worker", "start_load_kv")),
]


@pytest.mark.parametrize("kind,site", CASES, ids=[f"{k}-at-{m}" for k, (_, m) in CASES])
def test_no_connector_call_waits_for_the_sidecar(engine, sidecar, capsys, kind, site):
    out = stall_run(engine, sidecar, site, kind, HOLD_S)
    assert out["fired"], f"the fault never started at {site[1]}"
    assert out["preempted"] >= 1, "vLLM preempted the low-priority request"
    worst = max(out["calls"].items(), key=lambda kv: kv[1])
    with capsys.disabled():
        print(f"\nvllm stall: {kind} at {site[1]}: worst call {worst[0]} {worst[1] * 1000:.1f} ms over {out['steps']} steps", file=sys.stderr)
    slow = {m: round(s, 3) for m, s in out["calls"].items() if s >= HOLD_S / 2}
    assert not slow, f"calls that waited for the {kind} sidecar (seconds): {slow}"


@pytest.fixture
def stalling_sidecar(tmp_path):
    """A sidecar whose tier under host memory stalls while ``stall_file`` exists."""
    from pathlib import Path

    from tests.conftest import Sidecar

    plugin = Path(__file__).resolve().parent / "plugins" / "stalling-store.mjs"
    stall_file = tmp_path / "stall"
    s = Sidecar(
        config={
            "tiers": [
                {"name": "cpu", "type": "local-cpu", "capacityBytes": 64 * 1024 * 1024},
                {
                    "name": "disk",
                    "type": "module",
                    "module": str(plugin),
                    "options": {"path": str(tmp_path / "chunks"), "stallFile": str(stall_file)},
                },
            ]
        }
    )
    s.stall_file = str(stall_file)
    try:
        yield s
    finally:
        s.close()


def test_no_connector_call_waits_for_a_stalled_lower_tier(engine, stalling_sidecar, capsys):
    """The prefix is only in the lower tier, which stalls from the first lookup on: the lookup
    cannot be answered in time, the request computes, and nothing in vLLM's step waits."""
    out = stall_run(engine, stalling_sidecar, ("scheduler", "get_num_new_matched_tokens"), "disk-stalled", HOLD_S, stalling_sidecar.stall_file)
    assert out["fired"]
    worst = max(out["calls"].items(), key=lambda kv: kv[1])
    with capsys.disabled():
        print(f"\nvllm stall: disk-stalled at get_num_new_matched_tokens: worst call {worst[0]} {worst[1] * 1000:.1f} ms", file=sys.stderr)
    slow = {m: round(s, 3) for m, s in out["calls"].items() if s >= HOLD_S / 2}
    assert not slow, f"calls that waited for the stalled tier (seconds): {slow}"
