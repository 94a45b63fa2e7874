/**
 * The capacity planner's pieces without an engine: model presets and Hugging Face configs, the
 * LRU and infinite bounds on chunk keys, the TTFT model against its published figure, and the
 * conversion of planned capacities into verification-model capacities.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { chunkKeyTrace, lruBound } from '../../src/sim/bounds.ts';
import { kvBytesPerToken, MODEL_PRESETS, modelFromHfConfig } from '../../src/sim/models.ts';
import { chunksIn, cpuTierBytes, gpuBlocksIn, type PlanShapes } from '../../src/sim/planner.ts';
import { prefillSeconds, TTFT_CHECK, ttftCheck } from '../../src/sim/ttft-model.ts';
import type { SimRequest } from '../../src/sim/types.ts';

const KiB = 1024;

describe('model presets and config.json', () => {
  it('KV bytes per token of every preset', () => {
    const got = Object.fromEntries(
      Object.entries(MODEL_PRESETS).map(([k, m]) => [k, kvBytesPerToken(m)]),
    );
    assert.deepEqual(got, {
      'llama-3.1-8b': 128 * KiB,
      'llama-3.1-70b': 320 * KiB,
      'qwen2.5-7b': 56 * KiB,
      'mistral-7b': 128 * KiB,
      // 61 layers x (512 + 64) x bf16: ~68.6 KiB.
      'deepseek-v3': 61 * 576 * 2,
    });
  });

  it('reads a dense and an MLA config.json', () => {
    const llama = modelFromHfConfig(
      {
        num_hidden_layers: 32,
        num_attention_heads: 32,
        num_key_value_heads: 8,
        hidden_size: 4096,
        intermediate_size: 14336,
        vocab_size: 128256,
        torch_dtype: 'bfloat16',
      },
      'llama',
    );
    assert.equal(kvBytesPerToken(llama), 128 * KiB);
    assert.ok(Math.abs(llama.activeParams / 8.03e9 - 1) < 0.02, `params ${llama.activeParams}`);
    const ds = modelFromHfConfig(
      {
        num_hidden_layers: 61,
        num_attention_heads: 128,
        hidden_size: 7168,
        kv_lora_rank: 512,
        qk_rope_head_dim: 64,
        torch_dtype: 'bfloat16',
      },
      'ds',
    );
    assert.equal(ds.mla, true);
    assert.equal(kvBytesPerToken(ds), 61 * 576 * 2);
    assert.throws(() => modelFromHfConfig({ num_hidden_layers: 2 }, 'bad'), {
      code: 'KVT_INVALID_ARGUMENT',
      message: /bad: num_attention_heads must be an integer >= 1/,
    });
    assert.throws(
      () =>
        modelFromHfConfig(
          { num_hidden_layers: 2, num_attention_heads: 2, hidden_size: 8, torch_dtype: 'int3' },
          'c',
        ),
      /torch_dtype must be one of/,
    );
  });
});

describe('bounds from chunk keys', () => {
  const tok = (seed: number, n: number) =>
    Uint32Array.from({ length: n }, (_, i) => seed * 1000 + i);
  const req = (id: string, at: number, prompt: Uint32Array): SimRequest => ({
    id,
    arrivalMs: at,
    promptTokens: prompt,
    outputTokens: 1,
  });
  const cat = (...p: Uint32Array[]) => Uint32Array.from(p.flatMap((x) => [...x]));

  it('infinite and LRU caches count contiguous whole-chunk prefix hits', () => {
    const a = tok(1, 64);
    const b = tok(2, 64);
    // Chunks of 16: A (4 chunks), B (4 chunks), then A again + 1 token, then B again + 1 token.
    const trace = chunkKeyTrace(
      {
        name: 'w',
        requests: [
          req('a', 0, a),
          req('b', 1, b),
          req('a2', 2, cat(a, tok(3, 1))),
          req('b2', 3, cat(b, tok(4, 1))),
        ],
      },
      16,
    );
    assert.equal(trace.promptTokens, 64 + 64 + 65 + 65);
    assert.equal(trace.uniqueChunks, 8);
    const inf = lruBound(trace, Number.POSITIVE_INFINITY);
    // a2 and b2 each find their 4 chunks; a and b could not look up their last chunk anyway.
    assert.equal(inf.hitTokens, 128);
    // 4 chunks: b evicts a, so a2 misses; a2 then evicts b, so b2 misses.
    assert.equal(lruBound(trace, 4).hitTokens, 0);
    assert.equal(lruBound(trace, 8).hitTokens, 128);
    assert.equal(lruBound(trace, 0).hitTokens, 0);
    assert.throws(() => lruBound(trace, -1), { code: 'KVT_INVALID_ARGUMENT' });
  });
});

describe('TTFT model', () => {
  it('reproduces the published figure within 10% and prints the check', () => {
    const m = MODEL_PRESETS[TTFT_CHECK.model]!;
    const c = ttftCheck(m);
    assert.ok(Math.abs(c.recomputeSeconds / TTFT_CHECK.recomputeSeconds - 1) < 0.1, c.line);
    assert.ok(Math.abs(c.hostLoadSeconds / TTFT_CHECK.hostLoadSeconds - 1) < 0.1, c.line);
    assert.match(c.line, /^TTFT model check \(Llama-3\.1-8B, 10,000 tokens/);
    assert.ok(prefillSeconds(m, 5_000, 10_000) < prefillSeconds(m, 0, 5_000) * 1.5);
    assert.equal(prefillSeconds(m, 10, 10), 0);
  });
});

describe('planned capacities', () => {
  const s: PlanShapes = {
    planned: MODEL_PRESETS['llama-3.1-8b']!,
    verificationBytesPerToken: 512,
    chunkTokens: 256,
    blockTokens: 16,
  };
  it('keep the chunk count between the planned and the verification model', () => {
    assert.equal(chunksIn(8 * 2 ** 30, s), 256);
    // 256 chunks of 128 KiB (two 64 KiB arena pages each).
    assert.equal(cpuTierBytes(8 * 2 ** 30, s), 256 * 128 * KiB);
    assert.equal(gpuBlocksIn(32 * 2 ** 30, s), 16_384);
  });
});
