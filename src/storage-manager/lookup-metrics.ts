/**
 * The lookup's metrics: `kvtier_lookups_total` by result, tokens asked about and found per tier,
 * what lookups decided about each tier, and the lookup duration, recorded once per lookup by the
 * lookup walk (lookup-walk.ts) into tallies (counter-tally.ts, histogram-tally.ts) with label
 * objects made once.
 */
import { type CounterTally, type Tally, tallyOf } from '../metrics/counter-tally.ts';
import { type HistogramChild, histogramTallyOf } from '../metrics/histogram-tally.ts';
import type { KvtierMetrics } from '../metrics/metrics.ts';
import type { TierDecision } from './claim-rule.ts';
import type { TierTokens } from './storage-types.ts';

/** The `result` label of `kvtier_lookups_total`. */
export type LookupResultLabel = 'hit' | 'miss' | 'partial' | 'stale' | 'canceled' | 'error';

const RESULTS: readonly LookupResultLabel[] = [
  'hit',
  'miss',
  'partial',
  'stale',
  'canceled',
  'error',
];

/** Records lookups into `metrics` (nothing when undefined), counters through tallies. */
export class LookupRecorder {
  readonly #m: KvtierMetrics | undefined;
  readonly #results: Record<LookupResultLabel, Tally> | undefined;
  readonly #requested: Tally | undefined;
  readonly #hitTokens: CounterTally<'tier'> | undefined;
  readonly #tierTallies = new Map<string, Tally>();
  readonly #decisions: CounterTally<'tier' | 'decision'> | undefined;
  readonly #decisionTallies = new Map<string, Tally>();
  readonly #duration: HistogramChild | undefined;

  constructor(metrics: KvtierMetrics | undefined) {
    this.#m = metrics;
    if (metrics === undefined) return;
    const lookups = tallyOf(metrics.lookups);
    this.#results = Object.fromEntries(
      RESULTS.map((r) => [r, lookups.child({ result: r })]),
    ) as Record<LookupResultLabel, Tally>;
    this.#requested = tallyOf(metrics.lookupRequestedTokens).total;
    this.#hitTokens = tallyOf(metrics.lookupHitTokens);
    this.#decisions = tallyOf(metrics.lookupTierDecisions);
    this.#duration = histogramTallyOf(metrics.lookupDuration).child({});
  }

  /** Counts what a lookup decided about each tier (tiers it decided nothing about are left out). */
  decided(tiers: readonly TierDecision[]): void {
    const d = this.#decisions;
    if (d === undefined) return;
    for (const t of tiers) {
      if (t.decision === 'none') continue;
      const key = `${t.decision}\u0000${t.tier}`;
      let tally = this.#decisionTallies.get(key);
      if (tally === undefined) {
        tally = d.child({ tier: t.tier, decision: t.decision });
        this.#decisionTallies.set(key, tally);
      }
      tally.n++;
    }
  }

  /** Counts a lookup that ended without an answer. */
  ended(result: 'canceled' | 'error'): void {
    if (this.#results !== undefined) this.#results[result].n++;
  }

  /** Records an answered lookup: tokens asked about and found per tier, result, duration. */
  answered(
    status: 'ok' | 'stale' | 'canceled',
    tokenCounts: ArrayLike<number>,
    hitChunks: number,
    tiers: readonly TierTokens[],
    startedMs: number,
  ): void {
    const m = this.#m;
    if (m === undefined) return;
    let requested = 0;
    for (let i = 0; i < tokenCounts.length; i++) requested += tokenCounts[i]!;
    this.#requested!.n += requested;
    for (const t of tiers) this.#tierTally(t.tier).n += t.tokens;
    const result: LookupResultLabel =
      status !== 'ok'
        ? 'stale'
        : hitChunks === 0
          ? 'miss'
          : hitChunks === tokenCounts.length
            ? 'hit'
            : 'partial';
    this.#results![result].n++;
    this.#duration!.observe((performance.now() - startedMs) / 1000);
  }

  #tierTally(tier: string): Tally {
    let t = this.#tierTallies.get(tier);
    if (t === undefined) {
      t = this.#hitTokens!.child({ tier });
      this.#tierTallies.set(tier, t);
    }
    return t;
  }
}
