/**
 * The storage manager (the design card's `src/storage-manager`): the one owner of the tiers. The
 * lookup server (src/lookup-server/) hands it LOOKUP, CANCEL, PUT, GET, CLEAR and STATS; the data
 * plane (src/data-plane/) saves through `reserve` and loads through `takeLookup` and
 * `hostChunks`; the sidecar (src/sidecar.ts) builds it and closes it. It owns, and builds from its
 * options, the event manager (src/event-manager/: one entry per lookup, holding an answer's pins
 * until taken, cancelled or expired) and the serializer (src/serializer/: the chunk budget every
 * prefetch waits on); the LOOKUP path is {@link LookupWalk} (lookup-walk.ts), the PUT and SAVE
 * path {@link SavePath} (save-path.ts) with its write-through queue (write-through.ts).
 */
import type {
  Chunk,
  ChunkHash,
  HostMemoryTier,
  NamespaceId,
  PutOutcome,
  StorageBackend,
} from '../backends/core/types.ts';
import { closedError, KvtierError } from '../errors.ts';
import { EventManager } from '../event-manager/event-manager.ts';
import type { KvtierMetrics, MetricSources } from '../metrics/metrics.ts';
import { AsyncSerializer } from '../serializer/async-serializer.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import { requireInt } from '../util/validate.ts';
import { ClearFence } from './clear-fence.ts';
import { clockEpoch } from './epoch-file.ts';
import { LookupByteBudget } from './lookup-budget.ts';
import { LookupWalk } from './lookup-walk.ts';
import { localContains, localRead, type PeerReadLease } from './peer-source.ts';
import { SavePath, type StampedJob } from './save-path.ts';
import { type StorageStatsParts, storageMetricSources, storageStats } from './storage-stats.ts';
import type {
  LookupInput,
  LookupOutcome,
  PinnedLookup,
  StorageManagerOptions,
  StorageReservation,
  TierHealth,
} from './storage-types.ts';
import { ChunkShapes, TierRates } from './tier-rates.ts';
import { WriteThroughQueue } from './write-through.ts';

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
  /**
   * Each tier's read rate, measured by lookups (tier-rates.ts); `fix` sets one (the simulator's
   * modeled tiers). Lookups that name the engine's prefill rate decide with it (claim-rule.ts).
   */
  readonly tierRates: Pick<TierRates, 'rate' | 'fix'>;
  readonly #host: HostMemoryTier;
  readonly #serializer: AsyncSerializer;
  readonly #events: EventManager<PinnedLookup>;
  readonly #writeQueue: WriteThroughQueue<StampedJob>;
  readonly #fence = new ClearFence();
  readonly #lookups: LookupWalk;
  readonly #save: SavePath;
  readonly #metrics: KvtierMetrics | undefined;
  readonly #log: Logger;
  readonly #clearHooks: Pick<StorageManagerOptions, 'onEpoch' | 'onCleared'>;
  /** What `stats` and `metricSources` read. */
  readonly #statsParts: StorageStatsParts;
  #epoch: number;
  #closing: Promise<void> | undefined;

  /** @throws KvtierError KVT_CONFIG when the tier list is empty or the first tier is not host memory. */
  constructor(opts: StorageManagerOptions) {
    if (!Array.isArray(opts.tiers) || opts.tiers.length === 0) {
      throw new KvtierError('KVT_CONFIG', 'storage needs at least one tier');
    }
    const host = asHostMemoryTier(opts.tiers[0]!);
    const names = new Set<string>();
    for (const t of opts.tiers) {
      if (names.has(t.name))
        throw new KvtierError('KVT_CONFIG', `tier names must be unique, "${t.name}" appears twice`);
      names.add(t.name);
    }
    const tiers = [...opts.tiers];
    const metrics = opts.metrics;
    const log = opts.log ?? silentLogger;
    this.tiers = tiers;
    this.#host = host;
    this.#metrics = metrics;
    this.#log = log;
    this.#epoch = requireInt('initialEpoch', opts.initialEpoch ?? clockEpoch(), 0, 2 ** 32 - 2);
    this.#clearHooks = { onEpoch: opts.onEpoch, onCleared: opts.onCleared };
    const lookupBytes = new LookupByteBudget(opts.maxLookupBytes);
    const serializer = new AsyncSerializer({
      capacityChunks: requireInt(
        'prefetchBudgetChunks',
        opts.prefetchBudgetChunks ?? DEFAULTS.prefetchBudgetChunks,
        1,
      ),
    });
    const events = new EventManager<PinnedLookup>({
      maxEntries: requireInt('maxLookups', opts.maxLookups ?? DEFAULTS.maxLookups, 1),
      ttlMs: requireInt('pinTtlMs', opts.pinTtlMs ?? DEFAULTS.pinTtlMs, 1),
      sweepIntervalMs: opts.sweepIntervalMs ?? DEFAULTS.sweepIntervalMs,
      ...(opts.now !== undefined ? { now: opts.now } : {}),
    });
    const writeQueue = new WriteThroughQueue<StampedJob>({
      ...opts.writeThrough,
      onDrop: (tier, reason) => metrics?.writeThroughDropped.inc({ tier, reason }),
    });
    const fence = this.#fence;
    const epoch = () => this.#epoch;
    const closed = () => this.#closing !== undefined;
    const rates = new TierRates(opts.tierRates);
    const shapes = new ChunkShapes();
    this.#lookups = new LookupWalk({
      tiers,
      host,
      events,
      lookupBytes,
      serializer,
      fence,
      metrics,
      log,
      epoch,
      closed,
      rates,
      shapes,
    });
    const lower = tiers.slice(1);
    this.#save = new SavePath({ host, lower, fence, queue: writeQueue, metrics, closed, shapes });
    const writeThroughDropped = () => this.#save.writeThroughDropped;
    this.#statsParts = {
      tiers,
      epoch,
      events,
      lookupBytes,
      serializer,
      writeQueue,
      writeThroughDropped,
      rates,
    };
    this.tierRates = rates;
    this.#serializer = serializer;
    this.#events = events;
    this.#writeQueue = writeQueue;
    this.serializer = serializer;
    this.events = events;
    this.writeQueue = writeQueue;
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
   * into host memory. Host memory is asked first: when it answers alone (its packed index holds
   * every chunk in every namespace, or there is nothing below it to ask: no lower tier, or
   * `prefetch: false`), the outcome is returned at once, without a promise; else a promise
   * resolves when the answer (tokens ready in host memory) is known, the walk going on below
   * host memory from what it holds. A lookup id already in use is cancelled first. Never fails
   * for backend faults (a failing tier is a miss); rejects (never throws) with KVT_CAPACITY when
   * too many lookups are tracked, KVT_CLOSED after close, KVT_INVALID_ARGUMENT for inconsistent
   * input.
   */
  lookup(
    input: LookupInput,
    opts: { signal?: AbortSignal } = {},
  ): LookupOutcome | Promise<LookupOutcome> {
    return this.#lookups.lookup(input, opts);
  }

  /** Namespaces of a tracked lookup (running or answered), for the server's namespace rule. */
  lookupNamespaces(lookupId: string): readonly NamespaceId[] | undefined {
    return this.#lookups.namespacesOf(lookupId);
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
    this.#lookups.release(p);
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
   * {@link put} of a chunk another sidecar sent (PEER_PUT): host memory and the lower tiers, but
   * never a tier that reaches other sidecars (`capabilities.peers`), so that it is not sent on.
   * @throws KvtierError as {@link put}.
   */
  putFromPeer(ns: NamespaceId, hash: ChunkHash, chunk: Chunk): Promise<PutOutcome> {
    return this.#save.put(ns, hash, chunk, true);
  }

  /**
   * Leading chunks of `hashes` this sidecar holds for another one (PEER_CONTAINS): its tiers in
   * order, as a lookup walks them, without those that reach other sidecars; nothing is pinned.
   * @throws KvtierError `KVT_CLOSED` after close.
   */
  async peerContains(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    if (this.#closing !== undefined) throw closedError('storage manager');
    return localContains(this.tiers, ns, hashes, this.#log);
  }

  /**
   * Reads chunks for another sidecar (PEER_GET) from the same tiers as {@link peerContains},
   * without prefetching them. Host-memory chunks stay pinned, and lower tiers' buffers held, until
   * the lease is released: the caller builds its reply from them in place, then releases.
   * @throws KvtierError `KVT_CLOSED` after close.
   */
  async peerRead(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<PeerReadLease> {
    if (this.#closing !== undefined) throw closedError('storage manager');
    return localRead(this.tiers, ns, hashes, this.#log);
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

  /**
   * Reads one chunk from the first tier that has it (pinned while read where the tier pins);
   * returns a copy of its bytes, or null. A tier that fails is skipped. Not a prefetch: the
   * chunk is not brought into host memory and the serializer is not asked.
   */
  async get(ns: NamespaceId, hash: ChunkHash): Promise<Chunk | null> {
    if (this.#closing !== undefined) throw closedError('storage manager');
    for (const tier of this.tiers) {
      if (tier.health() === 'down') continue;
      const pinned = tier.capabilities.pinning && tier.pin(ns, [hash]) === 1;
      try {
        const chunk = (await tier.batchedGet(ns, [hash])).get(hash);
        if (chunk != null) {
          const copy = { tokens: chunk.tokens, data: Buffer.from(chunk.data) };
          chunk.release?.();
          return copy;
        }
      } catch (err) {
        this.#log.warn('tier get failed; trying the next tier', { tier: tier.name, err });
      } finally {
        if (pinned) tier.unpin(ns, [hash]);
      }
    }
    return null;
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
    // Jobs queued before this clear, not those of puts that arrive while it runs.
    const overtaken = (job: StampedJob) => this.#fence.clearedSince(job.ns, job.stamp);
    this.#writeQueue.discard(overtaken);
    this.#lookups.releaseCleared((ns) => only === undefined || only.has(ns));
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
    return storageMetricSources(this.#statsParts);
  }

  /** A JSON-friendly snapshot for the STATS request and `kvtier stats`. */
  stats(): Record<string, unknown> {
    return storageStats(this.#statsParts);
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

/**
 * The first tier as the host-memory port: the storage manager's first tier must be one.
 * @throws KvtierError `KVT_CONFIG` when it does not keep chunks in host memory or lacks `reserve`.
 */
export function asHostMemoryTier(tier: StorageBackend): HostMemoryTier {
  if (!tier.capabilities.hostMemory)
    throw new KvtierError(
      'KVT_CONFIG',
      `the first tier must keep chunks in host memory (e.g. local-cpu), got "${tier.name}" (${tier.kind})`,
    );
  if (typeof (tier as Partial<HostMemoryTier>).reserve !== 'function')
    throw new KvtierError(
      'KVT_CONFIG',
      `tier "${tier.name}" (${tier.kind}) declares hostMemory but does not implement HostMemoryTier.reserve (wrap it with instrumentHostTier or a ForwardingBackend that declares HostMemoryTier)`,
    );
  return tier as HostMemoryTier;
}
