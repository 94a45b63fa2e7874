import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

/** Spawns a TypeScript child that prints `ready <endpoint>`; resolves the endpoint. */
export async function spawnReady(
  script: string,
): Promise<{ child: ChildProcess; endpoint: string }> {
  // KVTIER_BENCH_NODE_FLAGS passes flags to every child, e.g. "--cpu-prof --cpu-prof-dir=/tmp/p".
  const flags = (process.env.KVTIER_BENCH_NODE_FLAGS ?? '').split(' ').filter((f) => f.length > 0);
  const loader = script.endsWith('.ts') ? ['--import', 'tsx'] : [];
  const child = spawn(process.execPath, [...flags, ...loader, script], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const rl = createInterface({ input: child.stdout! });
  const endpoint = await new Promise<string>((resolve, reject) => {
    rl.on('line', (line) => {
      if (line.startsWith('ready ')) resolve(line.slice(6).trim());
    });
    child.once('exit', (code) =>
      reject(new Error(`${script} exited with ${code} before it was ready`)),
    );
  });
  return { child, endpoint };
}

/** Closes the child's stdin (its signal to stop) and waits for it to exit. */
export async function stopChild(child: ChildProcess): Promise<void> {
  const exited = new Promise((r) => child.once('exit', r));
  child.stdin?.end();
  await exited;
}

/** Percentile of a sorted array (nearest rank). */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i]!;
}

/** Prints an aligned table. */
export function printTable(headers: string[], rows: (string | number)[][]): void {
  const cells = [headers, ...rows.map((r) => r.map(String))];
  const widths = headers.map((_, i) => Math.max(...cells.map((r) => (r[i] ?? '').length)));
  for (const [k, r] of cells.entries()) {
    console.log(
      r.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  '),
    );
    if (k === 0) console.log(widths.map((w) => '-'.repeat(w)).join('  '));
  }
}

/** Writes `bench/results/<name>` at the repository root, whether run from source or from dist/. */
export async function writeResults(name: string, data: unknown): Promise<string> {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json'))) {
    const up = dirname(dir);
    if (up === dir) throw new Error('writeResults: no package.json above the bench');
    dir = up;
  }
  const file = join(dir, 'bench', 'results', name);
  await mkdir(dirname(file), { recursive: true });
  await writeFile(file, `${JSON.stringify(data, null, 2)}\n`);
  return file;
}
