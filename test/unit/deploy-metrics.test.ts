/**
 * The metrics the deployment's dashboard and alerts rely on beyond the backend decorator's:
 * lookups answered past the engines' deadline, data-plane bytes by direction, and no gauge
 * named like a counter among the process metrics.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { CopyEngine, CopySurface, DeviceSurface } from '../../src/data-plane/data-plane.ts';
import { instrumentCopyEngine } from '../../src/data-plane/instrumented-copy-engine.ts';
import { isKvtierError } from '../../src/errors.ts';
import { KvtierMetrics } from '../../src/metrics/metrics.ts';
import { parsePromText, seriesKey } from '../support/prom-text.ts';

async function samples(m: KvtierMetrics): Promise<Map<string, number>> {
  return parsePromText(await m.text());
}

describe('kvtier_lookups_past_deadline_total', () => {
  it('counts lookup durations above the deadline (default 2 s), labeled or not', async () => {
    const m = new KvtierMetrics({ defaultMetrics: false });
    assert.equal(m.lookupDeadlineSeconds, 2);
    m.lookupDuration.observe(0.001);
    m.lookupDuration.observe(2);
    m.lookupDuration.observe(2.5);
    m.lookupDuration.observe({}, 7);
    const s = await samples(m);
    assert.equal(s.get('kvtier_lookups_past_deadline_total'), 2);
    assert.equal(s.get('kvtier_lookup_duration_seconds_count'), 4, 'every duration observed');
  });

  it('takes the deadline from the options and refuses a bad one', async () => {
    const m = new KvtierMetrics({ defaultMetrics: false, lookupDeadlineSeconds: 0.05 });
    m.lookupDuration.observe(0.06);
    assert.equal((await samples(m)).get('kvtier_lookups_past_deadline_total'), 1);
    for (const bad of [0, -1, Number.NaN, Number.POSITIVE_INFINITY, '2' as unknown as number])
      assert.throws(
        () => new KvtierMetrics({ defaultMetrics: false, lookupDeadlineSeconds: bad }),
        (err) =>
          isKvtierError(err, 'KVT_INVALID_ARGUMENT') && /lookupDeadlineSeconds/.test(err.message),
      );
  });
});

describe('instrumentCopyEngine', () => {
  const device: DeviceSurface = { sizeBytes: 1 << 20, close: async () => {} };

  function recorder(fail = false) {
    const calls: { surfaces: readonly CopySurface[]; ops: Float64Array }[] = [];
    const engine: CopyEngine = {
      openFile: async () => device,
      async copy(surfaces, ops) {
        calls.push({ surfaces, ops });
        if (fail) throw new Error('copy failed');
      },
    };
    return { engine, calls };
  }

  it('counts device-to-host bytes as save and host-to-device bytes as load, once a batch resolves', async () => {
    const m = new KvtierMetrics({ defaultMetrics: false });
    const { engine, calls } = recorder();
    const wrapped = instrumentCopyEngine(engine, m);
    const host = new Uint8Array(4096);
    const other = new Uint8Array(64);
    // save: device(0) -> host(1), twice; load: host(1) -> device(0); host -> host is not counted
    await wrapped.copy(
      [device, host, other],
      Float64Array.of(0, 0, 1, 0, 1000, 0, 1000, 1, 1000, 24, 1, 0, 0, 0, 512, 1, 0, 2, 0, 64),
    );
    assert.equal(calls.length, 1, 'one batch to the inner engine');
    assert.deepEqual([...calls[0]!.ops].length, 20, 'ops passed through unchanged');
    const s = await samples(m);
    assert.equal(s.get(seriesKey('kvtier_dataplane_bytes_total', { direction: 'save' })), 1024);
    assert.equal(s.get(seriesKey('kvtier_dataplane_bytes_total', { direction: 'load' })), 512);
  });

  it('counts nothing for a batch that rejects, and keeps the rejection', async () => {
    const m = new KvtierMetrics({ defaultMetrics: false });
    const wrapped = instrumentCopyEngine(recorder(true).engine, m);
    await assert.rejects(
      wrapped.copy([device, new Uint8Array(8)], Float64Array.of(0, 0, 1, 0, 8)),
      /copy failed/,
    );
    const s = await samples(m);
    assert.equal(
      s.get(seriesKey('kvtier_dataplane_bytes_total', { direction: 'save' })),
      undefined,
    );
  });

  it('has openCuda and cudaDevices exactly when the inner engine has them', () => {
    const m = new KvtierMetrics({ defaultMetrics: false });
    const plain = instrumentCopyEngine(recorder().engine, m);
    assert.equal(plain.openCuda, undefined);
    assert.equal(plain.cudaDevices, undefined);
    const cuda: CopyEngine = {
      ...recorder().engine,
      openCuda: async () => device,
      cudaDevices: () => ['GPU-1'],
    };
    const wrapped = instrumentCopyEngine(cuda, m);
    assert.deepEqual(wrapped.cudaDevices?.(), ['GPU-1']);
    assert.equal(typeof wrapped.openCuda, 'function');
  });
});

describe('process metrics', () => {
  it('no gauge carries the counter suffix _total', async () => {
    const m = new KvtierMetrics();
    const text = await m.text();
    const gaugesNamedTotal = [...text.matchAll(/^# TYPE (\S+_total) (\S+)$/gm)]
      .filter((t) => t[2] !== 'counter')
      .map((t) => t[1]);
    assert.deepEqual(gaugesNamedTotal, []);
    assert.match(text, /^# TYPE kvtier_nodejs_active_handles gauge$/m, 'the per-type gauges stay');
  });
});
