import { mapKey } from './block-allocator.ts';
import type { AdmissionSources, Req, SchedulerCounters } from './engine-scheduler-types.ts';

/**
 * Where prompt tokens came from, counted once per request: each admission collects its sources
 * on the request (`r.adm`); the admission that completes the prefill hands them to the counters,
 * and one thrown away by a preemption (or run again after one) goes to the preemption counters.
 *
 * Self-reuse: a preempted request that finds its own prefix again (in the GPU prefix cache, or in
 * kvtier, which saved it before the preemption) is not a hit on another request's prefix. The
 * positions it computed itself before its last preemption, beyond what its first admission found
 * cached, count as self-reuse wherever the completing admission found them cached.
 */

/** A fresh, empty admission. */
export function emptyAdmission(): AdmissionSources {
  return { gpu: 0, tiers: {}, recomputed: 0, crossNode: 0 };
}

function overlap(a0: number, a1: number, b0: number, b1: number): number {
  return Math.max(0, Math.min(a1, b1) - Math.max(a0, b0));
}

/**
 * The prompt's last token was computed: the admission's sources are the request's, counted once.
 * After a preemption in decode the prompt is computed again; that admission counts as preemption
 * work instead.
 */
export function prefillCompleted(c: SchedulerCounters, r: Req): void {
  if (r.prefillDone) {
    discardAdmission(c, r);
    return;
  }
  r.prefillDone = true;
  const a = r.adm;
  // The admission's sources are contiguous: GPU cache [0, gpu), kvtier tiers in order, then recomputed.
  const s0 = r.numPreemptions > 0 ? (r.firstHitTokens ?? 0) : 0;
  const s1 = r.numPreemptions > 0 ? r.ownProgress : 0;
  const selfGpu = overlap(0, a.gpu, s0, s1);
  c.gpuPrefixCache += a.gpu - selfGpu;
  c.selfReuseGpu += selfGpu;
  let pos = a.gpu;
  let selfKvtier = 0;
  for (const [t, n] of Object.entries(a.tiers)) {
    const own = overlap(pos, pos + n, s0, s1);
    selfKvtier += own;
    c.byTier[t] = (c.byTier[t] ?? 0) + n - own;
    pos += n;
  }
  c.selfReuseKvtier += selfKvtier;
  c.recomputed += a.recomputed;
  c.crossNode += a.crossNode;
  c.prefills.push({ requestId: r.id, promptTokens: r.promptLen, ...a, selfGpu, selfKvtier });
  r.adm = emptyAdmission();
}

/** Moves an admission that did not (or need not) complete the prefill to the preemption counters. */
export function discardAdmission(c: SchedulerCounters, r: Req): void {
  const a = r.adm;
  c.preemptionRecomputed += a.recomputed;
  for (const n of Object.values(a.tiers)) c.preemptionReloaded += n;
  r.adm = emptyAdmission();
}

/**
 * Credits `tokens` loaded from `firstToken` on to the tiers the lookup found their chunks in
 * (`tiers`: contiguous, fastest first, from token 0; unknown when absent).
 */
export function attribute(
  r: Req,
  tiers: readonly { tier: string; tokens: number }[] | undefined,
  firstToken: number,
  tokens: number,
): void {
  if (tokens <= 0) return;
  const by = r.adm.tiers;
  let pos = 0;
  const end = firstToken + tokens;
  for (const t of tiers ?? [{ tier: 'unknown', tokens: end }]) {
    const a = Math.max(pos, firstToken);
    const b = Math.min(pos + t.tokens, end);
    if (b > a) by[t.tier] = (by[t.tier] ?? 0) + (b - a);
    pos += t.tokens;
  }
}

/**
 * Tokens of `[firstToken, firstToken + tokens)` in chunks whose key is not in `own` (another
 * engine computed them). A chunk's key is the prefix hash at its last token.
 */
export function crossNodeTokens(
  r: Req,
  own: ReadonlySet<number>,
  firstToken: number,
  tokens: number,
  chunkSize: number,
): number {
  let n = 0;
  const end = firstToken + tokens;
  for (let c = Math.floor(firstToken / chunkSize); c * chunkSize < end; c++) {
    if ((c + 1) * chunkSize > r.promptLen || own.has(mapKey(r.hashes, (c + 1) * chunkSize - 1)))
      continue;
    n += overlap(c * chunkSize, (c + 1) * chunkSize, firstToken, end);
  }
  return n;
}

/**
 * Records that the request computed prompt positions `[start, end)`: how far it got itself (for
 * self-reuse), and in a fleet the key of every chunk the range completes as this engine's own.
 */
export function computedChunks(
  r: Req,
  d: { ownChunks?: Set<number>; chunkSize: number },
  start: number,
  end: number,
): void {
  r.ownComputedEnd = Math.max(r.ownComputedEnd, end);
  const own = d.ownChunks;
  if (own === undefined) return;
  const cs = d.chunkSize;
  for (let c = Math.floor(start / cs) + 1; c * cs <= end; c++) {
    if (c * cs <= r.promptLen) own.add(mapKey(r.hashes, c * cs - 1));
  }
}

/** Counts a finished request, with its modeled queueing and time to first token. */
export function finishedTiming(c: SchedulerCounters, r: Req, nowMs: number): void {
  c.finished++;
  const at = r.sim.arrivalMs;
  c.timings.push({
    queueMs: (r.firstScheduledMs ?? at) - at,
    ttftMs: (r.firstTokenMs ?? nowMs) - at,
  });
}

/** Counters of a scheduler whose kvtier has the tiers `tierNames` (each starting at 0). */
export function newCounters(tierNames: readonly string[]): SchedulerCounters {
  return {
    gpuPrefixCache: 0,
    byTier: Object.fromEntries(tierNames.map((n) => [n, 0])),
    recomputed: 0,
    selfReuseGpu: 0,
    selfReuseKvtier: 0,
    crossNode: 0,
    timings: [],
    unserved: 0,
    preemptions: 0,
    preemptionRecomputed: 0,
    preemptionReloaded: 0,
    prefills: [],
    pendingLookups: 0,
    stepsWaited: 0,
    verifiedBlocks: 0,
    mismatchedBlocks: 0,
    mismatches: [],
    invalidBlocks: 0,
    recomputedAfterFailure: 0,
    failedRequests: 0,
    failedTooLarge: 0,
    finished: 0,
    aborted: 0,
  };
}
