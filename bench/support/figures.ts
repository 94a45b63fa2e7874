/**
 * The figures of issue 10's target table, read out of one run of each benchmark's JSON
 * (bench/results/*.json), for `npm run bench` (bench/run-all.ts). A figure compares one number
 * (`compared`: a ratio against a raw limit measured in the same run, or an absolute value) with
 * its target.
 */

/** How a figure's compared number must stand against its target value. */
export type TargetOp = '<=' | '>=' | '<';

export interface Target {
  op: TargetOp;
  value: number;
}

/** One figure from one round. */
export interface FigureSample {
  /** Stable id, e.g. `lookup.p50.16`. */
  id: string;
  /** What is measured, for the table. */
  what: string;
  /** The measured value and its unit (e.g. 263, 'µs'). */
  value: number;
  unit: string;
  /** The raw limit measured in the same run, same unit; null where there is none. */
  raw: number | null;
  /** What `raw` is (e.g. 'ZMQ echo p50'). */
  rawWhat: string;
  /** The number held against the target: value/raw (or raw/value for times), or value itself. */
  compared: number;
  /** What `compared` is: 'ratio' or the unit of an absolute target. */
  comparedWhat: string;
  /** The target from the issue, or null for figures reported for information. */
  target: Target | null;
}

/** Whether `x` meets `t`. */
export function meets(x: number, t: Target): boolean {
  return t.op === '<=' ? x <= t.value : t.op === '>=' ? x >= t.value : x < t.value;
}

type Json = Record<string, unknown>;
const num = (o: Json, k: string): number => o[k] as number;
const rows = (o: Json, k: string): Json[] => (o[k] as Json[] | undefined) ?? [];
const MiB = 1024 * 1024;

/** Stall figure: the sidecar's event-loop stall against an idle process's in the same run. */
export function stallFigure(id: string, what: string, ms: number, idleMs: number): FigureSample {
  return {
    id,
    what,
    value: ms,
    unit: 'ms',
    raw: idleMs,
    rawWhat: 'idle process stall (machine noise)',
    compared: ms,
    comparedWhat: 'ms',
    target: { op: '<', value: 2 },
  };
}

export function lookupFigures(j: Json, prefix = 'lookup', client = 'TS client'): FigureSample[] {
  const out: FigureSample[] = [];
  for (const r of rows(j, 'results')) {
    if (r.kind === 'rtt') {
      const n = num(r, 'chunks');
      out.push({
        id: `${prefix}.p50.${n}`,
        what: `lookup p50, ${n} chunks, one in flight (${client})`,
        value: num(r, 'lookupP50Us'),
        unit: 'µs',
        raw: num(r, 'echoP50Us'),
        rawWhat: 'ZMQ echo p50',
        compared: num(r, 'lookupP50Us') / num(r, 'echoP50Us'),
        comparedWhat: 'ratio',
        target: { op: '<=', value: 1.5 },
      });
      out.push({
        id: `${prefix}.p99.${n}`,
        what: `lookup p99, ${n} chunks, one in flight (${client})`,
        value: num(r, 'lookupP99Us'),
        unit: 'µs',
        raw: num(r, 'echoP99Us'),
        rawWhat: 'ZMQ echo p99',
        compared: num(r, 'lookupP99Us') / num(r, 'echoP99Us'),
        comparedWhat: 'ratio',
        target: { op: '<=', value: 3 },
      });
    } else if (r.kind === 'throughput' && num(r, 'inflight') === 64) {
      const base = {
        value: num(r, 'lookupsPerSec'),
        unit: '/s',
        raw: num(r, 'echoPerSec'),
        rawWhat: 'ZMQ echo messages/s',
      };
      out.push({
        ...base,
        id: `${prefix}.rate.64`,
        what: '16-chunk lookups/s, 64 in flight',
        compared: num(r, 'lookupsPerSec'),
        comparedWhat: '/s',
        target: { op: '>=', value: 20_000 },
      });
      out.push({
        ...base,
        id: `${prefix}.rate.64.ratio`,
        what: '16-chunk lookups/s vs echo, 64 in flight',
        compared: num(r, 'ratio'),
        comparedWhat: 'ratio',
        target: { op: '>=', value: 0.6 },
      });
    }
  }
  return out;
}

export function tierFigures(j: Json): FigureSample[] {
  const out: FigureSample[] = [];
  for (const r of rows(j, 'rows')) {
    const tier = r.tier as string;
    const size = `${num(r, 'chunkBytes') / MiB} MiB`;
    for (const op of ['put', 'get'] as const) {
      out.push({
        id: `tiers.${tier}.${op}.${num(r, 'chunkBytes') / MiB}`,
        what: `${tier} ${op}, ${size} chunks`,
        value: num(r, `${op}GBs`),
        unit: 'GB/s',
        raw: num(r, `raw${op === 'put' ? 'Put' : 'Get'}GBs`),
        rawWhat:
          tier === 'cpu'
            ? 'memcpy'
            : tier === 'redis'
              ? 'raw ioredis'
              : tier === 's3'
                ? 'raw SDK'
                : 'raw file I/O',
        compared: num(r, `${op}Ratio`),
        comparedWhat: 'ratio',
        target: { op: '>=', value: 0.8 },
      });
    }
  }
  return out;
}

/** The largest stall per tier over its sizes, puts and gets. */
export function tierStalls(j: Json): Map<string, number> {
  const m = new Map<string, number>();
  for (const r of rows(j, 'rows')) {
    const t = r.tier as string;
    m.set(t, Math.max(m.get(t) ?? 0, (r.loopStallMs as number | undefined) ?? 0));
  }
  return m;
}

export function dataplaneFigures(j: Json): FigureSample[] {
  const out: FigureSample[] = [];
  for (const r of rows(j, 'rows')) {
    const production = String(r.path).startsWith('production');
    const op = String(r.op).startsWith('save') ? 'save' : 'load';
    out.push({
      id: `dataplane.${production ? 'production' : 'bare'}.${op}`,
      what: `data plane ${op}, ${production ? 'production sidecar' : 'bare path (in-process)'}`,
      value: num(r, 'gbPerSec'),
      unit: 'GB/s',
      raw: num(r, 'memcpyGbPerSec'),
      rawWhat: 'memcpy of the same bytes',
      compared: num(r, 'ratio'),
      comparedWhat: 'ratio',
      target: production ? { op: '>=', value: 0.9 } : null,
    });
  }
  const gib = (num(j, 'movedBytes') || 0) / 1024 ** 3;
  for (const l of rows(j, 'lookupDuringLoad')) {
    const production = String(l.path).startsWith('production');
    out.push({
      id: `dataplane.${production ? 'production' : 'bare'}.lookupP99DuringLoad`,
      what: `lookup p99 while a ${gib} GiB load runs, ${production ? 'production sidecar' : 'bare path'}`,
      value: num(l, 'p99Ms'),
      unit: 'ms',
      raw: null,
      rawWhat: '',
      compared: num(l, 'p99Ms'),
      comparedWhat: 'ms',
      target: production ? { op: '<', value: 5 } : null,
    });
  }
  return out;
}

/** Checksum figures come with their own median/min/max (the bench runs its rounds itself). */
export function checksumFigures(
  j: Json,
): { sample: FigureSample; min: number; max: number; rawMin: number; rawMax: number }[] {
  const out: { sample: FigureSample; min: number; max: number; rawMin: number; rawMax: number }[] =
    [];
  type S = { median: number; min: number; max: number };
  for (const r of rows(j, 'results')) {
    const method = r.method as string;
    if (method === 'memcpy') continue;
    const size = num(r, 'sizeBytes') / MiB;
    const g = r.gbps as S;
    const mc = r.memcpyGbps as S;
    out.push({
      sample: {
        id: `checksum.${method}.${size}`,
        what: `${method}, ${size} MiB`,
        value: g.median,
        unit: 'GB/s',
        raw: mc.median,
        rawWhat: 'memcpy',
        compared: g.median / mc.median,
        comparedWhat: 'ratio',
        target: null,
      },
      min: g.min,
      max: g.max,
      rawMin: mc.min,
      rawMax: mc.max,
    });
  }
  return out;
}

type Stat = { median: number; min: number; max: number };

/**
 * bench:scale figures: per store size, start to ready and to a complete index, memory per
 * indexed chunk (over a 1,024-chunk index, so fixed costs do not count), lookup p50/p99 against
 * that index, memory after churn.
 */
export function scaleFigures(j: Json): FigureSample[] {
  const out: FigureSample[] = [];
  const churnS = num(j, 'churnMs') / 1000;
  const base = num(j, 'baseChunks').toLocaleString('en-US');
  for (const r of rows(j, 'rows')) {
    const n = num(r, 'n');
    const label = n.toLocaleString('en-US');
    const v = (k: string) => (r[k] as Stat).median;
    const abs = (id: string, what: string, value: number, unit: string, target: Target | null) =>
      out.push({
        id: `scale.${id}.${n}`,
        what,
        value,
        unit,
        raw: null,
        rawWhat: '',
        compared: value,
        comparedWhat: unit,
        target,
      });
    abs('ready', `local disk, ${label} chunks: start to ready`, v('readyMs'), 'ms', {
      op: '<=',
      value: 2000,
    });
    abs(
      'indexed',
      `local disk, ${label} chunks: start to complete index (background scan)`,
      v('indexedMs'),
      'ms',
      null,
    );
    abs('rss', `local disk, ${label} chunks: RSS per indexed chunk`, v('rssBytesPerChunk'), 'B', {
      op: '<=',
      value: 128,
    });
    abs(
      'heap',
      `local disk, ${label} chunks: heap + typed arrays per chunk`,
      v('heapBytesPerChunk'),
      'B',
      null,
    );
    abs(
      'churn.rss',
      `local disk, ${label} chunks: RSS per indexed chunk after ${churnS} s of churn`,
      v('rssBytesPerChunkAfterChurn'),
      'B',
      { op: '<=', value: 128 },
    );
    for (const [p, target] of [
      ['p50', { op: '<=', value: 1.1 }],
      ['p99', null],
    ] as const) {
      const P = p.toUpperCase();
      out.push({
        id: `scale.lookup.${p}.${n}`,
        what: `local disk, ${label} chunks: 16-chunk lookup ${p}`,
        value: v(`lookup${P}Us`),
        unit: 'µs',
        raw: v(`base${P}Us`),
        rawWhat: `${base}-chunk index ${p}`,
        compared: v(`lookup${P}Ratio`),
        comparedWhat: 'ratio',
        target,
      });
    }
  }
  for (const f of rows(j, 'firstStart')) {
    const n = num(f, 'n');
    if (n === num(j, 'baseChunks')) continue;
    out.push({
      id: `scale.firstStart.${n}`,
      what: `local disk, ${n.toLocaleString('en-US')} chunks, no journal yet: start to complete index`,
      value: num(f, 'indexedMs'),
      unit: 'ms',
      raw: null,
      rawWhat: '',
      compared: num(f, 'indexedMs'),
      comparedWhat: 'ms',
      target: null,
    });
  }
  return out;
}
