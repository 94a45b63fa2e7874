"""Engines at different tensor-parallel sizes share KV: what an engine at TP 2 saves, engines of
the same model at TP 1 (each rank assembling its four KV heads from the TP 2 ranks' two shards)
and TP 4 (each reading one head of one shard) load under vLLM's own scheduler and model runner;
the scheduler offers the hit with no setting, and every loaded block is compared with the model's
KV by token and head (the model runner's check, through vLLM's view of the cache)."""

from __future__ import annotations

import pytest

from tests.vllm_real.harness.helpers import offered, prompt, serve


@pytest.mark.parametrize("tp", [1, 4])
def test_chunks_saved_at_tp2_load_at_another_tp(engine, tp):
    a = engine(tp=2, kv_heads=4)
    p = prompt(71, 100)
    serve(a, "a", p)
    b = engine(model_id=a.spec.model_id, tp=tp, kv_heads=4)
    assert len(b.worker_info) == tp
    serve(b, "filler", prompt(72, 40), max_tokens=1)
    serve(b, "b", p + [7])
    assert offered(b, "b") == [96]
    assert b.stats.loaded_blocks_compared == tp * 6
