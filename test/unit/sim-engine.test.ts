/**
 * The engine simulator against a real in-process sidecar: a multi-round workload finishes with
 * every loaded block byte-exact, kvtier and the GPU prefix cache both serving tokens; the block
 * allocator on its own; and the fault runs (lookup deadline, corrupted chunk, Redis outage,
 * sidecar restart), each finishing every request with 0 mismatches and counting what happened.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { BlockAllocator, mapKey } from '../../src/sim/block-allocator.ts';
import { runSimulation, type SimControl } from '../../src/sim/engine.ts';
import { prefixHashes } from '../../src/sim/kv-model.ts';
import { sourceTokens } from '../../src/sim/report.ts';
import type { SimReport, SimRequest } from '../../src/sim/types.ts';
import { type RedisServer, startRedis } from '../support/redis-server.ts';

function tokens(seed: number, n: number): number[] {
  const out: number[] = [];
  let x = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out.push((x >>> 0) % 32_000);
  }
  return out;
}

/** Users x rounds over a shared system prompt; each round extends the user's history. */
function multiRound(a: {
  users: number;
  rounds: number;
  systemTokens: number;
  questionTokens: number;
  outputTokens: number;
  roundGapMs: number;
}): SimRequest[] {
  const system = tokens(1, a.systemTokens);
  const out: SimRequest[] = [];
  for (let u = 0; u < a.users; u++) {
    let history = [...system];
    for (let r = 0; r < a.rounds; r++) {
      history = [...history, ...tokens(1000 * (u + 1) + r, a.questionTokens)];
      out.push({
        id: `u${u}-r${r}`,
        arrivalMs: r * a.roundGapMs + u,
        promptTokens: Uint32Array.from(history),
        outputTokens: a.outputTokens,
        group: `u${u}`,
      });
      history = [...history, ...tokens(7 + 31 * u + r, a.outputTokens)];
    }
  }
  return out;
}

function sum(o: Record<string, number>): number {
  return Object.values(o).reduce((a, b) => a + b, 0);
}

/** The invariants every run must keep. */
function assertClean(rep: SimReport, what: string): void {
  assert.equal(
    sourceTokens(rep),
    rep.promptTokens,
    `${what}: every prompt token has one source: ${JSON.stringify(rep.tokens)}`,
  );
  assert.equal(rep.mismatchedBlocks, 0, `${what}: mismatches ${JSON.stringify(rep.mismatches)}`);
  assert.deepEqual(rep.mismatches, []);
  assert.equal(
    rep.finished + rep.failed + (rep.aborted ?? 0),
    rep.requests,
    `${what}: every request ended`,
  );
}

/**
 * A hook that empties the engine's prefix cache whenever the engine is idle (between rounds),
 * so the next round's prefixes go to kvtier. Resetting while lookups are pending would discard
 * their answers every step.
 */
function noGpuCache(requests: readonly SimRequest[]) {
  const live = new Set(['waiting', 'waiting_for_remote_kvs', 'running', 'preempted']);
  return {
    onStep: (_: number, ctl: SimControl) => {
      if (!requests.some((r) => live.has(ctl.status(r.id) ?? ''))) ctl.resetPrefixCache();
    },
  };
}

const MODEL = { chunkSize: 64, blockSize: 16 };
// 4 layers x K/V x 2 heads x 16 dims x bf16.
const TOKEN_BYTES = 2 * 4 * 2 * 16 * 2;

describe('BlockAllocator', () => {
  it('refcounts, shares cached blocks and evicts the least recently freed first', () => {
    const a = new BlockAllocator({ numBlocks: 4 });
    // Blocks of one token: the key of block j is the prefix hash at position j.
    const h = prefixHashes(Uint32Array.from([7, 8, 9]));
    const x = a.allocate(2)!;
    assert.deepEqual(x, [0, 1]);
    a.cache(0, h, 0);
    a.cache(1, h, 1);
    assert.deepEqual(a.findCached(h, 3, 1), [0, 1]);
    a.touch([0]);
    a.free(x);
    assert.deepEqual(a.stats(), { usedBlocks: 1, freeBlocks: 3, cachedBlocks: 2, evictions: 0 });
    assert.equal(a.canAllocate([0], 3), true);
    assert.equal(a.canAllocate([1], 3), false, 'touching free block 1 takes it from the queue');
    // Blocks 2 and 3 were never used; block 1 was freed last, so it is evicted last.
    assert.deepEqual(a.allocate(3), [2, 3, 1]);
    assert.deepEqual(a.findCached(h, 2, 1), [0], 'block 1 was evicted with its key');
    assert.equal(a.stats().evictions, 1);
    assert.equal(a.allocate(1), null, 'nothing free');
    a.reset();
    assert.deepEqual(a.findCached(h, 1, 1), []);
    a.free([0]);
    assert.throws(() => a.free([0]), { code: 'KVT_INTERNAL' });
    assert.throws(() => a.touch([9]), { code: 'KVT_INVALID_ARGUMENT' });
  });

  it('never takes one prefix for another that shares the map key', () => {
    const a = new BlockAllocator({ numBlocks: 2 });
    // Positions 0 and 1 agree in the first 53 bits of their hash and differ in the last one.
    const h = Uint32Array.from([0x12345678, 0x9abcdef0, 0x12345678, 0x9abcdef1]);
    assert.equal(mapKey(h, 0), mapKey(h, 1));
    a.allocate(1);
    a.cache(0, h, 0);
    assert.deepEqual(a.findCached(h, 1, 1), [0]);
    assert.deepEqual(a.findCached(h.subarray(2), 1, 1), [], 'the other prefix misses');
  });
});

describe('runSimulation', () => {
  it('multi-round QA: 0 mismatches, kvtier serves later rounds, the GPU prefix cache hits too', async () => {
    const requests = multiRound({
      users: 4,
      rounds: 3,
      systemTokens: 256,
      questionTokens: 150,
      outputTokens: 8,
      roundGapMs: 1000,
    });
    let leak: { used: number; tracked: number } | undefined;
    const rep = await runSimulation({
      waitsAdvanceClock: false,
      workload: { name: 'multi-round', requests },
      model: MODEL,
      engine: { numGpuBlocks: 56, maxTokensPerStep: 512 },
      cpuBytes: 64 << 20,
      hooks: {
        onFinish: (ctl) => {
          leak = { used: ctl.blockStats().usedBlocks, tracked: ctl.trackedRequests };
        },
      },
    });
    assertClean(rep, 'multi-round');
    assert.equal(rep.finished, requests.length);
    assert.equal(rep.workload, 'multi-round');
    assert.equal(
      rep.promptTokens,
      requests.reduce((n, r) => n + r.promptTokens.length, 0),
    );
    assert.ok(rep.tokens.byTier.cpu! > 0, `kvtier served tokens: ${JSON.stringify(rep.tokens)}`);
    assert.ok(rep.tokens.gpuPrefixCache > 0, `GPU prefix cache hit: ${JSON.stringify(rep.tokens)}`);
    assert.ok(rep.verifiedBlocks > 0, 'loaded blocks were verified');
    // Loads of an admission a preemption threw away were verified and moved too.
    const loaded =
      sum(rep.tokens.byTier) +
      (rep.tokens.selfReuse?.kvtier ?? 0) +
      (rep.preemption?.reloadedTokens ?? 0);
    assert.equal(rep.verifiedBlocks, loaded / MODEL.blockSize, 'every loaded block verified');
    assert.equal(rep.bytes.loaded, loaded * TOKEN_BYTES, 'bytes loaded match the tokens');
    assert.ok(
      rep.bytes.saved > 0 && rep.bytes.saved % (MODEL.chunkSize * TOKEN_BYTES) === 0,
      'whole chunks saved',
    );
    assert.ok(
      rep.pendingLookups.lookups > 0 &&
        rep.pendingLookups.stepsWaited >= rep.pendingLookups.lookups,
      'lookups waited',
    );
    assert.ok(rep.modeledTtftMs.p50 > 0 && rep.modeledTtftMs.p90 >= rep.modeledTtftMs.p50, 'ttft');
    assert.deepEqual(rep.failures, {
      invalidBlocks: 0,
      recomputedAfterFailure: 0,
      failedRequests: 0,
      faultsInjected: [],
    });
    assert.deepEqual(leak, { used: 0, tracked: 0 }, 'no block or connector state left');
  });

  it('an aborted signal stops a paced run with KVT_ABORTED', async () => {
    const ac = new AbortController();
    const run = runSimulation({
      waitsAdvanceClock: false,
      workload: {
        name: 'late',
        requests: [
          {
            id: 'late',
            arrivalMs: 60_000,
            promptTokens: Uint32Array.from(tokens(3, 40)),
            outputTokens: 1,
          },
        ],
      },
      model: MODEL,
      timeScale: 1,
      hooks: { onStep: (step) => void (step === 1 && setImmediate(() => ac.abort())) },
      signal: ac.signal,
    });
    await assert.rejects(run, { code: 'KVT_ABORTED' });
  });

  it('rejects bad options before starting anything', async () => {
    const workload = { name: 'w', requests: [] };
    await assert.rejects(
      runSimulation({
        waitsAdvanceClock: false,
        workload,
        engine: { numGpuBlocks: 0 },
      }),
      {
        code: 'KVT_INVALID_ARGUMENT',
        message: /engine\.numGpuBlocks must be an integer in \[1/,
      },
    );
    await assert.rejects(
      runSimulation({
        waitsAdvanceClock: false,
        workload,
        model: { chunkSize: 40, blockSize: 16 },
      }),
      /multiple of model\.blockSize/,
    );
    await assert.rejects(
      runSimulation({
        waitsAdvanceClock: false,
        workload,
        faults: { redisOutage: { atStep: 2, forSteps: 2 } },
      }),
      /hooks\.killRedis/,
    );
    await assert.rejects(
      runSimulation({
        waitsAdvanceClock: false,
        workload,
        faults: { corruptChunks: { atStep: 1, count: 1 } },
      }),
      /lowest tier/,
    );
  });
});

describe('fault runs', () => {
  let redis: RedisServer;
  before(async () => {
    redis = await startRedis();
  });
  after(async () => {
    await redis?.stop();
  });

  const twoRounds = () =>
    multiRound({
      users: 4,
      rounds: 2,
      systemTokens: 128,
      questionTokens: 96,
      outputTokens: 3,
      roundGapMs: 1000,
    });

  it('a lookup deadline passes: the lookups answer 0 and the requests recompute', async () => {
    const rep = await runSimulation({
      waitsAdvanceClock: false,
      workload: { name: 'deadline', requests: twoRounds() },
      model: MODEL,
      engine: { numGpuBlocks: 128 },
      faults: { lookupDeadlineAtStep: 1 },
    });
    assertClean(rep, 'deadline');
    assert.equal(rep.finished, 8);
    const f = rep.failures.faultsInjected;
    assert.ok(
      f.some((s) => s.startsWith('lookup-deadline@step 1')),
      f.join('; '),
    );
    assert.ok(
      f.some((s) => /lookups past their deadline: [1-9]/.test(s)),
      f.join('; '),
    );
  });

  it('a stored chunk corrupted on disk is caught by its checksum: a miss, never a mismatch', async () => {
    // Ordered by events, not by wall time: u0 saves; once its blocks are freed (its saves are
    // in the CPU tier and queued for the disk), the next step waits for the write-through queue
    // to drain, so u0's chunks are on the disk before any filler saves and the fault (at the
    // first step that finds chunks on the disk) corrupts only u0's. The fillers then push u0's
    // chunks out of the 4-page CPU tier; u0's second round arrives once the engine is idle
    // (modeled clock, waits not counted) and reads them from disk.
    const u0 = tokens(5, 200);
    const requests: SimRequest[] = [
      { id: 'u0-r0', arrivalMs: 0, promptTokens: Uint32Array.from(u0), outputTokens: 2 },
      ...Array.from({ length: 6 }, (_, i) => ({
        id: `filler-${i}`,
        arrivalMs: 100 + i,
        promptTokens: Uint32Array.from(tokens(50 + i, 200)),
        outputTokens: 2,
      })),
      {
        id: 'u0-r1',
        arrivalMs: 400,
        promptTokens: Uint32Array.from([...u0, ...tokens(6, 60)]),
        outputTokens: 2,
      },
    ];
    const noGpu = noGpuCache(requests);
    let u0Freed = false;
    let u0OnDisk = false;
    const diskChunksAtFault: number[] = [];
    const rep = await runSimulation({
      waitsAdvanceClock: false,
      workload: { name: 'corrupt', requests },
      model: MODEL,
      engine: { numGpuBlocks: 128 },
      // The CPU arena's pages are 64 KiB: 4 chunks.
      cpuBytes: 4 * 64 * 1024,
      lowerTiers: [{ name: 'disk', type: 'local-disk', options: { capacityBytes: 64 << 20 } }],
      faults: { corruptChunks: { atStep: 1, count: 1000 } },
      hooks: {
        onEvent: (e) => {
          if (e.type === 'freed' && e.requestId === 'u0-r0') u0Freed = true;
        },
        onStep: async (step, ctl) => {
          noGpu.onStep(step, ctl);
          if (u0Freed && !u0OnDisk) {
            u0OnDisk = true;
            await ctl.sidecar.storage.writeQueue.idle();
            const disk = ctl.sidecar.storage.tiers.find((t) => t.name === 'disk')!;
            diskChunksAtFault.push(disk.stats().chunks);
          }
        },
      },
    });
    assert.deepEqual(diskChunksAtFault, [3], "u0's 3 chunks, and only they, reached the disk");
    assertClean(rep, 'corrupt');
    assert.equal(rep.finished, requests.length);
    const f = rep.failures.faultsInjected;
    assert.ok(
      f.some((s) =>
        /^corrupt-chunks@step \d+: [1-9]\d* stored chunks corrupted on tier "disk"/.test(s),
      ),
      f.join('; '),
    );
    assert.ok(
      f.some((s) => /corrupt chunks detected by the sidecar: [1-9]/.test(s)),
      f.join('; '),
    );
  });

  it('Redis killed and restarted mid-run: every request finishes', async () => {
    const requests = twoRounds();
    const rep = await runSimulation({
      waitsAdvanceClock: false,
      workload: { name: 'redis', requests },
      model: MODEL,
      engine: { numGpuBlocks: 128 },
      cpuBytes: 4 * 64 * 1024,
      lowerTiers: [
        {
          name: 'redis',
          type: 'redis',
          options: { url: redis.url, timeoutMs: 300, connectTimeoutMs: 2000 },
        },
      ],
      faults: { redisOutage: { atStep: 3, forSteps: 4 } },
      hooks: {
        ...noGpuCache(requests),
        killRedis: () => redis.kill(),
        restartRedis: () => redis.restart(),
      },
    });
    assertClean(rep, 'redis');
    assert.equal(rep.finished, 8);
    const f = rep.failures.faultsInjected.filter((s) => s.startsWith('redis-outage'));
    assert.deepEqual(
      f.map((s) => s.replace(/:.*/, '')),
      ['redis-outage@step 3', 'redis-outage@step 7'],
    );
  });

  it('the sidecar restarts mid-run: the disk tier is recovered and serves the later rounds', async () => {
    const requests = multiRound({
      users: 6,
      rounds: 2,
      systemTokens: 128,
      questionTokens: 96,
      outputTokens: 2,
      roundGapMs: 0,
    }).map((r) =>
      r.id.endsWith('r1') ? { ...r, arrivalMs: 1000 * Number(r.group!.slice(1)) + 1000 } : r,
    );
    const rep = await runSimulation({
      waitsAdvanceClock: false,
      workload: { name: 'restart', requests },
      model: MODEL,
      engine: { numGpuBlocks: 128 },
      lowerTiers: [{ name: 'disk', type: 'local-disk', options: { capacityBytes: 64 << 20 } }],
      faults: { sidecarRestartAtStep: 12 },
      hooks: noGpuCache(requests),
    });
    assertClean(rep, 'restart');
    assert.equal(rep.finished, 12);
    const f = rep.failures.faultsInjected;
    assert.ok(
      f.some((s) => /^sidecar-restart@step 12: .*recovered disk: [1-9]\d* chunks/.test(s)),
      f.join('; '),
    );
    assert.ok(
      rep.tokens.byTier.disk! > 0,
      `disk served after the restart: ${JSON.stringify(rep.tokens)}`,
    );
  });
});
