/**
 * The deployment's observability against a running sidecar: every metric that the Grafana
 * dashboard and the Prometheus alert rules name is exported on the sidecar's real /metrics,
 * /metrics passes `promtool check metrics`, the rules pass `promtool check rules` and fire on
 * the series they are written for (`promtool test rules`), the dashboard's expressions parse in
 * Prometheus, the dashboard JSON is what scripts/gen-grafana-dashboard.mjs writes, and
 * docker-compose.yml provisions it. The promtool checks need Debian's `prometheus` package and
 * are skipped, with that reason, without it.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { parse, stringify } from 'yaml';
import { defaultConfig } from '../../src/config/config.ts';
import { Sidecar } from '../../src/sidecar.ts';
import { silentLogger } from '../../src/util/log.ts';
import {
  alertExprs,
  dashboardExprs,
  dashboards,
  exportedNames,
  findPromtool,
  metricNamesIn,
  NO_PROMETHEUS,
  PROMETHEUS_SYNTHETIC,
  promtoolCheckMetrics,
} from '../support/deploy-observability.ts';
import { REPO_ROOT } from '../support/fixtures.ts';

const promtool = findPromtool();
const needsPromtool = promtool === undefined ? NO_PROMETHEUS : false;

describe('metric names in PromQL', () => {
  it('are read from selectors, not from functions, keywords, labels, strings or durations', () => {
    assert.deepEqual(
      metricNamesIn(
        'histogram_quantile(0.99, sum by (le, tier) (rate(kvtier_a_bucket{tier=~"x|y", instance=~".*"}[5m]))) / on (tier) group_left (op) kvtier_b offset 1h > bool 1e3 and up{job="kvtier"} unless min_over_time(kvtier_c[30m:1m])',
      ).sort(),
      ['kvtier_a_bucket', 'kvtier_b', 'kvtier_c', 'up'],
    );
  });

  it('exported names include histogram series and labeled families without samples', () => {
    const names = exportedNames(
      [
        '# HELP h x',
        '# TYPE h histogram',
        'h_bucket{le="+Inf"} 0',
        '# TYPE c counter',
        '# TYPE g gauge',
        'g 1',
      ].join('\n'),
    );
    for (const n of ['h', 'h_bucket', 'h_sum', 'h_count', 'c', 'g']) assert.ok(names.has(n), n);
  });
});

describe('dashboard and alert rules against a running sidecar', () => {
  let sidecar: Sidecar;
  let text = '';
  const dir = mkdtempSync(join(tmpdir(), 'kvtier-observability-'));

  before(async () => {
    sidecar = await Sidecar.start({
      config: {
        ...defaultConfig(),
        listen: 'tcp://127.0.0.1:*',
        metrics: { host: '127.0.0.1', port: 0 },
        tiers: [
          { name: 'cpu', type: 'local-cpu', options: { capacityBytes: 16 * 1024 * 1024 } },
          {
            name: 'disk',
            type: 'local-disk',
            options: { path: join(dir, 'chunks'), capacityBytes: 64 * 1024 * 1024 },
          },
        ],
        logLevel: 'silent',
      },
      log: silentLogger,
    });
    const res = await fetch(`${sidecar.opsUrl}/metrics`);
    assert.equal(res.status, 200);
    text = await res.text();
  });

  after(async () => {
    await sidecar?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('every metric the dashboard and the alert rules name is on /metrics', () => {
    const exported = exportedNames(text);
    const exprs = [...dashboardExprs(), ...alertExprs()];
    assert.ok(exprs.length >= 30, `found ${exprs.length} expressions`);
    const missing: string[] = [];
    let used = 0;
    for (const { where, expr } of exprs) {
      const names = metricNamesIn(expr);
      assert.ok(names.length > 0, `${where}: no metric in ${expr}`);
      for (const n of names) {
        used++;
        if (!exported.has(n) && !PROMETHEUS_SYNTHETIC.has(n)) missing.push(`${where}: ${n}`);
      }
    }
    assert.deepEqual(missing, [], 'metrics named in PromQL but not exported');
    assert.ok(used > exprs.length);
  });

  it('the dashboard covers what operators asked for', () => {
    const all = dashboardExprs()
      .map((e) => e.expr)
      .join('\n');
    for (const metric of [
      'kvtier_lookup_hit_tokens_total', // hit rate by tier
      'kvtier_lookup_duration_seconds_bucket', // p50/p99
      'kvtier_backend_bytes_written_total', // bytes in per tier
      'kvtier_backend_bytes_read_total', // bytes out per tier
      'kvtier_backend_evictions_total',
      'kvtier_backend_pinned_chunks',
      'kvtier_backend_health', // breaker state
      'kvtier_writethrough_queue_depth',
      'kvtier_writethrough_dropped_total',
      'kvtier_dataplane_bytes_total', // data-plane GB/s
    ])
      assert.ok(all.includes(metric), `the dashboard shows ${metric}`);
  });

  it('/metrics passes promtool check metrics with no complaint', { skip: needsPromtool }, () => {
    const r = promtoolCheckMetrics(promtool!, text);
    assert.equal(r.out, '', `promtool check metrics printed:\n${r.out}`);
    assert.equal(r.status, 0);
  });
});

describe('alert rules with promtool', { skip: needsPromtool }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'kvtier-rules-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('deploy/prometheus/alerts.yml passes promtool check rules', () => {
    const r = spawnSync(promtool!, ['check', 'rules', 'deploy/prometheus/alerts.yml'], {
      cwd: REPO_ROOT,
      encoding: 'utf8',
      timeout: 20_000,
    });
    assert.equal(r.status, 0, `${r.stdout}${r.stderr}`);
    assert.match(r.stdout, /SUCCESS/);
  });

  it("the dashboard's expressions parse in Prometheus", () => {
    const rules = dashboardExprs().map((e, i) => ({
      record: `kvtier:dashboard_${i}`,
      expr: e.expr,
    }));
    const file = join(dir, 'dashboard-rules.yml');
    writeFileSync(file, stringify({ groups: [{ name: 'dashboard', rules }] }));
    const r = spawnSync(promtool!, ['check', 'rules', file], { encoding: 'utf8', timeout: 20_000 });
    assert.equal(r.status, 0, `${r.stdout}${r.stderr}`);
  });

  it('the alerts fire on the series they are written for (promtool test rules)', () => {
    const rulesFile = join(REPO_ROOT, 'deploy', 'prometheus', 'alerts.yml');
    const inst = { instance: 'kvtier:9464', job: 'kvtier' };
    const lbl = (name: string, labels: Record<string, string>) =>
      `${name}{${Object.entries({ ...inst, ...labels })
        .map(([k, v]) => `${k}="${v}"`)
        .join(',')}}`;
    const tests = {
      rule_files: [rulesFile],
      evaluation_interval: '1m',
      tests: [
        {
          interval: '1m',
          input_series: [
            { series: lbl('kvtier_backend_health', { tier: 'redis' }), values: '1 1 0x10' },
            { series: lbl('kvtier_backend_health', { tier: 'cpu' }), values: '1x12' },
            { series: lbl('up', {}), values: '1x12' },
            {
              series: lbl('kvtier_writethrough_dropped_total', {
                tier: 's3',
                reason: 'queue_full',
              }),
              values: '0+10x30',
            },
            { series: lbl('kvtier_lookups_past_deadline_total', {}), values: '0+3x30' },
            { series: lbl('kvtier_backend_pinned_chunks', { tier: 'cpu' }), values: '4x40' },
            {
              series: lbl('kvtier_backend_corrupt_chunks_total', { tier: 'disk' }),
              values: '0 0 1x20',
            },
          ],
          alert_rule_test: [
            {
              eval_time: '5m',
              alertname: 'KvtierTierDown',
              exp_alerts: [
                {
                  exp_labels: { ...inst, tier: 'redis', severity: 'warning' },
                  exp_annotations: alertAnnotations('KvtierTierDown', { tier: 'redis' }),
                },
              ],
            },
            { eval_time: '5m', alertname: 'KvtierDown', exp_alerts: [] },
            {
              eval_time: '20m',
              alertname: 'KvtierWriteThroughDropsRising',
              exp_alerts: [
                {
                  exp_labels: {
                    instance: inst.instance,
                    tier: 's3',
                    reason: 'queue_full',
                    severity: 'warning',
                  },
                  exp_annotations: alertAnnotations('KvtierWriteThroughDropsRising', {
                    tier: 's3',
                    reason: 'queue_full',
                  }),
                },
              ],
            },
            {
              eval_time: '20m',
              alertname: 'KvtierLookupsPastDeadline',
              exp_alerts: [
                {
                  exp_labels: { instance: inst.instance, severity: 'warning' },
                  exp_annotations: alertAnnotations('KvtierLookupsPastDeadline', {}),
                },
              ],
            },
            { eval_time: '20m', alertname: 'KvtierPinsNotReturningToZero', exp_alerts: [] },
            {
              eval_time: '35m',
              alertname: 'KvtierPinsNotReturningToZero',
              exp_alerts: [
                {
                  exp_labels: { instance: inst.instance, severity: 'warning' },
                  exp_annotations: alertAnnotations('KvtierPinsNotReturningToZero', {}),
                },
              ],
            },
            {
              eval_time: '5m',
              alertname: 'KvtierCorruptChunks',
              exp_alerts: [
                {
                  exp_labels: { instance: inst.instance, tier: 'disk', severity: 'warning' },
                  exp_annotations: alertAnnotations('KvtierCorruptChunks', { tier: 'disk' }),
                },
              ],
            },
          ],
        },
      ],
    };
    const file = join(dir, 'alerts.test.yml');
    writeFileSync(file, stringify(tests));
    const r = spawnSync(promtool!, ['test', 'rules', file], { encoding: 'utf8', timeout: 30_000 });
    assert.equal(r.status, 0, `${r.stdout}${r.stderr}`);
  });
});

/** A rule's annotations with `{{ $labels.x }}` filled in as Prometheus would. */
function alertAnnotations(alert: string, labels: Record<string, string>): Record<string, string> {
  const doc = parse(
    readFileSync(join(REPO_ROOT, 'deploy', 'prometheus', 'alerts.yml'), 'utf8'),
  ) as {
    groups: { rules: { alert: string; annotations: Record<string, string> }[] }[];
  };
  const rule = doc.groups.flatMap((g) => g.rules).find((r) => r.alert === alert)!;
  const all: Record<string, string> = { instance: 'kvtier:9464', ...labels };
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(rule.annotations))
    out[k] = v.replace(/\{\{ \$labels\.(\w+) \}\}/g, (_, name: string) => all[name] ?? '');
  return out;
}

describe('Grafana provisioning', () => {
  it('the dashboard JSON is what scripts/gen-grafana-dashboard.mjs writes', () => {
    const r = spawnSync(process.execPath, ['scripts/gen-grafana-dashboard.mjs', '--stdout'], {
      cwd: REPO_ROOT,
      encoding: 'utf8',
    });
    assert.equal(r.status, 0, r.stderr);
    const [board] = dashboards().filter((d) => d.file.endsWith('kvtier.json'));
    assert.ok(board !== undefined);
    assert.deepEqual(
      board.json,
      JSON.parse(r.stdout),
      'run node scripts/gen-grafana-dashboard.mjs',
    );
  });

  it('docker-compose.yml provisions the datasource and the dashboards that use it', () => {
    const compose = parse(readFileSync(join(REPO_ROOT, 'docker-compose.yml'), 'utf8')) as {
      services: Record<string, { volumes?: string[]; depends_on?: Record<string, unknown> }>;
    };
    const grafana = compose.services.grafana;
    assert.ok(grafana !== undefined, 'a grafana service');
    assert.ok('prometheus' in (grafana.depends_on ?? {}));
    const mounts = new Map(
      (grafana.volumes ?? []).map((v) => {
        const [src, dst] = v.split(':');
        return [dst!, src!];
      }),
    );
    assert.equal(mounts.get('/etc/grafana/provisioning'), './deploy/grafana/provisioning');
    const provider = parse(
      readFileSync(join(REPO_ROOT, 'deploy/grafana/provisioning/dashboards/kvtier.yml'), 'utf8'),
    ) as { providers: { options: { path: string } }[] };
    const path = provider.providers[0]!.options.path;
    assert.equal(
      mounts.get(path),
      './deploy/grafana/dashboards',
      'the dashboards are mounted where the provider reads',
    );

    const ds = parse(
      readFileSync(
        join(REPO_ROOT, 'deploy/grafana/provisioning/datasources/prometheus.yml'),
        'utf8',
      ),
    ) as { datasources: { uid: string; type: string; url: string }[] };
    const [prom] = ds.datasources;
    assert.equal(prom?.type, 'prometheus');
    assert.equal(prom?.url, 'http://prometheus:9090', 'the compose service');
    const uids = new Set<string>();
    const walk = (node: unknown): void => {
      if (Array.isArray(node)) node.forEach(walk);
      else if (typeof node === 'object' && node !== null) {
        const o = node as Record<string, unknown>;
        const d = o.datasource as { uid?: string } | undefined;
        if (typeof d?.uid === 'string') uids.add(d.uid);
        Object.values(o).forEach(walk);
      }
    };
    for (const d of dashboards()) walk(d.json);
    assert.deepEqual([...uids], [prom!.uid], 'every panel uses the provisioned datasource');
  });

  it('Prometheus loads the alert rules from deploy/prometheus', () => {
    const compose = parse(readFileSync(join(REPO_ROOT, 'docker-compose.yml'), 'utf8')) as {
      services: Record<string, { volumes?: string[] }>;
    };
    const prom = parse(readFileSync(join(REPO_ROOT, 'deploy', 'prometheus.yml'), 'utf8')) as {
      rule_files: string[];
    };
    const mounted = new Map(
      (compose.services.prometheus?.volumes ?? []).map((v) => {
        const [src, dst] = v.split(':');
        return [dst!, src!];
      }),
    );
    assert.deepEqual(
      prom.rule_files.map((f) => mounted.get(f)),
      ['./deploy/prometheus/alerts.yml'],
    );
  });
});
