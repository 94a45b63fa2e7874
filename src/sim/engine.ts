import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setImmediate as nextTurn } from 'node:timers/promises';
import { defaultConfig, type KvtierConfig } from '../config/config.ts';
import { KvtierSchedulerConnector } from '../connector/scheduler-connector.ts';
import { KvtierWorkerConnector } from '../connector/worker-connector.ts';
import { abortedError, KvtierError } from '../errors.ts';
import { LookupClient } from '../lookup-client/lookup-client.ts';
import { Sidecar } from '../sidecar.ts';
import { BlockAllocator, type BlockAllocatorStats } from './block-allocator.ts';
import { FaultInjector, validateFaults } from './engine-faults.ts';
import { Activity, KvFile, SimDataPlaneClient, SimLookupClient } from './engine-io.ts';
import { resolveSimOptions } from './engine-options.ts';
import {
  type CompletedPrefill,
  type LoadAllocInfo,
  type SimEvent,
  type SimRequestStatus,
  SimScheduler,
} from './engine-scheduler.ts';
import { DEFAULT_MODEL, kvBytesPerToken, modelPreset, type PlannedModel } from './models.ts';
import { loadSeconds, prefillSeconds } from './ttft-model.ts';
import type {
  SimEngineOptions,
  SimFaults,
  SimModel,
  SimReport,
  SimTierConfig,
  Workload,
} from './types.ts';

/** p50, p90 and mean of `values` (0 for none). */
function summarize(values: number[]): { p50: number; p90: number; mean: number } {
  const v = [...values].sort((a, b) => a - b);
  const pct = (p: number) =>
    v.length === 0 ? 0 : v[Math.min(v.length - 1, Math.ceil(p * v.length) - 1)]!;
  return {
    p50: pct(0.5),
    p90: pct(0.9),
    mean: v.length === 0 ? 0 : v.reduce((a, b) => a + b, 0) / v.length,
  };
}

/** The modeled TTFT of every completed prefill, with kvtier and had kvtier served nothing (ms). */
function modeledTtft(
  m: PlannedModel,
  prefills: readonly CompletedPrefill[],
  tierTypes: Record<string, string>,
): { withKvtier: ReturnType<typeof summarize>; withoutKvtier: ReturnType<typeof summarize> } {
  const withK: number[] = [];
  const withoutK: number[] = [];
  for (const p of prefills) {
    let load = 0;
    for (const [tier, n] of Object.entries(p.tiers))
      load += loadSeconds(m, n, tierTypes[tier] ?? tier);
    withK.push(1000 * (prefillSeconds(m, p.promptTokens - p.recomputed, p.promptTokens) + load));
    withoutK.push(1000 * prefillSeconds(m, p.gpu, p.promptTokens));
  }
  return { withKvtier: summarize(withK), withoutKvtier: summarize(withoutK) };
}

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
  onProgress?: (step: number, done: number, total: number) => void;
  signal?: AbortSignal;
  hooks?: SimHooks;
}

const MODEL_ID = 'kvtier-sim/deterministic';

/**
 * Runs a workload through a vLLM-v1-like engine against a real kvtier sidecar started in-process
 * (lookups and the data plane over ZMQ on loopback, a host-device KV file under `workDir`), and
 * verifies every loaded block byte for byte against recomputation. Closes everything it started,
 * also on error.
 *
 * `tokens.byTier` counts tokens loaded valid, credited to the tier each chunk's lookup found it
 * in (the answers' tier breakdown, recorded by the simulator's lookup client). Token sources are
 * counted per admission, so after preemptions or failed loads they add up to more than the
 * prompt tokens.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for bad options; `KVT_ABORTED` when `signal` aborts;
 *   `KVT_INTERNAL` if the engine can make no progress (a bug); `KVT_CONFIG` when a tier fails.
 */
export async function runSimulation(opts: RunSimulationOptions): Promise<SimReport> {
  const o = resolveSimOptions(opts);
  const { model, engine } = o;
  const planned = opts.planned ?? modelPreset(DEFAULT_MODEL);
  const hooks = opts.hooks ?? {};
  const faults = opts.faults ?? {};
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
  const config: KvtierConfig = {
    ...defaultConfig(),
    listen: 'tcp://127.0.0.1:*',
    metrics: null,
    tiers: [
      { name: 'cpu', type: 'local-cpu', options: { capacityBytes: o.cpuBytes } },
      ...lowerTiers,
    ],
    logLevel: 'silent',
  };
  const bptl = model.numKvHeads * model.headDim * 2;
  const tokenBytes = 2 * model.numLayers * bptl;
  const activity = new Activity();
  let sidecar: Sidecar | undefined;
  let kv: KvFile | undefined;
  let worker: KvtierWorkerConnector | undefined;
  let connector: KvtierSchedulerConnector | undefined;
  let admin: LookupClient | undefined;
  let corruptSeen = 0;
  let shmDir: string | undefined;
  try {
    sidecar = await Sidecar.start({ config, processMetrics: false });
    const endpoint = sidecar.server.endpoint;
    // tmpfs when there is one: the engine's KV cache is memory, never written back to a disk.
    shmDir = existsSync('/dev/shm') ? mkdtempSync('/dev/shm/kvtier-sim-') : undefined;
    kv = new KvFile(join(shmDir ?? dir, 'kv.bin'), {
      numBlocks: engine.numGpuBlocks,
      numLayers: model.numLayers,
      blockSize: model.blockSize,
      bytesPerTokenPerLayer: bptl,
    });
    const dp = new SimDataPlaneClient({
      endpoint,
      heartbeatIntervalMs: 0,
      activity,
      chunkBytes: model.chunkSize * tokenBytes,
      tokenBytes,
    });
    worker = new KvtierWorkerConnector({ client: dp });
    const registration = kv.registration({
      engineId: 'sim-engine-0',
      modelId: MODEL_ID,
      numKvHeads: model.numKvHeads,
      headDim: model.headDim,
      chunkSize: model.chunkSize,
    });
    const reg = await worker.registerKvCaches(registration);
    let skewMs = 0;
    const lookup = new SimLookupClient({
      endpoint,
      namespaces: [reg.namespace],
      lookupTimeoutMs: engine.lookupTimeoutMs,
      now: () => Date.now() + skewMs,
      activity,
    });
    connector = new KvtierSchedulerConnector({
      lookup,
      blockSize: reg.blockSize,
      chunkSize: reg.chunkSize,
      partialChunkLoads: engine.partialChunkLoads,
    });
    admin = new LookupClient({ endpoint });
    const allocator = new BlockAllocator({ numBlocks: engine.numGpuBlocks });
    const sched = new SimScheduler(
      {
        connector,
        allocator,
        kv,
        blockSize: model.blockSize,
        chunkSize: model.chunkSize,
        maxTokensPerStep: engine.maxTokensPerStep,
        maxRunning: engine.maxRunning,
        kvLoadFailurePolicy: engine.kvLoadFailurePolicy,
        tiersOf: (id) => {
          // Asked once, when the lookup's load settles.
          const t = lookup.tiersByLookup.get(id);
          lookup.tiersByLookup.delete(id);
          return t;
        },
        ...(hooks.onEvent === undefined ? {} : { onEvent: hooks.onEvent }),
        ...(hooks.onLoadAlloc === undefined ? {} : { onLoadAlloc: hooks.onLoadAlloc }),
      },
      config.tiers.map((t) => t.name),
    );
    const w = worker;
    const corruptOf = (s: Sidecar) =>
      s.storage.tiers.reduce((n, t) => n + (t.stats().corruptObjects ?? 0), 0);
    const injector = new FaultInjector(faults, lowerTiers.at(-1), {
      sidecar: () => sidecar!,
      restartSidecar: async () => {
        // A graceful restart: transfers drain first, the lower tiers must bring the data back.
        await w.whenIdle();
        corruptSeen += corruptOf(sidecar!);
        await sidecar!.close();
        sidecar = await Sidecar.start({
          config: { ...config, listen: endpoint },
          processMetrics: false,
        });
        const again = await w.registerKvCaches(registration);
        if (again.namespace !== reg.namespace)
          throw new KvtierError('KVT_INTERNAL', 'namespace changed across a sidecar restart');
      },
      admin,
      namespace: () => reg.namespace,
      skewLookupClock: (ms) => {
        skewMs += ms;
      },
      pendingLookups: () => lookup.pendingLookups,
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
      blockStats: () => allocator.stats(),
      get trackedRequests() {
        return connector!.trackedRequests;
      },
      get sidecar() {
        return sidecar!;
      },
    };
    const clockMs = () =>
      o.timeScale > 0 ? (performance.now() - started) / o.timeScale : modelNowMs;

    for (;;) {
      if (opts.signal?.aborted) throw abortedError(opts.signal, 'simulation');
      const seen = activity.count;
      step++;
      sched.step = step;
      await hooks.onStep?.(step, ctl);
      await injector.beforeStep(step);
      let admitted = 0;
      for (
        const now = clockMs();
        next < total && requests[next]!.arrivalMs <= now;
        next++, admitted++
      )
        sched.admit(requests[next]!);

      const { finishedSending, finishedRecving } = w.getFinished();
      const invalid = w.getBlockIdsWithLoadErrors();
      connector.updateConnectorOutput({
        finishedSending,
        finishedRecving,
        invalidBlockIds: invalid,
      });
      sched.processWorkerOutput(finishedSending, finishedRecving, invalid);

      const { scheduled } = sched.schedule();
      const meta = connector.buildConnectorMeta({ scheduled: sched.connectorStep(scheduled) });
      sched.noteLoads(meta.loads);
      const stall = injector.afterSchedule(step);
      await injector.beforeLoads(step, meta.loads);
      const preempted = meta.finished.filter((e) => e.kind === 'preempted').map((e) => e.requestId);
      // Blocks of preempted requests are reused this step: no save may still read them.
      if (preempted.length > 0) await w.handlePreemptions(preempted);
      w.startLoadKv(meta);
      const computed = sched.forward(scheduled);
      w.waitForSave();
      if (computed > 0) modelNowMs += Math.max(1, (computed * 1000) / engine.prefillTokensPerSec);
      const c = sched.counters;
      opts.onProgress?.(step, c.finished + c.aborted + c.failedRequests + c.failedTooLarge, total);

      if (next >= total && sched.liveRequests === 0 && sched.delayedFrees === 0) break;
      if (stall) continue;
      const progress =
        scheduled.length > 0 ||
        admitted > 0 ||
        meta.loads.length + meta.saves.length + meta.finished.length > 0 ||
        finishedSending.size + finishedRecving.size > 0;
      if (progress || activity.count !== seen) {
        await nextTurn();
        continue;
      }
      // Idle: wait for a lookup answer, a transfer, a lookup deadline or the next arrival.
      const waits: number[] = [];
      const deadline = lookup.nextDeadline();
      if (deadline !== undefined) waits.push(deadline - lookup.clock());
      const inFlight = deadline !== undefined || dp.inFlight > 0;
      if (next < total) {
        const due = requests[next]!.arrivalMs;
        if (o.timeScale > 0) waits.push(due * o.timeScale - (performance.now() - started));
        else if (!inFlight) {
          modelNowMs = Math.max(modelNowMs, due);
          continue;
        }
      }
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
    const c = sched.counters;
    corruptSeen += corruptOf(sidecar);
    const tierTypes = Object.fromEntries(config.tiers.map((t) => [t.name, t.type]));
    const ttft = modeledTtft(planned, c.prefills, tierTypes);
    const plannedBytes = kvBytesPerToken(planned);
    const faultsInjected = injector.fired.map((f) => `${f.kind}@step ${f.step}: ${f.detail}`);
    if (lookup.timedOut > 0)
      faultsInjected.push(
        `lookups past their deadline: ${lookup.timedOut} (answered 0, recomputed)`,
      );
    if (corruptSeen > 0)
      faultsInjected.push(
        `corrupt chunks detected by the sidecar: ${corruptSeen} (treated as misses, removed)`,
      );
    if (c.invalidBlocks > 0)
      faultsInjected.push(
        `failed loads: ${c.invalidBlocks} invalid blocks (${engine.kvLoadFailurePolicy === 'recompute' ? `${c.recomputedAfterFailure} tokens recomputed` : `${c.failedRequests} requests failed`})`,
      );
    const stats = w.stats();
    if (stats.savesFailed > 0)
      faultsInjected.push(`saves failed: ${stats.savesFailed} (only future hits lost)`);
    return {
      workload: opts.workload.name,
      requests: total,
      finished: c.finished,
      failed: c.failedRequests + c.failedTooLarge,
      aborted: c.aborted,
      promptTokens: requests.reduce((n, r) => n + r.promptTokens.length, 0),
      tokens: {
        gpuPrefixCache: c.gpuPrefixCache,
        byTier: c.byTier,
        recomputed: c.recomputed,
        unserved: c.unserved,
      },
      preemption: {
        preemptions: c.preemptions,
        recomputedTokens: c.preemptionRecomputed,
        reloadedTokens: c.preemptionReloaded,
      },
      model: {
        name: planned.name,
        kvBytesPerToken: plannedBytes,
        verificationBytesPerToken: tokenBytes,
        gpuCacheTokens: engine.numGpuBlocks * model.blockSize,
        chunkTokens: model.chunkSize,
      },
      bytes: { saved: dp.bytesSaved, loaded: dp.bytesLoaded },
      modelBytes: {
        saved: (dp.bytesSaved / tokenBytes) * plannedBytes,
        loaded: (dp.bytesLoaded / tokenBytes) * plannedBytes,
      },
      pendingLookups: { lookups: c.pendingLookups, stepsWaited: c.stepsWaited },
      verifiedBlocks: c.verifiedBlocks,
      mismatchedBlocks: c.mismatchedBlocks,
      mismatches: c.mismatches,
      failures: {
        invalidBlocks: c.invalidBlocks,
        recomputedAfterFailure: c.recomputedAfterFailure,
        failedRequests: c.failedRequests,
        faultsInjected,
      },
      modeledTtftMs: ttft.withKvtier,
      modeledTtftWithoutKvtierMs: ttft.withoutKvtier,
      wallMs: performance.now() - started,
      steps: step,
    };
  } finally {
    await connector?.close().catch(() => {});
    await worker?.close().catch(() => {});
    await admin?.close().catch(() => {});
    await sidecar?.close().catch(() => {});
    kv?.close();
    if (shmDir !== undefined) rmSync(shmDir, { recursive: true, force: true });
    if (ownDir) rmSync(dir, { recursive: true, force: true });
  }
}
