import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setImmediate as nextTurn } from 'node:timers/promises';
import { abortedError, KvtierError } from '../errors.ts';
import type { Sidecar } from '../sidecar.ts';
import type { BlockAllocatorStats } from './block-allocator.ts';
import { FaultInjector, validateFaults } from './engine-faults.ts';
import { Activity } from './engine-io.ts';
import { type NodeTiming, SimNode } from './engine-node.ts';
import { resolveSimOptions } from './engine-options.ts';
import { nodeReport } from './engine-report.ts';
import type { LoadAllocInfo, SimEvent, SimRequestStatus } from './engine-scheduler.ts';
import { DEFAULT_MODEL, modelPreset, type PlannedModel } from './models.ts';
import type {
  SimEngineOptions,
  SimFaults,
  SimModel,
  SimReport,
  SimTierConfig,
  Workload,
} from './types.ts';

export type { NodeTiming } from './engine-node.ts';
export { SIM_ENGINE_DEFAULTS, SIM_MODEL_DEFAULTS } from './engine-options.ts';
export type { LoadAllocInfo, SimEvent, SimRequestStatus } from './engine-scheduler.ts';

/** What `hooks.onStep` may do to the run (tests drive the conformance cases through it). */
export interface SimControl {
  /** The current step (1-based). */
  readonly step: number;
  /** Aborts a request wherever it is (vLLM `abort_requests`); false when unknown or ended. */
  abort(requestId: string): boolean;
  /** Resets the engine's prefix cache and the connector's cached lookups. */
  resetPrefixCache(): boolean;
  /** A request's status, or undefined before it arrived. */
  status(requestId: string): SimRequestStatus | undefined;
  /** The engine's GPU blocks (leak checks: every block is free once the run is over). */
  blockStats(): BlockAllocatorStats;
  /** Requests the scheduler connector still tracks (0 once every request ended). */
  readonly trackedRequests: number;
  /** The sidecar under test (a new one after a restart fault). */
  readonly sidecar: Sidecar;
}

/** Callbacks into a run; all optional. */
export interface SimHooks {
  /** Called at the start of every step, before arrivals and scheduling; awaited. */
  onStep?(step: number, ctl: SimControl): void | Promise<void>;
  /** Called once after the last step, before anything is closed; awaited. */
  onFinish?(ctl: SimControl): void | Promise<void>;
  /** Every status change, settled load, free and load intent. */
  onEvent?(e: SimEvent): void;
  /**
   * Called after each `updateStateAfterAlloc`; returning a token count makes the engine call
   * `updateStateAfterAlloc` a second time for the same request with that count (ending at a
   * chunk boundary, at most the first), as an engine that re-plans an allocation would.
   */
  onLoadAlloc?(a: LoadAllocInfo): number | undefined;
  /** Kills the Redis server of a Redis tier (needed by `faults.redisOutage`). */
  killRedis?(): Promise<void>;
  /** Restarts it (needed by `faults.redisOutage`). */
  restartRedis?(): Promise<void>;
}

/** Options of {@link runSimulation}. */
export interface RunSimulationOptions {
  workload: Workload;
  model?: Partial<SimModel>;
  engine?: Partial<SimEngineOptions>;
  /** Sidecar tiers below the CPU tier; the CPU tier is { name:'cpu', type:'local-cpu', capacityBytes: cpuBytes }. */
  cpuBytes?: number;
  /** Default none. A `local-disk` or `fs` tier without `options.path` gets `<workDir>/<name>`. */
  lowerTiers?: SimTierConfig[];
  faults?: SimFaults;
  /**
   * The model the run is planned for (default the Llama-3.1-8B preset): the modeled TTFT and
   * `modelBytes` are its; the bytes that move are the verification model's (`model`).
   */
  planned?: PlannedModel;
  /** Directory for the KV file and any disk tier; default a fresh temp dir removed at the end. */
  workDir?: string;
  /**
   * Real-time pacing: request `arrivalMs` is honoured at `arrivalMs * timeScale` ms of wall time.
   * 0 (default) runs as fast as possible on a modeled clock: each step advances it by its
   * modeled compute time (tokens / `prefillTokensPerSec`, at least 1 ms) or by the wall time
   * it waited for kvtier.
   */
  timeScale?: number;
  /**
   * With `timeScale` 0, whether the wall time the engine spends waiting for kvtier advances the
   * modeled clock. Default true: TTFT then includes kvtier's latency as measured. False makes a
   * run's schedule independent of how fast this machine is (an arrival is admitted when the
   * modeled compute reaches it, or when the engine is idle with nothing in flight), which the
   * tests use so that a loaded machine cannot reorder arrivals against saves.
   */
  waitsAdvanceClock?: boolean;
  /**
   * The planner's time model: steps last what the GPU model says, a kvtier load is ready only
   * after its modeled transfer, decode-only phases run in a tight loop (without `hooks.onStep`).
   * Without it, a step lasts its tokens over `engine.prefillTokensPerSec` (at least 1 ms).
   */
  timing?: NodeTiming;
  /**
   * Await, before each step, what it depends on (due loads, saves a lookup could find, lookups),
   * so the schedule does not depend on how fast this machine is. Default false.
   */
  settle?: boolean;
  /** kvtier on (default) or off: the same engine with nothing looked up, loaded or saved. */
  kvtier?: boolean;
  /** More options of the CPU tier (`local-cpu`), e.g. `pageBytes`. */
  cpuTierOptions?: Record<string, unknown>;
  /** Lower tiers whose capacity a sweep enforces every 60 s of modeled time (fs-backed tiers). */
  sweepTiers?: readonly string[];
  onProgress?: (step: number, done: number, total: number) => void;
  signal?: AbortSignal;
  hooks?: SimHooks;
}

/**
 * Runs a workload through a vLLM-v1-like engine against a real kvtier sidecar started in-process
 * (lookups and the data plane over ZMQ on loopback, a host-device KV file under `workDir`), and
 * verifies every loaded block byte for byte against recomputation. Closes everything it started,
 * also on error. With `kvtier: false` the same engine runs without a sidecar.
 *
 * `tokens.byTier` counts tokens loaded valid, credited to the tier each chunk's lookup found it
 * in (the answers' tier breakdown, recorded by the simulator's lookup client).
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for bad options; `KVT_ABORTED` when `signal` aborts;
 *   `KVT_INTERNAL` if the engine can make no progress (a bug); `KVT_CONFIG` when a tier fails.
 */
export async function runSimulation(opts: RunSimulationOptions): Promise<SimReport> {
  const o = resolveSimOptions(opts);
  const { model, engine } = o;
  const planned = opts.planned ?? modelPreset(DEFAULT_MODEL);
  const hooks = opts.hooks ?? {};
  const faults = opts.faults ?? {};
  const kvtier = opts.kvtier ?? true;
  validateFaults(faults, o.lowerTiers.at(-1), hooks);
  const started = performance.now();
  const ownDir = opts.workDir === undefined;
  const dir = opts.workDir ?? mkdtempSync(join(tmpdir(), 'kvtier-sim-'));
  mkdirSync(dir, { recursive: true });
  const lowerTiers = o.lowerTiers.map((t) =>
    (t.type === 'local-disk' || t.type === 'fs') && t.options.path === undefined
      ? { ...t, options: { ...t.options, path: join(dir, t.name) } }
      : t,
  );
  const activity = new Activity();
  let node: SimNode | undefined;
  try {
    node = await SimNode.start({
      engineId: 'sim-engine-0',
      model,
      engine,
      kvtier,
      cpuTier: { ...opts.cpuTierOptions, capacityBytes: o.cpuBytes },
      lowerTiers,
      dir,
      activity,
      ...(opts.timing === undefined ? {} : { timing: opts.timing }),
      settle: opts.settle === true,
      ...(opts.sweepTiers === undefined || opts.sweepTiers.length === 0
        ? {}
        : { sweepTiers: opts.sweepTiers }),
      ...(hooks.onEvent === undefined ? {} : { onEvent: hooks.onEvent }),
      ...(hooks.onLoadAlloc === undefined ? {} : { onLoadAlloc: hooks.onLoadAlloc }),
    });
    const n = node;
    const sched = n.sched;
    const injector = new FaultInjector(faults, lowerTiers.at(-1), {
      sidecar: () => n.sidecar as Sidecar,
      restartSidecar: () => n.restartSidecar(),
      admin: n.admin as NonNullable<typeof n.admin>,
      namespace: () => n.namespace,
      skewLookupClock: (ms) => n.skewLookupClock(ms),
      pendingLookups: () => n.lookup?.pendingLookups ?? 0,
      lookupTimeoutMs: engine.lookupTimeoutMs,
      ...(hooks.killRedis === undefined ? {} : { killRedis: () => hooks.killRedis!() }),
      ...(hooks.restartRedis === undefined ? {} : { restartRedis: () => hooks.restartRedis!() }),
    });

    const requests = [...opts.workload.requests].sort((a, b) => a.arrivalMs - b.arrivalMs);
    const total = requests.length;
    let next = 0;
    let modelNowMs = 0;
    let step = 0;
    const ctl: SimControl = {
      get step() {
        return step;
      },
      abort: (id) => sched.abort(id),
      resetPrefixCache: () => sched.resetPrefixCache(),
      status: (id) => sched.status(id),
      blockStats: () => n.allocator.stats(),
      get trackedRequests() {
        return n.connector.trackedRequests;
      },
      get sidecar() {
        return n.sidecar as Sidecar;
      },
    };
    const clockMs = () =>
      o.timeScale > 0 ? (performance.now() - started) / o.timeScale : modelNowMs;
    const fastForward =
      opts.timing !== undefined && hooks.onStep === undefined && o.timeScale === 0;

    for (;;) {
      if (opts.signal?.aborted) throw abortedError(opts.signal, 'simulation');
      const seen = activity.count;
      step++;
      sched.step = step;
      await hooks.onStep?.(step, ctl);
      await injector.beforeStep(step);
      let admitted = 0;
      const now = clockMs();
      for (; next < total && requests[next]!.arrivalMs <= now; next++, admitted++)
        sched.admit(requests[next]!);
      const res = await n.step(now, {
        afterSchedule: () => injector.afterSchedule(step),
        beforeLoads: (loads) => injector.beforeLoads(step, loads),
      });
      if (o.timeScale === 0) modelNowMs = now + res.stepMs;
      if (fastForward) {
        const until = next < total ? requests[next]!.arrivalMs : Number.POSITIVE_INFINITY;
        modelNowMs = n.fastForward(modelNowMs, until);
        step = sched.step;
      }
      const c = sched.counters;
      opts.onProgress?.(step, c.finished + c.aborted + c.failedRequests + c.failedTooLarge, total);

      if (next >= total && n.done) break;
      if (res.stall) continue;
      if (res.progress || admitted > 0) {
        await nextTurn();
        continue;
      }
      if (activity.count !== seen) {
        await nextTurn();
        continue;
      }
      // Idle: wait for a lookup answer, a transfer, a lookup deadline, a due load or the next arrival.
      const waits: number[] = [];
      const deadline = n.lookup?.nextDeadline();
      if (deadline !== undefined)
        waits.push(deadline - (n.lookup as NonNullable<typeof n.lookup>).clock());
      const inFlight = n.inFlight;
      const due = n.nextDueMs();
      if (o.timeScale === 0 && !inFlight) {
        const at = Math.min(
          due ?? Number.POSITIVE_INFINITY,
          next < total ? requests[next]!.arrivalMs : Number.POSITIVE_INFINITY,
        );
        if (Number.isFinite(at)) {
          modelNowMs = Math.max(modelNowMs, at);
          continue;
        }
      }
      if (next < total && o.timeScale > 0)
        waits.push(requests[next]!.arrivalMs * o.timeScale - (performance.now() - started));
      if (due !== undefined && o.timeScale > 0)
        waits.push(due * o.timeScale - (performance.now() - started));
      if (!inFlight && waits.length === 0)
        throw new KvtierError(
          'KVT_INTERNAL',
          `simulation stuck at step ${step}: ${sched.liveRequests} live requests, ${sched.delayedFrees} delayed frees, nothing in flight`,
        );
      const t0 = performance.now();
      await activity.wait(seen, {
        ...(waits.length > 0 ? { timeoutMs: Math.max(0, Math.min(...waits)) } : {}),
        ...(opts.signal === undefined ? {} : { signal: opts.signal }),
      });
      if (o.timeScale === 0 && o.waitsAdvanceClock) modelNowMs += performance.now() - t0;
      // The waker runs before the client records the answer: let that land first.
      await nextTurn();
    }

    await hooks.onFinish?.(ctl);
    return nodeReport(n, {
      workload: opts.workload,
      requests,
      planned,
      model,
      endMs: clockMs(),
      wallMs: performance.now() - started,
      faultsInjected: injector.fired.map((f) => `${f.kind}@step ${f.step}: ${f.detail}`),
      kvLoadFailurePolicy: engine.kvLoadFailurePolicy,
    });
  } finally {
    await node?.close();
    if (ownDir) rmSync(dir, { recursive: true, force: true });
  }
}
