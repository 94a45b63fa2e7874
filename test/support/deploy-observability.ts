/**
 * What the deployment's dashboards and alert rules ask of a sidecar's /metrics: the PromQL
 * expressions of deploy/grafana/dashboards/*.json and deploy/prometheus/alerts.yml, the metric
 * names they use, the names a /metrics text exports, and `promtool` when Debian's `prometheus`
 * package is installed.
 */
import { spawnSync } from 'node:child_process';
import { accessSync, constants, readdirSync, readFileSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { parse } from 'yaml';
import { REPO_ROOT } from './fixtures.ts';

/** One PromQL expression and where it came from (for failure messages). */
export interface PromExpr {
  readonly where: string;
  readonly expr: string;
}

/**
 * Series that Prometheus makes itself for every target rather than reading them from /metrics:
 * `up` (did the scrape succeed).
 */
export const PROMETHEUS_SYNTHETIC = new Set(['up']);

/** Grafana's template variables, replaced by values Prometheus accepts. */
const GRAFANA_VARS: ReadonlyArray<readonly [RegExp, string]> = [
  [/\$__rate_interval|\$__interval|\$__range/g, '5m'],
  [/\$instance/g, '.*'],
];

/** Replaces Grafana's template variables so the expression is plain PromQL. */
export function substituteGrafanaVars(expr: string): string {
  let out = expr;
  for (const [re, value] of GRAFANA_VARS) out = out.replace(re, value);
  return out;
}

/** Every dashboard under deploy/grafana/dashboards, parsed. */
export function dashboards(): { file: string; json: Record<string, unknown> }[] {
  const dir = join(REPO_ROOT, 'deploy', 'grafana', 'dashboards');
  return readdirSync(dir)
    .filter((f) => f.endsWith('.json'))
    .sort()
    .map((f) => ({
      file: join('deploy/grafana/dashboards', f),
      json: JSON.parse(readFileSync(join(dir, f), 'utf8')) as Record<string, unknown>,
    }));
}

interface Panel {
  title?: string;
  targets?: { expr?: string; refId?: string }[];
  panels?: Panel[];
}

/** The PromQL of every panel target and query variable of every dashboard (variables substituted). */
export function dashboardExprs(): PromExpr[] {
  const out: PromExpr[] = [];
  for (const { file, json } of dashboards()) {
    const walk = (panels: Panel[]) => {
      for (const p of panels) {
        for (const t of p.targets ?? [])
          if (typeof t.expr === 'string')
            out.push({
              where: `${file} "${p.title}" ${t.refId}`,
              expr: substituteGrafanaVars(t.expr),
            });
        walk(p.panels ?? []);
      }
    };
    walk((json.panels as Panel[] | undefined) ?? []);
    const vars = (json.templating as { list?: { name: string; definition?: string }[] } | undefined)
      ?.list;
    for (const v of vars ?? []) {
      // label_values(metric, label) is Grafana's, not PromQL: its metric is checked by name.
      const m = /^label_values\((\w+),\s*\w+\)$/.exec(v.definition ?? '');
      if (m !== null) out.push({ where: `${file} variable ${v.name}`, expr: m[1]! });
    }
  }
  return out;
}

/** deploy/prometheus/alerts.yml, parsed. */
export function alertRules(): { alert: string; expr: string; for?: string }[] {
  const doc = parse(
    readFileSync(join(REPO_ROOT, 'deploy', 'prometheus', 'alerts.yml'), 'utf8'),
  ) as {
    groups: { rules: { alert: string; expr: string; for?: string }[] }[];
  };
  return doc.groups.flatMap((g) => g.rules);
}

/** The PromQL of every alert rule. */
export function alertExprs(): PromExpr[] {
  return alertRules().map((r) => ({
    where: `deploy/prometheus/alerts.yml ${r.alert}`,
    expr: r.expr,
  }));
}

const KEYWORDS = new Set([
  'by',
  'without',
  'on',
  'ignoring',
  'group_left',
  'group_right',
  'bool',
  'and',
  'or',
  'unless',
  'offset',
  'atan2',
  'inf',
  'nan',
]);

/**
 * Metric names a PromQL expression selects. Strings, label matchers, range and subquery
 * brackets and the label lists of `by`/`without`/`on`/`ignoring`/`group_*` are removed first;
 * what is left that looks like a name and is not a function call or keyword is a metric.
 */
export function metricNamesIn(expr: string): string[] {
  const s = expr
    .replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`/g, '""')
    .replace(/\{[^}]*\}/g, ' ')
    .replace(/\[[^\]]*\]/g, ' ')
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ');
  const names = new Set<string>();
  for (const m of s.matchAll(/[A-Za-z_:][A-Za-z0-9_:]*/g)) {
    const name = m[0];
    const before = s[m.index - 1];
    if (before !== undefined && /[0-9.]/.test(before)) continue; // 1e3, 5m, 0.5
    if (/^\s*\(/.test(s.slice(m.index + name.length))) continue; // a function call
    if (KEYWORDS.has(name.toLowerCase())) continue;
    names.add(name);
  }
  return [...names];
}

/**
 * Sample names a /metrics text exports: every family declared by `# TYPE` (a labeled family
 * without samples yet is still exported), with `_bucket`, `_sum` and `_count` for histograms and
 * summaries, and every sample name seen.
 */
export function exportedNames(text: string): Set<string> {
  const names = new Set<string>();
  for (const line of text.split('\n')) {
    const t = /^# TYPE (\S+) (\S+)/.exec(line);
    if (t !== null) {
      names.add(t[1]!);
      if (t[2] === 'histogram') for (const s of ['_bucket', '_sum', '_count']) names.add(t[1] + s);
      if (t[2] === 'summary') for (const s of ['_sum', '_count']) names.add(t[1] + s);
      continue;
    }
    const m = /^([A-Za-z_:][A-Za-z0-9_:]*)[{ ]/.exec(line);
    if (m !== null) names.add(m[1]!);
  }
  return names;
}

/** `promtool`'s path, or undefined when Debian's `prometheus` package is not installed. */
export function findPromtool(): string | undefined {
  return findProgram('promtool');
}

/** `prometheus`'s path, or undefined when Debian's `prometheus` package is not installed. */
export function findPrometheus(): string | undefined {
  return findProgram('prometheus');
}

function findProgram(name: string): string | undefined {
  const dirs = ['/usr/bin', ...(process.env.PATH ?? '').split(delimiter).filter((d) => d !== '')];
  for (const d of dirs) {
    try {
      accessSync(join(d, name), constants.X_OK);
      return join(d, name);
    } catch {}
  }
  return undefined;
}

/** Why a promtool or prometheus check is skipped here. */
export const NO_PROMETHEUS =
  "Debian's prometheus package is not installed (apt-get install prometheus; npm test does as root)";

/** Runs `promtool check metrics` on a /metrics text: its exit status and every line it printed. */
export function promtoolCheckMetrics(
  promtool: string,
  text: string,
): { status: number; out: string } {
  const r = spawnSync(promtool, ['check', 'metrics'], {
    input: text,
    encoding: 'utf8',
    timeout: 20_000,
  });
  return { status: r.status ?? -1, out: `${r.stdout ?? ''}${r.stderr ?? ''}`.trim() };
}
