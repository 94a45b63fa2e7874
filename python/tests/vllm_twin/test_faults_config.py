"""Scenarios of how vLLM builds the connector: the current revision's layout helper, the layout
the attention backend actually uses, and the hybrid KV cache manager."""

from __future__ import annotations

import pytest
from vllm import _twin
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, MambaSpec, SlidingWindowSpec

from kvtier_vllm.errors import ConfigError
from tests.vllm_twin.twin.helpers import offered, prompt, serve

VERSIONS = pytest.mark.parametrize("version", _twin.VERSIONS, ids=["fixture", "current"])


def test_current_vllm_starts_and_serves(twin):
    """At the current revision the layout helper answers None when no connector requires a
    layout; both roles must start and serve hits."""
    a = twin(version=_twin.CURRENT)
    p = prompt(11, 50)
    serve(a, "a", p)
    b = twin(version=_twin.CURRENT, model=a.spec.model, reverse_blocks=True)
    serve(b, "b", p + [3])
    assert offered(b, "b") == [48]


@VERSIONS
@pytest.mark.parametrize("backend", ["flash_attn", "flashinfer"])
def test_hnd_caches_chosen_by_vllm_are_used(twin, monkeypatch, version, backend):
    """``VLLM_KV_CACHE_LAYOUT=HND`` (kv_layout unset): the attention backends build head-major
    caches; kvtier registers them as they are and the scheduler looks up the same namespace."""
    monkeypatch.setenv("VLLM_KV_CACHE_LAYOUT", "HND")
    env = {"VLLM_KV_CACHE_LAYOUT": "HND"}
    a = twin(version=version, backend=backend, env=env)
    assert [w["in_block"] for w in a.worker_info] == ["HND", "HND"]
    p = prompt(12, 50)
    serve(a, "a", p)
    b = twin(version=version, backend=backend, env=env, model=a.spec.model, reverse_blocks=True)
    serve(b, "b", p + [4])
    assert offered(b, "b") == [48]
    assert b.stats.loaded_blocks_compared == 2 * 12


@VERSIONS
def test_hma_enabled_plain_model_serves(twin, version):
    """The hybrid KV cache manager is on (vLLM's default): a model with one full-attention group
    starts with kvtier and serves hits."""
    a = twin(version=version, disable_hybrid_kv_cache_manager=False)
    p = prompt(13, 40)
    serve(a, "a", p)
    b = twin(version=version, model=a.spec.model, disable_hybrid_kv_cache_manager=False)
    serve(b, "b", p + [1])
    assert offered(b, "b") == [32]


def _groups(kind: str):
    full = KVCacheGroupSpec(["model.layers.0.self_attn.attn"], FullAttentionSpec(4, 4, 8, "float16"))
    if kind == "sliding":
        other = KVCacheGroupSpec(["model.layers.1.self_attn.attn"], SlidingWindowSpec(4, 4, 8, "float16", 32))
    else:
        other = KVCacheGroupSpec(["model.layers.1.mixer"], MambaSpec(4))
    return [full, other]


@pytest.mark.parametrize("kind", ["sliding", "mamba"])
def test_hybrid_models_are_refused_with_what_to_do(twin, kind):
    """A model that needs several KV cache groups is refused at start-up with a message that
    says which vLLM setting makes it work, or that kvtier cannot serve it."""
    with pytest.raises(ConfigError) as err:
        twin(disable_hybrid_kv_cache_manager=False, kv_cache_groups=_groups(kind))
    text = str(err.value)
    if kind == "sliding":
        assert "--disable-hybrid-kv-cache-manager" in text
    else:
        assert "without kvtier" in text and "Mamba" in text
