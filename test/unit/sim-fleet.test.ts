/**
 * The fleet replay against real sidecars: engines with their own GPU caches and CPU tiers and one
 * shared fs tier; a request routed to another engine than the one that computed its prefix loads
 * it from the shared tier (a cross-node hit), byte-exact; with node-local tiers it cannot. And the
 * routers on their own.
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { runFleet } from '../../src/sim/fleet.ts';
import { resolveEngineSpeed } from '../../src/sim/gpu.ts';
import { modelPreset } from '../../src/sim/models.ts';
import { plannerTiming } from '../../src/sim/planner-timing.ts';
import { sourceTokens } from '../../src/sim/report.ts';
import { createRouter } from '../../src/sim/router.ts';
import { resolveTierModels } from '../../src/sim/tier-models.ts';
import type { SimReport, SimRequest, SimTierConfig } from '../../src/sim/types.ts';

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

const llama = modelPreset('llama-3.1-8b');
const speed = resolveEngineSpeed(llama);
const timing = plannerTiming(llama, speed, resolveTierModels(speed.gpu.hostLinkBytesPerSec));
const MODEL = { chunkSize: 64, blockSize: 16, numLayers: 2, numKvHeads: 1, headDim: 2 };

/** Three documents read once each, then queried: round-robin sends each query to another engine. */
function documents(): SimRequest[] {
  const docs = [tokens(1, 512), tokens(2, 512), tokens(3, 512)];
  const out: SimRequest[] = docs.map((d, i) => ({
    id: `read-${i}`,
    arrivalMs: i * 10_000,
    promptTokens: d,
    outputTokens: 4,
  }));
  for (const [i, d] of docs.entries())
    out.push({
      id: `query-${i}`,
      arrivalMs: 60_000 + i * 10_000,
      promptTokens: Uint32Array.from([...d, ...tokens(10 + i, 40)]),
      outputTokens: 4,
    });
  return out;
}

function fsTier(path: string, shared: boolean, engines: number): SimTierConfig[][] {
  const tier = (i: number): SimTierConfig => ({
    name: 'fs',
    type: 'fs',
    options: {
      path: shared ? path : `${path}-${i}`,
      capacityBytes: 64 << 20,
      fsync: 'none',
      sweepIntervalMs: 24 * 3600 * 1000,
    },
  });
  return Array.from({ length: engines }, (_, i) => [tier(i)]);
}

function assertClean(r: SimReport, what: string): void {
  assert.equal(sourceTokens(r), r.promptTokens, `${what}: ${JSON.stringify(r.tokens)}`);
  assert.equal(r.mismatchedBlocks, 0, `${what}: ${JSON.stringify(r.mismatches)}`);
  assert.equal(r.finished, r.requests, `${what}: every request finished`);
  for (const [i, e] of (r.engines ?? []).entries()) {
    assert.equal(sourceTokens(e), e.promptTokens, `${what}, engine ${i}`);
    assert.equal(e.mismatchedBlocks, 0, `${what}, engine ${i}`);
  }
}

describe('runFleet', () => {
  let dir = '';
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'kvtier-fleet-test-'));
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  const base = {
    workload: { name: 'documents', requests: documents() },
    engines: 2,
    router: 'round-robin' as const,
    model: MODEL,
    // Each engine's GPU cache is too small to keep a document until its query; its CPU tier
    // stages 12 chunks, enough for one document's 8 read from the shared tier.
    engine: { numGpuBlocks: 40 },
    cpuBytes: 12 * 4096,
    cpuTierOptions: { pageBytes: 4096 },
    timing,
    sweepTiers: ['fs'],
  };

  it('a shared tier serves a prefix computed on another engine, every loaded block byte-exact', async () => {
    const r = await runFleet({
      ...base,
      engineTiers: fsTier(join(dir, 'shared'), true, 2),
      sharedTiers: ['fs'],
      workDir: join(dir, 'a'),
    });
    assertClean(r, 'shared');
    assert.equal(r.engines?.length, 2);
    assert.deepEqual(
      r.engines?.map((e) => e.requests),
      [3, 3],
      'round-robin: reads 0 and 2 and query 1 on engine 0',
    );
    // Every query ran on the other engine than its document's read: all of it is cross-node.
    const fs = r.tokens.byTier.fs ?? 0;
    assert.equal(fs, 3 * 512, `each query loads its document: ${JSON.stringify(r.tokens)}`);
    assert.equal(r.crossNodeTokens, fs, 'every loaded chunk was computed on the other engine');
    assert.equal(r.verifiedBlocks, fs / 16, 'every loaded block verified');
    assert.equal(
      r.engines?.reduce((n, e) => n + e.verifiedBlocks, 0),
      r.verifiedBlocks,
      'the fleet adds up its engines',
    );
  });

  it("node-local tiers: no engine sees another engine's chunks", async () => {
    const r = await runFleet({
      ...base,
      engineTiers: fsTier(join(dir, 'local'), false, 2),
      workDir: join(dir, 'b'),
    });
    assertClean(r, 'node-local');
    assert.equal(r.tokens.byTier.fs ?? 0, 0);
    assert.equal(r.crossNodeTokens, 0);
  });

  it('peer tiers and no shared store: a prefix computed on one engine is loaded from its home sidecar, byte-exact', async () => {
    const run = `t${process.pid}-${Date.now()}`;
    const listens = [0, 1].map((i) => `inproc://kvtier-sim-${run}-${i}`);
    const peerTier = (i: number): SimTierConfig => ({
      name: 'peer',
      type: 'peer',
      options: {
        self: `node-${i}`,
        peers: listens.map((endpoint, j) => ({ name: `node-${j}`, endpoint })),
        timeoutMs: 600_000,
      },
    });
    const r = await runFleet({
      ...base,
      // Each engine's own disk below its host memory, then the other sidecar.
      engineTiers: fsTier(join(dir, 'peers'), false, 2).map((ts, i) => [...ts, peerTier(i)]),
      listens,
      workDir: join(dir, 'c'),
    });
    assertClean(r, 'peers');
    // Every query ran on the other engine than its document's read: what it loads from the peer
    // tier, the other engine computed. A chunk whose home is the querying engine's own sidecar
    // was sent there when it was saved, and is found in that sidecar's own tiers instead.
    const peer = r.tokens.byTier.peer ?? 0;
    const local = (r.tokens.byTier.fs ?? 0) + (r.tokens.byTier.cpu ?? 0);
    assert.ok(peer > 0, `some chunks came from the other sidecar: ${JSON.stringify(r.tokens)}`);
    assert.equal(
      peer + local,
      3 * 512,
      `each query loads its document: ${JSON.stringify(r.tokens)}`,
    );
    assert.equal(r.crossNodeTokens, 3 * 512, 'every loaded chunk was computed on the other engine');
    assert.equal(r.verifiedBlocks, (3 * 512) / 16, 'every loaded block verified');
  });

  it('routers: round-robin, least-loaded, and prefix affinity that keeps a prefix on one engine', () => {
    const load = [5, 1, 3];
    const engines = load.map((_, i) => ({ outstandingTokens: () => load[i] as number }));
    const o = { chunkTokens: 64, memoryChunks: 100, meanRequestTokens: 10 };
    const rr = createRouter('round-robin', 3, o);
    const r = (id: string, p: Uint32Array): SimRequest => ({
      id,
      arrivalMs: 0,
      promptTokens: p,
      outputTokens: 1,
    });
    const doc = tokens(5, 256);
    assert.deepEqual(
      [0, 1, 2, 3].map((i) => rr.route(r(`x${i}`, doc), engines)),
      [0, 1, 2, 0],
    );
    assert.equal(createRouter('least-loaded', 3, o).route(r('y', doc), engines), 1);
    const pa = createRouter('prefix-affinity', 3, o);
    assert.equal(pa.route(r('a', doc), engines), 1, 'no match: least loaded');
    load[1] = 4;
    assert.equal(pa.route(r('b', Uint32Array.from([...doc, 1, 2])), engines), 1, 'same prefix');
    assert.equal(pa.route(r('c', tokens(6, 256)), engines), 2, 'another prefix: least loaded');
    load[1] = 50;
    assert.equal(pa.route(r('d', doc), engines), 2, 'the balance guard: engine 1 is overloaded');
    assert.throws(() => createRouter('random', 2, o), /--router must be one of/);
  });
});
