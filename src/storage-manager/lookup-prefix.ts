/**
 * Arithmetic on a lookup's ready prefix for the lookup walk (lookup-walk.ts): its tokens, the
 * budget cut (design decision 4: a prefetch must fit the serializer's whole budget), and the
 * per-tier breakdown the answer reports.
 */
import type { StorageBackend } from '../backends/core/types.ts';
import type { Segment } from './prefetch.ts';
import type { TierTokens } from './storage-types.ts';

/** Tokens of chunks [from, to). */
export function tokensOf(tokenCounts: ArrayLike<number>, from: number, to: number): number {
  let n = 0;
  for (let i = from; i < to; i++) n += tokenCounts[i]!;
  return n;
}

/**
 * `ready` shortened so that the chunks to prefetch (those below host memory, over every
 * namespace) fit in `budget` chunks.
 */
export function fitBudget(
  segmentsByNs: readonly (readonly Segment[])[],
  ready: number,
  budget: number,
): number {
  let lower = 0;
  for (const segs of segmentsByNs)
    for (const s of segs)
      if (s.tierIndex > 0) lower += Math.max(0, Math.min(s.end, ready) - s.start);
  if (lower <= budget) return ready;
  let used = 0;
  for (let pos = 0; pos < ready; pos++) {
    for (const segs of segmentsByNs) {
      const s = segs.find((x) => x.start <= pos && pos < x.end);
      if (s !== undefined && s.tierIndex > 0) used++;
    }
    if (used > budget) return pos;
  }
  return ready;
}

/** Tokens of [0, ready) per tier of `tiers` that holds them, in tier order; tiers with none are left out. */
export function breakdown(
  tiers: readonly StorageBackend[],
  segments: readonly Segment[],
  ready: number,
  tokenCounts: ArrayLike<number>,
): TierTokens[] {
  const out: TierTokens[] = [];
  for (const s of segments) {
    const tokens = tokensOf(tokenCounts, s.start, Math.min(s.end, ready));
    if (tokens > 0) out.push({ tier: tiers[s.tierIndex]!.name, tokens });
  }
  return out;
}
