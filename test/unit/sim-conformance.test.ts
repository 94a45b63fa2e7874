/**
 * Conformance of the engine's connector state machine, each case a short simulator run against
 * a real in-process sidecar: preempted and resumed through a load, aborted while loading, load
 * failure under both policies, prefix-cache reset during loads, `updateStateAfterAlloc` twice,
 * full-prompt hits (the last token is always computed), and partial-chunk claims (the engine's
 * prefix cache ends inside a stored chunk).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  runSimulation,
  type SimControl,
  type SimEvent,
  type SimHooks,
} from '../../src/sim/engine.ts';
import { sourceTokens } from '../../src/sim/report.ts';
import type { SimReport, SimRequest } from '../../src/sim/types.ts';

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

function req(id: string, arrivalMs: number, prompt: number[], outputTokens: number): SimRequest {
  return { id, arrivalMs, promptTokens: Uint32Array.from(prompt), outputTokens };
}

const MODEL = { chunkSize: 32, blockSize: 16 };
const LIVE = new Set(['waiting', 'waiting_for_remote_kvs', 'running', 'preempted']);

/** Records events and leak state; empties the engine's prefix cache whenever it is idle. */
function harness(requests: readonly SimRequest[], extra: SimHooks = {}) {
  const events: SimEvent[] = [];
  const end = { usedBlocks: -1, tracked: -1 };
  const hooks: SimHooks = {
    ...extra,
    onEvent: (e) => events.push(e),
    onStep: async (step, ctl) => {
      if (!requests.some((r) => LIVE.has(ctl.status(r.id) ?? ''))) ctl.resetPrefixCache();
      await extra.onStep?.(step, ctl);
    },
    onFinish: (ctl) => {
      end.usedBlocks = ctl.blockStats().usedBlocks;
      end.tracked = ctl.trackedRequests;
    },
  };
  const statuses = (id: string) =>
    events
      .filter((e) => e.type === 'status' && e.requestId === id)
      .map((e) => (e as { to: string }).to);
  const loads = (id: string) =>
    events
      .filter((e) => e.type === 'load-done' && e.requestId === id)
      .map((e) => {
        const l = e as Extract<SimEvent, { type: 'load-done' }>;
        return [l.tokens, l.validTokens];
      });
  return { hooks, events, end, statuses, loads };
}

function assertClean(rep: SimReport, end: { usedBlocks: number; tracked: number }): void {
  assert.equal(rep.mismatchedBlocks, 0, `mismatches ${JSON.stringify(rep.mismatches)}`);
  assert.equal(rep.finished + rep.failed + (rep.aborted ?? 0), rep.requests, 'every request ended');
  assert.deepEqual(end, { usedBlocks: 0, tracked: 0 }, 'no block or connector state left');
  assert.equal(
    sourceTokens(rep),
    rep.promptTokens,
    `every prompt token has one source: ${JSON.stringify(rep.tokens)}`,
  );
}

/** W saves a 160-token prompt (5 chunks); X, arriving later, extends it and loads it from kvtier. */
function writerThenReader(): SimRequest[] {
  const w = tokens(21, 160);
  return [req('W', 0, w, 1), req('X', 100, [...w, ...tokens(22, 40)], 4)];
}

describe('connector state machine', () => {
  it('preempted, then resumed through a kvtier load: back to PREEMPTED, then RUNNING', async () => {
    const requests = [req('A', 0, tokens(11, 160), 100), req('B', 0, tokens(12, 160), 100)];
    let reset = false;
    const h = harness(requests, {
      onStep: (_, ctl) => {
        // B's blocks are gone; drop the engine's cached copies too so it resumes from kvtier.
        if (!reset && ctl.status('B') === 'preempted') reset = ctl.resetPrefixCache();
      },
    });
    const rep = await runSimulation({
      waitsAdvanceClock: false,
      workload: { name: 'preempt', requests },
      model: MODEL,
      engine: { numGpuBlocks: 24 },
      hooks: h.hooks,
    });
    assertClean(rep, h.end);
    assert.equal(rep.finished, 2);
    assert.deepEqual(h.statuses('B'), [
      'waiting',
      'running',
      'preempted',
      'waiting_for_remote_kvs',
      'preempted',
      'running',
      'finished',
    ]);
    assert.deepEqual(h.loads('B'), [[128, 128]], '4 chunks before the last token');
    // A is often preempted too (while B runs). How many of its blocks the engine's prefix cache
    // still holds then depends on when: it resumes with at most one load, a partial-chunk claim
    // of whole blocks beyond them, every loaded block verified.
    const a = h.loads('A');
    assert.ok(a.length <= 1, JSON.stringify(a));
    const aTokens = a.length === 0 ? 0 : a[0]![0]!;
    assert.ok(
      aTokens % MODEL.blockSize === 0 &&
        aTokens <= 128 &&
        (a.length === 0 || a[0]?.[1] === aTokens),
      JSON.stringify(a),
    );
    assert.equal(rep.verifiedBlocks, 8 + aTokens / MODEL.blockSize);
    assert.equal(h.statuses('A').at(-1), 'finished');
  });

  it('aborted while loading: the blocks are freed only once the worker reports the transfer over', async () => {
    const requests = writerThenReader();
    let aborted: boolean | undefined;
    const h = harness(requests, {
      onStep: (_, ctl: SimControl) => {
        if (aborted === undefined && ctl.status('X') === 'waiting_for_remote_kvs')
          aborted = ctl.abort('X');
      },
    });
    const rep = await runSimulation({
      waitsAdvanceClock: false,
      workload: { name: 'abort', requests },
      model: MODEL,
      hooks: h.hooks,
    });
    assert.equal(aborted, true);
    assertClean(rep, h.end);
    assert.equal(rep.aborted, 1);
    assert.equal(rep.finished, 1);
    assert.deepEqual(h.statuses('X'), ['waiting', 'waiting_for_remote_kvs', 'aborted']);
    assert.deepEqual(h.loads('X'), [], 'an aborted request is not resumed');
    const freed = h.events.filter((e) => e.type === 'freed' && e.requestId === 'X');
    assert.deepEqual(
      freed.map((e) => (e as { delayed: boolean }).delayed),
      [true],
      'freed once, when the worker reported the load (finishedRecving)',
    );
  });

  it('load failure under recompute: rolled back to the valid prefix, recomputed, byte-exact', async () => {
    const requests = writerThenReader();
    const h = harness(requests);
    const rep = await runSimulation({
      waitsAdvanceClock: false,
      workload: { name: 'recompute', requests },
      model: MODEL,
      engine: { kvLoadFailurePolicy: 'recompute' },
      faults: { evictBetweenLookupAndLoadAtStep: 1 },
      hooks: h.hooks,
    });
    assertClean(rep, h.end);
    assert.equal(rep.finished, 2);
    assert.deepEqual(h.loads('X'), [[160, 0]]);
    assert.equal(rep.failures.invalidBlocks, 10);
    assert.equal(rep.failures.recomputedAfterFailure, 160);
    assert.equal(rep.failures.failedRequests, 0);
    assert.equal(rep.tokens.recomputed, 160 + 200, 'X recomputed its whole prompt');
    assert.ok(
      rep.failures.faultsInjected.some((s) => s.startsWith('evict-between-lookup-and-load@step')),
      rep.failures.faultsInjected.join('; '),
    );
    assert.deepEqual(h.statuses('X'), [
      'waiting',
      'waiting_for_remote_kvs',
      'waiting',
      'running',
      'finished',
    ]);
  });

  it('load failure under fail: the request finishes as failed', async () => {
    const requests = writerThenReader();
    const h = harness(requests);
    const rep = await runSimulation({
      waitsAdvanceClock: false,
      workload: { name: 'fail', requests },
      model: MODEL,
      engine: { kvLoadFailurePolicy: 'fail' },
      faults: { evictBetweenLookupAndLoadAtStep: 1 },
      hooks: h.hooks,
    });
    assertClean(rep, h.end);
    assert.equal(rep.finished, 1);
    assert.equal(rep.failed, 1);
    assert.equal(rep.failures.failedRequests, 1);
    assert.equal(rep.failures.recomputedAfterFailure, 0);
    assert.deepEqual(h.statuses('X'), ['waiting', 'waiting_for_remote_kvs', 'failed']);
  });

  it('reset prefix cache during loads: the loads complete byte-exact', async () => {
    const w1 = tokens(31, 160);
    const w2 = tokens(32, 160);
    const requests = [
      req('W1', 0, w1, 1),
      req('W2', 0, w2, 1),
      req('X1', 100, [...w1, ...tokens(33, 40)], 2),
      req('X2', 100, [...w2, ...tokens(34, 40)], 2),
    ];
    const loadingAtReset: string[] = [];
    const h = harness(requests, {
      onStep: (_, ctl) => {
        const loading = ['X1', 'X2'].filter((id) => ctl.status(id) === 'waiting_for_remote_kvs');
        if (loadingAtReset.length === 0 && loading.length > 0 && ctl.resetPrefixCache())
          loadingAtReset.push(...loading);
      },
    });
    const rep = await runSimulation({
      waitsAdvanceClock: false,
      workload: { name: 'reset', requests },
      model: MODEL,
      hooks: h.hooks,
    });
    assertClean(rep, h.end);
    assert.equal(rep.finished, 4);
    assert.ok(loadingAtReset.length > 0, 'the reset happened while a load was in flight');
    for (const id of loadingAtReset) assert.deepEqual(h.loads(id), [[160, 160]], id);
    assert.ok(rep.verifiedBlocks >= 10, `verified ${rep.verifiedBlocks}`);
  });

  it('updateStateAfterAlloc called twice: the second call decides the load', async () => {
    const ws = [41, 42, 43].map((s) => tokens(s, 160));
    const requests = [
      ...ws.map((w, i) => req(`W${i + 1}`, 0, w, 1)),
      ...ws.map((w, i) => req(`X${i + 1}`, 100, [...w, ...tokens(50 + i, 40)], 2)),
    ];
    const second: Record<string, (t: number) => number> = {
      X1: (t) => t,
      X2: (t) => t - MODEL.chunkSize,
      X3: () => 0,
    };
    const h = harness(requests, { onLoadAlloc: (a) => second[a.requestId]?.(a.externalTokens) });
    const rep = await runSimulation({
      waitsAdvanceClock: false,
      workload: { name: 'twice', requests },
      model: MODEL,
      hooks: h.hooks,
    });
    assertClean(rep, h.end);
    assert.equal(rep.finished, 6);
    const intents = (id: string) =>
      h.events
        .filter((e) => e.type === 'alloc-intent' && e.requestId === id)
        .map((e) => (e as { externalTokens: number }).externalTokens);
    assert.deepEqual(intents('X1'), [160, 160]);
    assert.deepEqual(intents('X2'), [160, 128]);
    assert.deepEqual(intents('X3'), [160, 0]);
    assert.deepEqual(h.loads('X1'), [[160, 160]], 'the same intent twice is one load');
    assert.deepEqual(h.loads('X2'), [[128, 128]]);
    assert.deepEqual(h.loads('X3'), [], 'a second call with 0 clears the intent');
    assert.deepEqual(rep.tokens.byTier, { cpu: 288 });
    assert.equal(rep.tokens.recomputed, 3 * 160 + (200 - 160) + (200 - 128) + 200);
  });

  for (const partialChunkLoads of [true, false])
    it(`engine prefix ending inside a stored chunk, partialChunkLoads ${partialChunkLoads}`, async () => {
      // W stores 5 chunks. P (W's first 48 tokens and one more) runs long, keeping 3 blocks of W's
      // prefix in the engine's cache: X (W and 40 more tokens) finds 48 tokens there, inside chunk 1.
      const w = tokens(71, 160);
      const requests = [
        req('W', 0, w, 1),
        req('P', 100, [...w.slice(0, 48), 7], 300),
        req('X', 150, [...w, ...tokens(72, 40)], 1),
      ];
      const h = harness(requests);
      const rep = await runSimulation({
        waitsAdvanceClock: false,
        workload: { name: 'partial', requests },
        model: MODEL,
        engine: { partialChunkLoads },
        hooks: h.hooks,
      });
      assertClean(rep, h.end);
      assert.equal(rep.finished, 3);
      assert.equal(h.statuses('P').includes('preempted'), false);
      assert.deepEqual(h.loads('P'), [[32, 32]], 'P loads chunk 0 and computes the rest');
      if (partialChunkLoads) {
        // The rest of chunk 1 (tokens 48..63, one block skipped) and chunks 2..4.
        assert.deepEqual(h.loads('X'), [[112, 112]]);
        assert.equal(rep.verifiedBlocks, 2 + 7);
        assert.deepEqual(rep.tokens.byTier, { cpu: 32 + 112 });
        assert.equal(rep.tokens.recomputed, 160 + 17 + 40);
      } else {
        assert.deepEqual(h.loads('X'), [], 'a claim from inside a chunk is 0');
        assert.equal(rep.verifiedBlocks, 2);
        assert.equal(rep.tokens.recomputed, 160 + 17 + 152);
      }
      assert.equal(rep.tokens.gpuPrefixCache, 48);
    });

  it('full-prompt hit: the last token is still computed', async () => {
    const w1 = tokens(61, 128); // exactly 4 chunks: 3 are looked up
    const w2 = tokens(62, 129); // 4 chunks and a token: all 4 load, 1 token computed
    const requests = [
      req('W1', 0, w1, 1),
      req('W2', 0, w2, 1),
      req('R1', 100, w1, 1),
      req('R2', 100, w2, 1),
    ];
    const h = harness(requests);
    const rep = await runSimulation({
      waitsAdvanceClock: false,
      workload: { name: 'full', requests },
      model: MODEL,
      hooks: h.hooks,
    });
    assertClean(rep, h.end);
    assert.equal(rep.finished, 4);
    assert.deepEqual(h.loads('R1'), [[96, 96]]);
    assert.deepEqual(h.loads('R2'), [[128, 128]]);
    assert.equal(rep.tokens.recomputed, 128 + 129 + 32 + 1);
    assert.deepEqual(rep.tokens.byTier, { cpu: 224 });
    assert.equal(rep.verifiedBlocks, 224 / MODEL.blockSize);
  });
});
