/**
 * The capacity planner's pieces without an engine: model presets and Hugging Face configs, the
 * bounds on chunk keys (LRU, infinite, a tier behind the run's own GPU cache) and the flags of a
 * figure above its bound, the GPU model and its calibration, the tier models against the
 * benchmark results they come from, load, gain, targets and capacities.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { chunkKeyTrace, lruBound, tierBehindGpuBound } from '../../src/sim/bounds.ts';
import {
  decodeStepSeconds,
  defaultGpusPerEngine,
  defaultKvCacheBytes,
  GPU_PRESETS,
  prefillSeconds,
  resolveEngineSpeed,
  stepSeconds,
} from '../../src/sim/gpu.ts';
import {
  kvBytesPerToken,
  MODEL_PRESETS,
  modelFromHfConfig,
  modelPreset,
} from '../../src/sim/models.ts';
import {
  boundFlags,
  cheapestReaching,
  chunksIn,
  cpuTier,
  engineCapacity,
  gainOver,
  gpuBlocksIn,
  offeredLoad,
  overload,
  type PlanRow,
  type PlanShapes,
  sustainableScale,
} from '../../src/sim/planner.ts';
import { formatSize } from '../../src/sim/report.ts';
import {
  loadDurationSeconds,
  PLANNER_TIERS,
  resolveTierModels,
  TIER_MODEL_DEFAULTS,
} from '../../src/sim/tier-models.ts';
import {
  calibrationLine,
  hostLinkLine,
  TTFT_REFERENCE,
  tenThousandTokens,
} from '../../src/sim/ttft-model.ts';
import type { SimReport, SimRequest } from '../../src/sim/types.ts';
import { REPO_ROOT } from '../support/fixtures.ts';

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

/** A report with the fields the planner reads; `over` replaces any of them. */
function report(over: Partial<SimReport> = {}): SimReport {
  return {
    workload: 'w',
    requests: 10,
    finished: 10,
    failed: 0,
    promptTokens: 10_000,
    tokens: {
      gpuPrefixCache: 0,
      byTier: {},
      selfReuse: { gpu: 0, kvtier: 0 },
      recomputed: 10_000,
      unserved: 0,
    },
    preemption: { preemptions: 0, recomputedTokens: 0, reloadedTokens: 0 },
    bytes: { saved: 0, loaded: 0 },
    pendingLookups: { lookups: 0, stepsWaited: 0 },
    verifiedBlocks: 0,
    mismatchedBlocks: 0,
    mismatches: [],
    failures: {
      invalidBlocks: 0,
      recomputedAfterFailure: 0,
      failedRequests: 0,
      faultsInjected: [],
    },
    modeledTtftMs: { p50: 1000, p90: 4000, mean: 1500 },
    timeline: {
      queueMs: { p50: 0, p90: 0, mean: 0 },
      busyMs: 50_000,
      makespanMs: 100_000,
      utilization: 0.5,
    },
    wallMs: 1,
    steps: 1,
    ...over,
  };
}

describe('a tier behind the GPU cache, and flags above a bound', () => {
  const tok = (seed: number, n: number) =>
    Uint32Array.from({ length: n }, (_, i) => seed * 1000 + i);
  const req = (id: string, at: number, prompt: Uint32Array): SimRequest => ({
    id,
    arrivalMs: at,
    promptTokens: prompt,
    outputTokens: 1,
  });
  const a = tok(1, 64);
  const trace = chunkKeyTrace(
    {
      name: 'w',
      requests: [
        req('a', 0, a),
        req('a2', 1, Uint32Array.from([...a, 7])),
        req('a3', 2, Uint32Array.from([...a, 8])),
      ],
    },
    16,
  );

  it("starts where the run's own GPU cache stopped for each request", () => {
    // a2 and a3 can find a's 4 chunks; total prompt tokens 64 + 65 + 65.
    assert.equal(tierBehindGpuBound(trace, {}, 8), 128 / 194);
    // The GPU served a2 fully and 2 chunks of a3: the tier is left a3's last 2 chunks.
    assert.equal(tierBehindGpuBound(trace, { a2: 64, a3: 40 }, 8), 32 / 194);
    // A tier of 1 chunk keeps only a's last chunk, which no lookup can reach first.
    assert.equal(tierBehindGpuBound(trace, {}, 1), 0);
  });

  it('flags each figure above its bound, self-reuse left out', () => {
    const r = report({
      tokens: {
        gpuPrefixCache: 3_000,
        byTier: { cpu: 2_000 },
        selfReuse: { gpu: 1_000, kvtier: 2_000 },
        recomputed: 2_000,
        unserved: 0,
      },
    });
    const b = { lru: 0.9, tierBehindGpu: 0.2, lruWithGpu: 0.5, infinite: 0.6 };
    assert.deepEqual(boundFlags(r, b), [], 'kvtier 20% and kvtier + GPU 50% are at their bounds');
    const flags = boundFlags(r, { ...b, tierBehindGpu: 0.15, lruWithGpu: 0.45, infinite: 0.48 });
    assert.equal(flags.length, 3, flags.join('; '));
    assert.match(flags[0] as string, /^kvtier alone 20\.0% > tier-behind-GPU bound 15\.0%/);
    assert.match(flags[1] as string, /^kvtier \+ GPU 50\.0% > LRU \+GPU bound 45\.0%/);
    assert.match(flags[2] as string, /^kvtier \+ GPU 50\.0% > infinite-cache bound 48\.0%/);
  });
});

describe('engine speed from the model and the GPU', () => {
  const llama = modelPreset('llama-3.1-8b');
  const h100 = resolveEngineSpeed(llama, { gpu: 'h100' });

  it('has the four presets, and places a 70B and DeepSeek-V3 on enough GPUs', () => {
    assert.deepEqual(Object.keys(GPU_PRESETS), ['h100', 'h200', 'a100', 'l40s']);
    assert.equal(defaultGpusPerEngine(llama, GPU_PRESETS.h100!), 1);
    assert.equal(defaultGpusPerEngine(modelPreset('llama-3.1-70b'), GPU_PRESETS.h100!), 4);
    assert.equal(defaultGpusPerEngine(modelPreset('deepseek-v3'), GPU_PRESETS.h200!), 8);
    assert.throws(() => resolveEngineSpeed(llama, { gpu: 'tpu' }), /--gpu must be one of h100/);
    // 90% of 80 GB less 16 GB of weights.
    assert.equal(defaultKvCacheBytes(llama, h100), 0.9 * 80e9 - 8.03e9 * 2);
  });

  it('prefill is compute-bound and grows with the model and the context; decode is memory-bound', () => {
    const at = (m: string, g: string) =>
      prefillSeconds(
        modelPreset(m),
        resolveEngineSpeed(modelPreset(m), { gpu: g, gpus: 1 }),
        0,
        8192,
      );
    assert.ok(at('llama-3.1-70b', 'h100') > 8 * at('llama-3.1-8b', 'h100'));
    assert.ok(at('llama-3.1-8b', 'a100') > 3 * at('llama-3.1-8b', 'h100'));
    assert.equal(at('llama-3.1-8b', 'h200'), at('llama-3.1-8b', 'h100'), 'same FLOPs');
    // One long prefill chunk: compute time; one decode token: the weights over HBM bandwidth.
    const chunk = stepSeconds(llama, h100, [{ start: 0, end: 8192 }]);
    assert.equal(chunk, prefillSeconds(llama, h100, 0, 8192));
    const decode = decodeStepSeconds(llama, h100, 1, 1000);
    assert.ok(Math.abs(decode / ((8.03e9 * 2 + 1001 * 131072) / (3.35e12 * 0.75)) - 1) < 1e-9);
    assert.equal(decode, stepSeconds(llama, h100, [{ start: 1000, end: 1001 }]));
    const h200 = resolveEngineSpeed(llama, { gpu: 'h200' });
    assert.ok(decodeStepSeconds(llama, h200, 1, 1000) < decode, 'more HBM bandwidth');
  });

  it("prints the MFU's calibration and the measured link's load beside the published one", () => {
    const c = tenThousandTokens(modelPreset(TTFT_REFERENCE.model), h100);
    assert.ok(Math.abs(c.prefillSeconds / TTFT_REFERENCE.recomputeSeconds - 1) < 0.05);
    // 1.31 GB over the H100's measured-derived 51.2 GB/s: not LMCache's 0.06 s, and not made to be.
    assert.equal(c.hostLoadSeconds.toFixed(3), '0.026');
    const seventy = modelPreset('llama-3.1-70b');
    const a100 = resolveEngineSpeed(seventy, { gpu: 'a100' });
    const line = calibrationLine(seventy, a100);
    assert.match(
      line,
      /^MFU 0\.33 gives a 10,000-token Llama-3\.1-8B prefill on NVIDIA H100 SXM 0\.5\d s/,
    );
    assert.match(
      line,
      /This run, Llama-3\.1-70B on 4 × NVIDIA A100 SXM 80GB at MFU 0\.33: \d+\.\d\d s\.$/,
    );
    const link = hostLinkLine(seventy, a100);
    assert.match(
      link,
      /^NVIDIA H100 SXM's 51\.2 GB\/s loads the same 10,000 tokens' KV \(1\.31 GB\) from host memory in 0\.026 s; LMCache published ~0\.06 s\. The link: torch's host-to-device copy on an H100 /,
    );
    assert.match(
      link,
      /This run, Llama-3\.1-70B on NVIDIA A100 SXM 80GB: 0\.128 s at 25\.6 GB\/s \(not measured: half the H100's/,
    );
  });
});

describe('tier models', () => {
  it('take their defaults from bench/results/summary-2026-11-23.json', () => {
    const summary = JSON.parse(
      readFileSync(`${REPO_ROOT}/bench/results/summary-2026-11-23.json`, 'utf8'),
    ) as {
      figures: { id: string; value: { median: number } }[];
    };
    const median = (id: string) => summary.figures.find((f) => f.id === id)?.value.median;
    for (const t of PLANNER_TIERS) {
      const d = TIER_MODEL_DEFAULTS[t];
      if (d.benchIds === undefined) continue;
      assert.ok(
        Math.abs(d.readBytesPerSec / ((median(d.benchIds.bandwidth) ?? 0) * 1e9) - 1) < 1e-9,
        t,
      );
      const floor = (2 * 2 ** 20) / ((median(d.benchIds.floor) ?? 0) * 1e9);
      assert.ok(Math.abs(d.floorSeconds / floor - 1) < 1e-9, t);
    }
  });

  it("the peer tier's default is bench:peer's lookup and load from another sidecar, and it costs nothing to hold", () => {
    const peer = JSON.parse(readFileSync(`${REPO_ROOT}/bench/results/peer.json`, 'utf8')) as {
      rows: { what: string; gbps: number }[];
    };
    const row = peer.rows.find((r) => r.what.includes('peer tier'));
    assert.ok(row !== undefined);
    const d = TIER_MODEL_DEFAULTS.peer;
    assert.ok(Math.abs(d.readBytesPerSec / (row.gbps * 1e9) - 1) < 1e-9);
    assert.ok(Math.abs(d.floorSeconds / ((2 * 2 ** 20) / (row.gbps * 1e9)) - 1) < 1e-9);
    assert.equal(d.pricePerGiB, 0);
  });

  it("time a load as each lower tier's read then the host link, and take overrides", () => {
    const m = resolveTierModels(22e9, { disk: { readBytesPerSec: 2e9 } });
    assert.equal(m.cpu.readBytesPerSec, 22e9);
    assert.equal(loadDurationSeconds({ cpu: 22e9 }, m), 1);
    assert.equal(loadDurationSeconds({ disk: 2e9 }, m), 1 + 2e9 / 22e9);
    // A small read takes the tier's floor.
    assert.equal(loadDurationSeconds({ s3: 1000 }, m), m.s3.floorSeconds + m.cpu.floorSeconds);
    assert.throws(() => resolveTierModels(22e9, { fs: { readBytesPerSec: 0 } }), /positive number/);
  });
});

describe('load, gain, targets and capacities', () => {
  const llama = modelPreset('llama-3.1-8b');
  const speed = resolveEngineSpeed(llama);
  const prompt = new Uint32Array(4096);
  const w = {
    name: 'w',
    requests: Array.from({ length: 11 }, (_, i) => ({
      id: `r${i}`,
      arrivalMs: i * 100,
      promptTokens: prompt,
      outputTokens: 100,
    })),
  };

  it('offered load against capacity, and the time scale of a sustainable rate', () => {
    const cap = engineCapacity(w, llama, speed, 400_000, 64);
    assert.equal(cap.batch, 64, 'the KV cache holds more than maxRunning requests');
    assert.ok(Math.abs(cap.prefillSeconds / prefillSeconds(llama, speed, 0, 4096) - 1) < 1e-12);
    const load = offeredLoad(w, llama, speed, cap);
    assert.equal(load.requestsPerSec, 10);
    assert.ok(Math.abs(load.rho - 10 / cap.requestsPerSec) < 1e-9);
    const s = sustainableScale(load, 0.8);
    const slow = offeredLoad(
      { name: 'w', requests: w.requests.map((r) => ({ ...r, arrivalMs: r.arrivalMs * s })) },
      llama,
      speed,
      cap,
    );
    assert.ok(Math.abs(slow.rho - 0.8) < 1e-9);
    assert.match(
      overload(load, report()) ?? '',
      /requests arrive at \d+% of the engine's capacity/,
    );
    assert.equal(overload(slow, report()), undefined);
    const thrashing = report({
      preemption: { preemptions: 9, recomputedTokens: 2_000, reloadedTokens: 0 },
    });
    assert.match(overload(slow, thrashing) ?? '', /preemption threw away 20% of the prompt work/);
  });

  it('gain over the run without kvtier counts preemption recompute, and the cheapest row reaching a target', () => {
    const off = report({
      preemption: { preemptions: 1, recomputedTokens: 1_000, reloadedTokens: 0 },
    });
    const on = report({
      tokens: {
        gpuPrefixCache: 0,
        byTier: { cpu: 3_000 },
        selfReuse: { gpu: 0, kvtier: 0 },
        recomputed: 7_000,
        unserved: 0,
      },
      modeledTtftMs: { p50: 600, p90: 2000, mean: 900 },
    });
    const g = gainOver(off, on, 10_000);
    assert.equal(g.savedTokensPerSec, 400, '(10,000 + 1,000 - 7,000) tokens over 10 s');
    assert.equal(g.savedShare, 0.4);
    assert.deepEqual(g.ttftP90, [4000, 2000]);
    const row = (label: string, cost: number, saved: number): PlanRow => ({
      label,
      capacities: { cpu: 1 },
      report: on,
      gain: { ...g, savedTokensPerSec: saved },
      flags: [],
      cost,
    });
    const rows = [row('big', 100, 500), row('small', 10, 300), row('tiny', 1, 100)];
    assert.equal(cheapestReaching(rows, { kind: 'saved', tokensPerSec: 250 })?.label, 'small');
    assert.equal(cheapestReaching(rows, { kind: 'saved', tokensPerSec: 600 }), undefined);
    assert.equal(cheapestReaching(rows, { kind: 'ttft-p90', ms: 2000 })?.label, 'tiny');
  });

  it('keep the chunk count between the planned and the verification model, and print sizes', () => {
    const s: PlanShapes = {
      planned: llama,
      verificationBytesPerToken: 16,
      chunkTokens: 256,
      blockTokens: 16,
    };
    assert.equal(chunksIn(8 * 2 ** 30, s), 256);
    // 256 chunks of 4 KiB (one arena page each).
    assert.deepEqual(cpuTier(8 * 2 ** 30, s), { capacityBytes: 256 * 4096, pageBytes: 4096 });
    assert.equal(gpuBlocksIn(32 * 2 ** 30, s), 16_384);
    assert.equal(formatSize(8e9), '7.45 GiB');
    assert.equal(formatSize(2125673267.2), '1.98 GiB');
    assert.equal(formatSize(32 * 2 ** 30), '32 GiB');
    assert.equal(formatSize(1.5 * 2 ** 40), '1.5 TiB');
    assert.equal(formatSize(300 * 2 ** 20), '300 MiB');
  });
});
