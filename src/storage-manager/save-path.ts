import type {
  Chunk,
  ChunkHash,
  ChunkReservation,
  HostMemoryTier,
  NamespaceId,
  PutOutcome,
  StorageBackend,
} from '../backends/core/types.ts';
import { closedError, KvtierError } from '../errors.ts';
import type { KvtierMetrics } from '../metrics/metrics.ts';
import type { ClearFence } from './clear-fence.ts';
import type { SaveOutcome, StorageReservation } from './storage-types.ts';
import type { ChunkShapes } from './tier-rates.ts';
import type { WriteJob, WriteThroughQueue } from './write-through.ts';

/** A write-through job with the fence stamp of the write that queued it. */
export interface StampedJob extends WriteJob {
  readonly stamp: number;
}

/** What the save side shares with the storage manager that owns it. */
export interface SavePathOptions {
  readonly host: HostMemoryTier;
  /** The tiers below host memory, in order: every write-through targets all of them. */
  readonly lower: readonly StorageBackend[];
  readonly fence: ClearFence;
  /** Owned by the manager (CLEAR discards from it, close flushes it). */
  readonly queue: WriteThroughQueue<StampedJob>;
  readonly metrics: KvtierMetrics | undefined;
  /** Whether the manager is closing. */
  readonly closed: () => boolean;
  /** Bytes per token by namespace: every chunk stored is a sample of it. */
  readonly shapes: ChunkShapes;
}

/**
 * The storage manager's write side: PUTs and saves land in the host-memory tier (pinned while
 * their write-through is pending) and are queued for the lower tiers, behind the CLEAR fence.
 * Only the storage manager builds and calls it.
 */
export class SavePath {
  readonly #host: HostMemoryTier;
  readonly #lower: readonly StorageBackend[];
  /** The lower tiers a chunk from another sidecar goes to: those that do not reach sidecars. */
  readonly #lowerLocal: readonly StorageBackend[];
  readonly #fence: ClearFence;
  readonly #queue: WriteThroughQueue<StampedJob>;
  readonly #metrics: KvtierMetrics | undefined;
  readonly #closed: () => boolean;
  readonly #shapes: ChunkShapes;
  #writeDropped = 0;

  constructor(o: SavePathOptions) {
    this.#host = o.host;
    this.#lower = o.lower;
    this.#lowerLocal = o.lower.filter((t) => t.capabilities.peers !== true);
    this.#fence = o.fence;
    this.#queue = o.queue;
    this.#metrics = o.metrics;
    this.#closed = o.closed;
    this.#shapes = o.shapes;
  }

  /**
   * Stores a chunk in the CPU tier and queues it for the lower tiers. Never waits for room:
   * returns 'dropped' when no tier will get the chunk. The chunk's bytes must not change until
   * the write-through has run (the manager keeps a reference when the CPU tier could not take them).
   * A CLEAR of `ns` that runs before this resolves wins: the chunk is not kept. With `fromPeer`
   * (a chunk another sidecar sent), the tiers that reach other sidecars are not written.
   * @throws KvtierError `KVT_CLOSED` after close; the CPU tier's `KVT_INVALID_ARGUMENT`.
   */
  async put(ns: NamespaceId, hash: ChunkHash, chunk: Chunk, fromPeer = false): Promise<PutOutcome> {
    this.#checkOpen();
    this.#shapes.record(ns, chunk.data.byteLength, chunk.tokens);
    const stamp = this.#fence.stamp();
    const targets = fromPeer ? this.#lowerLocal : this.#lower;
    const pinForWrite = targets.length > 0;
    const outcome = await this.#host.put(ns, hash, chunk, { pin: pinForWrite });
    const inCpu = outcome !== 'dropped';
    if (this.#fence.clearedSince(ns, stamp)) {
      if (inCpu && pinForWrite) this.#host.unpin(ns, [hash]);
      if (outcome === 'stored') await this.#host.remove(ns, [hash]).catch(() => 0);
      return outcome;
    }
    if (!pinForWrite) return outcome;
    const queued = this.#enqueue(ns, hash, chunk, inCpu, stamp, targets);
    return inCpu ? outcome : queued ? 'stored' : 'dropped';
  }

  /**
   * Reserves host memory for a chunk the caller writes in place (the data plane's gather), so
   * the bytes never pass through the JS heap. Never waits: evicts like `put`, or drops.
   * @returns a {@link StorageReservation}; `'exists'` when the CPU tier already has the chunk
   *   (touched, nothing reserved); `'dropped'` (counted by the tier) when there is no room.
   * @throws KvtierError `KVT_CLOSED` after close; `KVT_INVALID_ARGUMENT` on bad sizes.
   */
  reserve(
    ns: NamespaceId,
    hash: ChunkHash,
    bytes: number,
    tokens: number,
  ): StorageReservation | 'exists' | 'dropped' {
    this.#checkOpen();
    this.#shapes.record(ns, bytes, tokens);
    const stamp = this.#fence.stamp();
    const r = this.#host.reserve(ns, hash, bytes, tokens);
    if (typeof r === 'string') return r;
    let settled = false;
    const settle = (): ChunkReservation => {
      if (settled) throw new KvtierError('KVT_INTERNAL', 'storage reservation already settled');
      settled = true;
      return r;
    };
    return {
      view: r.view,
      commit: () => this.#commit(ns, hash, tokens, settle(), stamp),
      abort: () => settle().abort(),
    };
  }

  #commit(
    ns: NamespaceId,
    hash: ChunkHash,
    tokens: number,
    r: ChunkReservation,
    stamp: number,
  ): SaveOutcome {
    if (this.#closed()) {
      r.abort();
      throw closedError('storage manager');
    }
    if (this.#fence.clearedSince(ns, stamp)) {
      r.abort();
      return 'dropped';
    }
    const pinForWrite = this.#lower.length > 0;
    const outcome = r.commit({ pin: pinForWrite });
    if (!pinForWrite) return outcome;
    if (outcome === 'exists') {
      this.#host.unpin(ns, [hash]);
      return 'exists';
    }
    this.#enqueue(ns, hash, { tokens, data: r.view }, true, stamp, this.#lower);
    return 'stored';
  }

  /**
   * Queues the write-through of a chunk (pinned in the CPU tier when `inCpu`; the pin is
   * released when the job leaves the queue). Returns false, counted, when the queue is full.
   */
  #enqueue(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    inCpu: boolean,
    stamp: number,
    targets: readonly StorageBackend[],
  ): boolean {
    const job: StampedJob = {
      ns,
      hash,
      chunk,
      stamp,
      targets,
      done: () => {
        if (inCpu) this.#host.unpin(ns, [hash]);
      },
    };
    if (this.#queue.enqueue(job)) return true;
    if (inCpu) this.#host.unpin(ns, [hash]);
    this.#writeDropped++;
    for (const t of targets)
      this.#metrics?.writeThroughDropped.inc({ tier: t.name, reason: 'queue_full' });
    return false;
  }

  /** Write-throughs refused because the queue was full, since start (PUT and saves). */
  get writeThroughDropped(): number {
    return this.#writeDropped;
  }

  #checkOpen(): void {
    if (this.#closed()) throw closedError('storage manager');
  }
}
