/**
 * Cost of the local-disk tier as its store grows: for 10k, 100k and 1M indexed chunks, the time
 * from opening the tier to serving (ready) and to a complete index (the background scan), the
 * memory each indexed chunk costs (RSS, and V8 heap plus typed arrays), the p50/p99 of a
 * 16-chunk lookup (contains) against an index that is all but empty (1,024 chunks), and memory
 * after a phase of churn (new chunks put at the bound, each evicting the least recently used;
 * the small index churns as long, and its growth is subtracted as well).
 * Each measurement runs in a fresh process; rounds are interleaved over the sizes.
 *   npm run bench:scale   (KVTIER_BENCH_QUICK=1: short churn;
 *     KVTIER_BENCH_SCALE_SIZES=10000,100000 sizes; KVTIER_BENCH_SCALE_CHURN_S=n seconds of churn
 *     per measurement (default 60, quick 5; the full figure is 600);
 *     KVTIER_BENCH_SCALE_ROUNDS=n (default 3); KVTIER_BENCH_SCALE_DIR=where the stores are kept;
 *     KVTIER_BENCH_SCALE_KEEP=1 keeps them for the next run)
 * Stores are written once (about a minute per million chunks) and reused by later rounds, each
 * starting from the journal the previous one left. Prints a table and writes
 * bench/results/scale.json.
 */
import { spawn } from 'node:child_process';
import { rmSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { printTable, writeResults } from './support/child.ts';
import { ensureScaleStore } from './support/scale-store.ts';

const QUICK = process.env.KVTIER_BENCH_QUICK === '1';
const SIZES = (process.env.KVTIER_BENCH_SCALE_SIZES ?? '10000,100000,1000000')
  .split(',')
  .map(Number);
/** The index lookups are compared with: all but empty, so a lookup has chunks to find. */
const BASE = 1024;
const CHURN_MS = Number(process.env.KVTIER_BENCH_SCALE_CHURN_S ?? (QUICK ? 5 : 60)) * 1000;
const ROUNDS = Number(process.env.KVTIER_BENCH_SCALE_ROUNDS ?? 3);
const LOOKUPS = QUICK ? 5000 : 20_000;
const ROOT = process.env.KVTIER_BENCH_SCALE_DIR ?? join(tmpdir(), 'kvtier-bench-scale');
const KEEP = process.env.KVTIER_BENCH_SCALE_KEEP === '1';
const here = new URL('.', import.meta.url).pathname;
const ext = import.meta.url.endsWith('.ts') ? '.ts' : '.js';

type Json = Record<string, unknown>;

interface Sample {
  n: number;
  readyMs: number;
  readyCpuMs: number;
  indexedMs: number;
  chunks: number;
  rssDelta: number;
  heapDelta: number;
  lookupP50Us: number;
  lookupP99Us: number;
  churnPuts: number;
  chunksAfterChurn: number;
  rssDeltaAfterChurn: number;
  heapDeltaAfterChurn: number;
  closeMs: number;
  scan: Json | null;
}

function runChild(dir: string, n: number, churnMs: number, lookups: number): Promise<Sample> {
  const args = [
    '--expose-gc',
    ...(ext === '.ts' ? ['--import', 'tsx'] : []),
    join(here, 'support', `scale-child${ext}`),
    JSON.stringify({ dir, n, churnMs, lookups }),
  ];
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
    });
    child.once('exit', (code) => {
      const line = out.split('\n').find((l) => l.startsWith('result '));
      if (code !== 0 || line === undefined) reject(new Error(`scale child (${n}) exited ${code}`));
      else resolve(JSON.parse(line.slice(7)) as Sample);
    });
  });
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

const range = (xs: number[]) => ({
  median: median(xs),
  min: Math.min(...xs),
  max: Math.max(...xs),
});

async function main(): Promise<void> {
  const written: Json[] = [];
  const firstStart: Json[] = [];
  for (const n of [BASE, ...SIZES]) {
    const dir = join(ROOT, String(n));
    const t = performance.now();
    if (ensureScaleStore(dir, n)) {
      written.push({ n, seconds: (performance.now() - t) / 1000 });
      // The first start has no journal: the scan indexes every file (and writes the journal).
      const s = await runChild(dir, n, 0, 100);
      firstStart.push({ n, readyMs: s.readyMs, indexedMs: s.indexedMs, closeMs: s.closeMs });
      console.log(
        `store of ${n} chunks written in ${((performance.now() - t) / 1000).toFixed(1)} s; ` +
          `first start (no journal): indexed by the scan in ${s.indexedMs.toFixed(0)} ms`,
      );
    }
  }
  const rounds: { round: number; load: number; base: Sample; samples: Sample[] }[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    const load = loadavg()[0]!;
    // The small index churns as long as the others, so that what churn itself leaves in memory
    // (V8's heap grown by the garbage of many puts) is subtracted from theirs.
    const base = await runChild(join(ROOT, String(BASE)), BASE, CHURN_MS, LOOKUPS);
    const samples: Sample[] = [];
    for (const n of SIZES)
      samples.push(await runChild(join(ROOT, String(n)), n, CHURN_MS, LOOKUPS));
    rounds.push({ round: r + 1, load, base, samples });
    console.log(`round ${r + 1}/${ROUNDS} done (load average ${load.toFixed(2)})`);
  }
  const rows = SIZES.map((n, i) => {
    const per = rounds.map(({ base, samples }) => {
      const s = samples[i]!;
      // Memory per chunk over the all-but-empty index, so fixed costs do not count.
      const over = (a: number, b: number) => (a - b) / (s.chunks - base.chunks);
      return {
        readyMs: s.readyMs,
        readyCpuMs: s.readyCpuMs,
        indexedMs: s.indexedMs,
        rssPerChunk: over(s.rssDelta, base.rssDelta),
        heapPerChunk: over(s.heapDelta, base.heapDelta),
        p50Us: s.lookupP50Us,
        p99Us: s.lookupP99Us,
        baseP50Us: base.lookupP50Us,
        baseP99Us: base.lookupP99Us,
        p50Ratio: s.lookupP50Us / base.lookupP50Us,
        p99Ratio: s.lookupP99Us / base.lookupP99Us,
        churnPuts: s.churnPuts,
        rssPerChunkAfterChurn: over(s.rssDeltaAfterChurn, base.rssDeltaAfterChurn),
        heapPerChunkAfterChurn: over(s.heapDeltaAfterChurn, base.heapDeltaAfterChurn),
        churnRssGrowthMiB: (s.rssDeltaAfterChurn - s.rssDelta) / 2 ** 20,
        closeMs: s.closeMs,
      };
    });
    const stat = (k: keyof (typeof per)[number]) => range(per.map((p) => p[k]));
    return {
      n,
      readyMs: stat('readyMs'),
      readyCpuMs: stat('readyCpuMs'),
      indexedMs: stat('indexedMs'),
      rssBytesPerChunk: stat('rssPerChunk'),
      heapBytesPerChunk: stat('heapPerChunk'),
      lookupP50Us: stat('p50Us'),
      lookupP99Us: stat('p99Us'),
      baseP50Us: stat('baseP50Us'),
      baseP99Us: stat('baseP99Us'),
      lookupP50Ratio: stat('p50Ratio'),
      lookupP99Ratio: stat('p99Ratio'),
      churnPuts: stat('churnPuts'),
      churnRssGrowthMiB: stat('churnRssGrowthMiB'),
      rssBytesPerChunkAfterChurn: stat('rssPerChunkAfterChurn'),
      heapBytesPerChunkAfterChurn: stat('heapPerChunkAfterChurn'),
      closeMs: stat('closeMs'),
    };
  });
  const f = (s: { median: number; min: number; max: number }, d = 0) =>
    `${s.median.toFixed(d)} [${s.min.toFixed(d)}–${s.max.toFixed(d)}]`;
  console.log(
    `\nLocal-disk index at scale, ${ROUNDS} rounds (median [min–max]); lookups: 16 chunks each, ` +
      `against a ${BASE}-chunk index; churn ${CHURN_MS / 1000} s per measurement`,
  );
  printTable(
    [
      'chunks',
      'ready ms',
      'ready CPU ms',
      'indexed ms',
      'RSS B/chunk',
      'heap B/chunk',
      'p50 µs',
      'p50 ratio',
      'p99 µs',
      'puts in churn',
      'RSS B/chunk after',
    ],
    rows.map((r) => [
      r.n.toLocaleString('en-US'),
      f(r.readyMs),
      f(r.readyCpuMs),
      f(r.indexedMs),
      f(r.rssBytesPerChunk),
      f(r.heapBytesPerChunk),
      f(r.lookupP50Us, 2),
      f(r.lookupP50Ratio, 2),
      f(r.lookupP99Us, 2),
      f(r.churnPuts),
      f(r.rssBytesPerChunkAfterChurn),
    ]),
  );
  console.log(
    'targets: ready <= 2000 ms at 1M, <= 128 B per chunk, lookup p50 ratio <= 1.10 (issue 23), ' +
      '<= 1.5 at 1M (issue 34)',
  );
  const file = await writeResults('scale.json', {
    bench: 'scale',
    date: new Date().toISOString(),
    machine: { cpus: cpus().length, model: cpus()[0]?.model, node: process.version },
    quick: QUICK,
    baseChunks: BASE,
    churnMs: CHURN_MS,
    lookups: LOOKUPS,
    written,
    firstStart,
    rows,
    rounds,
  });
  console.log(`\nwrote ${file}`);
  if (!KEEP) rmSync(ROOT, { recursive: true, force: true });
}

await main();
