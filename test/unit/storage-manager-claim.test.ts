/**
 * "Never slower than recomputing" in the storage manager (claim-rule.ts): a lookup that names the
 * engine's prefill rate claims a lower tier's hits only where fetching them beats computing them,
 * does not ask a tier that could not win, reports every tier's rate and what it decided, and
 * counts the decisions. The lower tier is a gated in-process tier (nothing moves until the test
 * opens its gate, so a get that must not happen would hang the test, and none is timed).
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { afterEach, describe, test } from 'node:test';
import type { ChunkHash } from '../../src/hashing/chunk-hash.ts';
import { KvtierMetrics } from '../../src/metrics/metrics.ts';
import type { LookupInput, LookupOutcome } from '../../src/storage-manager/storage-types.ts';
import { createTestStorage, type TestStorage, taggedHashes } from '../support/fixtures.ts';

const NS = '0123456789abcdef0123456789abcdef';
const NS2 = 'fedcba9876543210fedcba9876543210';
/** 16 tokens of 256 bytes each. */
const TOKENS = 16;
const CHUNK_BYTES = 4096;
/**
 * The gated tier as the tests fix it: 50 ms a request, 1 MB/s. At 1,000 tokens/s of compute,
 * fetching loses below about 68 tokens (0.05 + T * 256 / 1e6 < T / 1000) and wins above.
 */
const SLOW = { readBytesPerSec: 1e6, latencySeconds: 0.05 };
const RATE = 1000;

const open: TestStorage[] = [];

afterEach(async () => {
  await Promise.all(open.splice(0).map((s) => s.storage.close()));
});

function setup(metrics?: KvtierMetrics): TestStorage {
  const s = createTestStorage({ storage: metrics === undefined ? {} : { metrics } });
  open.push(s);
  return s;
}

function chunk() {
  return { tokens: TOKENS, data: randomBytes(CHUNK_BYTES) };
}

/** Teaches the manager the namespace's bytes per token with one stored chunk (the tag `shape`). */
async function learnShape(s: TestStorage, ns = NS): Promise<void> {
  assert.equal(await s.storage.put(ns, taggedHashes(1, `shape-${ns}`)[0]!, chunk()), 'stored');
  await s.storage.writeQueue.idle();
}

async function putTier(
  tier: { put: TestStorage['cpu']['put'] },
  hs: ChunkHash[],
  ns = NS,
): Promise<void> {
  for (const h of hs) assert.equal(await tier.put(ns, h, chunk()), 'stored');
}

function input(id: string, hs: ChunkHash[], extra: Partial<LookupInput> = {}): LookupInput {
  return {
    lookupId: id,
    namespaces: [NS],
    hashes: hs,
    tokenCounts: hs.map(() => TOKENS),
    computeTokensPerSec: RATE,
    ...extra,
  };
}

function decision(out: LookupOutcome, tier: string) {
  return out.rates?.tiers.find((t) => t.tier === tier);
}

describe('claim rule: never slower than recomputing', () => {
  test('without the engine rate every hit is claimed and no rates are reported', async () => {
    const s = setup();
    s.storage.tierRates.fix('gated', SLOW);
    await learnShape(s);
    const hs = taggedHashes(2, 'plain');
    await putTier(s.gated, hs);
    s.gated.gate.open();
    const out = await s.storage.lookup(input('p', hs, { computeTokensPerSec: undefined }));
    assert.equal(out.hitTokens, 2 * TOKENS);
    assert.equal(out.rates, undefined);
  });

  test('a short run in a slow tier is declined without asking the tier: nothing fetched, answered at once', async () => {
    const s = setup();
    s.storage.tierRates.fix('gated', SLOW);
    await learnShape(s);
    const hs = taggedHashes(5, 'short');
    await putTier(s.cpu, hs.slice(0, 4));
    await putTier(s.gated, hs.slice(4));
    const contains = s.gated.calls.contains;
    // The gate stays closed: a get would never finish.
    const out = await s.storage.lookup(input('s', hs));
    assert.equal(out.status, 'ok');
    assert.equal(out.hitChunks, 4, 'the host-memory prefix only');
    assert.deepEqual(out.tiers, [{ tier: 'cpu', tokens: 4 * TOKENS }]);
    assert.equal(s.gated.calls.contains, contains, 'the tier was not asked');
    assert.equal(s.gated.calls.get, 0);
    assert.deepEqual(decision(out, 'gated'), {
      tier: 'gated',
      decision: 'decline',
      readBytesPerSec: SLOW.readBytesPerSec,
      latencySeconds: SLOW.latencySeconds,
      declinedTokens: 0,
    });
    assert.equal(decision(out, 'cpu')?.decision, 'none');
    assert.equal(out.rates?.bytesPerToken, CHUNK_BYTES / TOKENS);
    assert.equal(s.cpu.stats().chunks, 5, 'the shape chunk and the 4 hits: nothing brought in');
  });

  test('a long run in the same tier is worth fetching: claimed and brought into host memory', async () => {
    const s = setup();
    s.storage.tierRates.fix('gated', SLOW);
    await learnShape(s);
    const hs = taggedHashes(8, 'long');
    await putTier(s.gated, hs);
    s.gated.gate.open();
    const out = await s.storage.lookup(input('l', hs));
    assert.equal(out.hitTokens, 8 * TOKENS);
    assert.deepEqual(out.tiers, [{ tier: 'gated', tokens: 8 * TOKENS }]);
    assert.equal(decision(out, 'gated')?.decision, 'load');
    assert.equal(s.gated.calls.get, 1);
  });

  test('a tier asked (the whole prompt could win) whose run is too short is declined after its probe, its pins released', async () => {
    const s = setup();
    s.storage.tierRates.fix('gated', SLOW);
    await learnShape(s);
    const hs = taggedHashes(10, 'probed');
    await putTier(s.gated, hs.slice(0, 2)); // 32 tokens there, 160 asked about
    const out = await s.storage.lookup(input('d', hs));
    assert.equal(out.hitTokens, 0);
    assert.equal(s.gated.calls.contains, 1, 'asked');
    assert.equal(s.gated.calls.get, 0, 'nothing fetched');
    assert.equal(decision(out, 'gated')?.decision, 'decline');
    assert.equal(decision(out, 'gated')?.declinedTokens, 2 * TOKENS);
    assert.equal(s.gated.stats().pinnedChunks ?? 0, 0, 'the probe pins went');
  });

  test('a faster engine declines what a slower one loads', async () => {
    const s = setup();
    s.storage.tierRates.fix('gated', SLOW);
    await learnShape(s);
    const hs = taggedHashes(8, 'rates');
    await putTier(s.gated, hs);
    const fast = await s.storage.lookup(input('fast', hs, { computeTokensPerSec: 1e6 }));
    assert.equal(fast.hitTokens, 0);
    assert.equal(decision(fast, 'gated')?.decision, 'decline');
    s.gated.gate.open();
    const slow = await s.storage.lookup(input('slow', hs, { computeTokensPerSec: 10 }));
    assert.equal(slow.hitTokens, 8 * TOKENS);
    assert.equal(decision(slow, 'gated')?.decision, 'load');
  });

  test('with several namespaces a decline in one cuts the prefix for all', async () => {
    const s = setup();
    s.storage.tierRates.fix('gated', SLOW);
    await learnShape(s, NS);
    await learnShape(s, NS2);
    const hs = taggedHashes(8, 'ranks');
    await putTier(s.cpu, hs, NS);
    await putTier(s.cpu, hs.slice(0, 7), NS2);
    await putTier(s.gated, hs.slice(7), NS2); // NS2's last chunk only below: 16 tokens, declined
    const out = await s.storage.lookup(input('r', hs, { namespaces: [NS, NS2] }));
    assert.equal(out.hitChunks, 7);
    assert.equal(s.gated.calls.get, 0);
  });

  test('an unmeasured tier is fetched from (which measures it); once measured, an engine it cannot beat declines it', async () => {
    const s = setup();
    await learnShape(s);
    const [a, b] = [taggedHashes(2, 'first'), taggedHashes(2, 'second')];
    await putTier(s.gated, [...a, ...b]);
    s.gated.gate.open();
    // No engine computes 1e15 tokens/s: any measured tier loses, an unmeasured one is tried.
    const first = await s.storage.lookup(input('m1', a, { computeTokensPerSec: 1e15 }));
    assert.equal(first.hitTokens, 2 * TOKENS, 'unmeasured: tried');
    assert.equal(decision(first, 'gated')?.decision, 'load');
    const measured = s.storage.tierRates.rate('gated');
    assert.equal(measured.source, 'measured');
    assert.ok((measured.readBytesPerSec ?? 0) > 0 && (measured.latencySeconds ?? -1) >= 0);
    assert.ok((decision(first, 'gated')?.readBytesPerSec ?? 0) > 0, 'reported measured');
    const second = await s.storage.lookup(input('m2', b, { computeTokensPerSec: 1e15 }));
    assert.equal(second.hitTokens, 0);
    assert.equal(decision(second, 'gated')?.decision, 'decline');
    const third = await s.storage.lookup(input('m3', b, { computeTokensPerSec: 1 }));
    assert.equal(third.hitTokens, 2 * TOKENS, 'one token a second: any tier wins');
  });

  test('counts decisions per tier, shows rates in STATS and as gauges', async () => {
    const metrics = new KvtierMetrics({ defaultMetrics: false });
    const s = setup(metrics);
    metrics.bindSources(s.storage.metricSources());
    s.storage.tierRates.fix('gated', SLOW);
    await learnShape(s);
    const short = taggedHashes(1, 'c-short');
    const long = taggedHashes(8, 'c-long');
    await putTier(s.gated, [...short, ...long]);
    await s.storage.lookup(input('c1', short));
    await s.storage.lookup(input('c2', short));
    s.gated.gate.open();
    await s.storage.lookup(input('c3', long));
    await s.storage.lookup(input('c4', long, { computeTokensPerSec: undefined }));
    const text = await metrics.text();
    assert.match(text, /kvtier_lookup_tier_decisions_total\{tier="gated",decision="decline"\} 2\n/);
    assert.match(text, /kvtier_lookup_tier_decisions_total\{tier="gated",decision="load"\} 1\n/);
    assert.doesNotMatch(text, /kvtier_lookup_tier_decisions_total\{tier="cpu"/);
    assert.match(text, /kvtier_tier_read_bandwidth_bytes_per_second\{tier="gated"\} 1000000\n/);
    assert.match(text, /kvtier_tier_read_latency_seconds\{tier="gated"\} 0.05\n/);
    const tiers = s.storage.stats().tiers as { name: string; readRate?: unknown }[];
    assert.equal(tiers[0]!.readRate, undefined, 'host memory has no read rate');
    assert.deepEqual(tiers[1]!.readRate, { bytesPerSec: 1e6, latencyMs: 50, source: 'fixed' });
  });

  test('a lookup cancelled while it fetches reports the rates too', async () => {
    const s = setup();
    await learnShape(s);
    const hs = taggedHashes(2, 'cancelled');
    await putTier(s.gated, hs);
    const pending = s.storage.lookup(input('x', hs)); // unmeasured: fetched, the gate holds it
    while (s.gated.gate.waiting === 0) await new Promise((r) => setImmediate(r));
    assert.equal(s.storage.cancel('x'), true);
    const out = await pending;
    assert.equal(out.status, 'canceled');
    assert.deepEqual(
      out.rates?.tiers.map((t) => t.tier),
      ['cpu', 'gated'],
    );
  });

  test('a lookup host memory answers alone reports the rates, deciding nothing', async () => {
    const s = setup();
    s.storage.tierRates.fix('gated', SLOW);
    await learnShape(s);
    const hs = taggedHashes(3, 'host');
    await putTier(s.cpu, hs);
    const out = s.storage.lookup(input('h', hs));
    assert.ok(!(out instanceof Promise), 'answered at once');
    assert.equal(out.hitTokens, 3 * TOKENS);
    assert.deepEqual(
      out.rates?.tiers.map((t) => [t.tier, t.decision]),
      [
        ['cpu', 'none'],
        ['gated', 'none'],
      ],
    );
    assert.equal(out.rates?.bytesPerToken, CHUNK_BYTES / TOKENS);
  });
});
