import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { cpuTier, type PlanShapes } from '../sim/planner.ts';
import { executePlannerRun, type PlannerRunSpec } from '../sim/planner-run.ts';
import { formatSize } from '../sim/report.ts';
import { runInWorkers } from '../sim/run-pool.ts';
import { PLANNER_TIERS, type PlannerTier } from '../sim/tier-models.ts';
import type { SimReport, Workload } from '../sim/types.ts';
import { scaleArrivals } from '../sim/workload-spec.ts';
import type { SimulateCommandIo } from './simulate-io.ts';
import type { Plan } from './simulate-plan.ts';
import { type RunTiers, setUpTiers } from './simulate-tiers.ts';

/**
 * The runs of a plan: its configurations (one per swept capacity, or the flags' one), and the
 * machinery that makes a batch of runs, each with its own directory and tiers: in worker threads
 * (the default), or one after the other in this thread (an injected runner, or fault runs, whose
 * hooks cannot cross to a worker).
 */

/** One configuration: a capacity per tier in the planned model's bytes. */
export interface Configuration {
  label: string;
  capacities: Partial<Record<PlannerTier, number>> & { cpu: number };
}

/** The configurations a plan asks for, in the order they are reported. */
export function configurations(plan: Plan): Configuration[] {
  if (plan.sweeps.length === 0)
    return [{ label: describe(plan.tiers), capacities: { ...plan.tiers } }];
  return plan.sweeps.flatMap((s) =>
    s.capacitiesBytes.map((c) => ({
      label: `${s.tier} ${formatSize(c)}`,
      capacities: { ...plan.tiers, [s.tier]: c },
    })),
  );
}

/** "cpu 32 GiB + disk 1 TiB". */
export function describe(caps: Partial<Record<PlannerTier, number>>): string {
  return PLANNER_TIERS.filter((t) => caps[t] !== undefined)
    .map((t) => `${t} ${formatSize(caps[t] as number)}`)
    .join(' + ');
}

/** What a batch of runs shares. */
export interface RunRequest {
  plan: Plan;
  shapes: PlanShapes;
  /** The spec every run starts from (tiers, kvtier and scale are set per run). */
  spec: PlannerRunSpec;
  /** The workload at scale 1, for runs in this thread. */
  workload: Workload;
  io: SimulateCommandIo;
  /** Runs at once in worker threads, at most. */
  workers: number;
}

/** One run of a batch. */
export interface RunItem {
  /** The configuration; undefined for a run without kvtier. */
  config: Configuration | undefined;
  kvtier: boolean;
  /** In a fleet: fs, redis and s3 shared (else split N ways). */
  shared: boolean;
  /** In a fleet: a peer tier below the (node-local) tiers. */
  peers?: boolean;
  /** Factor on the workload's arrivals. */
  scale: number;
}

/**
 * Makes a batch of runs and returns their reports in order. Every run's directory and servers
 * are removed afterwards, also on error.
 */
export async function executeRuns(
  req: RunRequest,
  items: readonly RunItem[],
): Promise<SimReport[]> {
  const { plan, shapes, io } = req;
  const made: { dir: string; tiers: RunTiers }[] = [];
  try {
    const specs: PlannerRunSpec[] = [];
    for (const it of items) {
      const dir = await mkdtemp(join(tmpdir(), 'kvtier-sim-'));
      const caps: Partial<Record<PlannerTier, number>> = { ...it.config?.capacities };
      delete caps.cpu;
      const tiers = await setUpTiers({
        capacities: it.kvtier ? caps : {},
        engines: plan.engines,
        shared: it.shared,
        peers: it.peers === true,
        shapes,
        workDir: dir,
        redisUrl: it.kvtier ? plan.redisUrl : undefined,
        redisOutage: it.kvtier && plan.faults?.redisOutage !== undefined,
      }).catch(async (err: unknown) => {
        await rm(dir, { recursive: true, force: true });
        throw err;
      });
      made.push({ dir, tiers });
      const cpu = cpuTier(it.config?.capacities.cpu ?? plan.tiers.cpu, shapes);
      specs.push({
        ...req.spec,
        arrivalScale: it.scale,
        kvtier: it.kvtier,
        cpuBytes: cpu.capacityBytes,
        cpuTierOptions: { pageBytes: cpu.pageBytes },
        engineTiers: tiers.engineTiers,
        sharedTiers: tiers.sharedTiers,
        sweepTiers: tiers.sweepTiers,
        ...(tiers.listens === undefined ? {} : { listens: tiers.listens }),
        workDir: dir,
      });
    }
    const started = performance.now();
    const done = (i: number, r: SimReport) =>
      io.err(
        `kvtier simulate: run ${i + 1}/${specs.length} done: ${items[i]?.config?.label ?? 'kvtier off'}${items[i]?.kvtier && plan.engines > 1 ? (items[i]?.peers ? ', peers' : items[i]?.shared ? ', shared' : ', node-local') : ''} (${(r.wallMs / 1000).toFixed(1)} s; ${((performance.now() - started) / 1000).toFixed(1)} s since the batch began)`,
      );
    const inThread =
      io.runSimulation ?? (plan.faults !== undefined ? executePlannerRun : undefined);
    if (inThread === undefined)
      return await runInWorkers(specs, req.workers, {
        ...(io.signal === undefined ? {} : { signal: io.signal }),
        onDone: done,
      });
    const out: SimReport[] = [];
    for (const [i, spec] of specs.entries()) {
      const hooks = made[i]?.tiers.hooks;
      const r = await inThread({
        ...spec,
        workload: scaleArrivals(req.workload, spec.arrivalScale),
        ...(items[i]?.kvtier && plan.faults !== undefined ? { faults: plan.faults } : {}),
        ...(hooks === undefined ? {} : { hooks }),
        ...(io.signal === undefined ? {} : { signal: io.signal }),
      });
      done(i, r);
      out.push(r);
    }
    return out;
  } finally {
    for (const m of made) {
      await m.tiers.close();
      await rm(m.dir, { recursive: true, force: true });
    }
  }
}
