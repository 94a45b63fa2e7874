"""Layer-wise loads (``layerwise_loads``) under vLLM's own scheduler and model-runner mixin: kvtier
offers a hit as a synchronous load (``load_kv_async`` False), so vLLM schedules the request in
the step that loads it, never in ``WAITING_FOR_REMOTE_KVS``; the LOAD copies layer by layer and
vLLM's ``maybe_transfer_kv_layer`` calls ``wait_for_layer_load`` before each attention layer,
which compares what it reads, bit for bit, with the model's KV. A failed load is recovered by
vLLM's own invalid-block path: the request is rewound and recomputes."""

from __future__ import annotations

import pytest

from tests.vllm_real.harness.helpers import offered, prompt, run_clearing_before_the_load, serve, status

LAYERWISE = {"layerwise_loads": True}


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_saved_prefix_loads_layer_by_layer_in_the_step_that_schedules_the_request(engine, async_scheduling):
    a = engine(async_scheduling=async_scheduling, layers=4)
    p = prompt(11, 100)
    serve(a, "a", p)
    b = engine(async_scheduling=async_scheduling, model_id=a.spec.model_id, layers=4, extra=dict(LAYERWISE))
    serve(b, "warm", prompt(999, 64), max_tokens=1)
    b.add_request("b", p + [7], 2)
    seen = set()
    while b.busy():
        b.step()
        s = status(b, "b")
        if s is not None:
            seen.add(s.name)
    assert offered(b, "b") == [96], "three whole chunks offered"
    assert "WAITING_FOR_REMOTE_KVS" not in seen, f"a synchronous load never waits for finished_recving: {seen}"
    # Both ranks' six loaded blocks were read by attention, each layer after its wait.
    assert b.stats.loaded_blocks_compared == 2 * 6
    waits = [w.get("layerwise_waits", 0) for w in b.worker_stats()]
    assert all(n >= 4 for n in waits), f"every layer of the load was waited for on each rank: {waits}"


def test_a_layerwise_load_whose_chunks_went_is_recomputed_through_vllms_invalid_blocks(engine, real_sidecar):
    """A CLEAR lands after the answer and before the LOAD: the load reports invalid blocks,
    ``wait_for_layer_load`` returns on that answer, and vLLM rewinds the running request and
    recomputes it: attention never reads a byte the failed load left (the harness compares
    every layer of every step)."""
    a = engine(layers=4)
    p = prompt(12, 100)
    serve(a, "a", p)
    b = engine(model_id=a.spec.model_id, layers=4, extra=dict(LAYERWISE))
    b.add_request("x", p + [1], max_tokens=2)
    run_clearing_before_the_load(b, real_sidecar.endpoint)
    assert offered(b, "x")[0] == 96
    assert b.finished["x"] == "length"
    assert b.stats.loaded_blocks_compared == 0, "nothing the failed load wrote was read as loaded"
    assert sum(w.get("loads_failed", 0) for w in b.worker_stats()) >= 2, "each rank's load failed"
