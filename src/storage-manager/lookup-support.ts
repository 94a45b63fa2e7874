/**
 * Parts of the storage manager's lookup: its metrics (recorded once per lookup with label
 * objects made once), its event-manager hooks (one object, no closures), its outcome, and its
 * walk over the tiers (the full one, and the one host memory answers alone).
 */
import type {
  ChunkHash,
  HostMemoryTier,
  NamespaceId,
  PackedHostIndex,
  StorageBackend,
} from '../backends/core/types.ts';
import { abortedError, KvtierError } from '../errors.ts';
import type { EventManager, PrefetchHooks } from '../event-manager/event-manager.ts';
import { type CounterTally, type Tally, tallyOf } from '../metrics/counter-tally.ts';
import type { KvtierMetrics } from '../metrics/metrics.ts';
import type { LazyAbort } from './lazy-abort.ts';
import type { LookupBytesHold } from './lookup-budget.ts';
import { LookupHashes } from './lookup-hashes.ts';
import { PinLedger } from './pin-ledger.ts';
import type { LookupInput, LookupOutcome, PinnedLookup } from './storage-types.ts';
import type { Segment, TierTokens, TierWalk } from './tier-walk.ts';

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

  constructor(metrics: KvtierMetrics | undefined) {
    this.#m = metrics;
    if (metrics === undefined) return;
    const lookups = tallyOf(metrics.lookups);
    this.#results = Object.fromEntries(
      RESULTS.map((r) => [r, lookups.child({ result: r })]),
    ) as Record<LookupResultLabel, Tally>;
    this.#requested = tallyOf(metrics.lookupRequestedTokens).total;
    this.#hitTokens = tallyOf(metrics.lookupHitTokens);
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
    m.lookupDuration.observe((performance.now() - startedMs) / 1000);
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

/** A lookup's event-manager hooks, one object per lookup (no closures). */
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

/** The namespaces of lookup `id` while `events` tracks it (running or answered), else undefined. */
export function namespacesOfLookup(
  events: Pick<EventManager<PinnedLookup>, 'result' | 'hooksOf'>,
  id: string,
): readonly NamespaceId[] | undefined {
  const done = events.result(id);
  if (done !== undefined) return done.namespaces;
  const hooks = events.hooksOf(id);
  return hooks instanceof LookupHooks ? hooks.namespaces : undefined;
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

/**
 * The tier walk of a lookup that host memory answers alone (the storage manager's `lookupNow`):
 * finds and pins each namespace's hits through the host tier's packed index. Returns the pins
 * and the ready prefix (pins past it released), or undefined, holding no pin, when the walk
 * would go on below host memory (a chunk missing there while `hasLower` tiers may be asked)
 * or the index failed: the full walk then decides.
 */
export function probeHost(
  host: HostMemoryTier,
  index: PackedHostIndex,
  input: LookupInput,
  hashes: LookupHashes,
  hasLower: boolean,
): { ledger: PinLedger; ready: number } | undefined {
  const n = hashes.length;
  const askLower = hasLower && input.prefetch !== false;
  const ledger = new PinLedger();
  let ready = n;
  if (n === 0) return { ledger, ready };
  const packed = hashes.packed;
  for (const ns of input.namespaces) {
    let k: number;
    try {
      k = index.contains(ns, packed, 0, n, true);
    } catch {
      ledger.releaseAll();
      return undefined;
    }
    k = Math.max(0, Math.min(k, n));
    if (k > 0) ledger.addPacked(host, index, ns, 0, hashes, 0, k);
    if (k < n && askLower) {
      ledger.releaseAll();
      return undefined;
    }
    ready = Math.min(ready, k);
  }
  ledger.releaseFrom(ready);
  return { ledger, ready };
}

/**
 * The walk of a lookup over every tier, prefetch included (the storage manager's `lookup`):
 * returns its answer with the pins of its ready prefix, stale when `clock`'s epoch moved
 * meanwhile (a CLEAR ran). Takes no pin it does not hand over or release, whatever happens.
 */
export async function walkLookup(
  walker: TierWalk,
  clock: { readonly epoch: number; readonly cpu: StorageBackend },
  input: LookupInput,
  hashes: LookupHashes,
  signal: LazyAbort,
  memory: LookupBytesHold,
  stamp: number,
): Promise<PinnedLookup> {
  const epoch = clock.epoch;
  const ledger = new PinLedger();
  try {
    const n = hashes.length;
    const tierCount = input.prefetch === false ? 1 : walker.tiers.length;
    const segmentsByNs: Segment[][] = [];
    let ready = n;
    for (const ns of input.namespaces) {
      const segments = await walker.probe(ns, hashes, tierCount, ledger, signal);
      segmentsByNs.push(segments);
      ready = Math.min(ready, segments.length === 0 ? 0 : segments[segments.length - 1]!.end);
    }
    ready = walker.fitBudget(segmentsByNs, ready);
    ledger.releaseFrom(ready);
    if (signal.aborted) throw abortedError(signal.signal, 'lookup');
    const walk = { namespaces: input.namespaces, hashes, tokenCounts: input.tokenCounts };
    ready = await walker.prefetch(walk, segmentsByNs, ready, ledger, signal, stamp);
    ledger.releaseAllBut(clock.cpu);
    ledger.releaseFrom(ready);
    const status = clock.epoch !== epoch ? 'stale' : 'ok';
    if (status === 'stale') ready = 0;
    let hitTokens = 0;
    for (let i = 0; i < ready; i++) hitTokens += input.tokenCounts[i]!;
    const tiers = walker.breakdown(segmentsByNs[0] ?? [], ready, input.tokenCounts);
    return new AnsweredLookup(
      { status, epoch: clock.epoch, hitTokens, hitChunks: ready, tiers },
      input.lookupId,
      input.namespaces,
      // The list the ledger refers to as well (compacted if the answer stays).
      hashes,
      ledger,
      memory,
    );
  } catch (err) {
    ledger.releaseAll();
    throw err;
  }
}

/** A lookup's hashes, checked against its token counts and namespaces. @throws KvtierError KVT_INVALID_ARGUMENT. */
export function lookupHashesOf(input: LookupInput): LookupHashes {
  const hashes = LookupHashes.of(input.hashes);
  if (hashes.length !== input.tokenCounts.length) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `lookup has ${hashes.length} hashes but ${input.tokenCounts.length} token counts`,
    );
  }
  if (input.namespaces.length === 0)
    throw new KvtierError('KVT_INVALID_ARGUMENT', 'lookup needs at least one namespace');
  return hashes;
}

/** The answer of a lookup {@link probeHost} found `ready` chunks of in host memory (tier `tier`). */
export function hostAnswer(
  input: LookupInput,
  hashes: LookupHashes,
  ledger: PinLedger,
  ready: number,
  epoch: number,
  tier: string,
  memory: LookupBytesHold,
): AnsweredLookup {
  let hitTokens = 0;
  for (let i = 0; i < ready; i++) hitTokens += input.tokenCounts[i]!;
  const tiers = ready > 0 ? [{ tier, tokens: hitTokens }] : [];
  const outcome: LookupOutcome = { status: 'ok', epoch, hitTokens, hitChunks: ready, tiers };
  return new AnsweredLookup(outcome, input.lookupId, input.namespaces, hashes, ledger, memory);
}
