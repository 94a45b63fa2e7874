import type { SimNode } from './engine-node.ts';
import { kvBytesPerToken, type PlannedModel } from './models.ts';
import type { SimModel, SimReport, Workload } from './types.ts';

/**
 * Turns a finished node's counters into a {@link SimReport}: the sources of every prompt token,
 * preemption work, bytes moved (measured and in the planned model's bytes), verification, and
 * the modeled timeline (TTFT including queueing, queueing alone, GPU busy time).
 */

/** p50, p90 and mean of `values` (0 for none). */
export function summarize(values: readonly number[]): { p50: number; p90: number; mean: number } {
  const v = [...values].sort((a, b) => a - b);
  const pct = (p: number) =>
    v.length === 0 ? 0 : (v[Math.min(v.length - 1, Math.ceil(p * v.length) - 1)] as number);
  return {
    p50: pct(0.5),
    p90: pct(0.9),
    mean: v.length === 0 ? 0 : v.reduce((a, b) => a + b, 0) / v.length,
  };
}

/** What the report says besides the node's counters. */
export interface NodeReportContext {
  workload: Workload;
  /** The requests this node served (a fleet's share; the workload's own otherwise). */
  requests: readonly { promptTokens: Uint32Array; arrivalMs: number }[];
  planned: PlannedModel;
  model: SimModel;
  /** Modeled time the last request finished (ms). */
  endMs: number;
  wallMs: number;
  faultsInjected?: string[];
  kvLoadFailurePolicy: 'recompute' | 'fail';
}

/** The report of one node. */
export function nodeReport(node: SimNode, x: NodeReportContext): SimReport {
  const c = node.sched.counters;
  const m = x.model;
  const tokenBytes = 2 * m.numLayers * m.numKvHeads * m.headDim * 2;
  const plannedBytes = kvBytesPerToken(x.planned);
  const dp = node.dataPlane;
  const faults = [...(x.faultsInjected ?? [])];
  const lookup = node.lookup;
  if (lookup !== undefined && lookup.timedOut > 0)
    faults.push(`lookups past their deadline: ${lookup.timedOut} (answered 0, recomputed)`);
  const corrupt = node.corruptObjects();
  if (corrupt > 0)
    faults.push(`corrupt chunks detected by the sidecar: ${corrupt} (treated as misses, removed)`);
  if (c.invalidBlocks > 0)
    faults.push(
      `failed loads: ${c.invalidBlocks} invalid blocks (${x.kvLoadFailurePolicy === 'recompute' ? `${c.recomputedAfterFailure} tokens recomputed` : `${c.failedRequests} requests failed`})`,
    );
  const stats = node.worker?.stats();
  if (stats !== undefined && stats.savesFailed > 0)
    faults.push(`saves failed: ${stats.savesFailed} (only future hits lost)`);
  const firstArrival = x.requests.reduce(
    (a, r) => Math.min(a, r.arrivalMs),
    Number.POSITIVE_INFINITY,
  );
  const makespanMs = x.requests.length === 0 ? 0 : Math.max(0, x.endMs - firstArrival);
  const saved = dp?.bytesSaved ?? 0;
  const loaded = dp?.bytesLoaded ?? 0;
  return {
    workload: x.workload.name,
    requests: x.requests.length,
    finished: c.finished,
    failed: c.failedRequests + c.failedTooLarge,
    aborted: c.aborted,
    promptTokens: x.requests.reduce((n, r) => n + r.promptTokens.length, 0),
    tokens: {
      gpuPrefixCache: c.gpuPrefixCache,
      byTier: c.byTier,
      selfReuse: { gpu: c.selfReuseGpu, kvtier: c.selfReuseKvtier },
      recomputed: c.recomputed,
      unserved: c.unserved,
    },
    preemption: {
      preemptions: c.preemptions,
      recomputedTokens: c.preemptionRecomputed,
      reloadedTokens: c.preemptionReloaded,
    },
    model: {
      name: x.planned.name,
      kvBytesPerToken: plannedBytes,
      verificationBytesPerToken: tokenBytes,
      gpuCacheTokens: node.allocator.numBlocks * m.blockSize,
      chunkTokens: m.chunkSize,
    },
    bytes: { saved, loaded },
    modelBytes: {
      saved: (saved / tokenBytes) * plannedBytes,
      loaded: (loaded / tokenBytes) * plannedBytes,
    },
    pendingLookups: { lookups: c.pendingLookups, stepsWaited: c.stepsWaited },
    verifiedBlocks: c.verifiedBlocks,
    mismatchedBlocks: c.mismatchedBlocks,
    mismatches: c.mismatches,
    failures: {
      invalidBlocks: c.invalidBlocks,
      recomputedAfterFailure: c.recomputedAfterFailure,
      failedRequests: c.failedRequests,
      faultsInjected: faults,
    },
    modeledTtftMs: summarize(c.timings.map((t) => t.ttftMs)),
    timeline: {
      queueMs: summarize(c.timings.map((t) => t.queueMs)),
      busyMs: node.busyMs,
      meanBlocksInUse: node.busyMs > 0 ? node.usedBlockMs / node.busyMs : 0,
      makespanMs,
      utilization: makespanMs > 0 ? node.busyMs / makespanMs : 0,
    },
    crossNodeTokens: c.crossNode,
    ...(lookup === undefined || Object.keys(lookup.decisions).length === 0
      ? {}
      : { tierDecisions: structuredClone(lookup.decisions) }),
    gpuHitTokens: Object.fromEntries(c.prefills.map((p) => [p.requestId, p.gpu - p.selfGpu])),
    kvtier: node.config !== undefined,
    wallMs: x.wallMs,
    steps: node.steps,
    fastForwardedSteps: node.fastForwardedSteps,
  };
}
