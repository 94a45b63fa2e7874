"""A real model's KV through kvtier: a tiny randomly initialised Llama (transformers; two
layers, grouped-query attention, bf16) computes the KV of a prompt's prefix; one engine writes it
into its paged blocks and saves it through kvtier; a second engine, whose blocks are handed out
in another order, looks it up and loads it (for a partial-chunk prefix, after its own prefix
cache); its blocks are gathered back and the model continues the prompt from them. The logits
must be ``torch.equal`` to continuing from the KV the model computed. Tensor parallelism 2: each
worker holds half the KV heads."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vllm import _twin

from tests.vllm_twin.twin.helpers import offered, step_until

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

LAYERS, KV_HEADS, HEAD_DIM, VOCAB = 2, 4, 8, 512
PREFIX = 32  # two 16-token chunks


@pytest.fixture(scope="module")
def model():
    from transformers.models.llama.configuration_llama import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=8,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=256,
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


def _gather(engine, request_id: str, n: int):
    """The KV of the request's first ``n`` tokens, read back from both ranks' blocks."""
    table = engine.scheduler.kv_cache_manager.get_block_ids(request_id)[0]
    parts = [engine.pool.call(r, "gather", engine.spec.engine_id, (table, n)) for r in engine.ranks]
    t = torch.from_numpy(np.concatenate(parts, axis=3)).view(torch.bfloat16)  # [n, layers, 2, heads, dim]
    return [(t[:, i, 0].permute(1, 0, 2), t[:, i, 1].permute(1, 0, 2)) for i in range(LAYERS)]


@pytest.mark.parametrize("local", [0, 24], ids=["whole-chunks", "partial-chunk"])
def test_logits_after_a_kvtier_load_equal_a_full_recomputation(twin, model, local):
    rng = np.random.default_rng(7)
    prompt = [int(t) for t in rng.integers(0, VOCAB, 45)]
    prefix_kv = _kv(model, prompt[:PREFIX])
    rest_kv = _kv(model, prompt)  # the engines' KV for the tokens after the prefix
    full = [(torch.cat([pk, rk[:, PREFIX:]], 1), torch.cat([pv, rv[:, PREFIX:]], 1)) for (pk, pv), (rk, rv) in zip(prefix_kv, rest_kv)]
    spec = dict(version=_twin.CURRENT, dtype="bfloat16", layers=LAYERS, kv_heads=KV_HEADS, head_dim=HEAD_DIM)

    a = twin(**spec)
    a.provide("a", _per_rank(full, 2))
    a.add_request("a", prompt[: PREFIX + 1], max_tokens=1)
    a.run()

    b = twin(model=a.spec.model, reverse_blocks=True, **spec)
    if local:
        # b's own prefix cache ends inside the second chunk, on a block boundary
        b.provide("b0", _per_rank(full, 2))
        b.add_request("b0", prompt[:local] + [1], max_tokens=1)
        b.run()
    b.provide("b", _per_rank(full, 2))
    b.add_request("b", prompt, max_tokens=4)
    step_until(b, lambda: b.scheduler.requests["b"].num_output_tokens >= 1)
    assert offered(b, "b") == [PREFIX - local], "kvtier loads the rest of the prefix"
    loaded = _gather(b, "b", PREFIX)
    b.run()

    want = _continue(model, prefix_kv, prompt[PREFIX:])
    got = _continue(model, loaded, prompt[PREFIX:])
    assert torch.equal(got, want)
