import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { abortedError, KvtierError } from '../errors.ts';
import { Activity } from './engine-io.ts';
import { type NodeTiming, SimNode } from './engine-node.ts';
import { resolveSimOptions } from './engine-options.ts';
import { nodeReport, summarize } from './engine-report.ts';
import { DEFAULT_MODEL, modelPreset, type PlannedModel } from './models.ts';
import { createRouter, type RouterKind } from './router.ts';
import type {
  SimEngineOptions,
  SimModel,
  SimReport,
  SimRequest,
  SimTierConfig,
  Workload,
} from './types.ts';

/**
 * A fleet of modeled engines on one modeled clock: each engine has its own GPU cache, its own
 * kvtier sidecar and CPU tier, and the tiers named shared are one store for all of them (one
 * directory, one Redis key space). A router sends each arriving request to an engine, seeing the
 * engines' outstanding work at that moment. Every engine verifies every block it loads byte for
 * byte, whichever engine computed it. The planner's timing model is required: the engines
 * advance on it, each step of each engine taking its modeled time.
 */

/** Options of {@link runFleet}. */
export interface RunFleetOptions {
  workload: Workload;
  /** Engines, at least 1. */
  engines: number;
  router: RouterKind;
  model?: Partial<SimModel>;
  engine?: Partial<SimEngineOptions>;
  planned?: PlannedModel;
  /** Each engine's CPU tier, bytes of the verification model. */
  cpuBytes?: number;
  cpuTierOptions?: Record<string, unknown>;
  /**
   * Each engine's tiers below its CPU tier, in order, one list per engine. A shared tier appears
   * in every list with the same options (one directory, one Redis server and key prefix); a
   * node-local one with options of its own.
   */
  engineTiers: readonly (readonly SimTierConfig[])[];
  /** Names of the shared tiers (one engine sweeps each shared fs-backed tier, not all). */
  sharedTiers?: readonly string[];
  /**
   * Each engine's sidecar endpoint, when its tiers need them known up front: a `peer` tier lists
   * the fleet's sidecars (`inproc://` endpoints serve, all sidecars being in this thread).
   */
  listens?: readonly string[];
  kvtier?: boolean;
  timing: NodeTiming;
  /** Tiers swept for capacity on the modeled clock (fs-backed ones). */
  sweepTiers?: readonly string[];
  workDir?: string;
  signal?: AbortSignal;
}

/**
 * Runs the fleet. The report adds up every engine (`engines` holds each one's report): token
 * sources, bytes, verification, TTFT over all requests, utilisation as busy time over engines x
 * makespan, and `crossNodeTokens`: kvtier tokens in chunks another engine computed.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for bad options; `KVT_ABORTED` when `signal` aborts;
 *   `KVT_INTERNAL` if the fleet can make no progress.
 */
export async function runFleet(opts: RunFleetOptions): Promise<SimReport> {
  if (!Number.isInteger(opts.engines) || opts.engines < 1 || opts.engines > 64)
    throw new KvtierError('KVT_INVALID_ARGUMENT', `engines must be 1..64, got ${opts.engines}`);
  if (opts.engineTiers.length !== opts.engines)
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `engineTiers must hold one tier list per engine (${opts.engines}), got ${opts.engineTiers.length}`,
    );
  for (const t of opts.engineTiers)
    resolveSimOptions({ workload: { name: '', requests: [] }, lowerTiers: [...t] });
  const o = resolveSimOptions(opts);
  const planned = opts.planned ?? modelPreset(DEFAULT_MODEL);
  const started = performance.now();
  const ownDir = opts.workDir === undefined;
  const dir = opts.workDir ?? mkdtempSync(join(tmpdir(), 'kvtier-fleet-'));
  mkdirSync(dir, { recursive: true });
  const shared = new Set(opts.sharedTiers ?? []);
  // Chunks another engine stored can be found through a shared tier or a peer tier.
  const crossNode =
    shared.size > 0 || opts.engineTiers.some((ts) => ts.some((t) => t.type === 'peer'));
  if (opts.listens !== undefined && opts.listens.length !== opts.engines)
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `listens must hold one endpoint per engine (${opts.engines}), got ${opts.listens.length}`,
    );
  const activity = new Activity();
  const nodes: SimNode[] = [];
  const assigned: SimRequest[][] = [];
  try {
    for (let i = 0; i < opts.engines; i++) {
      const tiers = (opts.engineTiers[i] as readonly SimTierConfig[]).map((t) =>
        withPath(t, dir, i),
      );
      const sweep = (opts.sweepTiers ?? []).filter((n) => i === 0 || !shared.has(n));
      nodes.push(
        await SimNode.start({
          engineId: `sim-engine-${i}`,
          model: o.model,
          engine: o.engine,
          kvtier: opts.kvtier ?? true,
          cpuTier: { ...opts.cpuTierOptions, capacityBytes: o.cpuBytes },
          lowerTiers: tiers,
          dir,
          activity,
          timing: opts.timing,
          settle: true,
          ownChunks: new Set(),
          // A lookup must find on a shared tier or a peer what every engine stored before it.
          ...(crossNode
            ? { beforeLookups: () => Promise.all(nodes.map((n) => n.drainWrites())).then(() => {}) }
            : {}),
          ...(sweep.length > 0 ? { sweepTiers: sweep } : {}),
          ...(opts.listens === undefined ? {} : { listen: opts.listens[i] }),
        }),
      );
      assigned.push([]);
    }
    const requests = [...opts.workload.requests].sort((a, b) => a.arrivalMs - b.arrivalMs);
    const meanTokens =
      requests.reduce((n, r) => n + r.promptTokens.length + r.outputTokens, 0) /
      Math.max(1, requests.length);
    const router = createRouter(opts.router, nodes.length, {
      chunkTokens: o.model.chunkSize,
      memoryChunks: Math.floor(
        (o.engine.numGpuBlocks * o.model.blockSize) / o.model.chunkSize +
          o.cpuBytes /
            (o.model.chunkSize * 2 * o.model.numLayers * o.model.numKvHeads * o.model.headDim * 2),
      ),
      meanRequestTokens: meanTokens,
    });
    const engines = nodes;
    const busyUntil = nodes.map(() => 0);
    let next = 0;
    let t = 0;
    for (;;) {
      if (opts.signal?.aborted) throw abortedError(opts.signal, 'fleet simulation');
      const seen = activity.count;
      for (; next < requests.length && requests[next]!.arrivalMs <= t; next++) {
        const r = requests[next]!;
        const i = router.route(r, engines);
        nodes[i]!.admit(r);
        assigned[i]!.push(r);
      }
      const nextArrival =
        next < requests.length ? requests[next]!.arrivalMs : Number.POSITIVE_INFINITY;
      let again = false;
      for (const [i, n] of nodes.entries()) {
        if (busyUntil[i]! > t) continue;
        const res = await n.step(t);
        let end = t + res.stepMs;
        if (res.stepMs > 0) end = n.fastForward(end, nextArrival);
        busyUntil[i] = end;
        if (res.progress && res.stepMs === 0) again = true;
      }
      if (next >= requests.length && nodes.every((n) => n.done)) break;
      if (again) continue;
      let at = nextArrival;
      for (const [i, n] of nodes.entries()) {
        // A busy engine takes its due loads at its next step; an idle one wakes for them.
        const due = n.nextDueMs();
        if (busyUntil[i]! > t) at = Math.min(at, busyUntil[i]!);
        else if (due !== undefined && due > t) at = Math.min(at, due);
      }
      if (Number.isFinite(at) && at > t) {
        t = at;
        continue;
      }
      if (!nodes.some((n) => n.inFlight)) {
        throw new KvtierError(
          'KVT_INTERNAL',
          `fleet stuck at ${t.toFixed(1)} ms: ${nodes.map((n) => n.sched.liveRequests).join('/')} live requests per engine, nothing in flight`,
        );
      }
      await activity.wait(seen, opts.signal === undefined ? {} : { signal: opts.signal });
    }
    const endMs = Math.max(t, ...busyUntil);
    const wallMs = performance.now() - started;
    const per = nodes.map((n, i) =>
      nodeReport(n, {
        workload: opts.workload,
        requests: assigned[i]!,
        planned,
        model: o.model,
        endMs,
        wallMs,
        kvLoadFailurePolicy: o.engine.kvLoadFailurePolicy,
      }),
    );
    return fleetReport(per, nodes, requests, endMs, wallMs);
  } finally {
    for (const n of nodes) await n.close();
    if (ownDir) rmSync(dir, { recursive: true, force: true });
  }
}

/** A file-backed tier without a path gets `<dir>/<name>-<engine>`. */
function withPath(t: SimTierConfig, dir: string, engine: number): SimTierConfig {
  if ((t.type !== 'local-disk' && t.type !== 'fs') || t.options.path !== undefined) return t;
  return { ...t, options: { ...t.options, path: join(dir, `${t.name}-${engine}`) } };
}

function fleetReport(
  per: SimReport[],
  nodes: readonly SimNode[],
  requests: readonly SimRequest[],
  endMs: number,
  wallMs: number,
): SimReport {
  const first = per[0] as SimReport;
  const sum = (f: (r: SimReport) => number) => per.reduce((n, r) => n + f(r), 0);
  const byTier: Record<string, number> = {};
  for (const r of per)
    for (const [k, v] of Object.entries(r.tokens.byTier)) byTier[k] = (byTier[k] ?? 0) + v;
  const timings = nodes.flatMap((n) => n.sched.counters.timings);
  const firstArrival = requests[0]?.arrivalMs ?? 0;
  const makespanMs = Math.max(0, endMs - firstArrival);
  const busyMs = sum((r) => r.timeline?.busyMs ?? 0);
  return {
    ...first,
    requests: requests.length,
    finished: sum((r) => r.finished),
    failed: sum((r) => r.failed),
    aborted: sum((r) => r.aborted ?? 0),
    promptTokens: sum((r) => r.promptTokens),
    tokens: {
      gpuPrefixCache: sum((r) => r.tokens.gpuPrefixCache),
      byTier,
      selfReuse: {
        gpu: sum((r) => r.tokens.selfReuse?.gpu ?? 0),
        kvtier: sum((r) => r.tokens.selfReuse?.kvtier ?? 0),
      },
      recomputed: sum((r) => r.tokens.recomputed),
      unserved: sum((r) => r.tokens.unserved),
    },
    preemption: {
      preemptions: sum((r) => r.preemption?.preemptions ?? 0),
      recomputedTokens: sum((r) => r.preemption?.recomputedTokens ?? 0),
      reloadedTokens: sum((r) => r.preemption?.reloadedTokens ?? 0),
    },
    bytes: { saved: sum((r) => r.bytes.saved), loaded: sum((r) => r.bytes.loaded) },
    modelBytes: {
      saved: sum((r) => r.modelBytes?.saved ?? 0),
      loaded: sum((r) => r.modelBytes?.loaded ?? 0),
    },
    pendingLookups: {
      lookups: sum((r) => r.pendingLookups.lookups),
      stepsWaited: sum((r) => r.pendingLookups.stepsWaited),
    },
    verifiedBlocks: sum((r) => r.verifiedBlocks),
    mismatchedBlocks: sum((r) => r.mismatchedBlocks),
    mismatches: per.flatMap((r) => r.mismatches).slice(0, 20),
    failures: {
      invalidBlocks: sum((r) => r.failures.invalidBlocks),
      recomputedAfterFailure: sum((r) => r.failures.recomputedAfterFailure),
      failedRequests: sum((r) => r.failures.failedRequests),
      faultsInjected: per.flatMap((r, i) =>
        r.failures.faultsInjected.map((f) => `engine ${i}: ${f}`),
      ),
    },
    modeledTtftMs: summarize(timings.map((x) => x.ttftMs)),
    timeline: {
      queueMs: summarize(timings.map((x) => x.queueMs)),
      busyMs,
      meanBlocksInUse: sum((r) => r.timeline?.meanBlocksInUse ?? 0),
      makespanMs,
      utilization: makespanMs > 0 ? busyMs / (per.length * makespanMs) : 0,
    },
    crossNodeTokens: sum((r) => r.crossNodeTokens ?? 0),
    ...mergedDecisions(per),
    gpuHitTokens: Object.assign({}, ...per.map((r) => r.gpuHitTokens ?? {})),
    wallMs,
    steps: sum((r) => r.steps),
    fastForwardedSteps: sum((r) => r.fastForwardedSteps ?? 0),
    engines: per,
  };
}

/** The engines' tier decisions added up (nothing when none decided). */
function mergedDecisions(per: readonly SimReport[]): Pick<SimReport, 'tierDecisions'> {
  const out: NonNullable<SimReport['tierDecisions']> = {};
  for (const r of per)
    for (const [tier, d] of Object.entries(r.tierDecisions ?? {})) {
      const c = out[tier] ?? { load: 0, decline: 0, declinedTokens: 0 };
      out[tier] = c;
      c.load += d.load;
      c.decline += d.decline;
      c.declinedTokens += d.declinedTokens;
    }
  return Object.keys(out).length === 0 ? {} : { tierDecisions: out };
}
