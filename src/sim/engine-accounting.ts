import type { Req, SchedulerCounters } from './engine-scheduler-types.ts';

/**
 * Where prompt tokens came from, counted once per request: each admission collects its sources
 * on the request (`r.adm`); the admission that completes the prefill hands them to the counters,
 * and one thrown away by a preemption (or run again after one) goes to the preemption counters.
 */

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
  c.gpuPrefixCache += a.gpu;
  c.recomputed += a.recomputed;
  for (const [t, n] of Object.entries(a.tiers)) c.byTier[t] = (c.byTier[t] ?? 0) + n;
  c.prefills.push({ requestId: r.id, promptTokens: r.promptLen, ...a });
  r.adm = { gpu: 0, tiers: {}, recomputed: 0 };
}

/** Moves an admission that did not (or need not) complete the prefill to the preemption counters. */
export function discardAdmission(c: SchedulerCounters, r: Req): void {
  const a = r.adm;
  c.preemptionRecomputed += a.recomputed;
  for (const n of Object.values(a.tiers)) c.preemptionReloaded += n;
  r.adm = { gpu: 0, tiers: {}, recomputed: 0 };
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
