import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { parseBytes } from '../config/bytes.ts';
import { isKvtierError } from '../errors.ts';
import { formatCapacity, renderHitRateChart } from '../sim/chart.ts';
import {
  formatPercent,
  formatReport,
  formatTable,
  hitRate,
  hitRateWithGpu,
  reportToJson,
} from '../sim/report.ts';
import type {
  SimEngineOptions,
  SimFaults,
  SimModel,
  SimReport,
  SimTierConfig,
  Workload,
} from '../sim/types.ts';
import { longDocQa, multiRoundQa, traceReplay } from '../sim/workloads.ts';

/** What `kvtier simulate` hands the engine for one run (the engine's `runSimulation` options). */
export interface SimulationRunOptions {
  workload: Workload;
  model?: Partial<SimModel>;
  engine?: Partial<SimEngineOptions>;
  /** Capacity of the sidecar's CPU tier in bytes; the engine's default when absent. */
  cpuBytes?: number;
  /** Tiers below the CPU tier, in order. */
  lowerTiers?: SimTierConfig[];
  faults?: SimFaults;
  /** Stops and restarts the run's own Redis server (given with `--fault redis-outage`). */
  hooks?: { killRedis(): Promise<void>; restartRedis(): Promise<void> };
  /** A fresh directory the run may write to (removed afterwards). */
  workDir?: string;
  signal?: AbortSignal;
}

/** Runs one simulation; the engine's `runSimulation` unless a test injects another. */
export type SimulationRunner = (opts: SimulationRunOptions) => Promise<SimReport>;

/** What `kvtier simulate` reads from and writes to; injected so tests need no process. */
export interface SimulateCommandIo {
  /** Writes one line of output (no trailing newline). */
  out: (line: string) => void;
  /** Writes one line of diagnostics (no trailing newline). */
  err: (line: string) => void;
  /** Writes a whole file (the chart). */
  writeFile: (path: string, text: string) => Promise<void>;
  /** Runs one simulation; default: the engine in `src/sim/engine.ts`. */
  runSimulation?: SimulationRunner;
  /** Aborts the run in progress and skips the rest of a sweep. */
  signal?: AbortSignal;
}

/** Exit code when every run finished with 0 mismatched blocks. */
export const EXIT_OK = 0;
/** Exit code when a run reported mismatched blocks or could not finish. */
export const EXIT_MISMATCH = 1;
/** Exit code for bad flags. */
export const EXIT_USAGE = 2;

/** Fault names `--fault` accepts, each optionally `@STEP`. */
export const FAULT_NAMES = [
  'redis-outage',
  'sidecar-restart',
  'corrupt',
  'deadline',
  'evict',
] as const;

/** Engine step a fault fires at when `--fault NAME` gives no `@STEP`. */
export const DEFAULT_FAULT_STEP = 5;

/** Usage text of `kvtier simulate`. */
export const SIMULATE_COMMAND_USAGE = `Usage: kvtier simulate --workload multi-round|long-doc|trace [options]

Drives a real kvtier sidecar with a simulated vLLM-like engine, verifies every loaded KV block
against recomputation and reports where prompt tokens came from. With --sweep, runs once per
capacity and prints hit rate against capacity (and, with --chart, draws it as SVG).

Workloads:
  --workload multi-round   users share a system prompt; each round resends the user's history
      --users N --rounds N --system-tokens N --question-tokens N --answer-tokens N
      --interval-ms X      ms between a user's rounds (default 1000)
  --workload long-doc      each document read once, then query rounds (document + query)
      --documents N --document-tokens N --queries N --query-tokens N --output-tokens N
      --interval-ms X      ms between requests (default 1000)
  --workload trace         replay a Mooncake JSONL trace
      --trace FILE [--limit N] [--time-scale X] [--max-input-tokens N]
  --seed N                 seed of every synthetic token (default 0)

Tiers and engine:
  --cpu SIZE               CPU tier capacity, e.g. 256M (default: the engine's)
  --disk SIZE              add a local disk tier of SIZE (in a temporary directory)
  --redis URL              add a Redis tier (a fresh key prefix per run)
  --fault redis-outage starts a private redis-server per run instead (REDIS_SERVER or PATH)
  --chunk-size N           tokens per stored chunk (default 256)
  --gpu-blocks N           engine GPU KV blocks (its own prefix cache)
  --policy recompute|fail  what to do with blocks that failed to load (default recompute)
  --no-partial-chunks      claim only from chunk boundaries: an engine prefix that ends inside
                           a stored chunk then recomputes the rest of it (for comparison)
  --fault NAME[@STEP]      inject a fault (repeatable): ${FAULT_NAMES.join(', ')}

Output:
  --json                   print JSON instead of text
  --sweep cpu=SIZES|disk=SIZES   e.g. cpu=64M,256M,1G: one run per capacity, a table
  --chart FILE             with --sweep: write an SVG chart of hit rate vs capacity
  --help                   print this text

Exit status: 0 when every run had 0 mismatched blocks, 1 otherwise, 2 on bad flags.`;

class UsageError extends Error {}

const WORKLOAD_FLAGS = {
  'multi-round': [
    'users',
    'rounds',
    'system-tokens',
    'question-tokens',
    'answer-tokens',
    'interval-ms',
  ],
  'long-doc': [
    'documents',
    'document-tokens',
    'queries',
    'query-tokens',
    'output-tokens',
    'interval-ms',
  ],
  trace: ['trace', 'limit', 'time-scale', 'max-input-tokens'],
} as const;
type WorkloadKind = keyof typeof WORKLOAD_FLAGS;

const STRING_FLAGS = [
  'workload',
  'seed',
  'cpu',
  'disk',
  'redis',
  'chunk-size',
  'gpu-blocks',
  'policy',
  'sweep',
  'chart',
  ...Object.values(WORKLOAD_FLAGS).flat(),
] as const;

interface Plan {
  load: (signal?: AbortSignal) => Promise<Workload>;
  base: Omit<SimulationRunOptions, 'workload' | 'workDir' | 'signal'>;
  diskBytes: number | undefined;
  redisUrl: string | undefined;
  sweep: { tier: 'cpu' | 'disk'; capacitiesBytes: number[] } | undefined;
  chart: string | undefined;
  json: boolean;
}

/**
 * Runs `kvtier simulate` with `argv` (the arguments after `simulate`). Never throws for bad
 * flags: it prints one `kvtier simulate: ...` line to `io.err` and resolves {@link EXIT_USAGE}.
 * A run that fails prints one line and resolves {@link EXIT_MISMATCH}.
 * @returns 0 when every run had 0 mismatched blocks (also for `--help`), 1 otherwise, 2 on bad flags.
 */
export async function runSimulateCommand(argv: string[], io: SimulateCommandIo): Promise<number> {
  let plan: Plan;
  try {
    const p = parsePlan(argv);
    if (p === 'help') {
      for (const line of SIMULATE_COMMAND_USAGE.split('\n')) io.out(line);
      return EXIT_OK;
    }
    plan = p;
  } catch (err) {
    if (err instanceof UsageError) {
      io.err(`kvtier simulate: ${err.message} (see --help)`);
      return EXIT_USAGE;
    }
    throw err;
  }

  let workload: Workload;
  try {
    workload = await plan.load(io.signal);
  } catch (err) {
    io.err(`kvtier simulate: ${oneLine(err)}`);
    return isKvtierError(err, 'KVT_ABORTED') ? EXIT_MISMATCH : EXIT_USAGE;
  }

  const run = io.runSimulation ?? defaultRunner;
  const capacities = plan.sweep?.capacitiesBytes ?? [undefined];
  const reports: SimReport[] = [];
  for (const [i, capacity] of capacities.entries()) {
    if (plan.sweep !== undefined) {
      io.err(
        `kvtier simulate: run ${i + 1}/${capacities.length}: ${plan.sweep.tier} tier ${formatCapacity(capacity as number)}`,
      );
    }
    try {
      reports.push(await runOnce(plan, workload, capacity, run, io.signal));
    } catch (err) {
      io.err(`kvtier simulate: run failed: ${oneLine(err)}`);
      return isKvtierError(err, 'KVT_INVALID_ARGUMENT') || isKvtierError(err, 'KVT_CONFIG')
        ? EXIT_USAGE
        : EXIT_MISMATCH;
    }
  }

  if (plan.sweep === undefined) {
    const report = reports[0] as SimReport;
    if (plan.json) io.out(JSON.stringify(reportToJson(report), null, 2));
    else for (const line of formatReport(report).split('\n')) io.out(line);
  } else {
    const { tier, capacitiesBytes } = plan.sweep;
    if (plan.json) {
      const runs = reports.map((r, i) => ({
        capacityBytes: capacitiesBytes[i],
        ...reportToJson(r),
      }));
      io.out(JSON.stringify({ sweep: { tier, capacitiesBytes }, runs }, null, 2));
    } else {
      for (const line of sweepTable(tier, capacitiesBytes, reports)) io.out(line);
    }
    if (plan.chart !== undefined) {
      const svg = renderHitRateChart({
        title: `kvtier hit rate vs ${tier === 'cpu' ? 'CPU' : 'disk'} tier capacity — ${workload.name}`,
        xLabel: `${tier === 'cpu' ? 'CPU' : 'disk'} tier capacity`,
        capacitiesBytes,
        series: [
          { name: 'kvtier (all tiers)', values: reports.map(hitRate) },
          { name: 'kvtier + GPU prefix cache', values: reports.map(hitRateWithGpu) },
        ],
      });
      await io.writeFile(plan.chart, svg);
      io.err(`kvtier simulate: chart written to ${plan.chart}`);
    }
  }
  const mismatched = reports.reduce((n, r) => n + r.mismatchedBlocks, 0);
  if (mismatched > 0) io.err(`kvtier simulate: ${mismatched} mismatched blocks`);
  return mismatched === 0 ? EXIT_OK : EXIT_MISMATCH;
}

/** The IO of the real process: stdout, stderr, files, and SIGINT aborting the run. */
export function processSimulateIo(): SimulateCommandIo {
  const ac = new AbortController();
  // Once: a second Ctrl-C falls through to Node's default and ends the process.
  process.once('SIGINT', () => ac.abort(new Error('interrupted (SIGINT)')));
  return {
    out: (l) => process.stdout.write(`${l}\n`),
    err: (l) => process.stderr.write(`${l}\n`),
    writeFile: (p, text) => writeFile(p, text, 'utf8'),
    signal: ac.signal,
  };
}

const defaultRunner: SimulationRunner = async (opts) => {
  // Loaded on demand so the other commands never pay for the engine.
  const { runSimulation } = await import('../sim/engine.ts');
  return await runSimulation(opts);
};

async function runOnce(
  plan: Plan,
  workload: Workload,
  sweepCapacity: number | undefined,
  run: SimulationRunner,
  signal: AbortSignal | undefined,
): Promise<SimReport> {
  // Each run gets its own directory and Redis key prefix, so no run sees another's chunks.
  const workDir = await mkdtemp(join(tmpdir(), 'kvtier-sim-'));
  let redis: PrivateRedis | undefined;
  try {
    const lowerTiers: SimTierConfig[] = [];
    const diskBytes = plan.sweep?.tier === 'disk' ? sweepCapacity : plan.diskBytes;
    if (diskBytes !== undefined) {
      lowerTiers.push({
        name: 'disk',
        type: 'local-disk',
        options: { path: join(workDir, 'disk'), capacityBytes: diskBytes },
      });
    }
    let redisUrl = plan.redisUrl;
    if (plan.base.faults?.redisOutage !== undefined) {
      // An outage needs a server this command can kill and restart, so it owns one per run.
      redis = await PrivateRedis.start(join(workDir, 'redis'));
      redisUrl = redis.url;
    }
    if (redisUrl !== undefined) {
      lowerTiers.push({
        name: 'redis',
        type: 'redis',
        options: { url: redisUrl, keyPrefix: `kvtier-sim-${randomBytes(6).toString('hex')}:` },
      });
    }
    const opts: SimulationRunOptions = { ...plan.base, workload, workDir, lowerTiers };
    if (redis !== undefined) {
      const r = redis;
      opts.hooks = { killRedis: () => r.kill(), restartRedis: () => r.restart() };
    }
    if (plan.sweep?.tier === 'cpu') opts.cpuBytes = sweepCapacity;
    if (signal !== undefined) opts.signal = signal;
    return await run(opts);
  } finally {
    await redis?.kill();
    await rm(workDir, { recursive: true, force: true });
  }
}

/** How long a private redis-server may take to accept connections (ms). */
const REDIS_START_TIMEOUT_MS = 10_000;

/** A `redis-server` without persistence on a loopback port, killed and restarted on demand. */
class PrivateRedis {
  #proc: ChildProcess | undefined;

  private constructor(
    readonly port: number,
    readonly dir: string,
  ) {}

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  static async start(dir: string): Promise<PrivateRedis> {
    await mkdir(dir, { recursive: true });
    const r = new PrivateRedis(await freePort(), dir);
    await r.restart();
    return r;
  }

  /** Starts the server (again) on the same port, empty. */
  async restart(): Promise<void> {
    const program = process.env.REDIS_SERVER ?? 'redis-server';
    const args = [
      '--port',
      String(this.port),
      '--bind',
      '127.0.0.1',
      '--save',
      '',
      '--appendonly',
      'no',
      '--dir',
      this.dir,
    ];
    const p = spawn(program, args, { stdio: ['ignore', 'pipe', 'ignore'] });
    this.#proc = p;
    await new Promise<void>((resolve, reject) => {
      let out = '';
      const done = (err?: Error) => {
        clearTimeout(timer);
        p.stdout?.off('data', onData);
        p.off('error', done);
        p.off('exit', onExit);
        p.stdout?.resume();
        if (err === undefined) resolve();
        else reject(err);
      };
      const onData = (d: Buffer) => {
        out += d.toString();
        if (out.includes('Ready to accept connections')) done();
      };
      const onExit = (code: number | null) =>
        done(new Error(`${program} on port ${this.port} exited (${code}) before it was ready`));
      const timer = setTimeout(() => {
        p.kill('SIGKILL');
        done(
          new Error(`${program} on port ${this.port} not ready in ${REDIS_START_TIMEOUT_MS} ms`),
        );
      }, REDIS_START_TIMEOUT_MS);
      p.stdout?.on('data', onData);
      p.once('error', done);
      p.once('exit', onExit);
    });
  }

  /** Kills the server (SIGKILL) and waits for it to exit; idempotent. */
  async kill(): Promise<void> {
    const p = this.#proc;
    this.#proc = undefined;
    if (p === undefined || p.exitCode !== null || p.signalCode !== null) return;
    const exited = new Promise((resolve) => p.once('exit', resolve));
    p.kill('SIGKILL');
    await exited;
  }
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() =>
        typeof addr === 'object' && addr !== null
          ? resolve(addr.port)
          : reject(new Error('no port')),
      );
    });
  });
}

function parsePlan(argv: string[]): Plan | 'help' {
  let values: Record<string, string | string[] | boolean | undefined>;
  try {
    ({ values } = parseArgs({
      args: argv,
      strict: true,
      allowPositionals: false,
      options: {
        ...Object.fromEntries(STRING_FLAGS.map((f) => [f, { type: 'string' as const }])),
        fault: { type: 'string', multiple: true },
        json: { type: 'boolean' },
        'no-partial-chunks': { type: 'boolean' },
        help: { type: 'boolean' },
      },
    }));
  } catch (err) {
    // parseArgs spreads its hint over several lines; keep it, on one line.
    throw new UsageError(oneLine(err).replace(/\s*\n\s*/g, ' '));
  }
  if (values.help === true) return 'help';
  const str = (f: string) => values[f] as string | undefined;

  const kind = str('workload');
  if (kind === undefined) throw new UsageError('--workload multi-round|long-doc|trace is required');
  if (!(kind in WORKLOAD_FLAGS)) {
    throw new UsageError(
      `--workload must be multi-round, long-doc or trace, got ${JSON.stringify(kind)}`,
    );
  }
  for (const [other, flags] of Object.entries(WORKLOAD_FLAGS)) {
    if (other === kind) continue;
    for (const f of flags) {
      if (
        values[f] !== undefined &&
        !(WORKLOAD_FLAGS[kind as WorkloadKind] as readonly string[]).includes(f)
      ) {
        throw new UsageError(`--${f} applies to --workload ${other}, not ${kind}`);
      }
    }
  }
  const int = (f: string, min: number) => intFlag(f, str(f), min);
  const seed = int('seed', 0);
  let load: Plan['load'];
  if (kind === 'multi-round') {
    const opts = {
      users: int('users', 1),
      rounds: int('rounds', 1),
      systemPromptTokens: int('system-tokens', 0),
      questionTokens: int('question-tokens', 1),
      answerTokens: int('answer-tokens', 1),
      roundIntervalMs: numberFlag('interval-ms', str('interval-ms')),
      seed,
    };
    load = async () => multiRoundQa(opts);
  } else if (kind === 'long-doc') {
    const opts = {
      documents: int('documents', 1),
      documentTokens: int('document-tokens', 1),
      queriesPerDocument: int('queries', 0),
      queryTokens: int('query-tokens', 1),
      outputTokens: int('output-tokens', 1),
      requestIntervalMs: numberFlag('interval-ms', str('interval-ms')),
      seed,
    };
    load = async () => longDocQa(opts);
  } else {
    const path = str('trace');
    if (path === undefined) throw new UsageError('--workload trace needs --trace FILE');
    const timeScale = numberFlag('time-scale', str('time-scale'));
    const opts = {
      path,
      limit: int('limit', 1),
      timeScale,
      maxInputTokens: int('max-input-tokens', 1),
      seed,
    };
    load = (signal) =>
      traceReplay(opts, signal === undefined ? {} : { signal }).catch((err: unknown) => {
        if (isKvtierError(err)) throw err;
        throw new Error(`cannot read trace ${path}: ${oneLine(err)}`);
      });
  }

  const base: Plan['base'] = {};
  const cpu = sizeFlag('cpu', str('cpu'));
  if (cpu !== undefined) base.cpuBytes = cpu;
  const chunkSize = int('chunk-size', 1);
  if (chunkSize !== undefined) base.model = { chunkSize };
  const engine: Partial<SimEngineOptions> = {};
  const gpuBlocks = int('gpu-blocks', 1);
  if (gpuBlocks !== undefined) engine.numGpuBlocks = gpuBlocks;
  const policy = str('policy');
  if (policy !== undefined) {
    if (policy !== 'recompute' && policy !== 'fail') {
      throw new UsageError(`--policy must be recompute or fail, got ${JSON.stringify(policy)}`);
    }
    engine.kvLoadFailurePolicy = policy;
  }
  if (values['no-partial-chunks'] === true) engine.partialChunkLoads = false;
  if (Object.keys(engine).length > 0) base.engine = engine;
  const faults = parseFaults((values.fault as string[] | undefined) ?? []);
  if (faults !== undefined) base.faults = faults;

  const sweep = parseSweep(str('sweep'));
  const diskBytes = sizeFlag('disk', str('disk'));
  if (sweep?.tier === 'cpu' && cpu !== undefined) {
    throw new UsageError('--cpu and --sweep cpu=... both set the CPU tier capacity; give one');
  }
  if (sweep?.tier === 'disk' && diskBytes !== undefined) {
    throw new UsageError('--disk and --sweep disk=... both set the disk tier capacity; give one');
  }
  if (
    faults?.corruptChunks !== undefined &&
    diskBytes === undefined &&
    sweep?.tier !== 'disk' &&
    str('redis') === undefined &&
    faults.redisOutage === undefined
  ) {
    throw new UsageError(
      '--fault corrupt damages chunks on the lowest tier: add --disk SIZE or --redis URL',
    );
  }
  if (faults?.redisOutage !== undefined && str('redis') !== undefined) {
    throw new UsageError(
      '--fault redis-outage runs its own Redis server (it must kill it); drop --redis',
    );
  }
  const chart = str('chart');
  if (chart !== undefined && sweep === undefined) {
    throw new UsageError('--chart FILE needs --sweep cpu=...|disk=...');
  }
  return {
    load,
    base,
    diskBytes,
    redisUrl: str('redis'),
    sweep,
    chart,
    json: values.json === true,
  };
}

function parseFaults(specs: readonly string[]): SimFaults | undefined {
  if (specs.length === 0) return undefined;
  const faults: SimFaults = {};
  for (const spec of specs) {
    const [name, at] = spec.split('@', 2) as [string, string | undefined];
    if (!(FAULT_NAMES as readonly string[]).includes(name)) {
      throw new UsageError(
        `--fault must be one of ${FAULT_NAMES.join(', ')} (optionally @STEP), got ${JSON.stringify(spec)}`,
      );
    }
    const step = at === undefined ? DEFAULT_FAULT_STEP : (intFlag('fault', at, 1) as number);
    if (name === 'redis-outage') faults.redisOutage = { atStep: step, forSteps: 5 };
    else if (name === 'sidecar-restart') faults.sidecarRestartAtStep = step;
    else if (name === 'corrupt') faults.corruptChunks = { atStep: step, count: 2 };
    else if (name === 'deadline') faults.lookupDeadlineAtStep = step;
    else faults.evictBetweenLookupAndLoadAtStep = step;
  }
  return faults;
}

function parseSweep(raw: string | undefined): Plan['sweep'] {
  if (raw === undefined) return undefined;
  const m = /^(cpu|disk)=(.+)$/.exec(raw);
  if (m === null) {
    throw new UsageError(
      `--sweep must look like cpu=64M,256M,1G or disk=1G,4G, got ${JSON.stringify(raw)}`,
    );
  }
  const tier = m[1] as 'cpu' | 'disk';
  const sizes = (m[2] as string).split(',').map((v) => sizeFlag('sweep', v.trim()) as number);
  if (sizes.some((s) => s === 0)) throw new UsageError('--sweep capacities must be > 0');
  const capacitiesBytes = [...new Set(sizes)].sort((a, b) => a - b);
  return { tier, capacitiesBytes };
}

function sweepTable(
  tier: string,
  capacities: readonly number[],
  reports: readonly SimReport[],
): string[] {
  const tiers = [...new Set(reports.flatMap((r) => Object.keys(r.tokens.byTier)))];
  const headers = [
    `${tier} capacity`,
    'hit rate',
    'with GPU',
    'GPU cache',
    ...tiers.map((t) => `tier ${t}`),
    'recomputed',
    'failed reqs',
    'mismatched',
  ];
  const rows = reports.map((r, i) => [
    formatCapacity(capacities[i] as number),
    formatPercent(hitRate(r)),
    formatPercent(hitRateWithGpu(r)),
    String(r.tokens.gpuPrefixCache),
    ...tiers.map((t) => String(r.tokens.byTier[t] ?? 0)),
    String(r.tokens.recomputed),
    String(r.failed),
    String(r.mismatchedBlocks),
  ]);
  return formatTable(rows, headers);
}

function intFlag(flag: string, raw: string | undefined, min: number): number | undefined {
  if (raw === undefined) return undefined;
  const n = Number(raw);
  if (!/^[0-9]+$/.test(raw) || !Number.isSafeInteger(n) || n < min) {
    throw new UsageError(`--${flag} must be an integer >= ${min}, got ${JSON.stringify(raw)}`);
  }
  return n;
}

function numberFlag(flag: string, raw: string | undefined): number | undefined {
  if (raw === undefined) return undefined;
  const n = Number(raw);
  if (raw.trim() === '' || !Number.isFinite(n) || n < 0) {
    throw new UsageError(`--${flag} must be a number >= 0, got ${JSON.stringify(raw)}`);
  }
  return n;
}

function sizeFlag(flag: string, raw: string | undefined): number | undefined {
  if (raw === undefined) return undefined;
  try {
    return parseBytes(`--${flag}`, raw);
  } catch (err) {
    throw new UsageError(oneLine(err));
  }
}

function oneLine(err: unknown): string {
  const msg = err instanceof Error ? err.message : String(err);
  return msg.split('\n', 1)[0] ?? msg;
}
