/**
 * "Never slower than recomputing": the rule a lookup applies when it names the engine's prefill
 * rate (`LookupInput.computeTokensPerSec`). A tier below host memory is claimed from only where
 * fetching its hits (at the rate {@link TierRates} measures for it, in the KV bytes per token
 * the manager has seen for the namespace, {@link ChunkShapes}) takes less time than the engine
 * computing those tokens. A tier that cannot win ends the ready prefix where its hits begin: a
 * miss from there on, nothing fetched from it. A tier that could not win even for every token
 * left is not asked at all, so a slow tier costs a short prompt no round trip either.
 *
 * One {@link ClaimRule} per lookup: it decides, and keeps what it decided per tier for the reply
 * (`LookupOutcome.rates`) and the metrics (`kvtier_lookup_tier_decisions_total`).
 */
import type { NamespaceId, StorageBackend } from '../backends/core/types.ts';
import type { TierRate } from '../protocol/messages.ts';
import type { Segment } from './prefetch.ts';
import type { ChunkShapes, TierRates } from './tier-rates.ts';

/** What a lookup decided about one tier. */
export type TierDecisionKind = 'none' | 'load' | 'decline';

/** One tier as a lookup's answer reports it (`LookupOutcome.rates`). */
export interface TierDecision {
  tier: string;
  /** `load`: its hits were claimed; `decline`: not asked, or its hits not claimed; `none`. */
  decision: TierDecisionKind;
  /** Read bandwidth, bytes/s, and per-request latency, seconds; undefined while not measured. */
  readBytesPerSec: number | undefined;
  latencySeconds: number | undefined;
  /** Tokens of the first namespace the tier held that the lookup declined (0 when not asked). */
  declinedTokens: number;
}

/** One lookup's application of the rule. */
export class ClaimRule {
  readonly #tiers: readonly StorageBackend[];
  readonly #rates: TierRates;
  readonly #shapes: ChunkShapes;
  readonly #tokensPerSec: number;
  readonly #tokenCounts: ArrayLike<number>;
  /** Per tier index: what was decided, and tokens declined (first namespace). */
  readonly decisions: TierDecisionKind[];
  readonly #declined: number[];
  readonly #firstNs: NamespaceId | undefined;

  constructor(
    tiers: readonly StorageBackend[],
    rates: TierRates,
    shapes: ChunkShapes,
    computeTokensPerSec: number,
    tokenCounts: ArrayLike<number>,
    firstNs: NamespaceId | undefined,
  ) {
    this.#tiers = tiers;
    this.#rates = rates;
    this.#shapes = shapes;
    this.#tokensPerSec = computeTokensPerSec;
    this.#tokenCounts = tokenCounts;
    this.#firstNs = firstNs;
    this.decisions = tiers.map(() => 'none');
    this.#declined = tiers.map(() => 0);
  }

  /**
   * Whether tier `ti` is worth asking about chunks `[pos, n)` of `ns`: false (recorded as a
   * decline) when fetching all of them would not beat computing them, so no count of them
   * could. The host-memory tier is always worth asking.
   */
  worthProbing(ti: number, ns: NamespaceId, pos: number, n: number): boolean {
    if (ti === 0 || this.#wins(ti, ns, this.#tokens(pos, n))) return true;
    this.decisions[ti] = 'decline';
    return false;
  }

  /**
   * The ready prefix once every lower-tier run of hits that loses to computing is cut off (at
   * its first chunk): `ready` or less. A cut can shorten a run found earlier, which is then
   * judged again on what is left of it.
   */
  apply(
    namespaces: readonly NamespaceId[],
    segmentsByNs: readonly (readonly Segment[])[],
    ready: number,
  ): number {
    let r = ready;
    for (let changed = true; changed; ) {
      changed = false;
      for (let i = 0; i < namespaces.length && !changed; i++)
        for (const s of segmentsByNs[i]!) {
          const end = Math.min(s.end, r);
          if (s.tierIndex === 0 || end <= s.start) continue;
          const tokens = this.#tokens(s.start, end);
          if (this.#wins(s.tierIndex, namespaces[i]!, tokens)) continue;
          this.decisions[s.tierIndex] = 'decline';
          if (namespaces[i] === this.#firstNs) this.#declined[s.tierIndex]! += tokens;
          r = s.start;
          changed = true;
          break;
        }
    }
    for (const segs of segmentsByNs)
      for (const s of segs)
        if (s.tierIndex > 0 && Math.min(s.end, r) > s.start) this.decisions[s.tierIndex] = 'load';
    return r;
  }

  /** Every tier with its rate and what this lookup decided about it, in tier order. */
  report(): TierDecision[] {
    return this.#tiers.map((t, ti) => {
      const rate = this.#rates.rate(t.name);
      return {
        tier: t.name,
        decision: this.decisions[ti]!,
        readBytesPerSec: rate.readBytesPerSec,
        latencySeconds: rate.latencySeconds,
        declinedTokens: this.#declined[ti]!,
      };
    });
  }

  /** Whether fetching `tokens` of `ns` from tier `ti` takes less time than computing them. */
  #wins(ti: number, ns: NamespaceId, tokens: number): boolean {
    const bpt = this.#shapes.bytesPerToken(ns);
    // Not measured yet, or chunks of an unknown size: fetched, which measures them.
    if (bpt === undefined) return true;
    const fetch = this.#rates.fetchSeconds(this.#tiers[ti]!.name, tokens * bpt);
    return fetch === undefined || fetch < tokens / this.#tokensPerSec;
  }

  #tokens(from: number, to: number): number {
    let n = 0;
    for (let i = from; i < to; i++) n += this.#tokenCounts[i]!;
    return n;
  }
}

/** The rates of every tier with no decision (a lookup host memory answered alone). */
export function ratesOnly(tiers: readonly StorageBackend[], rates: TierRates): TierDecision[] {
  return tiers.map((t) => {
    const r = rates.rate(t.name);
    return {
      tier: t.name,
      decision: 'none',
      readBytesPerSec: r.readBytesPerSec,
      latencySeconds: r.latencySeconds,
      declinedTokens: 0,
    };
  });
}

/**
 * A lookup's rates as LOOKUP_RESULT carries them (docs/protocol.md 4.1): bandwidth in whole
 * bytes/s and latency in whole µs, 0 where not measured.
 */
export function ratesOnWire(rates: { bytesPerToken: number; tiers: readonly TierDecision[] }): {
  bytesPerToken: number;
  tierRates: TierRate[];
} {
  const u32 = (x: number) => Math.min(0xffffffff, Math.max(0, Math.round(x)));
  return {
    bytesPerToken: u32(rates.bytesPerToken),
    tierRates: rates.tiers.map((t) => ({
      tier: t.tier,
      decision: t.decision,
      readBytesPerSec: BigInt(Math.max(0, Math.round(t.readBytesPerSec ?? 0))),
      latencyUs: u32((t.latencySeconds ?? 0) * 1e6),
      declinedTokens: u32(t.declinedTokens),
    })),
  };
}
