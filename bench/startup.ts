/**
 * How long `kvtier serve` takes to listen, as a user starts it from a clone (the README's
 * numbers come from here):
 *   npm run bench:startup                 (5 starts of each; --rounds N, --npx-rounds N)
 * - `node bin/kvtier.js serve` with no config (CPU + disk tiers, the disk in a temp cache
 *   directory): spawn to its "serving on" line;
 * - the raw limit, measured in the same run: `node` starting and printing one line (no kvtier);
 * - `npx kvtier serve` from the repository root: what npm adds before the program starts;
 * - `kvtier version`, `kvtier --help` and `kvtier ping` (against an idle sidecar) to their exit,
 *   against `node -e 0` to its exit: what the CLI's lazy imports buy.
 * Each figure is the median of its rounds, with min and max. Writes bench/results/startup.json.
 */
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeResults } from './support/child.ts';

const argv = process.argv.slice(2);
const flag = (name: string, fallback: number): number => {
  const i = argv.indexOf(name);
  return i >= 0 ? Number(argv[i + 1]) : fallback;
};
const ROUNDS = flag('--rounds', 5);
const NPX_ROUNDS = flag('--npx-rounds', 3);
const here = new URL('.', import.meta.url).pathname;
const root = join(here, import.meta.url.endsWith('.ts') ? '..' : '../..');

/** Spawns `cmd` in its own process group; resolves ms until a stderr line contains `marker`. */
function timeUntil(
  cmd: string,
  args: string[],
  env: NodeJS.ProcessEnv,
  marker: string,
): Promise<number> {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const p = spawn(cmd, args, {
      cwd: root,
      env,
      stdio: ['ignore', 'ignore', 'pipe'],
      detached: true,
    });
    let err = '';
    let done = false;
    p.stderr.setEncoding('utf8').on('data', (d: string) => {
      err += d;
      if (done || !err.includes(marker)) return;
      done = true;
      const ms = performance.now() - t0;
      // The whole group: npx leaves its child running when only npx is signalled.
      p.once('exit', () => resolve(ms));
      try {
        process.kill(-p.pid!, 'SIGTERM');
      } catch {
        resolve(ms);
      }
    });
    p.once('exit', (code) => {
      if (!done) reject(new Error(`${cmd} ${args.join(' ')} exited ${code}: ${err.slice(-500)}`));
    });
  });
}

/** Spawns `node ARGS`; resolves ms until it exits 0 (its answer printed). */
function timeToExit(args: string[], env: NodeJS.ProcessEnv): Promise<number> {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const p = spawn(process.execPath, args, {
      cwd: root,
      env,
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let err = '';
    p.stderr.setEncoding('utf8').on('data', (d: string) => {
      err += d;
    });
    p.once('exit', (code) => {
      if (code === 0) resolve(performance.now() - t0);
      else reject(new Error(`node ${args.join(' ')} exited ${code}: ${err.slice(-500)}`));
    });
  });
}

function stats(ms: number[]): { medianMs: number; minMs: number; maxMs: number; rounds: number } {
  const s = [...ms].sort((a, b) => a - b);
  const r = (x: number) => Math.round(x);
  return {
    medianMs: r(s[Math.floor(s.length / 2)]!),
    minMs: r(s[0]!),
    maxMs: r(s.at(-1)!),
    rounds: s.length,
  };
}

const cache = await mkdtemp(join(tmpdir(), 'kvtier-bench-startup-'));
const env: NodeJS.ProcessEnv = { ...process.env, XDG_CACHE_HOME: cache, KVTIER_LOG_LEVEL: 'warn' };
for (const k of Object.keys(env))
  if (k.startsWith('KVTIER_') && k !== 'KVTIER_LOG_LEVEL') delete env[k];
const serveArgs = ['serve', '--listen', 'tcp://127.0.0.1:*', '--metrics-port', '0'];
const load1 = loadavg()[0]!;
const node: number[] = [];
const serve: number[] = [];
const npx: number[] = [];
const nodeExit: number[] = [];
const version: number[] = [];
const help: number[] = [];
const ping: number[] = [];
// A sidecar for `kvtier ping` to answer (an idle one, started once).
const pingPort = 20000 + Math.floor(Math.random() * 20000);
const pinged = spawn(
  process.execPath,
  ['bin/kvtier.js', 'serve', '--listen', `tcp://127.0.0.1:${pingPort}`, '--metrics-port', '0'],
  { cwd: root, env: { ...env, KVTIER_DISK: 'off' }, stdio: ['ignore', 'ignore', 'pipe'] },
);
await new Promise<void>((resolve, reject) => {
  let err = '';
  pinged.stderr.setEncoding('utf8').on('data', (d: string) => {
    err += d;
    if (err.includes('serving on')) resolve();
  });
  pinged.once('exit', (code) => reject(new Error(`the sidecar for ping exited ${code}: ${err}`)));
});
try {
  for (let i = 0; i < ROUNDS; i++) {
    node.push(
      await timeUntil(process.execPath, ['-e', "process.stderr.write('up\\n')"], env, 'up'),
    );
    serve.push(
      await timeUntil(process.execPath, ['bin/kvtier.js', ...serveArgs], env, 'serving on'),
    );
    nodeExit.push(await timeToExit(['-e', '0'], env));
    version.push(await timeToExit(['bin/kvtier.js', 'version'], env));
    help.push(await timeToExit(['bin/kvtier.js', '--help'], env));
    ping.push(
      await timeToExit(['bin/kvtier.js', 'ping', '--endpoint', `tcp://127.0.0.1:${pingPort}`], env),
    );
  }
  for (let i = 0; i < NPX_ROUNDS; i++)
    npx.push(await timeUntil('npx', ['kvtier', ...serveArgs], env, 'serving on'));
} finally {
  pinged.kill('SIGTERM');
  await new Promise((r) => pinged.once('exit', r));
  await rm(cache, { recursive: true, force: true });
}
const result = {
  machine: {
    cpus: cpus().length,
    loadAverage1mAtStart: Number(load1.toFixed(2)),
    node: process.version,
  },
  nodeStart: stats(node),
  serve: stats(serve),
  npxServe: stats(npx),
  serveOverNodeStart: Number((stats(serve).medianMs / stats(node).medianMs).toFixed(2)),
  nodeExit: stats(nodeExit),
  version: stats(version),
  help: stats(help),
  ping: stats(ping),
  versionOverNode: Number((stats(version).medianMs / stats(nodeExit).medianMs).toFixed(2)),
  helpOverNode: Number((stats(help).medianMs / stats(nodeExit).medianMs).toFixed(2)),
};
const row = (what: string, s: ReturnType<typeof stats>) =>
  `| ${what.padEnd(38)} | ${String(s.medianMs).padStart(7)} | ${String(s.minMs).padStart(7)} | ${String(s.maxMs).padStart(7)} |`;
console.log(
  `startup on ${result.machine.cpus} cores, load ${result.machine.loadAverage1mAtStart}, node ${process.version}`,
);
console.log(`| ${'ms to the first line'.padEnd(38)} |  median |     min |     max |`);
console.log(`|${'-'.repeat(40)}|---------|---------|---------|`);
console.log(row('node -e (raw limit: Node starting)', result.nodeStart));
console.log(row('node bin/kvtier.js serve', result.serve));
console.log(row('npx kvtier serve', result.npxServe));
console.log(`serve / raw limit: ${result.serveOverNodeStart}x`);
console.log(`| ${'ms to exit 0'.padEnd(38)} |  median |     min |     max |`);
console.log(`|${'-'.repeat(40)}|---------|---------|---------|`);
console.log(row('node -e 0 (raw limit)', result.nodeExit));
console.log(row('kvtier version', result.version));
console.log(row('kvtier --help', result.help));
console.log(row('kvtier ping (an idle sidecar answers)', result.ping));
console.log(`version / node: ${result.versionOverNode}x, --help / node: ${result.helpOverNode}x`);
console.log(`wrote ${await writeResults('startup.json', result)}`);
