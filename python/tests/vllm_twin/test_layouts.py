"""Every KV cache layout the attention backends hand the connector, in fp16 and bf16: one engine
saves a prompt, another (blocks in another order) loads it, and every loaded block is compared
bit for bit by the workers."""

from __future__ import annotations

import pytest
from vllm import _twin

from tests.vllm_twin.twin.helpers import offered, prompt, serve

CASES = [
    ("flash_attn", "NHD", "float16", False),
    ("flash_attn", "HND", "bfloat16", False),
    ("flashinfer", "NHD", "bfloat16", False),
    ("flashinfer", "HND", "float16", False),
    ("mla", "NHD", "bfloat16", True),
]


@pytest.mark.parametrize("backend,layout,dtype,mla", CASES, ids=[f"{b}-{l}-{d}" for b, l, d, _ in CASES])
def test_layout_round_trip(twin, backend, layout, dtype, mla):
    spec = dict(version=_twin.CURRENT, backend=backend, dtype=dtype, mla=mla, head_dim=16 if mla else 8)
    if layout == "HND":
        spec["extra"] = {"kv_layout": "HND"}  # vLLM builds what the connector requires
    a = twin(**spec)
    assert [w["in_block"] for w in a.worker_info] == [layout, layout]
    p = prompt(51, 70)
    serve(a, "a", p)
    b = twin(model=a.spec.model, reverse_blocks=True, **spec)
    serve(b, "b", p + [8])
    assert offered(b, "b") == [64]
    assert b.stats.loaded_blocks_compared == 2 * 16
