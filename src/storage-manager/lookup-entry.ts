/**
 * What the event manager holds for a lookup the lookup walk (lookup-walk.ts) registered: its
 * hooks while it runs ({@link LookupHooks}: abort it, release its answer), then its answer
 * ({@link AnsweredLookup}: the outcome, the pins of its ready prefix and its hashes) until a LOAD
 * or HOLD takes it (the data plane reads its hashes), a CANCEL or CLEAR releases it, or the pin
 * TTL expires.
 */
import type { ChunkHash, NamespaceId } from '../backends/core/types.ts';
import type { PrefetchHooks } from '../event-manager/event-manager.ts';
import type { LazyAbort } from './lazy-abort.ts';
import type { LookupBytesHold } from './lookup-budget.ts';
import type { LookupHashes } from './lookup-hashes.ts';
import type { PinLedger } from './pin-ledger.ts';
import type { LookupOutcome, LookupRates, PinnedLookup, TierTokens } from './storage-types.ts';

/** A running lookup's event-manager hooks, one object per lookup (no closures). */
export class LookupHooks implements PrefetchHooks<PinnedLookup> {
  readonly #abort: LazyAbort;
  readonly #release: (p: PinnedLookup) => void;
  /** The namespaces the running lookup names (for the servers' namespace rule). */
  readonly namespaces: readonly NamespaceId[];

  constructor(
    abort: LazyAbort,
    release: (p: PinnedLookup) => void,
    namespaces: readonly NamespaceId[],
  ) {
    this.#abort = abort;
    this.#release = release;
    this.namespaces = namespaces;
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
  rates?: LookupRates;
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
    if (outcome.rates !== undefined) this.rates = outcome.rates;
    this.lookupId = lookupId;
    this.namespaces = namespaces;
    this.#hashes = hashes;
    this.ledger = ledger;
    this.memory = memory;
  }

  get hashes(): readonly ChunkHash[] {
    return this.#hashes.hexSlice(0, Math.min(this.hitChunks, this.#hashes.length));
  }

  /** Gives the room of its kept hashes back (once released; they stay readable). Idempotent. */
  freeHashes(): void {
    this.#hashes.free();
  }
}

/** The public part of an answered lookup (a copy: the pinned lookup stays internal). */
export function outcomeOf(p: PinnedLookup): LookupOutcome {
  const o: LookupOutcome = {
    status: p.status,
    epoch: p.epoch,
    hitTokens: p.hitTokens,
    hitChunks: p.hitChunks,
    tiers: p.tiers,
  };
  if (p.rates !== undefined) o.rates = p.rates;
  return o;
}
