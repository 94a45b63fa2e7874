import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Histogram, Registry } from 'prom-client';
import { histogramTallyOf } from '../../src/metrics/histogram-tally.ts';
import { onObserve } from '../../src/metrics/prom-helpers.ts';

const BUCKETS = [0.001, 0.01, 0.1, 1];
const VALUES = [0, 0.0005, 0.001, 0.002, 0.01, 0.05, 0.5, 1, 3, 1e9];

function pair(labelNames: string[]) {
  const registry = new Registry();
  const make = (name: string) =>
    new Histogram({ name, help: 'h', labelNames, buckets: BUCKETS, registers: [registry] });
  return { registry, tallied: make('t_tallied_seconds'), plain: make('t_plain_seconds') };
}

/** The exposition of one histogram with its name replaced, to compare two of them. */
async function text(h: Histogram<string>, name: string): Promise<string> {
  const got = await h.get();
  return got.values
    .map((v) => JSON.stringify(v).replaceAll(name, 'X'))
    .sort()
    .join('\n');
}

test('a histogram tally reads as the same histogram observed value by value', async () => {
  const { tallied, plain } = pair(['tier', 'op']);
  const a = histogramTallyOf(tallied).child({ tier: 'cpu', op: 'contains' });
  const b = histogramTallyOf(tallied).child({ tier: 'cpu', op: 'get' });
  assert.equal(
    histogramTallyOf(tallied).child({ tier: 'cpu', op: 'contains' }),
    a,
    'one per labels',
  );
  for (const v of VALUES) {
    a.observe(v);
    plain.observe({ tier: 'cpu', op: 'contains' }, v);
  }
  b.observe(0.02);
  plain.observe({ tier: 'cpu', op: 'get' }, 0.02);
  // Observed through the histogram itself too: both land in the same series.
  tallied.observe({ tier: 'cpu', op: 'get' }, 0.3);
  plain.observe({ tier: 'cpu', op: 'get' }, 0.3);
  assert.equal(await text(tallied, 't_tallied_seconds'), await text(plain, 't_plain_seconds'));
  a.observe(0.05);
  plain.observe({ tier: 'cpu', op: 'contains' }, 0.05);
  assert.equal(await text(tallied, 't_tallied_seconds'), await text(plain, 't_plain_seconds'));
});

test('a histogram without labels, through the registry, after a reset', async () => {
  const { registry, tallied, plain } = pair([]);
  const c = histogramTallyOf(tallied).child({});
  for (const v of VALUES) {
    c.observe(v);
    plain.observe(v);
  }
  const out = await registry.metrics();
  const series = (name: string) =>
    out
      .split('\n')
      .filter((l) => l.startsWith(name))
      .map((l) => l.slice(name.length))
      .join('\n');
  assert.equal(series('t_tallied_seconds'), series('t_plain_seconds'));
  assert.match(out, /t_tallied_seconds_count 10/);
  tallied.reset();
  plain.reset();
  c.observe(0.5);
  plain.observe(0.5);
  assert.equal(await text(tallied, 't_tallied_seconds'), await text(plain, 't_plain_seconds'));
});

test('values an onObserve callback watches are reported at once; bad values throw', () => {
  const { tallied } = pair([]);
  const seen: number[] = [];
  onObserve(tallied, (v) => seen.push(v));
  const c = histogramTallyOf(tallied).child({});
  c.observe(0.25);
  c.observe(2);
  assert.deepEqual(seen, [0.25, 2]);
  assert.throws(() => c.observe(Number.NaN), TypeError);
  assert.throws(() => c.observe(Number.POSITIVE_INFINITY), TypeError);
});

test('with exemplars on, children observe through the histogram', async () => {
  const registry = new Registry<typeof Registry.OPENMETRICS_CONTENT_TYPE>();
  registry.setContentType(Registry.OPENMETRICS_CONTENT_TYPE);
  const h = new Histogram({
    name: 't_ex_seconds',
    help: 'h',
    buckets: BUCKETS,
    enableExemplars: true,
    registers: [registry],
  });
  histogramTallyOf(h).child({}).observe(0.5);
  const got = await h.get();
  assert.equal(got.values.find((v) => v.metricName === 't_ex_seconds_count')?.value, 1);
});
