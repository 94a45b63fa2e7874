"""A real model's KV through kvtier under vLLM's own code: a tiny randomly initialised Llama
(transformers; two layers, grouped-query attention, bf16) computes the KV of a prompt; engine A
writes it into its paged blocks and saves it through kvtier; engine B, whose blocks differ,
looks the prefix up and loads it (for a partial-chunk prefix, after its own prefix cache). B's
model **cannot compute the prefix**: a prefix token it is asked to compute gets a poison value
and is counted, so a load that silently failed and was recomputed fails the test. B's blocks are
gathered back and the model continues the prompt from them: the logits must be ``torch.equal``
to continuing from the KV the model computed. Tensor parallelism 2: each worker holds half the
KV heads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.vllm_real.harness.helpers import offered, step_until

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

LAYERS, KV_HEADS, HEAD_DIM, VOCAB = 2, 4, 8, 512
PREFIX = 64  # two 32-token chunks


@pytest.fixture(scope="module")
def model():
    from transformers.models.llama.configuration_llama import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
        num_attention_heads=8, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, max_position_embeddings=256,
    )
    return LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


def _kv(model, tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (K, V) of ``tokens``, each ``[kv_heads, T, head_dim]``."""
    with torch.no_grad():
        cache = model(torch.tensor([tokens]), use_cache=True).past_key_values
    return [(layer.keys[0], layer.values[0]) for layer in cache.layers]


def _per_rank(kv, tp: int) -> list[np.ndarray]:
    """The engine's int16 KV ``[T, layers, 2, heads of the rank, dim]`` for each rank."""
    out = []
    per = KV_HEADS // tp
    for r in range(tp):
        layers = [torch.stack([k[r * per : (r + 1) * per], v[r * per : (r + 1) * per]]) for k, v in kv]
        t = torch.stack(layers)  # [layers, 2, heads, T, dim]
        out.append(t.permute(3, 0, 1, 2, 4).contiguous().view(torch.int16).numpy())
    return out


def _continue(model, kv, rest: list[int]) -> torch.Tensor:
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache()
    for i, (k, v) in enumerate(kv):
        cache.update(k.unsqueeze(0).clone(), v.unsqueeze(0).clone(), i)
    with torch.no_grad():
        return model(torch.tensor([rest]), past_key_values=cache).logits


def _gathered(engine, request_id: str, n: int):
    parts = engine.gather(request_id, n)
    t = torch.from_numpy(np.concatenate(parts, axis=3)).view(torch.bfloat16)  # [n, layers, 2, heads, dim]
    return [(t[:, i, 0].permute(1, 0, 2), t[:, i, 1].permute(1, 0, 2)) for i in range(LAYERS)]


@pytest.mark.parametrize("local", [0, 48], ids=["whole-chunks", "partial-chunk"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_logits_after_a_kvtier_load_equal_a_full_recomputation(engine, model, local, async_scheduling):
    rng = np.random.default_rng(7)
    prompt = [int(t) for t in rng.integers(3, VOCAB, 90)]
    prefix_kv = _kv(model, prompt[:PREFIX])
    rest_kv = _kv(model, prompt)  # the engines' KV for the tokens after the prefix
    full = [
        (torch.cat([pk, rk[:, PREFIX:]], 1), torch.cat([pv, rv[:, PREFIX:]], 1))
        for (pk, pv), (rk, rv) in zip(prefix_kv, rest_kv)
    ]
    spec = dict(dtype="bfloat16", layers=LAYERS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, async_scheduling=async_scheduling)

    a = engine(**spec)
    a.provide("a", _per_rank(full, 2))
    a.add_request("a", prompt[: PREFIX + 1], max_tokens=1)
    a.run()

    b = engine(model_id=a.spec.model_id, **spec)
    if local:
        # b's own prefix cache then ends inside the second chunk, on a block boundary: b0 loads
        # the first chunk (it cannot compute it) and computes up to there.
        b.provide("b0", _per_rank(full, 2), compute_from=32)
        b.add_request("b0", prompt[:local] + [1], max_tokens=1)
        b.run()
        assert offered(b, "b0") == [32]
    b.provide("b", _per_rank(full, 2), compute_from=PREFIX)
    b.add_request("b", prompt, max_tokens=4)
    step_until(b, lambda: b.scheduler.requests["b"].num_output_tokens >= 1)
    assert offered(b, "b") == [PREFIX - local], "kvtier loads the rest of the prefix"
    loaded = _gathered(b, "b", PREFIX)
    b.run()
    assert b.stats.forbidden_computes == 0, "no prefix token was recomputed: every one was loaded"

    want = _continue(model, prefix_kv, prompt[PREFIX:])
    got = _continue(model, loaded, prompt[PREFIX:])
    assert torch.equal(got, want)
