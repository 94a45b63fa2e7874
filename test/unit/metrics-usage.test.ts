/**
 * `kvtier_build_info` and the per-namespace usage gauges: what a tier's stats name per namespace
 * (its largest, NAMESPACE_USAGE_LIMIT at most) and the rest as namespace="other", so the label
 * count stays bounded however many namespaces a tier holds.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  type BackendStats,
  boundedNamespaceUsage,
  NAMESPACE_USAGE_LIMIT,
} from '../../src/backends/core/types.ts';
import { KvtierMetrics } from '../../src/metrics/metrics.ts';
import { parsePromText } from '../support/prom-text.ts';

const ns = (i: number) => i.toString(16).padStart(32, '0');

describe('build info and usage per namespace', () => {
  it('kvtier_build_info is 1 with the labels given', async () => {
    const m = new KvtierMetrics({
      defaultMetrics: false,
      buildInfo: { version: '9.9.9', node: 'v24.0.0' },
    });
    const text = await m.text();
    assert.match(text, /^kvtier_build_info\{version="9\.9\.9",node="v24\.0\.0"\} 1$/m);
  });

  it('a tier with many namespaces exports the largest by name and the rest as "other"', async () => {
    const usage = new Map<string, { chunks: number; bytes: number }>();
    for (let i = 0; i < 100; i++) usage.set(ns(i), { chunks: 1 + i, bytes: 1000 * (1 + i) });
    const stats: BackendStats = {
      chunks: 5050,
      bytesUsed: 5_050_000,
      capacityBytes: null,
      pinnedChunks: 0,
      evictions: 0,
      droppedPuts: 0,
      ...boundedNamespaceUsage(usage),
    };
    assert.equal(Object.keys(stats.namespaces!).length, NAMESPACE_USAGE_LIMIT);
    const m = new KvtierMetrics({ defaultMetrics: false });
    m.bindSources({ backends: () => [{ name: 'cpu', stats: () => stats, health: () => 'up' }] });
    const samples = [...parsePromText(await m.text())].filter(([k]) =>
      k.startsWith('kvtier_namespace_bytes{'),
    );
    assert.equal(samples.length, NAMESPACE_USAGE_LIMIT + 1, 'bounded: the largest and "other"');
    const get = (n: string) => samples.find(([k]) => k.includes(`namespace="${n}"`))?.[1];
    assert.equal(get(ns(99)), 100_000, 'the largest by name');
    let rest = 0;
    for (let i = 0; i < 100 - NAMESPACE_USAGE_LIMIT; i++) rest += 1000 * (1 + i);
    assert.equal(get('other'), rest, 'the rest summed');
  });
});
