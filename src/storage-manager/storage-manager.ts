import type {
  Chunk,
  ChunkHash,
  HostMemoryTier,
  NamespaceId,
  PutOutcome,
  StorageBackend,
} from '../backends/core/types.ts';
import { abortedError, closedError, KvtierError } from '../errors.ts';
import {
  EventManager,
  type PendingPrefetch,
  type PrefetchHooks,
} from '../event-manager/event-manager.ts';
import type { KvtierMetrics, MetricSources } from '../metrics/metrics.ts';
import { AsyncSerializer } from '../serializer/async-serializer.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import { requireInt } from '../util/validate.ts';
import { ClearFence } from './clear-fence.ts';
import { clockEpoch } from './epoch-file.ts';
import { LazyAbort } from './lazy-abort.ts';
import { estimateLookupBytes, LookupByteBudget, type LookupBytesHold } from './lookup-budget.ts';
import type { LookupHashes } from './lookup-hashes.ts';
import {
  hostAnswer,
  LookupHooks,
  LookupRecorder,
  lookupHashesOf,
  namespacesOfLookup,
  outcomeOf,
  probeHost,
  walkLookup,
} from './lookup-support.ts';
import { asHostMemoryTier, SavePath, type StampedJob } from './save-path.ts';
import {
  readFirstTier,
  type StorageParts,
  storageMetricSources,
  storageStats,
} from './storage-report.ts';
import type {
  LookupInput,
  LookupOutcome,
  PinnedLookup,
  StorageManagerOptions,
  StorageReservation,
  TierHealth,
} from './storage-types.ts';
import { TierWalk } from './tier-walk.ts';
import { WriteThroughQueue } from './write-through.ts';

export { asHostMemoryTier } from './save-path.ts';
export type {
  LookupInput,
  LookupOutcome,
  PinnedLookup,
  SaveOutcome,
  StorageManagerOptions,
  StorageReservation,
  TierHealth,
} from './storage-types.ts';
export type { TierTokens } from './tier-walk.ts';

const DEFAULTS = {
  prefetchBudgetChunks: 1024,
  pinTtlMs: 60_000,
  maxLookups: 4096,
  sweepIntervalMs: 1000,
};

/**
 * Runs lookups over the tiers (design decision 3, docs/architecture.md), prefetches lower-tier
 * hits into the CPU tier under the serializer, tracks each lookup in the event manager, and
 * writes puts and saves through to the lower tiers. It owns the tiers it is given and closes them; nothing else
 * writes to them, queues write-throughs or keeps their counters (the data plane saves through
 * {@link StorageManager.reserve} and reads through {@link StorageManager.hostChunks}).
 */
export class StorageManager {
  /** The tiers in order, for reading names, stats and health (tests, the simulator, PING). */
  readonly tiers: readonly StorageBackend[];
  /** Diagnostics and tests: queue occupancy; only the manager enqueues. */
  readonly writeQueue: Pick<WriteThroughQueue, 'depth' | 'bytes' | 'idle'>;
  /** Diagnostics and tests: prefetch budget occupancy. */
  readonly serializer: Pick<AsyncSerializer, 'capacity' | 'inUse' | 'waiters'>;
  /** Diagnostics and tests: lookup states and counts. */
  readonly events: Pick<EventManager<PinnedLookup>, 'state' | 'sizes' | 'expiredTotal'>;
  readonly #host: HostMemoryTier;
  readonly #lower: readonly StorageBackend[];
  readonly #serializer: AsyncSerializer;
  readonly #events: EventManager<PinnedLookup>;
  readonly #writeQueue: WriteThroughQueue<StampedJob>;
  readonly #fence = new ClearFence();
  readonly #walk: TierWalk;
  /** Answered lookups that hold pins (in the event manager or taken), for CLEAR to release. */
  readonly #answered = new Set<PinnedLookup>();
  readonly #save: SavePath;
  readonly #lookupBytes: LookupByteBudget;
  readonly #metrics: KvtierMetrics | undefined;
  readonly #recorder: LookupRecorder;
  readonly #log: Logger;
  readonly #clearHooks: Pick<StorageManagerOptions, 'onEpoch' | 'onCleared'>;
  /** `releaseLookup`, bound once for every lookup's dispose hook. */
  readonly #release = (p: PinnedLookup): void => this.releaseLookup(p);
  /** The hooks of every lookup {@link lookupNow} answers: its entry is done as soon as it is
   * made, so there is no work to abort, only pins to release. */
  readonly #answeredHooks: PrefetchHooks<PinnedLookup> = {
    abort: () => {},
    dispose: this.#release,
  };
  #epoch: number;
  #closing: Promise<void> | undefined;

  /** @throws KvtierError KVT_CONFIG when the tier list is empty or the first tier is not host memory. */
  constructor(opts: StorageManagerOptions) {
    if (!Array.isArray(opts.tiers) || opts.tiers.length === 0) {
      throw new KvtierError('KVT_CONFIG', 'storage needs at least one tier');
    }
    const first = asHostMemoryTier(opts.tiers[0]!);
    const names = new Set<string>();
    for (const t of opts.tiers) {
      if (names.has(t.name))
        throw new KvtierError('KVT_CONFIG', `tier names must be unique, "${t.name}" appears twice`);
      names.add(t.name);
    }
    this.tiers = [...opts.tiers];
    this.#host = first;
    this.#lower = this.tiers.slice(1);
    this.#metrics = opts.metrics;
    this.#recorder = new LookupRecorder(opts.metrics);
    this.#log = opts.log ?? silentLogger;
    this.#epoch = requireInt('initialEpoch', opts.initialEpoch ?? clockEpoch(), 0, 2 ** 32 - 2);
    this.#clearHooks = { onEpoch: opts.onEpoch, onCleared: opts.onCleared };
    this.#lookupBytes = new LookupByteBudget(opts.maxLookupBytes);
    this.#serializer = new AsyncSerializer({
      capacityChunks: requireInt(
        'prefetchBudgetChunks',
        opts.prefetchBudgetChunks ?? DEFAULTS.prefetchBudgetChunks,
        1,
      ),
    });
    this.#events = new EventManager<PinnedLookup>({
      maxEntries: requireInt('maxLookups', opts.maxLookups ?? DEFAULTS.maxLookups, 1),
      ttlMs: requireInt('pinTtlMs', opts.pinTtlMs ?? DEFAULTS.pinTtlMs, 1),
      sweepIntervalMs: opts.sweepIntervalMs ?? DEFAULTS.sweepIntervalMs,
      ...(opts.now !== undefined ? { now: opts.now } : {}),
    });
    const metrics = this.#metrics;
    this.#writeQueue = new WriteThroughQueue<StampedJob>({
      ...opts.writeThrough,
      onDrop: (tier, reason) => metrics?.writeThroughDropped.inc({ tier, reason }),
    });
    this.#walk = new TierWalk({
      tiers: this.tiers,
      host: this.#host,
      serializer: this.#serializer,
      fence: this.#fence,
      metrics: this.#metrics,
      log: this.#log,
    });
    this.#save = new SavePath({
      host: this.#host,
      lower: this.#lower,
      fence: this.#fence,
      queue: this.#writeQueue,
      metrics: this.#metrics,
      closed: () => this.#closing !== undefined,
    });
    this.serializer = this.#serializer;
    this.events = this.#events;
    this.writeQueue = this.#writeQueue;
  }

  /** The host-memory tier, for diagnostics and tests (stats, pins); saves go through `reserve`. */
  get cpu(): StorageBackend {
    return this.#host;
  }

  /** Bumped by every clear; answers computed across a clear are reported stale. */
  get epoch(): number {
    return this.#epoch;
  }

  /**
   * Looks up a prompt's chunks across the tiers, pins the hits and prefetches lower-tier hits
   * into host memory. Resolves when the answer (tokens ready in host memory) is known; a lookup
   * id already in use is cancelled first. Never rejects for backend faults (a failing tier is a
   * miss); rejects with KVT_CAPACITY when too many lookups are tracked, KVT_CLOSED after close,
   * KVT_INVALID_ARGUMENT for inconsistent input.
   */
  async lookup(input: LookupInput, opts: { signal?: AbortSignal } = {}): Promise<LookupOutcome> {
    const hashes = this.#admit(input);
    const started = performance.now();
    const events = this.#events;
    events.cancel(input.lookupId);

    const ac = new LazyAbort();
    const outer = opts.signal;
    let onAbort: (() => void) | undefined;
    if (outer !== undefined) {
      onAbort = () => ac.abort(outer.reason);
      if (outer.aborted) onAbort();
      else outer.addEventListener('abort', onAbort, { once: true });
    }
    // Admitted and registered before any pin is taken, so a full budget or event manager
    // refuses the lookup cleanly.
    const memory = this.#lookupBytes.hold(
      estimateLookupBytes(hashes.length, input.lookupId.length),
    );
    let entry: PendingPrefetch;
    try {
      entry = events.addPending(
        input.lookupId,
        new LookupHooks(ac, this.#release, input.namespaces),
      );
    } catch (err) {
      memory.release();
      if (onAbort !== undefined) outer!.removeEventListener('abort', onAbort);
      throw err;
    }
    let recorded = false;
    try {
      const pinned = await walkLookup(
        this.#walk,
        this,
        input,
        hashes,
        ac,
        memory,
        this.#fence.stamp(),
      );
      if (ac.aborted) {
        pinned.ledger.releaseAll();
        throw abortedError(ac.signal, 'lookup');
      }
      recorded = true;
      return this.#settle(input, hashes, entry, pinned, started);
    } catch (err) {
      if (recorded) throw err;
      memory.release();
      events.fail(entry, err);
      if (ac.aborted) {
        this.#recorder.ended('canceled');
        return { status: 'canceled', epoch: this.#epoch, hitTokens: 0, hitChunks: 0, tiers: [] };
      }
      this.#recorder.ended('error');
      throw err;
    } finally {
      if (onAbort !== undefined) outer!.removeEventListener('abort', onAbort);
    }
  }

  /**
   * {@link lookup}, answered at once when the host-memory tier alone answers it: its packed
   * index holds every chunk in every namespace, or there is nothing below it to ask (no lower
   * tier, or `prefetch: false`). Same outcome, pins, tracking and accounting as `lookup`,
   * without a promise. Returns undefined, holding nothing new, when the lookup needs the tiers
   * below (or the host tier has no packed index): call `lookup` then.
   * @throws KvtierError as {@link lookup}.
   */
  lookupNow(input: LookupInput): LookupOutcome | undefined {
    const index = this.#host.packedIndex;
    if (index === undefined || this.#host.health() === 'down') return undefined;
    const hashes = this.#admit(input);
    const started = performance.now();
    const found = probeHost(this.#host, index, input, hashes, this.#lower.length > 0);
    if (found === undefined) return undefined;
    const { ledger, ready } = found;
    const events = this.#events;
    let memory: LookupBytesHold | undefined;
    let entry: PendingPrefetch;
    try {
      events.cancel(input.lookupId);
      memory = this.#lookupBytes.hold(estimateLookupBytes(hashes.length, input.lookupId.length));
      entry = events.addPending(input.lookupId, this.#answeredHooks);
    } catch (err) {
      memory?.release();
      ledger.releaseAll();
      throw err;
    }
    const host = this.tiers[0]!.name;
    const pinned = hostAnswer(input, hashes, ledger, ready, this.#epoch, host, memory);
    return this.#settle(input, hashes, entry, pinned, started);
  }

  /** Checks a lookup's input; returns its hashes. @throws KvtierError as {@link lookup}. */
  #admit(input: LookupInput): LookupHashes {
    if (this.#closing !== undefined) throw closedError('storage manager');
    return lookupHashesOf(input);
  }

  /**
   * Hands an answered lookup to its event-manager entry, keeps what stays (pins, the answer to
   * take) or releases it, records it, and returns its outcome.
   */
  #settle(
    input: LookupInput,
    hashes: LookupHashes,
    entry: PendingPrefetch,
    pinned: PinnedLookup,
    started: number,
  ): LookupOutcome {
    const events = this.#events;
    const memory = pinned.memory;
    events.fulfil(entry, pinned);
    // A CLEAR that ran after the walk (while this resumed) makes the answer stale too.
    if (pinned.status === 'ok' && pinned.epoch !== this.#epoch) this.#invalidate(pinned);
    if (
      (pinned.status !== 'ok' || input.pin === false) &&
      events.result(input.lookupId) === pinned
    ) {
      events.take(input.lookupId);
      pinned.ledger.releaseAll();
    } else {
      if (pinned.status === 'ok' && pinned.hitChunks > 0) this.#answered.add(pinned);
      // It stays (pins, or an answer to take): let go of the request's buffer.
      hashes.compact(pinned.hitChunks);
    }
    // What stays is the answer and its hits' pins (a no-op once released above).
    memory.resize(estimateLookupBytes(pinned.hitChunks, input.lookupId.length));
    if (!this.#answered.has(pinned) && events.result(input.lookupId) !== pinned) memory.release();
    this.#recorder.answered(
      pinned.status,
      input.tokenCounts,
      pinned.hitChunks,
      pinned.tiers,
      started,
    );
    return outcomeOf(pinned);
  }

  /** Namespaces of a tracked lookup (running or answered), for the server's namespace rule. */
  lookupNamespaces(lookupId: string): readonly NamespaceId[] | undefined {
    return namespacesOfLookup(this.#events, lookupId);
  }

  /** Cancels a lookup: aborts its prefetch or releases its pins. Returns whether it was known. */
  cancel(lookupId: string): boolean {
    return this.#events.cancel(lookupId);
  }

  /**
   * Takes an answered lookup with its pins; the caller must call `releaseLookup` when done
   * reading the chunks. Returns undefined when the lookup is unknown, still running or expired.
   */
  takeLookup(lookupId: string): PinnedLookup | undefined {
    return this.#events.take(lookupId);
  }

  /** Releases the pins of a lookup obtained from `takeLookup`. Idempotent. */
  releaseLookup(p: PinnedLookup): void {
    this.#answered.delete(p);
    p.ledger.releaseAll();
    p.memory.release();
  }

  /** Marks an answered lookup stale (a CLEAR overtook it) and releases its pins. */
  #invalidate(p: PinnedLookup): void {
    p.status = 'stale';
    p.epoch = this.#epoch;
    p.hitTokens = 0;
    p.hitChunks = 0;
    p.tiers = [];
    this.releaseLookup(p);
  }

  /** Expires lookups past the pin TTL; returns how many. */
  sweep(): number {
    const n = this.#events.sweep();
    if (n > 0) this.#metrics?.pinsExpired.inc(n);
    return n;
  }

  /**
   * Stores a chunk in the CPU tier and queues it for the lower tiers. Never waits for room:
   * returns 'dropped' when no tier will get the chunk. The chunk's bytes must not change until
   * the write-through has run (the manager keeps a reference when the CPU tier could not take them).
   * A CLEAR of `ns` that runs before this resolves wins: the chunk is not kept.
   * @throws KvtierError `KVT_CLOSED` after close; the CPU tier's `KVT_INVALID_ARGUMENT`.
   */
  put(ns: NamespaceId, hash: ChunkHash, chunk: Chunk): Promise<PutOutcome> {
    return this.#save.put(ns, hash, chunk);
  }

  /**
   * Reserves host memory for a chunk the caller writes in place (the data plane's gather), so
   * the bytes never pass through the JS heap; see {@link SavePath.reserve}.
   * @throws KvtierError `KVT_CLOSED` after close; `KVT_INVALID_ARGUMENT` on bad sizes.
   */
  reserve(
    ns: NamespaceId,
    hash: ChunkHash,
    bytes: number,
    tokens: number,
  ): StorageReservation | 'exists' | 'dropped' {
    return this.#save.reserve(ns, hash, bytes, tokens);
  }

  /** Write-throughs refused because the queue was full, since start (PUT and saves). */
  get writeThroughDropped(): number {
    return this.#save.writeThroughDropped;
  }

  /**
   * Reads chunks from the host-memory tier only, keyed by hash (`null`: not there). The bytes
   * are views into the arena: valid while the caller holds pins on the chunks (a lookup it took),
   * or until it next yields.
   */
  async hostChunks(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
  ): Promise<Map<ChunkHash, Chunk | null>> {
    if (this.#closing !== undefined) throw closedError('storage manager');
    return this.#host.batchedGet(ns, hashes);
  }

  /** Reads one chunk from the first tier that has it; returns a copy of its bytes, or null. */
  async get(ns: NamespaceId, hash: ChunkHash): Promise<Chunk | null> {
    if (this.#closing !== undefined) throw closedError('storage manager');
    return readFirstTier(this.tiers, ns, hash, this.#log);
  }

  /**
   * Drops the chunks of `namespaces` (all when empty) from every tier and bumps the epoch (and
   * waits for `onEpoch`), so running lookups are answered stale. Resolves the new epoch once the
   * clear holds: nothing put, saved or prefetched before the call can become visible afterwards.
   * Queued write-throughs of the namespaces are dropped, running ones waited for before the tiers
   * are cleared; answered lookups of them lose their pins (a load of one: every block invalid).
   */
  async clear(namespaces: readonly NamespaceId[] = []): Promise<number> {
    if (this.#closing !== undefined) throw closedError('storage manager');
    this.#epoch = (this.#epoch + 1) >>> 0;
    const recorded = this.#clearHooks.onEpoch?.(this.#epoch);
    this.#fence.clear(namespaces);
    const only = namespaces.length === 0 ? undefined : new Set(namespaces);
    const cleared = (ns: NamespaceId) => only === undefined || only.has(ns);
    // Jobs queued before this clear, not those of puts that arrive while it runs.
    const overtaken = (job: StampedJob) => this.#fence.clearedSince(job.ns, job.stamp);
    this.#writeQueue.discard(overtaken);
    for (const p of [...this.#answered])
      if (p.namespaces.some(cleared)) {
        if (this.#events.result(p.lookupId) === p) this.#events.take(p.lookupId);
        this.#invalidate(p);
      }
    await this.#writeQueue.settled(overtaken);
    await Promise.all(
      this.tiers.map(async (tier) => {
        try {
          if (namespaces.length === 0) await tier.clear();
          else for (const ns of namespaces) await tier.clear(ns);
        } catch (err) {
          this.#log.warn('tier clear failed', { tier: tier.name, err });
        }
      }),
    );
    // Reported before anything else can be: a store after the clear follows it on the stream.
    this.#clearHooks.onCleared?.(namespaces, this.#epoch);
    await recorded;
    return this.#epoch;
  }

  /** Name, kind and health of every tier, in order (readiness, PING). */
  tierHealth(): TierHealth[] {
    return this.tiers.map((t) => ({ name: t.name, kind: t.kind, health: t.health() }));
  }

  /** The scrape-time sources the metrics module reads from this manager. */
  metricSources(): MetricSources {
    return storageMetricSources(this.#parts);
  }

  /** A JSON-friendly snapshot for the STATS request and `kvtier stats`. */
  stats(): Record<string, unknown> {
    return storageStats(this.#parts);
  }

  /** What `stats` and `metricSources` read. */
  get #parts(): StorageParts {
    return {
      tiers: this.tiers,
      epoch: this.#epoch,
      events: this.#events,
      lookupBytes: this.#lookupBytes,
      serializer: this.#serializer,
      writeQueue: this.#writeQueue,
      writeThroughDropped: this.#save.writeThroughDropped,
      manager: this,
    };
  }

  /** Cancels lookups (releasing pins), flushes the write-through queue and closes every tier. Idempotent. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      this.#events.close();
      this.#serializer.close();
      await this.#writeQueue.close();
      await Promise.all(this.tiers.map((t) => t.close().catch(() => {})));
    })();
    return this.#closing;
  }
}
