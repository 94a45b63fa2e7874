"""How vLLM builds the connector, with vLLM's own config classes and factory: the KV cache
layouts the attention backends hand over (FlashAttention and FlashInfer shapes, NHD and HND,
MLA; fp16 and bf16), the layout vLLM picks when a connector requires one, the hybrid KV cache
manager on, and hybrid models refused at start-up with what to do."""

from __future__ import annotations

import pytest

from kvtier_vllm.errors import ConfigError
from tests.vllm_real.harness.helpers import offered, prompt, serve

CASES = [
    ("flash_attn", "NHD", "float16", False),
    ("flash_attn", "HND", "bfloat16", False),
    ("flashinfer", "NHD", "bfloat16", False),
    ("flashinfer", "HND", "float16", False),
    ("mla", "NHD", "bfloat16", True),
]


@pytest.mark.parametrize("backend,layout,dtype,mla", CASES, ids=[f"{b}-{l}-{d}" for b, l, d, _ in CASES])
def test_layout_round_trip(engine, backend, layout, dtype, mla):
    """One engine saves, another (other blocks) loads; every loaded block compared bit for bit.
    ``kv_layout`` HND in the connector's config makes vLLM build HND caches (vLLM asks the
    connector class for its required layout)."""
    spec = dict(backend=backend, dtype=dtype, mla=mla, head_dim=16 if mla else 8)
    if layout == "HND":
        spec["extra"] = {"kv_layout": "HND"}
    a = engine(**spec)
    assert [w["in_block"] for w in a.worker_info] == [layout, layout]
    p = prompt(51, 100)
    serve(a, "a", p)
    b = engine(model_id=a.spec.model_id, **spec)
    serve(b, "filler", prompt(52, 40), max_tokens=1)
    serve(b, "b", p + [8])
    assert offered(b, "b") == [96]
    assert b.stats.loaded_blocks_compared == 2 * 6


@pytest.mark.parametrize("backend", ["flash_attn", "flashinfer"])
def test_hnd_caches_chosen_by_vllm_are_used(engine, monkeypatch, backend):
    """``VLLM_KV_CACHE_LAYOUT=HND`` (kv_layout unset) in the scheduler and the workers: vLLM's
    layout helper answers HND, the caches are head-major, and the scheduler looks up the
    namespace the workers register."""
    monkeypatch.setenv("VLLM_KV_CACHE_LAYOUT", "HND")
    env = {"VLLM_KV_CACHE_LAYOUT": "HND"}
    a = engine(backend=backend, env=env)
    assert [w["in_block"] for w in a.worker_info] == ["HND", "HND"]
    p = prompt(53, 100)
    serve(a, "a", p)
    b = engine(backend=backend, env=env, model_id=a.spec.model_id)
    serve(b, "b", p + [4])
    assert offered(b, "b") == [96]
    assert b.stats.loaded_blocks_compared == 2 * 6


def test_hybrid_manager_on_with_a_plain_model(engine):
    """The hybrid KV cache manager on (vLLM's default): a model with one full-attention group
    starts with kvtier and serves hits."""
    a = engine(disable_hybrid_kv_cache_manager=False)
    p = prompt(54, 70)
    serve(a, "a", p)
    b = engine(model_id=a.spec.model_id, disable_hybrid_kv_cache_manager=False)
    serve(b, "b", p + [1])
    assert offered(b, "b") == [64]


def _groups(kind: str):
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, MambaSpec, SlidingWindowSpec

    full = KVCacheGroupSpec(["model.layers.0.self_attn.attn"], FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float16))
    if kind == "sliding":
        other = KVCacheGroupSpec(
            ["model.layers.1.self_attn.attn"],
            SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float16, sliding_window=64),
        )
    else:
        other = KVCacheGroupSpec(["model.layers.1.mixer"], MambaSpec(block_size=16, shapes=((4,),), dtypes=(torch.float16,)))
    return [full, other]


@pytest.mark.parametrize("kind", ["sliding", "mamba"])
def test_hybrid_models_are_refused_with_what_to_do(engine, kind):
    """A KV cache of several groups is refused when vLLM builds the connector, with a message
    that names the vLLM setting that makes it work, or says kvtier cannot serve the model."""
    with pytest.raises(ConfigError) as err:
        engine(disable_hybrid_kv_cache_manager=False, kv_cache_groups=_groups(kind))
    text = str(err.value)
    if kind == "sliding":
        assert "--disable-hybrid-kv-cache-manager" in text
    else:
        assert "without kvtier" in text and "Mamba" in text


def test_kv_cache_in_process_memory_as_vllms_cpu_backend_allocates_it(engine):
    """vLLM's CPU backend keeps the KV cache in plain tensors of process memory (its attention
    backend's shape, HND): the connector moves it into shared memory when it is registered, in
    place, and vLLM's tensors keep working; saves and loads are byte-exact."""
    spec = dict(backend="flash_attn", dtype="bfloat16", in_process_kv=True, extra={"kv_layout": "HND"})
    a = engine(**spec)
    p = prompt(55, 100)
    serve(a, "a", p)
    b = engine(model_id=a.spec.model_id, **spec)
    serve(b, "filler", prompt(56, 40), max_tokens=1)
    serve(b, "b", p + [9])
    assert offered(b, "b") == [96]
    assert b.stats.loaded_blocks_compared == 2 * 6
