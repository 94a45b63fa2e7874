import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Gauge, register as globalRegistry, Registry } from 'prom-client';
import type { BackendHealth, BackendStats } from '../../src/backends/core/types.ts';
import { isKvtierError } from '../../src/errors.ts';
import {
  KvtierMetrics,
  LATENCY_BUCKETS_SECONDS,
  type MetricBackendSource,
} from '../../src/metrics/metrics.ts';
import { assertValidPromText, parsePromText, seriesKey } from '../support/prom-text.ts';

const STATS: BackendStats = {
  chunks: 0,
  bytesUsed: 0,
  capacityBytes: null,
  pinnedChunks: 0,
  evictions: 0,
  droppedPuts: 0,
};

class FakeSource implements MetricBackendSource {
  statsCalls = 0;
  constructor(
    readonly name: string,
    public s: BackendStats,
    public h: BackendHealth = 'up',
  ) {}
  stats(): BackendStats {
    this.statsCalls++;
    return this.s;
  }
  health(): BackendHealth {
    return this.h;
  }
}

async function scrape(m: KvtierMetrics): Promise<Map<string, number>> {
  return parsePromText(await m.text());
}

describe('KvtierMetrics', () => {
  it('renders valid exposition text with the Prometheus 0.0.4 content type', async () => {
    const m = new KvtierMetrics();
    m.lookups.inc({ result: 'hit' });
    m.lookupDuration.observe(0.003);
    const text = await m.text();
    assertValidPromText(text);
    assert.equal(m.contentType, 'text/plain; version=0.0.4; charset=utf-8');
    // default process metrics are collected under the kvtier_ prefix
    assert.match(text, /^kvtier_process_cpu_user_seconds_total /m);
    assert.doesNotMatch(text, /^process_cpu_user_seconds_total /m);
  });

  it('records counters and histograms under kvtier_ names with typed labels', async () => {
    const m = new KvtierMetrics({ defaultMetrics: false });
    m.lookups.inc({ result: 'hit' }, 2);
    m.lookups.inc({ result: 'timeout' });
    m.lookupRequestedTokens.inc(1024);
    m.lookupHitTokens.inc({ tier: 'cpu' }, 512);
    m.requests.inc({ type: 'lookup' });
    m.protocolErrors.inc({ code: 'KVT_PROTOCOL' });
    m.writeThroughDropped.inc({ tier: 'disk', reason: 'queue_full' });
    m.pinsExpired.inc();
    m.lookupDuration.observe(0.0004);
    m.lookupDuration.observe(3);
    const s = await scrape(m);
    assert.equal(s.get(seriesKey('kvtier_lookups_total', { result: 'hit' })), 2);
    assert.equal(s.get(seriesKey('kvtier_lookups_total', { result: 'timeout' })), 1);
    assert.equal(s.get('kvtier_lookup_requested_tokens_total'), 1024);
    assert.equal(s.get(seriesKey('kvtier_lookup_hit_tokens_total', { tier: 'cpu' })), 512);
    assert.equal(s.get(seriesKey('kvtier_requests_total', { type: 'lookup' })), 1);
    assert.equal(s.get(seriesKey('kvtier_protocol_errors_total', { code: 'KVT_PROTOCOL' })), 1);
    assert.equal(
      s.get(seriesKey('kvtier_writethrough_dropped_total', { tier: 'disk', reason: 'queue_full' })),
      1,
    );
    assert.equal(s.get('kvtier_pins_expired_total'), 1);
    assert.equal(s.get(seriesKey('kvtier_lookup_duration_seconds_bucket', { le: '0.0005' })), 1);
    assert.equal(s.get(seriesKey('kvtier_lookup_duration_seconds_bucket', { le: '2.5' })), 1);
    assert.equal(s.get(seriesKey('kvtier_lookup_duration_seconds_bucket', { le: '5' })), 2);
    assert.equal(s.get('kvtier_lookup_duration_seconds_count'), 2);
    for (const key of s.keys()) assert.match(key, /^kvtier_/);
  });

  it('uses latency buckets from 50 µs to 10 s, increasing and log-spaced', () => {
    const b = LATENCY_BUCKETS_SECONDS;
    assert.equal(b[0], 0.00005);
    assert.equal(b.at(-1), 10);
    for (let i = 1; i < b.length; i++) {
      const ratio = b[i]! / b[i - 1]!;
      assert.ok(ratio >= 2 && ratio <= 2.5, `ratio ${ratio} between ${b[i - 1]} and ${b[i]}`);
    }
  });

  it('keeps two instances apart and never touches the global registry', async () => {
    const a = new KvtierMetrics();
    const b = new KvtierMetrics();
    a.lookups.inc({ result: 'miss' }, 5);
    const sa = await scrape(a);
    const sb = await scrape(b);
    assert.equal(sa.get(seriesKey('kvtier_lookups_total', { result: 'miss' })), 5);
    assert.equal(sb.get(seriesKey('kvtier_lookups_total', { result: 'miss' })), undefined);
    assert.equal(globalRegistry.getSingleMetric('kvtier_lookups_total'), undefined);
  });

  it('registers into an injected registry and refuses a second instance on it', async () => {
    const registry = new Registry();
    const m = new KvtierMetrics({ registry, defaultMetrics: false });
    assert.equal(m.registry, registry);
    m.pinsExpired.inc(3);
    assert.match(await registry.metrics(), /^kvtier_pins_expired_total 3$/m);
    assert.throws(
      () => new KvtierMetrics({ registry, defaultMetrics: false }),
      (err) =>
        isKvtierError(err, 'KVT_INVALID_ARGUMENT') && /kvtier_lookups_total/.test(err.message),
    );
  });

  it('rejects bad options with KVT_INVALID_ARGUMENT', () => {
    assert.throws(
      () => new KvtierMetrics({ defaultMetrics: 'yes' as unknown as boolean }),
      (err) => isKvtierError(err, 'KVT_INVALID_ARGUMENT') && /defaultMetrics/.test(err.message),
    );
    assert.throws(
      () => new KvtierMetrics({ registry: {} as Registry }),
      (err) => isKvtierError(err, 'KVT_INVALID_ARGUMENT'),
    );
  });

  it('reads per-tier gauges and totals from bound backends at scrape time', async () => {
    const m = new KvtierMetrics({ defaultMetrics: false });
    const cpu = new FakeSource('cpu', {
      chunks: 4,
      bytesUsed: 4096,
      capacityBytes: 8192,
      pinnedChunks: 2,
      evictions: 7,
      droppedPuts: 1,
    });
    const disk = new FakeSource('disk', { ...STATS, chunks: 9, corruptObjects: 3 }, 'degraded');
    let list: FakeSource[] = [cpu, disk];
    m.bindSources({ backends: () => list });

    let s = await scrape(m);
    const tier = (name: string, t: string) => s.get(seriesKey(name, { tier: t }));
    assert.equal(tier('kvtier_backend_chunks', 'cpu'), 4);
    assert.equal(tier('kvtier_backend_chunks', 'disk'), 9);
    assert.equal(tier('kvtier_backend_bytes', 'cpu'), 4096);
    assert.equal(tier('kvtier_backend_capacity_bytes', 'cpu'), 8192);
    assert.equal(tier('kvtier_backend_capacity_bytes', 'disk'), undefined, 'null capacity omitted');
    assert.equal(tier('kvtier_backend_pinned_chunks', 'cpu'), 2);
    assert.equal(tier('kvtier_backend_evictions_total', 'cpu'), 7);
    assert.equal(tier('kvtier_backend_dropped_puts_total', 'cpu'), 1);
    assert.equal(tier('kvtier_backend_corrupt_chunks_total', 'disk'), 3);
    assert.equal(
      tier('kvtier_backend_corrupt_chunks_total', 'cpu'),
      undefined,
      'absent when the tier does not report it',
    );
    assert.equal(tier('kvtier_backend_health', 'cpu'), 1);
    assert.equal(tier('kvtier_backend_health', 'disk'), 0.5);
    assert.equal(cpu.statsCalls, 1, 'one stats() read per backend per scrape');

    cpu.s = { ...cpu.s, chunks: 1, evictions: 10 };
    disk.h = 'down';
    list = [cpu];
    s = await scrape(m);
    assert.equal(tier('kvtier_backend_chunks', 'cpu'), 1);
    assert.equal(tier('kvtier_backend_evictions_total', 'cpu'), 10, 'total equals the source');
    assert.equal(tier('kvtier_backend_chunks', 'disk'), undefined, 'removed tier disappears');
    assert.equal(tier('kvtier_backend_health', 'disk'), undefined);
    assert.equal(cpu.statsCalls, 2);
  });

  it('produces no samples for unbound sources and reflects bound ones', async () => {
    const m = new KvtierMetrics({ defaultMetrics: false });
    const unbound = await scrape(m);
    for (const name of [
      'kvtier_serializer_capacity_chunks',
      'kvtier_serializer_in_use_chunks',
      'kvtier_serializer_waiters',
      'kvtier_events_expired_total',
      'kvtier_pinned_lookups',
      'kvtier_writethrough_queue_depth',
      'kvtier_epoch',
    ]) {
      assert.equal(unbound.get(name), undefined, name);
    }
    assert.equal(unbound.get(seriesKey('kvtier_events', { state: 'ongoing' })), undefined);

    let inUse = 3;
    m.bindSources({
      serializer: () => ({ capacity: 64, inUse, waiters: 2 }),
      events: () => ({ ongoing: 5, done: 6, expiredTotal: 11 }),
      pinnedLookups: () => 4,
      writeQueueDepth: () => 12,
      epoch: () => 42,
    });
    let s = await scrape(m);
    assert.equal(s.get('kvtier_serializer_capacity_chunks'), 64);
    assert.equal(s.get('kvtier_serializer_in_use_chunks'), 3);
    assert.equal(s.get('kvtier_serializer_waiters'), 2);
    assert.equal(s.get(seriesKey('kvtier_events', { state: 'ongoing' })), 5);
    assert.equal(s.get(seriesKey('kvtier_events', { state: 'done' })), 6);
    assert.equal(s.get('kvtier_events_expired_total'), 11);
    assert.equal(s.get('kvtier_pinned_lookups'), 4);
    assert.equal(s.get('kvtier_writethrough_queue_depth'), 12);
    assert.equal(s.get('kvtier_epoch'), 42);

    inUse = 9;
    m.bindSources({ epoch: undefined });
    s = await scrape(m);
    assert.equal(s.get('kvtier_serializer_in_use_chunks'), 9, 'read again at each scrape');
    assert.equal(s.get('kvtier_epoch'), undefined, 'unbound with undefined');
    assert.equal(s.get('kvtier_pinned_lookups'), 4, 'other sources stay bound');
  });

  it('skips a throwing source, counts it, and keeps the scrape going', async () => {
    const m = new KvtierMetrics({ defaultMetrics: false });
    const ok = new FakeSource('cpu', { ...STATS, chunks: 2 });
    const bad: MetricBackendSource = {
      name: 'remote',
      stats: () => {
        throw new Error('stats broke');
      },
      health: () => 'up',
    };
    m.bindSources({
      backends: () => [ok, bad],
      serializer: () => {
        throw new Error('serializer broke');
      },
      epoch: () => 1,
    });
    const text = await m.text();
    assertValidPromText(text);
    const s = parsePromText(text);
    assert.equal(s.get(seriesKey('kvtier_backend_chunks', { tier: 'cpu' })), 2);
    assert.equal(s.get(seriesKey('kvtier_backend_chunks', { tier: 'remote' })), undefined);
    assert.equal(s.get(seriesKey('kvtier_backend_health', { tier: 'remote' })), 1);
    assert.equal(s.get('kvtier_serializer_capacity_chunks'), undefined);
    assert.equal(s.get('kvtier_epoch'), 1);
    assert.equal(s.get(seriesKey('kvtier_metric_source_errors_total', { source: 'backends' })), 1);
    assert.equal(
      s.get(seriesKey('kvtier_metric_source_errors_total', { source: 'serializer' })),
      1,
    );
  });
});

const GOOD = `# A plain comment
# HELP req_total Requests with a \\\\ and a \\n in help.
# TYPE req_total counter
req_total{path="/a",code="200"} 3
req_total{code="500",path="/b\\"q\\"\\\\x\\ny",} 1 1712345678000

# TYPE temp gauge
temp -1.5e3
temp{where="in"} NaN
temp{where="out"} +Inf
temp{where="deep"} -Inf
untyped_thing 7
# TYPE lat histogram
lat_bucket{le="0.1",op="get"} 1
lat_bucket{le="1",op="get"} 4
lat_bucket{le="+Inf",op="get"} 4
lat_sum{op="get"} 2.5
lat_count{op="get"} 4
lat_bucket{le="+Inf",op="put"} 0
lat_sum{op="put"} 0
lat_count{op="put"} 0
# TYPE rpc summary
rpc{quantile="0.5"} 0.2
rpc_sum 10
rpc_count 40
`;

describe('prom-text validator', () => {
  it('accepts valid text and returns samples keyed by sorted labels', () => {
    assertValidPromText(GOOD);
    const s = parsePromText(GOOD);
    assert.equal(s.get('req_total{code="200",path="/a"}'), 3);
    assert.equal(s.get(seriesKey('req_total', { path: '/b"q"\\x\ny', code: '500' })), 1);
    assert.equal(s.get('temp'), -1500);
    assert.ok(Number.isNaN(s.get('temp{where="in"}')));
    assert.equal(s.get('temp{where="out"}'), Number.POSITIVE_INFINITY);
    assert.equal(s.get('temp{where="deep"}'), Number.NEGATIVE_INFINITY);
    assert.equal(s.get('lat_bucket{le="1",op="get"}'), 4);
    assert.equal(s.get('lat_count{op="put"}'), 0);
    assert.equal(s.get('rpc{quantile="0.5"}'), 0.2);
    assert.equal(s.size, 18);
  });

  it('accepts the Nan spelling prom-client writes', () => {
    assert.ok(Number.isNaN(parsePromText('# TYPE g gauge\ng Nan\n').get('g')));
  });

  const BAD: Array<[string, string, RegExp]> = [
    ['no trailing newline', 'a 1', /end with a newline/],
    ['bad metric name', '1abc 1\n', /invalid metric name/],
    ['bad label name', 'a{1x="v"} 1\n', /invalid label name/],
    ['unquoted label value', 'a{x=v} 1\n', /double-quoted/],
    ['unterminated label value', 'a{x="v} 1\n', /unterminated/],
    ['bad escape', 'a{x="\\t"} 1\n', /invalid escape/],
    ['duplicate label', 'a{x="1",x="2"} 1\n', /duplicate label/],
    ['missing separator', 'a{x="1" y="2"} 1\n', /expected ','/],
    ['bad value', 'a 1,5\n', /invalid value/],
    ['missing value', 'a\n', /expected a space|invalid value/],
    ['bad timestamp', 'a 1 12.5\n', /invalid timestamp/],
    ['extra text', 'a 1 2 3\n', /unexpected text/],
    ['bad type', '# TYPE a countr\na 1\n', /invalid type/],
    ['second TYPE', '# TYPE a gauge\n# TYPE a gauge\na 1\n', /second TYPE/],
    ['second HELP', '# HELP a x\n# HELP a y\na 1\n', /second HELP/],
    ['bad HELP escape', '# HELP a x\\ty\na 1\n', /invalid escape in HELP/],
    ['TYPE after samples', 'a 1\n# TYPE a gauge\n', /after its samples/],
    ['family split', 'a 1\nb 1\na{x="1"} 2\n', /not in one group/],
    ['duplicate series', 'a{x="1",y="2"} 1\na{y="2",x="1"} 2\n', /duplicate series/],
    ['negative counter', '# TYPE c_total counter\nc_total -1\n', /negative/],
    ['bucket without le', '# TYPE h histogram\nh_bucket{op="x"} 1\nh_count 1\n', /no le label/],
    [
      'le not increasing',
      '# TYPE h histogram\nh_bucket{le="1"} 1\nh_bucket{le="0.5"} 1\nh_bucket{le="+Inf"} 1\nh_count 1\n',
      /le not increasing/,
    ],
    [
      'decreasing bucket counts',
      '# TYPE h histogram\nh_bucket{le="1"} 3\nh_bucket{le="+Inf"} 2\nh_count 2\n',
      /count decreases/,
    ],
    ['no +Inf bucket', '# TYPE h histogram\nh_bucket{le="1"} 1\nh_count 1\n', /no \+Inf bucket/],
    [
      '_count differs from +Inf',
      '# TYPE h histogram\nh_bucket{le="+Inf"} 2\nh_sum 1\nh_count 3\n',
      /differs/,
    ],
    ['histogram without _count', '# TYPE h histogram\nh_bucket{le="+Inf"} 2\n', /no _count/],
    ['bare histogram sample', '# TYPE h histogram\nh 1\n', /without _bucket/],
  ];
  for (const [what, text, re] of BAD) {
    it(`rejects ${what}`, () => {
      assert.throws(() => parsePromText(text), re);
      assert.throws(() => assertValidPromText(text), { name: 'AssertionError' });
    });
  }
});

describe('KvtierMetrics with a failing collector in its registry', () => {
  it('rejects text() so the caller can answer 500', async () => {
    const registry = new Registry();
    const m = new KvtierMetrics({ registry, defaultMetrics: false });
    new Gauge({
      name: 'other_broken',
      help: 'x',
      registers: [registry],
      collect() {
        throw new Error('broken collector');
      },
    });
    await assert.rejects(m.text(), /broken collector/);
  });
});
