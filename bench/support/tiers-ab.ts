/**
 * A/B of two builds' tier throughput: runs bench/tiers.ts from checkout A, then from checkout B,
 * round after round (interleaved, so a noisy minute on a shared machine hits both), and prints
 * the median of each figure per build with its range: kvtier's GB/s, the raw limit's and the
 * ratio, as bench:tiers prints them. Each checkout must be built (`npm run build`, dist/); the
 * environment passes through (KVTIER_BENCH_TIERS=redis,s3, KVTIER_BENCH_TIERS_MIB,
 * KVTIER_BENCH_TIERS_REPEAT; KVTIER_NATIVE_PATH for a checkout without its own native addon).
 *   node --import tsx bench/support/tiers-ab.ts <checkout A> <checkout B> [rounds]
 * Each run rewrites its checkout's bench/results/tiers.json; restore it afterwards.
 */
import { spawnSync } from 'node:child_process';
import { join, resolve } from 'node:path';

const [a, b, roundsArg = '3'] = process.argv.slice(2);
if (a === undefined || b === undefined) {
  console.error('usage: tiers-ab.ts <checkout A> <checkout B> [rounds]');
  process.exit(2);
}
const rounds = Number(roundsArg);
const builds = [resolve(a), resolve(b)];
const COLUMNS = ['put', 'raw put', 'put ratio', 'get', 'raw get', 'get ratio'] as const;

/** figures[build][row key][column] = one value per round */
const figures = builds.map(() => new Map<string, number[][]>());

for (let r = 0; r < rounds; r++) {
  for (const [i, dir] of builds.entries()) {
    const run = spawnSync(process.execPath, [join(dir, 'dist/bench/tiers.js')], {
      cwd: dir,
      encoding: 'utf8',
      env: process.env,
      maxBuffer: 16 * 1024 * 1024,
    });
    if (run.status !== 0) {
      console.error(run.stdout, run.stderr);
      throw new Error(`${dir}: bench/tiers.ts exited with ${run.status}`);
    }
    // Rows: tier, chunk size and unit, then put, raw put, ratio, get, raw get, ratio, stall.
    for (const line of run.stdout.split('\n')) {
      const m =
        /^(\S+)\s+(\d+ [KMG]iB)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s/.exec(
          line,
        );
      if (m === null) continue;
      const key = `${m[1]} ${m[2]}`;
      const cols = figures[i]!.get(key) ?? COLUMNS.map(() => []);
      for (let c = 0; c < COLUMNS.length; c++) cols[c]!.push(Number(m[3 + c]));
      figures[i]!.set(key, cols);
    }
    console.error(`round ${r + 1}/${rounds}: ${dir} done`);
  }
}

const median = (xs: number[]) => {
  const s = [...xs].sort((x, y) => x - y);
  return s.length % 2 === 1
    ? s[(s.length - 1) / 2]!
    : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};
const cell = (xs: number[] | undefined) =>
  xs === undefined || xs.length === 0
    ? '-'
    : `${median(xs).toFixed(2)} [${Math.min(...xs).toFixed(2)}-${Math.max(...xs).toFixed(2)}]`;

console.log(
  `\nTier throughput, GB/s and ratio to raw: median [min-max] of ${rounds} interleaved rounds`,
);
console.log(`A = ${builds[0]}\nB = ${builds[1]}\n`);
console.log(`| row | build | ${COLUMNS.join(' | ')} |`);
console.log(`|---|---|${COLUMNS.map(() => '---').join('|')}|`);
for (const key of figures[0]!.keys()) {
  for (const [i, name] of ['A', 'B'].entries()) {
    const cols = figures[i]!.get(key);
    console.log(`| ${key} | ${name} | ${COLUMNS.map((_, c) => cell(cols?.[c])).join(' | ')} |`);
  }
}
