"""Engines whose attention backends build their KV caches differently share KV: what a
FlashAttention engine with token-major (NHD) blocks saves, a FlashInfer or FlashAttention engine
with head-major (HND) blocks loads, and the other way round, under vLLM's own scheduler and model
runner; every loaded block is compared with the model's KV (by token and head, through vLLM's
view of the cache), and the scheduler offers the hit without any layout setting."""

from __future__ import annotations

import pytest

from tests.vllm_real.harness.helpers import offered, prompt, serve

CASES = [
    (("flash_attn", "NHD"), ("flashinfer", "HND")),
    (("flashinfer", "HND"), ("flash_attn", "NHD")),
    (("flash_attn", "HND"), ("flashinfer", "NHD")),
]


def _spec(backend: str, layout: str) -> dict:
    spec: dict = dict(backend=backend, dtype="bfloat16")
    if layout == "HND":
        spec["extra"] = {"kv_layout": "HND"}
    return spec


@pytest.mark.parametrize("saver,loader", CASES, ids=[f"{a[0]}-{a[1]}-to-{b[0]}-{b[1]}" for a, b in CASES])
def test_chunks_saved_in_one_layout_load_into_another(engine, saver, loader):
    a = engine(**_spec(*saver))
    assert [w["in_block"] for w in a.worker_info] == [saver[1]] * 2
    p = prompt(61, 100)
    serve(a, "a", p)
    b = engine(model_id=a.spec.model_id, **_spec(*loader))
    assert [w["in_block"] for w in b.worker_info] == [loader[1]] * 2
    serve(b, "filler", prompt(62, 40), max_tokens=1)
    serve(b, "b", p + [7])
    assert offered(b, "b") == [96]
    assert b.stats.loaded_blocks_compared == 2 * 6
