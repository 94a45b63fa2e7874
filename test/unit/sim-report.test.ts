import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { isKvtierError } from '../../src/errors.ts';
import { formatCapacity, LABEL_CHAR_PX, renderHitRateChart } from '../../src/sim/chart.ts';
import {
  formatReport,
  formatTable,
  hitRate,
  hitRateWithGpu,
  reportToJson,
} from '../../src/sim/report.ts';
import type { SimReport } from '../../src/sim/types.ts';

function sampleReport(over: Partial<SimReport> = {}): SimReport {
  return {
    workload: 'multi-round-qa',
    requests: 8,
    finished: 7,
    failed: 1,
    promptTokens: 10_000,
    tokens: {
      gpuPrefixCache: 2_000,
      byTier: { cpu: 3_000, disk: 1_000 },
      recomputed: 4_000,
      unserved: 0,
    },
    bytes: { saved: 3 * 1024 ** 2, loaded: 1024 ** 2 },
    pendingLookups: { lookups: 5, stepsWaited: 12 },
    verifiedBlocks: 250,
    mismatchedBlocks: 0,
    mismatches: [],
    failures: {
      invalidBlocks: 4,
      recomputedAfterFailure: 64,
      failedRequests: 1,
      faultsInjected: ['redis-outage', 'corrupt'],
    },
    modeledTtftMs: { p50: 12.5, p90: 40.25, mean: 20 },
    wallMs: 1_234,
    steps: 99,
    ...over,
  };
}

describe('hitRate', () => {
  it('counts kvtier tiers over prompt tokens, with and without the GPU prefix cache', () => {
    const r = sampleReport();
    assert.equal(hitRate(r), 0.4);
    assert.equal(hitRateWithGpu(r), 0.6);
    const json = reportToJson(r);
    assert.equal(json.hitRate, 0.4);
    assert.equal(json.hitRateWithGpu, 0.6);
    assert.equal(json.verifiedBlocks, 250);
  });

  it('is 0 for a workload without prompt tokens', () => {
    const r = sampleReport({
      promptTokens: 0,
      tokens: { gpuPrefixCache: 0, byTier: {}, recomputed: 0, unserved: 0 },
    });
    assert.equal(hitRate(r), 0);
    assert.equal(hitRateWithGpu(r), 0);
  });
});

describe('formatReport', () => {
  it('has every section, with per-source percentages', () => {
    const text = formatReport(sampleReport());
    for (const section of [
      'workload multi-round-qa',
      'Prompt tokens',
      'Tokens served, by source',
      'Bytes moved by kvtier',
      'Pending lookups',
      'Verification',
      'Failures and how they were handled',
      'Time to first token (MODELED',
      'Wall time (measured)',
    ]) {
      assert.equal(text.includes(section), true, `report has "${section}"`);
    }
    assert.match(text, /GPU prefix cache\s+2,000\s+20\.0%/);
    assert.match(text, /kvtier tier "cpu"\s+3,000\s+30\.0%/);
    assert.match(text, /kvtier tier "disk"\s+1,000\s+10\.0%/);
    assert.match(text, /recomputed\s+4,000\s+40\.0%/);
    assert.match(text, /hit rate: kvtier 40\.0%, kvtier \+ GPU prefix cache 60\.0%/);
    assert.match(text, /saved \(engine → kvtier\)\s+3 MiB/);
    assert.match(text, /steps waited\s+12/);
    assert.match(text, /mismatched blocks\s+0/);
    assert.match(text, /faults injected:\n {4}- redis-outage\n {4}- corrupt\n/);
    assert.match(text, /requests failed \(policy "fail"\)\s+1/);
    assert.match(text, /Wall time \(measured\): 1\.23 s/);
  });

  it('labels every TTFT figure as modeled', () => {
    const lines = formatReport(sampleReport()).split('\n');
    const ttft = lines.filter((l) => /TTFT/.test(l));
    assert.equal(ttft.length, 3);
    for (const l of ttft) assert.match(l, /modeled TTFT (p50|p90|mean)/);
    assert.equal(ttft.join('\n').includes('40.3 ms'), true, 'p90 printed in ms');
  });

  it('lists mismatches with request, block and layer, and counts the unlisted ones', () => {
    const text = formatReport(
      sampleReport({
        mismatchedBlocks: 25,
        mismatches: [
          { requestId: 'mrqa-u0-r1', block: 3, layer: 2 },
          { requestId: 'mrqa-u1-r1', block: 7, layer: 0 },
        ],
      }),
    );
    assert.match(text, /mismatched blocks\s+25/);
    assert.match(text, /request mrqa-u0-r1, block 3, layer 2/);
    assert.match(text, /request mrqa-u1-r1, block 7, layer 0/);
    assert.match(text, /and 23 more not listed/);
  });
});

describe('formatTable', () => {
  it('aligns columns under a header and a rule', () => {
    assert.deepEqual(
      formatTable(
        [
          ['64 MiB', '1.0%'],
          ['1 GiB', '55.5%'],
        ],
        ['cpu', 'hit rate'],
      ),
      ['cpu     hit rate', '------  --------', '64 MiB      1.0%', '1 GiB      55.5%'],
    );
  });
});

/** Minimal SVG checks: one root element, balanced tags, and the polylines' points. */
function parseSvg(svg: string): { polylines: [number, number][][]; texts: string[] } {
  assert.equal((svg.match(/<svg\b/g) ?? []).length, 1, 'exactly one <svg>');
  assert.equal((svg.match(/<\/svg>/g) ?? []).length, 1, 'exactly one </svg>');
  assert.equal(svg.trimStart().startsWith('<svg'), true, 'starts with <svg');
  assert.equal(svg.trimEnd().endsWith('</svg>'), true, 'ends with </svg>');
  const stack: string[] = [];
  for (const m of svg.matchAll(/<(\/?)([a-zA-Z]+)[^>]*?(\/?)>/g)) {
    const [, close, name, selfClose] = m;
    if (selfClose === '/') continue;
    if (close === '/') assert.equal(stack.pop(), name, `</${name}> closes the open tag`);
    else stack.push(name as string);
  }
  assert.deepEqual(stack, [], 'every tag closed');
  const polylines = [...svg.matchAll(/<polyline[^>]*\bpoints="([^"]*)"/g)].map((m) =>
    (m[1] as string)
      .trim()
      .split(/\s+/)
      .map((p) => p.split(',').map(Number) as [number, number]),
  );
  const texts = [...svg.matchAll(/<text[^>]*>([^<]*)<\/text>/g)].map((m) => m[1] as string);
  return { polylines, texts };
}

describe('renderHitRateChart', () => {
  const capacitiesBytes = [64 * 1024 ** 2, 256 * 1024 ** 2, 1024 ** 3];

  it('is well-formed SVG with one point per sweep value, axis labels and a title', () => {
    const svg = renderHitRateChart({
      title: 'kvtier hit rate vs CPU tier capacity — trace:<conv>',
      xLabel: 'CPU tier capacity',
      capacitiesBytes,
      series: [
        { name: 'kvtier', values: [0.1, 0.3, 0.6] },
        { name: 'kvtier + GPU', values: [0.2, 0.4, 0.7] },
      ],
    });
    const { polylines, texts } = parseSvg(svg);
    assert.equal(polylines.length, 2);
    for (const line of polylines) assert.equal(line.length, capacitiesBytes.length);
    assert.equal(texts.includes('CPU tier capacity (bytes, log scale)'), true, 'x axis label');
    assert.equal(texts.includes('hit rate (% of prompt tokens)'), true, 'y axis label');
    assert.equal(
      texts.includes('kvtier hit rate vs CPU tier capacity — trace:&#60;conv&#62;'),
      true,
      'escaped title',
    );
    for (const t of ['64 MiB', '256 MiB', '1 GiB', '0%', '100%', '10.0%', '60.0%', '70.0%']) {
      assert.equal(texts.includes(t), true, `label ${t}`);
    }
    assert.equal((svg.match(/<circle\b/g) ?? []).length, 6);
  });

  it('draws rising hit rates as rising points, left to right in capacity order', () => {
    const svg = renderHitRateChart({
      title: 't',
      xLabel: 'disk tier capacity',
      // Given out of order: the chart sorts by capacity.
      capacitiesBytes: [1024 ** 3, 64 * 1024 ** 2, 256 * 1024 ** 2],
      series: [{ name: 'kvtier', values: [0.9, 0.2, 0.5] }],
    });
    const [line] = parseSvg(svg).polylines;
    assert.ok(line !== undefined, 'one polyline');
    const xs = line.map(([x]) => x);
    const ys = line.map(([, y]) => y);
    for (let i = 1; i < line.length; i++) {
      assert.equal(xs[i]! > xs[i - 1]!, true, 'x increases with capacity');
      assert.equal(ys[i]! < ys[i - 1]!, true, 'higher hit rate is drawn higher (smaller y)');
    }
    // Log scale: 64M → 256M → 1G are equal steps (factors of 4).
    assert.equal(Math.abs(xs[1]! - xs[0]! - (xs[2]! - xs[1]!)) < 0.2, true, 'even log steps');
  });

  it('never lets two value labels overlap, even where the lines meet', () => {
    // Five series, three of them equal at every capacity and two a hair apart: the worst case.
    const svg = renderHitRateChart({
      title: 't',
      xLabel: 'cpu tier capacity',
      capacitiesBytes: Array.from({ length: 8 }, (_, i) => 2 ** (30 + i)),
      series: [0.294, 0.294, 0.294, 0.05, 0.051].map((v, k) => ({
        name: `s${k}`,
        values: Array.from({ length: 8 }, (_, i) => v + i * 0.001),
      })),
    });
    const boxes = [
      ...svg.matchAll(/<text class="value" x="([\d.]+)" y="([\d.]+)"[^>]*>([^<]*)</g),
    ].map((m) => {
      const x = Number(m[1]);
      const y = Number(m[2]);
      // 12 px text: the glyphs sit in [y - 10, y + 2]; a digit is at most 7 px wide.
      return { x0: x, x1: x + (m[3] as string).length * LABEL_CHAR_PX, y0: y - 10, y1: y + 2 };
    });
    assert.equal(boxes.length, 40, 'a label per point');
    for (const [i, a] of boxes.entries())
      for (const b of boxes.slice(i + 1)) {
        const apart = a.x1 <= b.x0 || b.x1 <= a.x0 || a.y1 <= b.y0 || b.y1 <= a.y0;
        assert.ok(apart, `labels overlap: ${JSON.stringify([a, b])}`);
      }
  });

  it('refuses a series without one value per capacity', () => {
    assert.throws(
      () =>
        renderHitRateChart({
          title: 't',
          xLabel: 'x',
          capacitiesBytes,
          series: [{ name: 'kvtier', values: [0.1] }],
        }),
      (err: unknown) =>
        isKvtierError(err, 'KVT_INVALID_ARGUMENT') &&
        /one finite value per capacity/.test(err.message),
    );
  });
});

describe('formatCapacity', () => {
  it('keeps binary sizes binary and decimal sizes decimal', () => {
    assert.equal(formatCapacity(256 * 1024 ** 2), '256 MiB');
    assert.equal(formatCapacity(64e6), '64 MB');
    assert.equal(formatCapacity(1.5e9), '1.5 GB');
    assert.equal(formatCapacity(1000), '1000 B');
    assert.equal(formatCapacity(1_234_567), '1.2 MiB');
  });
});
