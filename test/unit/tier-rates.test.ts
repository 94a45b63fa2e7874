/**
 * Live tier rates (src/storage-manager/tier-rates.ts): decayed means of probes (latency) and gets
 * (bandwidth) on an injected clock, staleness, fixed rates, and the bytes per token of each
 * namespace.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { isKvtierError } from '../../src/errors.ts';
import { ChunkShapes, MIN_WEIGHT, TierRates } from '../../src/storage-manager/tier-rates.ts';

const NS = '0123456789abcdef0123456789abcdef';

function close(actual: number | undefined, expected: number, what: string): void {
  assert.ok(
    actual !== undefined && Math.abs(actual - expected) <= 1e-9 * Math.max(1, Math.abs(expected)),
    `${what}: ${actual} != ${expected}`,
  );
}

describe('TierRates', () => {
  it('knows nothing of a tier before its first sample: fetches of it are not estimated', () => {
    const r = new TierRates({ now: () => 0 });
    assert.deepEqual(r.rate('s3'), {
      readBytesPerSec: undefined,
      latencySeconds: undefined,
      source: 'none',
    });
    assert.equal(r.fetchSeconds('s3', 1 << 20), undefined);
  });

  it('takes the latency from probes and the bandwidth from gets less that latency', () => {
    let now = 0;
    const r = new TierRates({ now: () => now });
    r.recordProbe('s3', 0.02);
    r.recordProbe('s3', 0.04);
    close(r.rate('s3').latencySeconds, 0.03, 'mean latency');
    assert.equal(r.rate('s3').readBytesPerSec, undefined, 'no get yet');
    // 10 MB in 0.13 s, of which 0.03 s latency: 100 MB/s.
    r.recordGet('s3', 10e6, 0.13);
    now = 10;
    const rate = r.rate('s3');
    close(rate.readBytesPerSec, 100e6, 'bandwidth');
    assert.equal(rate.source, 'measured');
    close(r.fetchSeconds('s3', 50e6), 0.03 + 0.5, 'fetch = latency + bytes / bandwidth');
  });

  it('weighs recent samples more: each halves every half-life', () => {
    let now = 0;
    const r = new TierRates({ halfLifeMs: 1000, now: () => now });
    r.recordProbe('disk', 0.001);
    now = 1000; // the first sample now counts 1/2
    r.recordProbe('disk', 0.004);
    close(r.rate('disk').latencySeconds, (0.5 * 0.001 + 0.004) / 1.5, 'decayed mean');
  });

  it('forgets an estimate whose samples have decayed: the tier counts as unmeasured again', () => {
    let now = 0;
    const r = new TierRates({ halfLifeMs: 1000, now: () => now });
    r.recordProbe('s3', 0.05);
    r.recordGet('s3', 1e6, 0.06);
    assert.notEqual(r.fetchSeconds('s3', 1), undefined);
    // One sample of weight 1 falls under MIN_WEIGHT after log2(1 / MIN_WEIGHT) half-lives.
    now = Math.ceil(1000 * Math.log2(1 / MIN_WEIGHT)) + 1;
    assert.deepEqual(r.rate('s3'), {
      readBytesPerSec: undefined,
      latencySeconds: undefined,
      source: 'none',
    });
    assert.equal(r.fetchSeconds('s3', 1), undefined);
  });

  it('a get no slower than the probes still took time: a tenth of it counts as transfer', () => {
    const r = new TierRates({ now: () => 0 });
    r.recordProbe('redis', 0.01);
    r.recordGet('redis', 1000, 0.005);
    close(r.rate('redis').readBytesPerSec, 1000 / 0.0005, 'bandwidth from a tenth of the get');
  });

  it('ignores samples that carry nothing to measure', () => {
    const r = new TierRates({ now: () => 0 });
    r.recordGet('disk', 0, 0.01);
    r.recordGet('disk', 100, Number.NaN);
    r.recordProbe('disk', -1);
    r.recordProbe('disk', Number.POSITIVE_INFINITY);
    assert.equal(r.rate('disk').source, 'none');
  });

  it('a fixed rate overrides measurements until it is lifted', () => {
    const r = new TierRates({ now: () => 0 });
    r.recordProbe('s3', 0.001);
    r.recordGet('s3', 1e9, 1.001);
    r.fix('s3', { readBytesPerSec: 4e8, latencySeconds: 0.00575 });
    assert.deepEqual(r.rate('s3'), {
      readBytesPerSec: 4e8,
      latencySeconds: 0.00575,
      source: 'fixed',
    });
    r.fix('s3', undefined);
    assert.equal(r.rate('s3').source, 'measured');
    close(r.rate('s3').readBytesPerSec, 1e9, 'measured again');
  });

  it('refuses a bad half-life and a bad fixed rate with KVT_INVALID_ARGUMENT', () => {
    for (const halfLifeMs of [0, -1, Number.NaN, Number.POSITIVE_INFINITY])
      assert.throws(
        () => new TierRates({ halfLifeMs }),
        (e: unknown) => isKvtierError(e, 'KVT_INVALID_ARGUMENT') && /halfLifeMs/.test(String(e)),
      );
    const r = new TierRates();
    for (const bad of [
      { readBytesPerSec: 0, latencySeconds: 0 },
      { readBytesPerSec: -1, latencySeconds: 0 },
      { readBytesPerSec: 1, latencySeconds: -0.1 },
      { readBytesPerSec: Number.POSITIVE_INFINITY, latencySeconds: 0 },
    ])
      assert.throws(
        () => r.fix('s3', bad),
        (e: unknown) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
      );
  });
});

describe('ChunkShapes', () => {
  it('remembers the bytes per token of each namespace from its chunks', () => {
    const s = new ChunkShapes();
    assert.equal(s.bytesPerToken(NS), undefined);
    s.record(NS, 32 << 20, 256);
    assert.equal(s.bytesPerToken(NS), 131072);
    s.record(NS, 0, 256);
    s.record(NS, 100, 0);
    assert.equal(s.bytesPerToken(NS), 131072, 'empty chunks change nothing');
  });

  it('keeps at most 1024 namespaces, forgetting the least recently changed', () => {
    const s = new ChunkShapes();
    const ns = (i: number) => i.toString(16).padStart(32, '0');
    for (let i = 0; i <= 1024; i++) s.record(ns(i), 8 * (i + 1), 1);
    assert.equal(s.bytesPerToken(ns(0)), undefined);
    assert.equal(s.bytesPerToken(ns(1)), 16);
    assert.equal(s.bytesPerToken(ns(1024)), 8 * 1025);
  });
});
