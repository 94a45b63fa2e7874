import { randomBytes } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isKvtierError } from '../errors.ts';
import { chunkKeyTrace, lruBound } from '../sim/bounds.ts';
import { formatCapacity, renderHitRateChart } from '../sim/chart.ts';
import type { PlannedModel } from '../sim/models.ts';
import {
  adviceLine,
  boundRows,
  chunksIn,
  cpuTierBytes,
  diskTierBytes,
  gpuBlocksIn,
  type PlanShapes,
} from '../sim/planner.ts';
import { formatPlannerLines, sweepTable } from '../sim/planner-report.ts';
import { formatReport, hitRateWithGpu, kvtierTokens, reportToJson } from '../sim/report.ts';
import type { SimReport, SimTierConfig, Workload } from '../sim/types.ts';
import { PrivateRedis } from './private-redis.ts';
import {
  oneLine,
  type Plan,
  parsePlan,
  SIMULATE_COMMAND_USAGE,
  type SimulationRunOptions,
  UsageError,
} from './simulate-plan.ts';

export {
  DEFAULT_FAULT_STEP,
  FAULT_NAMES,
  SIMULATE_COMMAND_USAGE,
  type SimulationRunOptions,
} from './simulate-plan.ts';

/** Runs one simulation; the engine's `runSimulation` unless a test injects another. */
export type SimulationRunner = (opts: SimulationRunOptions) => Promise<SimReport>;

/** What `kvtier simulate` reads from and writes to; injected so tests need no process. */
export interface SimulateCommandIo {
  /** Writes one line of output (no trailing newline). */
  out: (line: string) => void;
  /** Writes one line of diagnostics (no trailing newline). */
  err: (line: string) => void;
  /** Writes a whole file (the chart: SVG text, PNG bytes). */
  writeFile: (path: string, data: string | Uint8Array) => Promise<void>;
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

/** Verification model KV bytes per token (the engine's default small model: 4 x 2 x 2 x 16 x 2). */
const VERIFICATION_BYTES_PER_TOKEN = 512;
const BLOCK_TOKENS = 16;

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
  let planned: PlannedModel;
  try {
    planned = await plan.loadModel();
    workload = await plan.load(io.signal);
  } catch (err) {
    io.err(`kvtier simulate: ${oneLine(err)}`);
    return isKvtierError(err, 'KVT_ABORTED') ? EXIT_MISMATCH : EXIT_USAGE;
  }
  const shapes: PlanShapes = {
    planned,
    verificationBytesPerToken: VERIFICATION_BYTES_PER_TOKEN,
    chunkTokens: plan.base.model?.chunkSize ?? 256,
    blockTokens: BLOCK_TOKENS,
  };
  const fmt = (n: number) => formatCapacity(n);
  const runBase = { ...plan.base, planned };
  if (plan.gpuMemoryBytes !== undefined) {
    runBase.engine = { ...runBase.engine, numGpuBlocks: gpuBlocksIn(plan.gpuMemoryBytes, shapes) };
  }

  const run = io.runSimulation ?? defaultRunner;
  const capacities = plan.sweep?.capacitiesBytes ?? [plan.cpuBytes];
  const reports: SimReport[] = [];
  for (const [i, capacity] of capacities.entries()) {
    if (plan.sweep !== undefined) {
      io.err(
        `kvtier simulate: run ${i + 1}/${capacities.length}: ${plan.sweep.tier} tier ${fmt(capacity)} of ${planned.name} KV (${chunksIn(capacity, shapes).toLocaleString('en-US')} chunks)`,
      );
    }
    try {
      reports.push(await runOnce(plan, runBase, workload, capacity, shapes, run, io.signal));
    } catch (err) {
      io.err(`kvtier simulate: run failed: ${oneLine(err)}`);
      return isKvtierError(err, 'KVT_INVALID_ARGUMENT') || isKvtierError(err, 'KVT_CONFIG')
        ? EXIT_USAGE
        : EXIT_MISMATCH;
    }
  }

  const trace = chunkKeyTrace(workload, shapes.chunkTokens);
  if (plan.sweep === undefined) {
    const report = reports[0] as SimReport;
    const cpuChunks = chunksIn(plan.cpuBytes, shapes);
    const bounds = {
      lru: lruBound(trace, cpuChunks).hitRate,
      infinite: lruBound(trace, Number.POSITIVE_INFINITY).hitRate,
    };
    const advice = adviceLine(trace, report, plan.cpuBytes, shapes, fmt);
    if (plan.json) {
      io.out(
        JSON.stringify(
          { ...reportToJson(report), cpuCapacityBytes: plan.cpuBytes, bounds, advice },
          null,
          2,
        ),
      );
    } else {
      for (const line of formatReport(report).split('\n')) io.out(line);
      io.out('');
      for (const line of formatPlannerLines(report, {
        planned,
        cpuBytes: plan.cpuBytes,
        bounds,
        fmt,
      }))
        io.out(line);
      io.out(advice);
    }
  } else {
    const { tier, capacitiesBytes } = plan.sweep;
    const rows = boundRows(trace, capacitiesBytes, reports, shapes);
    if (plan.json) {
      const runs = rows.map((r) => ({
        capacityBytes: r.capacityBytes,
        chunks: r.chunks,
        lruHitRate: r.lru,
        lruWithGpuHitRate: r.lruWithGpu,
        infiniteHitRate: r.infinite,
        ...reportToJson(r.report),
      }));
      io.out(
        JSON.stringify({ sweep: { tier, capacitiesBytes, model: planned.name }, runs }, null, 2),
      );
    } else {
      for (const line of sweepTable(tier, rows, planned, fmt)) io.out(line);
    }
    if (plan.chart !== undefined) {
      const svg = renderHitRateChart({
        title: `kvtier vs LRU and infinite cache — ${planned.name}, ${workload.name.replace(/^trace:/, '')}`,
        xLabel: `${tier === 'cpu' ? 'CPU' : 'disk'} tier capacity, GiB of ${planned.name} KV`,
        capacitiesBytes,
        xTicks: capacitiesBytes.map((c) => `${fmtGiB(c)} GiB`),
        series: [
          {
            name: 'kvtier + GPU prefix cache',
            values: reports.map(hitRateWithGpu),
          },
          {
            name: 'kvtier alone',
            values: reports.map((r) => kvtierTokens(r) / Math.max(1, r.promptTokens)),
          },
          {
            name: 'LRU cache, tier + GPU capacity',
            values: rows.map((r) => r.lruWithGpu),
            dashed: true,
          },
          { name: 'LRU cache, tier capacity', values: rows.map((r) => r.lru), dashed: true },
          { name: 'infinite cache', values: rows.map((r) => r.infinite), dashed: true },
        ],
      });
      await io.writeFile(plan.chart, svg);
      const png = `${plan.chart.replace(/\.svg$/i, '')}.png`;
      try {
        const { renderPng } = await import('../sim/png.ts');
        await io.writeFile(png, await renderPng(svg));
        io.err(`kvtier simulate: chart written to ${plan.chart} and ${png}`);
      } catch (err) {
        io.err(`kvtier simulate: chart written to ${plan.chart}; no PNG: ${oneLine(err)}`);
      }
    }
  }
  const mismatched = reports.reduce((n, r) => n + r.mismatchedBlocks, 0);
  if (mismatched > 0) io.err(`kvtier simulate: ${mismatched} mismatched blocks`);
  return mismatched === 0 ? EXIT_OK : EXIT_MISMATCH;
}

/** GiB with up to one decimal, for chart ticks in the model's GiB. */
function fmtGiB(bytes: number): string {
  const g = bytes / 2 ** 30;
  return `${Number.isInteger(g) ? g : g.toFixed(g < 10 ? 2 : 1)}`;
}

/** The IO of the real process: stdout, stderr, files, and SIGINT aborting the run. */
export function processSimulateIo(): SimulateCommandIo {
  const ac = new AbortController();
  // Once: a second Ctrl-C falls through to Node's default and ends the process.
  process.once('SIGINT', () => ac.abort(new Error('interrupted (SIGINT)')));
  return {
    out: (l) => process.stdout.write(`${l}\n`),
    err: (l) => process.stderr.write(`${l}\n`),
    writeFile: (p, data) => writeFile(p, data),
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
  base: Plan['base'],
  workload: Workload,
  capacity: number,
  shapes: PlanShapes,
  run: SimulationRunner,
  signal: AbortSignal | undefined,
): Promise<SimReport> {
  // Each run gets its own directory and Redis key prefix, so no run sees another's chunks.
  const workDir = await mkdtemp(join(tmpdir(), 'kvtier-sim-'));
  let redis: PrivateRedis | undefined;
  try {
    const lowerTiers: SimTierConfig[] = [];
    const diskBytes = plan.sweep?.tier === 'disk' ? capacity : plan.diskBytes;
    if (diskBytes !== undefined) {
      lowerTiers.push({
        name: 'disk',
        type: 'local-disk',
        options: { path: join(workDir, 'disk'), capacityBytes: diskTierBytes(diskBytes, shapes) },
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
    const cpu = plan.sweep?.tier === 'cpu' ? capacity : plan.cpuBytes;
    const opts: SimulationRunOptions = {
      ...base,
      workload,
      workDir,
      lowerTiers,
      cpuBytes: cpuTierBytes(cpu, shapes),
      // A virtual clock: the schedule does not depend on how fast this machine is.
      waitsAdvanceClock: false,
    };
    if (redis !== undefined) {
      const r = redis;
      opts.hooks = { killRedis: () => r.kill(), restartRedis: () => r.restart() };
    }
    if (signal !== undefined) opts.signal = signal;
    return await run(opts);
  } finally {
    await redis?.kill();
    await rm(workDir, { recursive: true, force: true });
  }
}
