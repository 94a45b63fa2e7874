#!/usr/bin/env node
// Writes deploy/grafana/dashboards/kvtier.json, the dashboard docker-compose.yml provisions.
// Edit the panels here and run `node scripts/gen-grafana-dashboard.mjs && npm run format`
// (`--stdout` prints it instead). test/unit/deploy-observability.test.ts checks that the JSON
// is current and that every metric it names is exported by a running sidecar.
import { writeFileSync } from 'node:fs';

const DS = { type: 'prometheus', uid: 'kvtier-prometheus' };
const SEL = 'instance=~"$instance"';
const RI = '$__rate_interval';

let nextId = 1;
let y = 0;

/** A timeseries panel at (x, y) of width w; targets are [expr, legend] pairs. */
function ts(title, description, x, w, unit, targets, extra = {}) {
  return {
    id: nextId++,
    type: 'timeseries',
    title,
    description,
    datasource: DS,
    gridPos: { x, y, w, h: 8 },
    fieldConfig: {
      defaults: { unit, custom: { fillOpacity: 10, showPoints: 'never' }, ...extra.defaults },
      overrides: [],
    },
    options: {
      legend: { displayMode: 'table', placement: 'bottom', calcs: ['lastNotNull', 'max'] },
      tooltip: { mode: 'multi', sort: 'desc' },
    },
    targets: targets.map(([expr, legendFormat], i) => ({
      datasource: DS,
      expr,
      legendFormat,
      refId: String.fromCharCode(65 + i),
    })),
  };
}

function row(title) {
  const p = {
    id: nextId++,
    type: 'row',
    title,
    collapsed: false,
    gridPos: { x: 0, y, w: 24, h: 1 },
    panels: [],
  };
  y += 1;
  return p;
}

function stat(title, description, x, w, unit, expr, extra = {}) {
  return {
    id: nextId++,
    type: 'stat',
    title,
    description,
    datasource: DS,
    gridPos: { x, y, w, h: 4 },
    fieldConfig: { defaults: { unit, ...extra.defaults }, overrides: [] },
    options: {
      reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
      colorMode: 'value',
      graphMode: 'area',
    },
    targets: [{ datasource: DS, expr, refId: 'A', legendFormat: extra.legend ?? '' }],
  };
}

const HEALTH_MAPPINGS = [
  {
    type: 'value',
    options: {
      0: { text: 'down', color: 'red', index: 0 },
      0.5: { text: 'degraded (breaker open)', color: 'orange', index: 1 },
      1: { text: 'up', color: 'green', index: 2 },
    },
  },
];

const panels = [];
panels.push(row('Overview'));
panels.push(
  stat(
    'Sidecars up',
    'Scrape targets of job kvtier answering.',
    0,
    4,
    'none',
    `sum(up{job="kvtier",${SEL}})`,
  ),
  stat(
    'Tiers down',
    'Tiers whose breaker reports down (kvtier_backend_health == 0).',
    4,
    4,
    'none',
    `count(kvtier_backend_health{${SEL}} == 0) or vector(0)`,
    {
      defaults: {
        thresholds: {
          mode: 'absolute',
          steps: [
            { color: 'green', value: null },
            { color: 'red', value: 1 },
          ],
        },
      },
    },
  ),
  stat(
    'Lookups/s',
    'Lookups answered per second, all results.',
    8,
    4,
    'reqps',
    `sum(rate(kvtier_lookups_total{${SEL}}[${RI}]))`,
  ),
  stat(
    'Token hit rate',
    'Tokens answered as ready over tokens asked about.',
    12,
    4,
    'percentunit',
    `sum(rate(kvtier_lookup_hit_tokens_total{${SEL}}[${RI}])) / sum(rate(kvtier_lookup_requested_tokens_total{${SEL}}[${RI}]))`,
  ),
  stat(
    'Lookup p99',
    'Lookup latency, 99th percentile.',
    16,
    4,
    's',
    `histogram_quantile(0.99, sum by (le) (rate(kvtier_lookup_duration_seconds_bucket{${SEL}}[${RI}])))`,
  ),
  stat(
    'Past deadline/s',
    "Lookups answered after the engines' lookup deadline (already taken as misses).",
    20,
    4,
    'reqps',
    `sum(rate(kvtier_lookups_past_deadline_total{${SEL}}[${RI}]))`,
  ),
);
y += 4;

panels.push(row('Lookups'));
panels.push(
  ts(
    'Hit rate by tier',
    'Share of the tokens asked about that each tier answered as ready (tiers add up to the total hit rate).',
    0,
    12,
    'percentunit',
    [
      [
        `sum by (tier) (rate(kvtier_lookup_hit_tokens_total{${SEL}}[${RI}])) / scalar(sum(rate(kvtier_lookup_requested_tokens_total{${SEL}}[${RI}])))`,
        '{{tier}}',
      ],
    ],
  ),
  ts('Lookup latency', 'From request to final answer.', 12, 12, 's', [
    [
      `histogram_quantile(0.5, sum by (le) (rate(kvtier_lookup_duration_seconds_bucket{${SEL}}[${RI}])))`,
      'p50',
    ],
    [
      `histogram_quantile(0.99, sum by (le) (rate(kvtier_lookup_duration_seconds_bucket{${SEL}}[${RI}])))`,
      'p99',
    ],
  ]),
);
y += 8;
panels.push(
  ts(
    'Lookups by result',
    'hit, partial, miss, canceled, stale, error per second; past deadline is counted apart.',
    0,
    12,
    'reqps',
    [
      [`sum by (result) (rate(kvtier_lookups_total{${SEL}}[${RI}]))`, '{{result}}'],
      [`sum(rate(kvtier_lookups_past_deadline_total{${SEL}}[${RI}]))`, 'past deadline'],
    ],
  ),
  ts(
    'Chunk hit ratio by tier',
    'Chunks found over chunks asked, per tier (lower tiers are asked only past the upper ones).',
    12,
    12,
    'percentunit',
    [
      [
        `sum by (tier) (rate(kvtier_backend_hits_total{${SEL}}[${RI}])) / (sum by (tier) (rate(kvtier_backend_hits_total{${SEL}}[${RI}])) + sum by (tier) (rate(kvtier_backend_misses_total{${SEL}}[${RI}])))`,
        '{{tier}}',
      ],
    ],
  ),
);
y += 8;

panels.push(row('Tiers'));
panels.push(
  ts('Bytes in per tier', 'Payload bytes stored per second.', 0, 12, 'Bps', [
    [`sum by (tier) (rate(kvtier_backend_bytes_written_total{${SEL}}[${RI}]))`, '{{tier}}'],
  ]),
  ts('Bytes out per tier', 'Payload bytes read per second.', 12, 12, 'Bps', [
    [`sum by (tier) (rate(kvtier_backend_bytes_read_total{${SEL}}[${RI}]))`, '{{tier}}'],
  ]),
);
y += 8;
panels.push(
  ts(
    'Occupancy',
    'Bytes held over the capacity bound, per tier (tiers without a bound are absent).',
    0,
    8,
    'percentunit',
    [
      [
        `sum by (tier) (kvtier_backend_bytes{${SEL}}) / sum by (tier) (kvtier_backend_capacity_bytes{${SEL}})`,
        '{{tier}}',
      ],
    ],
  ),
  ts('Evictions', 'Chunks evicted per second, per tier.', 8, 8, 'ops', [
    [`sum by (tier) (rate(kvtier_backend_evictions_total{${SEL}}[${RI}]))`, '{{tier}}'],
  ]),
  {
    id: nextId++,
    type: 'state-timeline',
    title: 'Breaker state',
    description:
      'Per tier: up, degraded (breaker open, probing) or down (bypassed: lookups miss, stores are dropped).',
    datasource: DS,
    gridPos: { x: 16, y, w: 8, h: 8 },
    fieldConfig: {
      defaults: {
        mappings: HEALTH_MAPPINGS,
        color: { mode: 'thresholds' },
        thresholds: {
          mode: 'absolute',
          steps: [
            { color: 'red', value: null },
            { color: 'orange', value: 0.5 },
            { color: 'green', value: 1 },
          ],
        },
      },
      overrides: [],
    },
    options: { showValue: 'never', mergeValues: true },
    targets: [
      {
        datasource: DS,
        expr: `min by (tier) (kvtier_backend_health{${SEL}})`,
        legendFormat: '{{tier}}',
        refId: 'A',
      },
    ],
  },
);
y += 8;
panels.push(
  ts('Backend latency p99', 'Per tier and operation, failed calls included.', 0, 12, 's', [
    [
      `histogram_quantile(0.99, sum by (le, tier, op) (rate(kvtier_backend_op_duration_seconds_bucket{${SEL}}[${RI}])))`,
      '{{tier}} {{op}}',
    ],
  ]),
  ts(
    'Errors and corrupt chunks',
    'Backend calls that failed, and stored chunks that failed verification (removed, answered as misses).',
    12,
    12,
    'ops',
    [
      [
        `sum by (tier, code) (rate(kvtier_backend_errors_total{${SEL}}[${RI}]))`,
        '{{tier}} {{code}}',
      ],
      [
        `sum by (tier) (rate(kvtier_backend_corrupt_chunks_total{${SEL}}[${RI}]))`,
        '{{tier}} corrupt',
      ],
    ],
  ),
);
y += 8;
panels.push(
  ts(
    'Read bandwidth (measured)',
    "Each lower tier's read bandwidth as lookups measure it (recent prefetch gets, less the tier's latency); absent while not measured.",
    0,
    8,
    'Bps',
    [[`max by (tier) (kvtier_tier_read_bandwidth_bytes_per_second{${SEL}})`, '{{tier}}']],
  ),
  ts(
    'Read latency (measured)',
    "Each lower tier's per-request latency as lookups measure it (recent probes).",
    8,
    8,
    's',
    [[`max by (tier) (kvtier_tier_read_latency_seconds{${SEL}})`, '{{tier}}']],
  ),
  ts(
    'Load or recompute',
    "Lookups that named the engine's prefill rate, per tier: load (fetching beat computing) or decline (recomputed; the tier not asked, or its hits left).",
    16,
    8,
    'ops',
    [
      [
        `sum by (tier, decision) (rate(kvtier_lookup_tier_decisions_total{${SEL}}[${RI}]))`,
        '{{tier}} {{decision}}',
      ],
    ],
  ),
);
y += 8;

panels.push(row('Pins and write-through'));
panels.push(
  ts(
    'Pins',
    'Chunks pinned in host memory and lookups holding pins; both return to zero when engines consume or cancel. Expired pins were released by TTL, not by the engine.',
    0,
    8,
    'short',
    [
      [`sum by (tier) (kvtier_backend_pinned_chunks{${SEL}})`, 'pinned chunks ({{tier}})'],
      [`sum(kvtier_pinned_lookups{${SEL}})`, 'lookups holding pins'],
      [`sum(rate(kvtier_pins_expired_total{${SEL}}[${RI}]))`, 'pins expired/s'],
    ],
  ),
  ts('Write-through queue', 'Chunks waiting to be written to the lower tiers.', 8, 8, 'short', [
    [`sum(kvtier_writethrough_queue_depth{${SEL}})`, 'queued chunks'],
  ]),
  ts(
    'Drops',
    'Write-through puts dropped (queue full, tier down) and puts a tier refused for lack of room.',
    16,
    8,
    'ops',
    [
      [
        `sum by (tier, reason) (rate(kvtier_writethrough_dropped_total{${SEL}}[${RI}]))`,
        'write-through {{tier}} {{reason}}',
      ],
      [
        `sum by (tier) (rate(kvtier_backend_dropped_puts_total{${SEL}}[${RI}]))`,
        'no room {{tier}}',
      ],
    ],
  ),
);
y += 8;

panels.push(row('Data plane and process'));
panels.push(
  ts(
    'Data-plane throughput',
    "Bytes copied between the engine's KV memory and host memory (save: engine to host, load: host to engine).",
    0,
    8,
    'Bps',
    [[`sum by (direction) (rate(kvtier_dataplane_bytes_total{${SEL}}[${RI}]))`, '{{direction}}']],
  ),
  ts(
    'Prefetch',
    'Serializer budget in use (chunks being prefetched into host memory) and waiters.',
    8,
    8,
    'short',
    [
      [`sum(kvtier_serializer_in_use_chunks{${SEL}})`, 'in use'],
      [`sum(kvtier_serializer_capacity_chunks{${SEL}})`, 'capacity'],
      [`sum(kvtier_serializer_waiters{${SEL}})`, 'waiters'],
    ],
  ),
  ts(
    'Event-loop lag',
    'Event-loop lag, 99th percentile: a busy loop delays every answer.',
    16,
    8,
    's',
    [[`max(kvtier_nodejs_eventloop_lag_p99_seconds{${SEL}})`, 'event-loop lag p99']],
  ),
);
y += 8;

const dashboard = {
  uid: 'kvtier',
  title: 'kvtier',
  description: 'kvtier KV-cache tiering sidecar: lookups, tiers, pins, write-through, data plane.',
  tags: ['kvtier'],
  schemaVersion: 39,
  version: 1,
  editable: false,
  graphTooltip: 1,
  refresh: '10s',
  time: { from: 'now-1h', to: 'now' },
  timepicker: {},
  annotations: { list: [] },
  links: [],
  templating: {
    list: [
      {
        name: 'instance',
        label: 'instance',
        type: 'query',
        datasource: DS,
        query: { query: 'label_values(kvtier_epoch, instance)', refId: 'instance' },
        definition: 'label_values(kvtier_epoch, instance)',
        includeAll: true,
        multi: true,
        allValue: '.*',
        current: { selected: true, text: 'All', value: '$__all' },
        refresh: 2,
        sort: 1,
      },
    ],
  },
  panels,
};

const text = `${JSON.stringify(dashboard, null, 2)}\n`;
if (process.argv.includes('--stdout')) {
  process.stdout.write(text);
} else {
  const out = new URL('../deploy/grafana/dashboards/kvtier.json', import.meta.url);
  writeFileSync(out, text);
  console.log(`wrote ${out.pathname}: ${panels.length} panels (format it with npm run format)`);
}
