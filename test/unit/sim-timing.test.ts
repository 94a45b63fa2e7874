/**
 * The planner's engine: runs on the GPU model's clock (TTFT with queueing, loads that take their
 * modeled time), decode phases run in a tight loop with the same outcome as stepping, the same
 * engine with kvtier off, and the accounting of a preempted request that finds its own prefix
 * again (self-reuse, apart from hits on other requests' prefixes; every source adds to 100%).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { runSimulation } from '../../src/sim/engine.ts';
import { emptyAdmission, newCounters, prefillCompleted } from '../../src/sim/engine-accounting.ts';
import { newReq } from '../../src/sim/engine-request.ts';
import { resolveEngineSpeed } from '../../src/sim/gpu.ts';
import { modelPreset } from '../../src/sim/models.ts';
import { plannerTiming } from '../../src/sim/planner-timing.ts';
import { sourceTokens } from '../../src/sim/report.ts';
import { resolveTierModels } from '../../src/sim/tier-models.ts';
import type { SimReport, SimRequest } from '../../src/sim/types.ts';

function tokens(seed: number, n: number): Uint32Array {
  const out = new Uint32Array(n);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out[i] = (x >>> 0) % 32_000;
  }
  return out;
}

const MODEL = { chunkSize: 64, blockSize: 16 };
const llama = modelPreset('llama-3.1-8b');
const speed = resolveEngineSpeed(llama);

function timing(hostLinkBytesPerSec = speed.gpu.hostLinkBytesPerSec) {
  return plannerTiming(llama, speed, resolveTierModels(hostLinkBytesPerSec));
}

function assertAddsUp(r: SimReport, what: string): void {
  assert.equal(sourceTokens(r), r.promptTokens, `${what}: sources ${JSON.stringify(r.tokens)}`);
  assert.equal(r.mismatchedBlocks, 0, `${what}: ${JSON.stringify(r.mismatches)}`);
  assert.equal(r.finished, r.requests, `${what}: every request finished`);
}

/**
 * A writer, then readers that extend its prompt, each after a filler that pushes the writer's
 * blocks out of a 60-block GPU cache: the readers find the writer's chunks in kvtier only.
 */
function readers(n: number, gapMs: number): SimRequest[] {
  const w = tokens(3, 640);
  return [
    { id: 'w', arrivalMs: 0, promptTokens: w, outputTokens: 40 },
    ...Array.from({ length: n }, (_, i) => [
      {
        id: `f${i}`,
        arrivalMs: (i + 0.5) * gapMs,
        promptTokens: tokens(100 + i, 900),
        outputTokens: 2,
      },
      {
        id: `r${i}`,
        arrivalMs: (i + 1) * gapMs,
        promptTokens: Uint32Array.from([...w, ...tokens(10 + i, 100)]),
        outputTokens: 40,
      },
    ]).flat(),
  ];
}

describe('the planner engine', () => {
  it('runs on the GPU model: decode fast-forward changes nothing but the work done', async () => {
    const requests = readers(5, 400);
    const base = {
      workload: { name: 'readers', requests },
      model: MODEL,
      // The GPU cache holds one request at a time: later readers need kvtier.
      engine: { numGpuBlocks: 60 },
      cpuBytes: 64 << 20,
      waitsAdvanceClock: false,
      settle: true,
      timing: timing(),
    };
    const fast = await runSimulation(base);
    // A step hook turns the tight decode loop off; everything else is the same.
    const slow = await runSimulation({ ...base, hooks: { onStep: () => {} } });
    assertAddsUp(fast, 'fast-forward');
    // How many steps run in the loop depends on when this machine finishes the transfers (none
    // runs while one is in flight); that some do is the point.
    assert.ok((fast.fastForwardedSteps ?? 0) > 0, `fast-forwarded ${fast.fastForwardedSteps}`);
    assert.equal(slow.fastForwardedSteps, 0);
    assert.equal(fast.steps, slow.steps, 'the same steps, counted');
    assert.deepEqual(fast.tokens, slow.tokens);
    assert.deepEqual(fast.modeledTtftMs, slow.modeledTtftMs);
    assert.deepEqual(fast.timeline, slow.timeline);
    assert.ok((fast.tokens.byTier.cpu ?? 0) > 0, 'readers loaded from kvtier');
    assert.ok(fast.verifiedBlocks > 0);
    // A 40-token decode on the GPU model takes tens of ms per token; TTFT includes no decode.
    assert.ok(
      fast.modeledTtftMs.p50 > 0 && fast.modeledTtftMs.p50 < 1000,
      `${fast.modeledTtftMs.p50}`,
    );
    assert.ok((fast.timeline?.busyMs ?? 0) > 40 * 6 * 6, 'decode steps were timed');
  });

  it('a load takes its modeled time: a slower host link delays first tokens, nothing else', async () => {
    const requests = readers(4, 200_000);
    const base = {
      workload: { name: 'readers', requests },
      model: MODEL,
      engine: { numGpuBlocks: 60 },
      cpuBytes: 64 << 20,
      waitsAdvanceClock: false,
      settle: true,
    };
    const fast = await runSimulation({ ...base, timing: timing() });
    // 1 MB/s: a 640-token load of Llama-3.1-8B KV (84 MB) takes 84 s.
    const slow = await runSimulation({ ...base, timing: timing(1e6) });
    assertAddsUp(slow, 'slow link');
    assert.deepEqual(slow.tokens, fast.tokens, 'the same tokens loaded');
    const loaded = fast.tokens.byTier.cpu ?? 0;
    assert.ok(loaded >= 3 * 640, `loads: ${JSON.stringify(fast.tokens)}`);
    // Each loaded token is 128 KiB of Llama-3.1-8B KV: at 1 MB/s, 0.131 s.
    assert.ok(
      slow.modeledTtftMs.mean - fast.modeledTtftMs.mean >
        (0.9 * loaded * 131.072) / requests.length,
      `mean TTFT ${fast.modeledTtftMs.mean} → ${slow.modeledTtftMs.mean}`,
    );
  });

  it('without kvtier, decode fast-forward also passes waiting requests blocked for blocks: same outcome', async () => {
    // Twelve requests at once on a GPU cache that holds three: most wait while others decode,
    // some are preempted, and the waiting ones start only as running ones finish.
    const queue: SimRequest[] = Array.from({ length: 12 }, (_, i) => ({
      id: `q${i}`,
      arrivalMs: i * 5,
      promptTokens: tokens(50 + i, 300 + 40 * i),
      outputTokens: 60 + 10 * i,
    }));
    // Forty requests on three shared prefixes: a waiting head finds cached blocks that decode
    // steps evict, under step budgets small enough that a long prompt's chunk is the budget.
    const prefixes = [tokens(7, 320), tokens(8, 480), tokens(9, 160)];
    const shared: SimRequest[] = Array.from({ length: 40 }, (_, i) => {
      const p = prefixes[i % 3] as Uint32Array;
      const t = new Uint32Array(p.length + 100 + ((i * 37) % 400));
      t.set(p);
      t.set(tokens(50 + i, t.length - p.length), p.length);
      return { id: `s${i}`, arrivalMs: i * 7, promptTokens: t, outputTokens: 30 + ((i * 13) % 90) };
    });
    const cases: [SimRequest[], number, number][] = [
      [queue, 80, 8192],
      [shared, 120, 256],
      [shared, 200, 200],
      [shared, 150, 512],
    ];
    for (const [requests, numGpuBlocks, maxTokensPerStep] of cases) {
      const what = `${requests.length} requests, ${numGpuBlocks} blocks, ${maxTokensPerStep} tokens a step`;
      const base = {
        workload: { name: 'queue', requests },
        model: MODEL,
        engine: { numGpuBlocks, maxTokensPerStep },
        waitsAdvanceClock: false,
        settle: true,
        timing: timing(),
        kvtier: false,
      };
      const fast = await runSimulation(base);
      const slow = await runSimulation({ ...base, hooks: { onStep: () => {} } });
      assertAddsUp(fast, what);
      assert.ok((fast.preemption?.preemptions ?? 0) > 0, `${what}: the queue preempts`);
      assert.ok(
        (fast.fastForwardedSteps ?? 0) > 0.6 * fast.steps,
        `${what}: fast-forwarded ${fast.fastForwardedSteps} of ${fast.steps}`,
      );
      assert.equal(slow.fastForwardedSteps, 0);
      assert.equal(fast.steps, slow.steps, what);
      assert.deepEqual(fast.tokens, slow.tokens, what);
      assert.deepEqual(fast.preemption, slow.preemption, what);
      assert.deepEqual(fast.modeledTtftMs, slow.modeledTtftMs, what);
      assert.deepEqual(fast.timeline, slow.timeline, what);
    }
  });

  it('with kvtier off: the same engine, no sidecar, nothing loaded or saved', async () => {
    const requests = readers(5, 400);
    const off = await runSimulation({
      workload: { name: 'readers', requests },
      model: MODEL,
      engine: { numGpuBlocks: 60 },
      waitsAdvanceClock: false,
      settle: true,
      timing: timing(),
      kvtier: false,
    });
    assertAddsUp(off, 'kvtier off');
    assert.equal(off.kvtier, false);
    assert.deepEqual(off.tokens.byTier, {});
    assert.deepEqual(off.bytes, { saved: 0, loaded: 0 });
    assert.equal(off.verifiedBlocks, 0);
    assert.ok(off.tokens.recomputed > 0);
  });
});

describe('self-reuse after preemption', () => {
  it('a request preempted in its prefill finds its own blocks again: self-reuse, apart', async () => {
    // B is admitted while its whole sequence fits in the 48 blocks (vLLM's admission gate),
    // but A keeps decoding and growing; B's prefill, 15 tokens a step beside A's decode, takes
    // blocks until a step needs one more than is free: B, the newest running request, is
    // preempted in its prefill and comes back after A.
    const rep = await runSimulation({
      workload: {
        name: 'preempt',
        requests: [
          { id: 'A', arrivalMs: 0, promptTokens: tokens(1, 300), outputTokens: 420 },
          { id: 'B', arrivalMs: 1, promptTokens: tokens(2, 440), outputTokens: 4 },
        ],
      },
      model: MODEL,
      engine: { numGpuBlocks: 48, maxTokensPerStep: 16 },
      cpuBytes: 64 << 20,
      waitsAdvanceClock: false,
      settle: true,
    });
    assertAddsUp(rep, 'preempt');
    assert.ok((rep.preemption?.preemptions ?? 0) > 0, 'B was preempted');
    const self = rep.tokens.selfReuse;
    assert.ok(
      self !== undefined && self.gpu + self.kvtier > 0,
      `self-reuse: ${JSON.stringify(rep.tokens)}`,
    );
    assert.equal(rep.tokens.gpuPrefixCache, 0, 'no request shares a prefix with another');
    assert.equal(
      Object.values(rep.tokens.byTier).reduce((a, b) => a + b, 0),
      0,
    );
  });

  it('splits the completing admission by position: own earlier progress beyond the first hit', () => {
    const c = newCounters([]);
    const r = newReq({ id: 'x', arrivalMs: 0, promptTokens: tokens(4, 1000), outputTokens: 1 });
    // First admission found 128 tokens of others' prefixes; it computed up to 700, was preempted;
    // the completing admission finds 256 in the GPU cache and 512 in kvtier (cpu then disk).
    r.firstHitTokens = 128;
    r.ownProgress = 700;
    r.numPreemptions = 1;
    r.adm = { ...emptyAdmission(), gpu: 256, tiers: { cpu: 256, disk: 256 }, recomputed: 232 };
    prefillCompleted(c, r);
    assert.equal(c.gpuPrefixCache, 128, 'GPU [0, 128): others');
    assert.equal(c.selfReuseGpu, 128, 'GPU [128, 256): own');
    assert.equal(c.selfReuseKvtier, 256 + 188, 'cpu [256, 512) and disk [512, 700): own');
    assert.deepEqual(c.byTier, { cpu: 0, disk: 68 }, 'disk [700, 768): a prefix another computed');
    assert.equal(c.recomputed, 232);
    const total =
      c.gpuPrefixCache +
      c.selfReuseGpu +
      c.selfReuseKvtier +
      c.recomputed +
      (c.byTier.cpu ?? 0) +
      (c.byTier.disk ?? 0);
    assert.equal(total, 1000);
  });
});

describe('never slower than recomputing, on the model', () => {
  /**
   * Writers of a long and a short prompt, fillers that push them out of the 200-block GPU cache
   * and the 40-chunk CPU tier, then a reader of each: the readers find the writers' chunks in the
   * `s3` tier only. The engine computes 12,000 tokens/s.
   */
  function stale(): SimRequest[] {
    const long = tokens(41, 2048);
    const short = tokens(42, 256);
    return [
      { id: 'wl', arrivalMs: 0, promptTokens: long, outputTokens: 2 },
      { id: 'ws', arrivalMs: 10, promptTokens: short, outputTokens: 2 },
      ...Array.from({ length: 4 }, (_, i) => ({
        id: `f${i}`,
        arrivalMs: 1000 + 100 * i,
        promptTokens: tokens(200 + i, 900),
        outputTokens: 2,
      })),
      {
        id: 'rl',
        arrivalMs: 5000,
        promptTokens: Uint32Array.from([...long, ...tokens(51, 64)]),
        outputTokens: 2,
      },
      {
        id: 'rs',
        arrivalMs: 6000,
        promptTokens: Uint32Array.from([...short, ...tokens(52, 64)]),
        outputTokens: 2,
      },
    ];
  }

  async function run(s3: { readBytesPerSec: number; floorSeconds: number }) {
    const models = resolveTierModels(speed.gpu.hostLinkBytesPerSec, { s3 });
    return runSimulation({
      workload: { name: 'stale', requests: stale() },
      model: MODEL,
      engine: { numGpuBlocks: 200, prefillTokensPerSec: 12_000, neverSlower: true },
      // 40 chunks (64 tokens of 512 bytes): a request's saves fit, the fillers push them out.
      cpuBytes: 40 * 64 * 512,
      cpuTierOptions: { pageBytes: 64 * 512 },
      lowerTiers: [{ name: 's3', type: 'fs', options: { capacityBytes: 64 << 20 } }],
      waitsAdvanceClock: false,
      settle: true,
      timing: plannerTiming(llama, speed, models),
    });
  }

  it('a slow S3 tier is declined for the short prefix and read for the long one', async () => {
    // 5 GB/s after 50 ms: fetching Llama-3.1-8B KV wins over 12,000 tokens/s of compute past
    // about 880 tokens.
    const rep = await run({ readBytesPerSec: 5e9, floorSeconds: 0.05 });
    assertAddsUp(rep, 'realistic s3');
    const d = rep.tierDecisions?.s3;
    assert.ok(d !== undefined && d.load >= 1 && d.decline >= 1, JSON.stringify(d));
    assert.equal(rep.tokens.byTier.s3, 2048, 'the long prefix came from S3, the short one did not');
  });

  it('a tier slower than computing at any length is never read', async () => {
    // 0.4 GB/s is 3,070 tokens/s of Llama-3.1-8B KV: slower than the engine's 12,000.
    const rep = await run({ readBytesPerSec: 0.4e9, floorSeconds: 0.00575 });
    assertAddsUp(rep, 'slow s3');
    const d = rep.tierDecisions?.s3;
    assert.ok(d !== undefined && d.load === 0 && d.decline >= 2, JSON.stringify(d));
    assert.equal(rep.tokens.byTier.s3 ?? 0, 0);
  });
});
