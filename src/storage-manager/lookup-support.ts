/**
 * Small parts of the storage manager's lookup: its metrics (recorded once per lookup with label
 * objects made once), its event-manager hooks (one object, no closures) and its outcome.
 */
import type { ChunkHash, NamespaceId } from '../backends/types.ts';
import type { PrefetchHooks } from '../event-manager/event-manager.ts';
import type { KvtierMetrics } from '../metrics/metrics.ts';
import type { LazyAbort } from './lazy-abort.ts';
import type { LookupBytesHold } from './lookup-budget.ts';
import type { LookupHashes } from './lookup-hashes.ts';
import type { PinLedger } from './pin-ledger.ts';
import type { LookupOutcome, PinnedLookup } from './storage-types.ts';
import type { TierTokens } from './tier-walk.ts';

/** The `result` label of `kvtier_lookups_total`. */
export type LookupResultLabel = 'hit' | 'miss' | 'partial' | 'stale' | 'canceled' | 'error';

const RESULT_LABELS: Readonly<Record<LookupResultLabel, { result: LookupResultLabel }>> = {
  hit: { result: 'hit' },
  miss: { result: 'miss' },
  partial: { result: 'partial' },
  stale: { result: 'stale' },
  canceled: { result: 'canceled' },
  error: { result: 'error' },
};

/** Records lookups into `metrics` (nothing when undefined). */
export class LookupRecorder {
  readonly #m: KvtierMetrics | undefined;
  readonly #tierLabels = new Map<string, { tier: string }>();

  constructor(metrics: KvtierMetrics | undefined) {
    this.#m = metrics;
  }

  /** Counts a lookup that ended without an answer. */
  ended(result: 'canceled' | 'error'): void {
    this.#m?.lookups.inc(RESULT_LABELS[result]);
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
    m.lookupRequestedTokens.inc(requested);
    for (const t of tiers) m.lookupHitTokens.inc(this.#tierLabel(t.tier), t.tokens);
    const result: LookupResultLabel =
      status !== 'ok'
        ? 'stale'
        : hitChunks === 0
          ? 'miss'
          : hitChunks === tokenCounts.length
            ? 'hit'
            : 'partial';
    m.lookups.inc(RESULT_LABELS[result]);
    m.lookupDuration.observe((performance.now() - startedMs) / 1000);
  }

  #tierLabel(tier: string): { tier: string } {
    let l = this.#tierLabels.get(tier);
    if (l === undefined) {
      l = { tier };
      this.#tierLabels.set(tier, l);
    }
    return l;
  }
}

/** A lookup's event-manager hooks, one object per lookup (no closures). */
export class LookupHooks implements PrefetchHooks<PinnedLookup> {
  readonly #abort: LazyAbort;
  readonly #release: (p: PinnedLookup) => void;

  constructor(abort: LazyAbort, release: (p: PinnedLookup) => void) {
    this.#abort = abort;
    this.#release = release;
  }

  abort(): void {
    this.#abort.abort();
  }

  dispose(p: PinnedLookup): void {
    this.#release(p);
  }
}

/** An answered lookup: its outcome, pins and hashes, kept packed (hex made when read). */
export class AnsweredLookup implements PinnedLookup {
  status: 'ok' | 'canceled' | 'stale';
  epoch: number;
  hitTokens: number;
  hitChunks: number;
  tiers: TierTokens[];
  readonly lookupId: string;
  readonly namespaces: readonly NamespaceId[];
  readonly ledger: PinLedger;
  readonly memory: LookupBytesHold;
  readonly #hashes: LookupHashes;

  constructor(
    outcome: LookupOutcome,
    lookupId: string,
    namespaces: readonly NamespaceId[],
    hashes: LookupHashes,
    ledger: PinLedger,
    memory: LookupBytesHold,
  ) {
    this.status = outcome.status;
    this.epoch = outcome.epoch;
    this.hitTokens = outcome.hitTokens;
    this.hitChunks = outcome.hitChunks;
    this.tiers = outcome.tiers;
    this.lookupId = lookupId;
    this.namespaces = namespaces;
    this.#hashes = hashes;
    this.ledger = ledger;
    this.memory = memory;
  }

  get hashes(): readonly ChunkHash[] {
    return this.#hashes.hexSlice(0, Math.min(this.hitChunks, this.#hashes.length));
  }
}

/** The public part of an answered lookup (a copy: the pinned lookup stays internal). */
export function outcomeOf(p: PinnedLookup): LookupOutcome {
  return {
    status: p.status,
    epoch: p.epoch,
    hitTokens: p.hitTokens,
    hitChunks: p.hitChunks,
    tiers: p.tiers,
  };
}
