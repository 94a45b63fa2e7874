import { AssertionError } from 'node:assert';

/**
 * A strict reader of Prometheus text exposition format 0.0.4 for tests: it checks what a
 * Prometheus server would choke on and returns every sample by series.
 *
 * Checked: `# HELP` / `# TYPE` syntax (one of each per family, TYPE before the family's samples,
 * types counter|gauge|histogram|summary|untyped), metric and label name syntax, label value
 * escaping (only `\\`, `\"`, `\n`), duplicate label names, numeric values (floats, `+Inf`,
 * `-Inf`, `NaN` in any case, as Go's parser reads them) and optional integer timestamps, families
 * kept in one group, no duplicate series, no negative counters, and for histograms: only
 * `_bucket`/`_sum`/`_count` samples, an `le` label on every bucket, `le` increasing with
 * non-decreasing counts, a `+Inf` bucket, and `_count` equal to it.
 */

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
const FLOAT = /^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$/;
const INF = /^[+-]?inf(?:inity)?$/i;
const NAN = /^nan$/i;
const TIMESTAMP = /^-?\d+$/;
const TYPES = new Set(['counter', 'gauge', 'histogram', 'summary', 'untyped']);

type Labels = ReadonlyArray<readonly [string, string]>;

/** Escapes a label value the way the exposition format writes it. */
function escapeLabelValue(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
}

/**
 * The key `parsePromText` uses for a series: the metric name, then labels sorted by name,
 * e.g. `kvtier_backend_hits_total{tier="cpu"}`; just the name when there are no labels.
 */
export function seriesKey(name: string, labels: Record<string, string> = {}): string {
  return keyOf(name, Object.entries(labels));
}

function keyOf(name: string, labels: Labels): string {
  if (labels.length === 0) return name;
  const sorted = [...labels].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  return `${name}{${sorted.map(([k, v]) => `${k}="${escapeLabelValue(v)}"`).join(',')}}`;
}

/** Parses a sample value or `null` when it is not one the format allows. */
function parseValue(s: string): number | null {
  if (FLOAT.test(s)) return Number(s);
  if (INF.test(s)) return s.startsWith('-') ? Number.NEGATIVE_INFINITY : Number.POSITIVE_INFINITY;
  if (NAN.test(s)) return Number.NaN;
  return null;
}

class Cursor {
  pos = 0;
  constructor(
    readonly s: string,
    readonly fail: (msg: string) => never,
  ) {}
  peek(): string | undefined {
    return this.s[this.pos];
  }
  skipBlanks(): void {
    while (this.peek() === ' ' || this.peek() === '\t') this.pos++;
  }
  take(re: RegExp): string {
    const m = re.exec(this.s.slice(this.pos));
    if (m === null) return '';
    this.pos += m[0].length;
    return m[0];
  }
}

function parseLabels(c: Cursor): Labels {
  const labels: Array<readonly [string, string]> = [];
  const seen = new Set<string>();
  c.pos++; // '{'
  for (;;) {
    c.skipBlanks();
    if (c.peek() === '}') break;
    const name = c.take(/^[^\s=,{}"]+/);
    if (!LABEL_NAME.test(name)) c.fail(`invalid label name ${JSON.stringify(name)}`);
    if (seen.has(name)) c.fail(`duplicate label ${name}`);
    seen.add(name);
    c.skipBlanks();
    if (c.peek() !== '=') c.fail(`expected '=' after label ${name}`);
    c.pos++;
    c.skipBlanks();
    if (c.peek() !== '"') c.fail(`label ${name} value must be double-quoted`);
    c.pos++;
    let value = '';
    for (;;) {
      const ch = c.peek();
      if (ch === undefined) c.fail(`unterminated value of label ${name}`);
      c.pos++;
      if (ch === '"') break;
      if (ch === '\\') {
        const esc = c.peek();
        c.pos++;
        if (esc === '\\') value += '\\';
        else if (esc === '"') value += '"';
        else if (esc === 'n') value += '\n';
        else c.fail(`invalid escape \\${esc ?? ''} in label ${name}`);
      } else {
        value += ch;
      }
    }
    labels.push([name, value]);
    c.skipBlanks();
    const sep = c.peek();
    if (sep === ',') {
      c.pos++;
      continue;
    }
    if (sep !== '}') c.fail(`expected ',' or '}' after label ${name}`);
    break;
  }
  c.pos++; // '}'
  return labels;
}

interface Bucket {
  le: number;
  count: number;
}

interface HistogramGroup {
  buckets: Bucket[];
  count?: number;
  line: number;
}

/**
 * Parses and validates exposition text.
 * @returns every sample's value by series key (see {@link seriesKey}).
 * @throws Error `line N: what is wrong` on the first violation.
 */
export function parsePromText(text: string): Map<string, number> {
  const samples = new Map<string, number>();
  const types = new Map<string, string>();
  const helps = new Set<string>();
  const finishedFamilies = new Set<string>();
  const histograms = new Map<string, HistogramGroup>();
  let current: string | undefined;
  let lineNo = 0;
  const fail = (msg: string): never => {
    throw new Error(`line ${lineNo}: ${msg}`);
  };
  const enterFamily = (family: string) => {
    if (family === current) return;
    if (finishedFamilies.has(family)) fail(`lines of ${family} are not in one group`);
    if (current !== undefined) finishedFamilies.add(current);
    current = family;
  };

  if (text.length > 0 && !text.endsWith('\n')) {
    lineNo = text.split('\n').length;
    fail('text must end with a newline');
  }
  const lines = text.split('\n');
  lines.pop();
  for (const line of lines) {
    lineNo++;
    if (line.trim() === '') continue;
    if (line.startsWith('#')) {
      const m = /^#[ \t]+(HELP|TYPE)(?:[ \t]+(.*))?$/.exec(line);
      if (m === null) continue; // a plain comment
      const [, keyword, rest = ''] = m;
      const nm = /^(\S+)(?:[ \t]+(.*))?$/.exec(rest);
      const name = nm?.[1] ?? '';
      const arg = nm?.[2] ?? '';
      if (!METRIC_NAME.test(name))
        fail(`invalid metric name in ${keyword}: ${JSON.stringify(name)}`);
      enterFamily(name);
      if (keyword === 'HELP') {
        if (helps.has(name)) fail(`second HELP for ${name}`);
        helps.add(name);
        if (/\\(?![\\n])/.test(arg.replace(/\\\\/g, ''))) fail(`invalid escape in HELP of ${name}`);
      } else {
        if (types.has(name)) fail(`second TYPE for ${name}`);
        if (!TYPES.has(arg.trim())) fail(`invalid type ${JSON.stringify(arg)} for ${name}`);
        if ([...samples.keys()].some((k) => familyOfKey(k, types) === name)) {
          fail(`TYPE for ${name} after its samples`);
        }
        types.set(name, arg.trim());
      }
      continue;
    }

    const c = new Cursor(line, fail);
    const name = c.take(/^[^\s{]+/);
    if (!METRIC_NAME.test(name)) fail(`invalid metric name ${JSON.stringify(name)}`);
    const labels = c.peek() === '{' ? parseLabels(c) : [];
    const rest = line.slice(c.pos);
    if (!/^[ \t]/.test(rest)) fail(`expected a space before the value of ${name}`);
    const parts = rest.trim().split(/[ \t]+/);
    if (parts.length > 2) fail(`unexpected text after the value of ${name}`);
    const value = parseValue(parts[0] ?? '');
    if (value === null) fail(`invalid value ${JSON.stringify(parts[0])} for ${name}`);
    if (parts[1] !== undefined && !TIMESTAMP.test(parts[1])) {
      fail(`invalid timestamp ${JSON.stringify(parts[1])} for ${name}`);
    }
    const v = value as number;

    const { family, suffix } = familyOf(name, types);
    enterFamily(family);
    const key = keyOf(name, labels);
    if (samples.has(key)) fail(`duplicate series ${key}`);
    samples.set(key, v);

    const type = types.get(family);
    if (type === 'counter' && v < 0) fail(`counter ${key} is negative`);
    if (type === 'histogram') {
      if (suffix === '') fail(`histogram ${family} has a sample without _bucket/_sum/_count`);
      const rest = labels.filter(([k]) => k !== 'le');
      const group = histograms.get(keyOf(family, rest)) ?? { buckets: [], line: lineNo };
      histograms.set(keyOf(family, rest), group);
      if (suffix === '_bucket') {
        const le = labels.find(([k]) => k === 'le')?.[1];
        if (le === undefined) fail(`bucket ${key} has no le label`);
        const bound = parseValue(le as string);
        if (bound === null || Number.isNaN(bound)) fail(`bucket ${key} has an invalid le`);
        const prev = group.buckets.at(-1);
        if (prev !== undefined && (bound as number) <= prev.le)
          fail(`bucket ${key}: le not increasing`);
        if (prev !== undefined && v < prev.count) fail(`bucket ${key}: count decreases`);
        if (v < 0 || Number.isNaN(v)) fail(`bucket ${key}: invalid count`);
        group.buckets.push({ le: bound as number, count: v });
      } else if (suffix === '_count') {
        group.count = v;
      }
    }
  }

  for (const [key, g] of histograms) {
    lineNo = g.line;
    const last = g.buckets.at(-1);
    if (last === undefined || last.le !== Number.POSITIVE_INFINITY)
      fail(`${key} has no +Inf bucket`);
    if (g.count === undefined) fail(`${key} has no _count`);
    if (g.count !== last?.count)
      fail(`${key}: _count ${g.count} differs from +Inf bucket ${last?.count}`);
  }
  return samples;
}

function familyOf(
  name: string,
  types: ReadonlyMap<string, string>,
): { family: string; suffix: string } {
  for (const suffix of ['_bucket', '_sum', '_count']) {
    if (!name.endsWith(suffix)) continue;
    const base = name.slice(0, -suffix.length);
    const t = types.get(base);
    if (t === 'histogram' || (t === 'summary' && suffix !== '_bucket'))
      return { family: base, suffix };
  }
  return { family: name, suffix: '' };
}

function familyOfKey(key: string, types: ReadonlyMap<string, string>): string {
  const name = key.split('{', 1)[0] ?? key;
  return familyOf(name, types).family;
}

/**
 * Asserts that `text` is valid exposition format 0.0.4 (see {@link parsePromText}).
 * @throws AssertionError with the first violation and its line number.
 */
export function assertValidPromText(text: string): void {
  try {
    parsePromText(text);
  } catch (err) {
    throw new AssertionError({ message: `invalid Prometheus text: ${(err as Error).message}` });
  }
}
