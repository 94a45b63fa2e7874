import { writeFile } from 'node:fs/promises';
import { isKvtierError } from '../errors.ts';
import { chunkKeyTrace, lruBound } from '../sim/bounds.ts';
import { SIM_ENGINE_DEFAULTS } from '../sim/engine-options.ts';
import {
  defaultKvCacheBytes,
  type EngineSpeed,
  prefillRate,
  resolveEngineSpeed,
} from '../sim/gpu.ts';
import type { PlannedModel } from '../sim/models.ts';
import {
  boundFlags,
  chunksIn,
  engineCapacity,
  gainOver,
  gpuBlocksIn,
  offeredLoad,
  overload,
  type PlanRow,
  type PlanShapes,
  rowBounds,
  sustainableScale,
} from '../sim/planner.ts';
import { formatPlan, type PlanResult } from '../sim/planner-report.ts';
import { configurationCost, resolveTierModels } from '../sim/tier-models.ts';
import { calibrationLine, hostLinkLine } from '../sim/ttft-model.ts';
import type { SimReport, Workload } from '../sim/types.ts';
import { loadWorkload, scaleArrivals } from '../sim/workload-spec.ts';
import type { SimulateCommandIo } from './simulate-io.ts';
import { adviceLine, writeChart } from './simulate-output.ts';
import {
  oneLine,
  type Plan,
  parsePlan,
  SIMULATE_COMMAND_USAGE,
  UsageError,
} from './simulate-plan.ts';
import {
  type Configuration,
  configurations,
  executeRuns,
  type RunRequest,
} from './simulate-runs.ts';

export type { PlannerRunOptions as SimulationRunOptions } from '../sim/planner-run.ts';
export type { SimulateCommandIo, SimulationRunner } from './simulate-io.ts';
export { DEFAULT_FAULT_STEP, FAULT_NAMES, SIMULATE_COMMAND_USAGE } from './simulate-plan.ts';

/** Exit code when every run finished with 0 mismatched blocks. */
export const EXIT_OK = 0;
/** Exit code when a run reported mismatched blocks or could not finish. */
export const EXIT_MISMATCH = 1;
/** Exit code for bad flags. */
export const EXIT_USAGE = 2;

/**
 * The verification model whose bytes move and are checked: 1 layer, 1 KV head of dim 2, bf16
 * (8 bytes per token: a 256-token chunk is 2 KiB), small enough that a 2,000-request trace moves
 * a few gigabytes, not terabytes, and still checks K and V of every position of every block.
 */
export const VERIFICATION_MODEL = Object.freeze({ numLayers: 1, numKvHeads: 1, headDim: 2 });
const VERIFICATION_BYTES_PER_TOKEN = 2 * 1 * 1 * 2 * 2;
const BLOCK_TOKENS = 16;
/**
 * Runs at once by default: every run of a batch up to this many. More runs than cores still pay:
 * a run waits on its sidecar part of the time, and equal runs packed on fewer workers leave a
 * core idle at the end (three runs on two workers take two runs' time).
 */
const MAX_WORKERS = 8;

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

  let planned: PlannedModel;
  let workload: Workload;
  let speed: EngineSpeed;
  try {
    planned = await plan.loadModel();
    speed = resolveEngineSpeed(planned, {
      ...(plan.gpu.name === undefined ? {} : { gpu: plan.gpu.name }),
      ...(plan.gpu.gpusPerEngine === undefined ? {} : { gpus: plan.gpu.gpusPerEngine }),
      ...(plan.gpu.mfu === undefined ? {} : { mfu: plan.gpu.mfu }),
    });
    workload = await loadWorkload(plan.workloadSpec, io.signal).catch((err: unknown) => {
      if (isKvtierError(err) || plan.workloadSpec.kind !== 'trace') throw err;
      throw new Error(`cannot read trace ${plan.workloadSpec.options.path}: ${oneLine(err)}`);
    });
  } catch (err) {
    io.err(`kvtier simulate: ${oneLine(err)}`);
    return isKvtierError(err, 'KVT_ABORTED') ? EXIT_MISMATCH : EXIT_USAGE;
  }
  const tierModels = resolveTierModels(speed.gpu.hostLinkBytesPerSec, plan.tierModels);
  const shapes: PlanShapes = {
    planned,
    verificationBytesPerToken: VERIFICATION_BYTES_PER_TOKEN,
    chunkTokens: plan.model.chunkSize ?? 256,
    blockTokens: BLOCK_TOKENS,
  };
  const gpuBytes = plan.gpuMemoryBytes ?? defaultKvCacheBytes(planned, speed);
  const engine = { ...plan.engine };
  engine.numGpuBlocks ??= gpuBlocksIn(gpuBytes, shapes);
  // Never slower than recomputing: the engines' lookups carry their prefill rate on this workload.
  engine.neverSlower = true;
  engine.prefillTokensPerSec ??= prefillRate(
    planned,
    speed,
    workload.requests.map((r) => r.promptTokens.length),
  );
  const req: RunRequest = {
    plan,
    shapes,
    spec: {
      workloadSpec: plan.workloadSpec,
      arrivalScale: 1,
      kvtier: true,
      engines: plan.engines,
      router: plan.router,
      model: { ...VERIFICATION_MODEL, ...plan.model },
      engine,
      planned,
      speed,
      tierModels,
      cpuBytes: 0,
      cpuTierOptions: {},
      engineTiers: [],
      sharedTiers: [],
      sweepTiers: [],
    },
    workload,
    io,
    workers: plan.workers ?? MAX_WORKERS,
  };
  const configs = configurations(plan);

  let result: PlanResult;
  let json: unknown;
  try {
    // Load first: the replay's rate, and the run without kvtier every gain is measured against.
    const capacity = engineCapacity(
      workload,
      planned,
      speed,
      engine.numGpuBlocks * BLOCK_TOKENS,
      engine.maxRunning ?? SIM_ENGINE_DEFAULTS.maxRunning,
    );
    const own = offeredLoad(workload, planned, speed, capacity, plan.engines);
    const sustainable =
      plan.timeScale === undefined && (plan.workloadSpec.kind === 'trace' || plan.teach);
    const scale = plan.timeScale ?? (sustainable ? sustainableScale(own, plan.utilization) : 1);
    const how: PlanResult['replay']['how'] =
      plan.timeScale !== undefined ? 'given' : sustainable ? 'sustainable' : 'own';
    let off: SimReport | undefined;
    const runs = [
      ...(off === undefined ? [{ config: undefined, kvtier: false, shared: true, scale }] : []),
      ...configs.flatMap((config) => [
        ...(plan.engines > 1 ? [{ config, kvtier: true, shared: false, scale }] : []),
        ...(plan.peers ? [{ config, kvtier: true, shared: false, peers: true, scale }] : []),
        { config, kvtier: true, shared: true, scale },
      ]),
    ];
    io.err(
      `kvtier simulate: ${runs.length} runs at time scale ${scale.toFixed(2)} (${configs.map((c) => c.label).join(', ')})`,
    );
    const pending = executeRuns(req, runs);
    // The trace's chunk keys need no engine: made here while the runs go on in worker threads.
    const trace = chunkKeyTrace(workload, shapes.chunkTokens);
    const infinite = lruBound(trace, Number.POSITIVE_INFINITY).hitRate;
    const gpuChunks =
      Math.floor((engine.numGpuBlocks * BLOCK_TOKENS) / shapes.chunkTokens) * plan.engines;
    const reports = await pending;
    if (off === undefined) off = reports.shift() as SimReport;
    const load = offeredLoad(
      scaleArrivals(workload, scale),
      planned,
      speed,
      capacity,
      plan.engines,
    );
    const rows: PlanRow[] = [];
    const nodeLocal: PlanRow[] = [];
    const peers: PlanRow[] = [];
    for (const c of configs) {
      if (plan.engines > 1)
        nodeLocal.push(row(c, reports.shift() as SimReport, off, load.spanMs, undefined));
      if (plan.peers) peers.push(row(c, reports.shift() as SimReport, off, load.spanMs, undefined));
      const r = reports.shift() as SimReport;
      const b = rowBounds(trace, r, tierChunks(c, shapes, plan.engines), gpuChunks, infinite);
      rows.push(row(c, r, off, load.spanMs, b));
    }
    for (const r of [...rows, ...nodeLocal, ...peers])
      r.cost = costOf(r.capacities, plan.engines, tierModels);
    result = {
      workload: workload.name,
      planned,
      speed,
      engines: plan.engines,
      ...(plan.engines > 1 ? { router: plan.router } : {}),
      load,
      replay: { scale, how, ...(how === 'sustainable' ? { target: plan.utilization } : {}) },
      overloaded: overload(load, off),
      off,
      rows,
      ...(plan.engines > 1 ? { nodeLocal } : {}),
      ...(plan.peers ? { peers } : {}),
      sweep: plan.sweeps.length > 0,
      target: plan.target,
      calibration: calibrationLine(planned, speed),
      hostLink: hostLinkLine(planned, speed),
      advice: '',
    };
    Object.assign(result, adviceLine(result, trace, shapes));
    json = {
      workload: result.workload,
      model: planned,
      engine: { ...speed, gpusPerEngine: speed.gpus, kvCacheBytes: gpuBytes },
      engines: plan.engines,
      router: result.router,
      replay: result.replay,
      load,
      overloaded: result.overloaded ?? null,
      baseline: withoutPerRequest(off),
      runs: rows.map(rowJson),
      ...(plan.engines > 1 ? { nodeLocal: nodeLocal.map(rowJson) } : {}),
      ...(plan.peers ? { peers: peers.map(rowJson) } : {}),
      target: plan.target ?? null,
      cheapest: result.cheapest?.label ?? null,
      tierModels,
      calibration: result.calibration,
      hostLink: result.hostLink,
      advice: result.advice,
    };
  } catch (err) {
    io.err(`kvtier simulate: run failed: ${oneLine(err)}`);
    return isKvtierError(err, 'KVT_INVALID_ARGUMENT') || isKvtierError(err, 'KVT_CONFIG')
      ? EXIT_USAGE
      : EXIT_MISMATCH;
  }
  if (plan.json) io.out(JSON.stringify(json, null, 2));
  else for (const line of formatPlan(result)) io.out(line);
  if (plan.chart !== undefined) await writeChart(plan.chart, result, io);
  const mismatched = [
    result.off,
    ...result.rows.map((r) => r.report),
    ...(result.nodeLocal ?? []).map((r) => r.report),
    ...(result.peers ?? []).map((r) => r.report),
  ].reduce((n, r) => n + r.mismatchedBlocks, 0);
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
    writeFile: (p, data) => writeFile(p, data),
    signal: ac.signal,
  };
}

function row(
  c: Configuration,
  report: SimReport,
  off: SimReport,
  spanMs: number,
  bounds: PlanRow['bounds'],
): PlanRow {
  return {
    label: c.label,
    capacities: c.capacities,
    report,
    gain: gainOver(off, report, spanMs),
    ...(bounds === undefined ? {} : { bounds }),
    flags: bounds === undefined ? [] : boundFlags(report, bounds),
    cost: 0,
  };
}

/** Chunks the configuration's kvtier holds: write-through makes its largest tier the bound. */
function tierChunks(c: Configuration, s: PlanShapes, engines: number): number {
  let max = 0;
  for (const [t, b] of Object.entries(c.capacities)) {
    const perNode = t === 'cpu' || t === 'disk';
    max = Math.max(max, chunksIn(b, s) * (perNode ? engines : 1));
  }
  return max;
}

function costOf(
  caps: PlanRow['capacities'],
  engines: number,
  models: ReturnType<typeof resolveTierModels>,
): number {
  const perNode = { cpu: caps.cpu, disk: caps.disk };
  const shared = { fs: caps.fs, redis: caps.redis, s3: caps.s3 };
  return engines * configurationCost(perNode, models) + configurationCost(shared, models);
}

function rowJson(r: PlanRow): unknown {
  return {
    label: r.label,
    capacities: r.capacities,
    cost: r.cost,
    gain: r.gain,
    bounds: r.bounds ?? null,
    flags: r.flags,
    report: withoutPerRequest(r.report),
  };
}

/** A report without its per-request figures (thousands of lines of JSON that say little). */
function withoutPerRequest(r: SimReport): SimReport {
  const { gpuHitTokens: _, engines, ...rest } = r;
  return engines === undefined ? rest : { ...rest, engines: engines.map(withoutPerRequest) };
}
