"""The request lifecycle under vLLM's own scheduler, synchronous and asynchronous scheduling:
saves and loads across engines whose blocks differ, partial-chunk prefixes, delayed frees,
aborts while loading and while a lookup is pending, vLLM's own preemption and the request's
second lookup. Every step compares the KV attention reads, bit for bit; every engine ends with
vLLM's scheduler empty and the sidecar holding no pins (the ``engine`` fixture)."""

from __future__ import annotations

import pytest

from tests.vllm_real.harness.helpers import loading, offered, prompt, serve, step_until

SCHEDULING = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


def _filler(engine, n: int = 64) -> None:
    """A request that takes and frees blocks first: the engine's next requests get others."""
    serve(engine, "filler", prompt(999, n), max_tokens=1)


@SCHEDULING
def test_saved_prompt_loads_into_another_engine_in_other_blocks(engine, async_scheduling):
    a = engine(async_scheduling=async_scheduling)
    p = prompt(1, 100)
    serve(a, "a", p)
    b = engine(async_scheduling=async_scheduling, model_id=a.spec.model_id)
    _filler(b)
    serve(b, "b", p + [7])
    assert offered(b, "b") == [96], "three whole chunks, never the last prompt token"
    assert b.tables["b"][:6] != a.tables["a"][:6], "the load wrote other blocks than the save read"
    assert b.stats.loaded_blocks_compared == 2 * 6, "both ranks' six loaded blocks were read by attention"


@SCHEDULING
def test_prefix_cache_ending_inside_a_stored_chunk(engine, async_scheduling):
    """vLLM's own prefix cache holds the first 48 tokens (a block boundary inside chunk 1): kvtier
    loads the rest of that chunk and the next one, skipping the blocks vLLM holds."""
    a = engine(async_scheduling=async_scheduling)
    p = prompt(2, 100)
    serve(a, "a", p)
    b = engine(async_scheduling=async_scheduling, model_id=a.spec.model_id)
    serve(b, "b0", p[:48] + [5], max_tokens=1)  # caches 3 blocks (48 tokens) in b
    serve(b, "b", p + [6])
    assert offered(b, "b0") == [32]
    assert offered(b, "b") == [96 - 48]
    # Per rank: b0's two loaded blocks; b's three, and b0's two again, now b's prefix-cache hit.
    assert b.stats.loaded_blocks_compared == 2 * (2 + 3 + 2)


@SCHEDULING
def test_delayed_free_keeps_blocks_until_the_saves_are_over(engine, async_scheduling):
    """A finished request with saves keeps its blocks (vLLM ``delay_free_blocks``) until a worker
    reports it in ``finished_sending``; then vLLM frees them (the fixture checks every block)."""
    e = engine(async_scheduling=async_scheduling)
    e.add_request("r", prompt(3, 70), max_tokens=1)
    step_until(e, lambda: "r" in e.finished, max_steps=200)
    assert "r" in e.scheduler.requests, "finished, its blocks kept while its saves may read them"
    e.run()
    assert "r" not in e.scheduler.requests
    f = engine(async_scheduling=async_scheduling, model_id=e.spec.model_id)
    serve(f, "s", prompt(3, 70) + [1])
    assert offered(f, "s") == [64]


@SCHEDULING
def test_abort_while_a_load_is_in_flight(engine, async_scheduling):
    a = engine(async_scheduling=async_scheduling)
    p = prompt(4, 128)
    serve(a, "w", p + [7])
    b = engine(async_scheduling=async_scheduling, model_id=a.spec.model_id)
    _filler(b)
    b.add_request("x", p + [9, 9, 9], max_tokens=3)
    step_until(b, lambda: loading(b, "x"))
    b.abort(["x"])
    b.run(200)
    assert b.finished["x"] == "abort"


@SCHEDULING
def test_abort_while_the_lookup_is_pending(engine, sidecar, async_scheduling):
    """The sidecar is frozen, so the lookup cannot be answered: vLLM skips the request step after
    step; an abort then ends it, and the lookup is cancelled once the sidecar is back."""
    slow = {"lookup_timeout_ms": 20000, "liveness_timeout_ms": 10000}
    a = engine(sidecar=sidecar, async_scheduling=async_scheduling)
    p = prompt(5, 70)
    serve(a, "w", p)
    b = engine(sidecar=sidecar, async_scheduling=async_scheduling, model_id=a.spec.model_id, extra=slow)
    sidecar.pause()
    try:
        b.add_request("x", p + [1], max_tokens=2)
        for _ in range(5):
            b.step()
        assert "x" in b.scheduler.requests and not offered(b, "x"), "the lookup is still pending"
        b.abort(["x"])
        b.run(50)
    finally:
        sidecar.resume()
    assert b.finished["x"] == "abort"
    serve(b, "y", p + [2])
    assert offered(b, "y") == [64]


@SCHEDULING
def test_vllms_preemption_then_the_request_looks_up_again(engine, async_scheduling):
    """vLLM's own preemption: under the priority policy, when blocks run out vLLM preempts the
    running request of lowest priority (its blocks are freed; prefix caching is off, as under
    the memory pressure that preempts). Scheduled again, it asks again, and kvtier offers the
    three chunks it saved before."""
    e = engine(async_scheduling=async_scheduling, num_blocks=20, enable_prefix_caching=False, policy="priority")
    # 150 tokens to decode (16 blocks in all, s then needs more than the 4 left): r is still
    # running when its saves are answered, also on a machine that answers them slowly.
    e.add_request("r", prompt(10, 100), max_tokens=150, priority=1)
    # r's prompt is computed and its three chunks are stored on both ranks before s comes.
    step_until(e, lambda: sum(w.get("chunks_saved", 0) for w in e.worker_stats()) >= 6, max_steps=500)
    e.add_request("s", prompt(11, 150), max_tokens=40, priority=0)
    step_until(e, lambda: e.scheduler.requests["r"].num_preemptions > 0, max_steps=500)
    e.run(3000)
    assert offered(e, "r") == [0, 96], "asked once per admission; after the preemption its three chunks"
    assert offered(e, "s") == [0]
    assert e.stats.loaded_blocks_compared == 2 * 6


@SCHEDULING
def test_request_finished_hands_vllm_no_params(engine, async_scheduling):
    """kvtier needs nothing in vLLM's request outputs: no ``kv_transfer_params``."""
    a = engine(async_scheduling=async_scheduling)
    p = prompt(6, 40)
    serve(a, "a", p)
    e = engine(async_scheduling=async_scheduling, model_id=a.spec.model_id)
    serve(e, "b", p + [1])
    e.add_request("c", p + [2], max_tokens=5)
    step_until(e, lambda: "c" in e.scheduler.requests and e.scheduler.requests["c"].num_output_tokens >= 1)
    e.abort(["c"])
    e.run(200)
    assert offered(e, "b") == [32]
    params = {o.request_id: o.kv_transfer_params for o in a.outputs + e.outputs if o.finish_reason is not None}
    assert params == {"a": None, "b": None}, "aborted requests end without an output of vLLM's scheduler"
