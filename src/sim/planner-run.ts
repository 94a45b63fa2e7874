import { runSimulation, type SimHooks } from './engine.ts';
import { runFleet } from './fleet.ts';
import type { EngineSpeed } from './gpu.ts';
import type { PlannedModel } from './models.ts';
import { plannerTiming } from './planner-timing.ts';
import type { RouterKind } from './router.ts';
import type { PlannerTier, TierModel } from './tier-models.ts';
import type {
  SimEngineOptions,
  SimFaults,
  SimModel,
  SimReport,
  SimTierConfig,
  Workload,
} from './types.ts';
import type { WorkloadSpec } from './workload-spec.ts';

/**
 * One run the planner makes, described in plain data so that a worker thread can make it: the
 * workload (by spec, with a factor on its arrivals), kvtier on or off, the engines and router,
 * the model, the GPU model and the tiers' models, and the sidecar's tiers in the verification
 * model's bytes.
 */
export interface PlannerRunSpec {
  /** How to make the workload again in a worker; absent: the run needs the workload itself. */
  workloadSpec?: WorkloadSpec;
  /** Factor on the workload's arrival times (the replay's time scale). */
  arrivalScale: number;
  kvtier: boolean;
  /** Engines (1: one engine, no router). */
  engines: number;
  router: RouterKind;
  model: Partial<SimModel>;
  engine: Partial<SimEngineOptions>;
  planned: PlannedModel;
  speed: EngineSpeed;
  tierModels: Record<PlannerTier, TierModel>;
  /** The CPU tier, bytes of the verification model, and more of its options. */
  cpuBytes: number;
  cpuTierOptions: Record<string, unknown>;
  /** Each engine's tiers below its CPU tier (a shared tier appears in every list alike). */
  engineTiers: SimTierConfig[][];
  /** Names of the tiers one store serves to every engine of a fleet. */
  sharedTiers: string[];
  /** Each engine's sidecar endpoint, where a peer tier names them. */
  listens?: string[];
  /** Names of the tiers whose capacity a sweep on the modeled clock enforces (fs-backed). */
  sweepTiers: string[];
  /** A directory the run may write to. */
  workDir?: string;
}

/** A planner run with its workload (already scaled) and what cannot cross to a worker. */
export interface PlannerRunOptions extends PlannerRunSpec {
  workload: Workload;
  faults?: SimFaults;
  hooks?: Pick<SimHooks, 'killRedis' | 'restartRedis'>;
  signal?: AbortSignal;
}

/**
 * Makes one planner run: `runSimulation` for one engine (settled and on the planner's timing),
 * `runFleet` for several.
 */
export async function executePlannerRun(o: PlannerRunOptions): Promise<SimReport> {
  const timing = plannerTiming(o.planned, o.speed, o.tierModels);
  const common = {
    workload: o.workload,
    model: o.model,
    engine: o.engine,
    planned: o.planned,
    cpuBytes: o.cpuBytes,
    cpuTierOptions: o.cpuTierOptions,
    kvtier: o.kvtier,
    timing,
    ...(o.workDir === undefined ? {} : { workDir: o.workDir }),
    ...(o.signal === undefined ? {} : { signal: o.signal }),
  };
  if (o.engines > 1)
    return await runFleet({
      ...common,
      engines: o.engines,
      router: o.router,
      engineTiers: o.engineTiers,
      sharedTiers: o.sharedTiers,
      sweepTiers: o.sweepTiers,
      ...(o.listens === undefined ? {} : { listens: o.listens }),
    });
  return await runSimulation({
    ...common,
    lowerTiers: o.engineTiers[0] ?? [],
    settle: true,
    waitsAdvanceClock: false,
    sweepTiers: o.sweepTiers,
    ...(o.faults === undefined ? {} : { faults: o.faults }),
    ...(o.hooks === undefined ? {} : { hooks: o.hooks }),
  });
}
