"""Faults under vLLM's own scheduler: chunks gone between the lookup and the load under both
``kv_load_failure_policy`` values (vLLM's load-failure recovery), a worker whose REGISTER
fails, a sidecar killed (SIGKILL) and one frozen (SIGSTOP) while engines run."""

from __future__ import annotations

import pytest

from tests.vllm_real.harness.helpers import offered, prompt, run_clearing_before_the_load, serve

SCHEDULING = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


@SCHEDULING
@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_chunks_gone_between_lookup_and_load(engine, real_sidecar, async_scheduling, policy):
    """A CLEAR lands after the answer and before the LOAD: the load reports invalid blocks,
    never wrong bytes; vLLM then recomputes the request (``recompute``) or finishes it with an
    error (``fail``)."""
    a = engine(async_scheduling=async_scheduling)
    p = prompt(21, 100)
    serve(a, "w", p)
    b = engine(async_scheduling=async_scheduling, model_id=a.spec.model_id, kv_load_failure_policy=policy)
    b.add_request("x", p + [1], max_tokens=2)
    run_clearing_before_the_load(b, real_sidecar.endpoint)
    assert offered(b, "x")[0] == 96
    assert b.finished["x"] == ("error" if policy == "fail" else "length")
    assert b.stats.loaded_blocks_compared == 0, "nothing the failed load wrote was read as loaded"


@SCHEDULING
def test_worker_whose_register_failed_does_not_livelock(engine, async_scheduling):
    """Rank 1 cannot register (the sidecar cannot open its KV cache): every load it is given
    fails; the scheduler stops offering what failed, and vLLM serves on."""
    a = engine(async_scheduling=async_scheduling)
    p = prompt(22, 100)
    serve(a, "w", p)
    b = engine(async_scheduling=async_scheduling, model_id=a.spec.model_id, unopenable_ranks=(1,))
    serve(b, "x", p + [1], max_steps=300)
    assert offered(b, "x") == [96, 0], "offered once; after the failed load it computes"
    for rid in ("y", "z"):
        serve(b, rid, p + [2, len(rid)], max_steps=300)
        assert offered(b, rid) in ([0], [96, 0]), "never offered the failed chunks twice"


@SCHEDULING
def test_sidecar_killed_and_restarted_while_engines_run(engine, sidecar, async_scheduling):
    """SIGKILL: lookups and loads in flight fail (requests recompute), nothing hangs; once a new
    sidecar answers on the same endpoint the workers register again and hits resume."""
    a = engine(sidecar=sidecar, async_scheduling=async_scheduling)
    p = prompt(23, 100)
    serve(a, "w", p)
    a.add_request("during", prompt(24, 100), max_tokens=20)
    for _ in range(3):
        a.step()
    sidecar.restart()  # host memory is gone with the old process
    a.run(1000)
    b = engine(sidecar=sidecar, async_scheduling=async_scheduling, model_id=a.spec.model_id)
    serve(b, "again", p + [1])
    assert offered(b, "again") == [0], "the killed sidecar's chunks are gone"
    c = engine(sidecar=sidecar, async_scheduling=async_scheduling, model_id=a.spec.model_id)
    serve(c, "after", p + [2])
    assert offered(c, "after") == [96], "saved again after the restart, and found"


@SCHEDULING
def test_frozen_sidecar_then_thawed(engine, sidecar, async_scheduling):
    """SIGSTOP while requests save and look up: vLLM keeps serving (lookups time out to 0,
    requests compute), and a thawed sidecar serves hits again; nothing read while frozen is
    stored under the wrong hashes (every later load is compared bit for bit)."""
    e = engine(sidecar=sidecar, async_scheduling=async_scheduling, extra={"request_timeout_ms": 1500, "lookup_timeout_ms": 500})
    p = prompt(25, 100)
    e.add_request("r1", p, max_tokens=8)
    for _ in range(2):
        e.step()
    sidecar.pause()
    try:
        e.add_request("r2", prompt(26, 120), max_tokens=4)
        e.run(3000)
    finally:
        sidecar.resume()
    f = engine(sidecar=sidecar, async_scheduling=async_scheduling, model_id=e.spec.model_id)
    serve(f, "r3", p + [1])
    serve(f, "r4", prompt(26, 120) + [1])
    assert f.stats.forbidden_computes == 0
