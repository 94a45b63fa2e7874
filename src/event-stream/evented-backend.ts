/**
 * Tier decorators that report what happens to chunks into the event stream (docs/events.md):
 * a put or an in-place save that stores a chunk, a `remove`, and what the tier drops by itself
 * (through its removal listener: evictions, corrupt objects) or finds by itself (a start-up
 * scan indexing files its journal missed). `clear` reports nothing here: the
 * storage manager reports a CLEAR once, for every tier.
 */
import { ForwardingBackend } from '../backends/core/forwarding-backend.ts';
import type {
  Chunk,
  ChunkHash,
  ChunkReservation,
  HostMemoryTier,
  NamespaceId,
  PackedHostIndex,
  PutOptions,
  PutOutcome,
  ReserveOutcome,
  StorageBackend,
} from '../backends/core/types.ts';
import { type ChunkEventSink, type EventTier, mediumOf } from './event-types.ts';

/**
 * Wraps a tier below host memory: a put answered `stored` or `exists` reports the chunk stored
 * in this tier (`exists` too: the tier holds it, whoever wrote it), `remove` reports the hashes
 * it was given. Sets the tier's removal listener (a tier has one; the wrapper owns it).
 */
export function eventedBackend(backend: StorageBackend, sink: ChunkEventSink): StorageBackend {
  return new EventedBackend(backend, sink, true);
}

/**
 * {@link eventedBackend} for the host-memory tier: keeps `reserve` (an in-place save reports
 * the chunk on `commit` → `stored`) and the packed index. A put or commit answered `exists`
 * reports nothing: the chunk was reported when it was stored.
 */
export function eventedHostTier(tier: HostMemoryTier, sink: ChunkEventSink): HostMemoryTier {
  return new EventedHostTier(tier, sink);
}

class EventedBackend<T extends StorageBackend = StorageBackend> extends ForwardingBackend<T> {
  protected readonly sink: ChunkEventSink;
  readonly #existsIsStored: boolean;
  #tier: EventTier | undefined;

  constructor(inner: T, sink: ChunkEventSink, existsIsStored: boolean) {
    super(inner);
    this.sink = sink;
    this.#existsIsStored = existsIsStored;
    inner.setRemovalListener?.((ns, hash, reason) => sink.removed(this.tier, ns, [hash], reason));
    inner.setFoundListener?.((ns, hash) => sink.stored(this.tier, ns, hash));
  }

  /** The tier as events name it; its medium follows the capabilities (a tier down at start has its backend's once started). */
  protected get tier(): EventTier {
    const medium = mediumOf(this.capabilities);
    if (this.#tier?.medium !== medium) this.#tier = Object.freeze({ name: this.name, medium });
    return this.#tier;
  }

  override async put(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    opts?: PutOptions,
  ): Promise<PutOutcome> {
    const outcome = await this.inner.put(ns, hash, chunk, opts);
    if (outcome === 'stored' || (outcome === 'exists' && this.#existsIsStored))
      this.sink.stored(this.tier, ns, hash);
    return outcome;
  }

  override async remove(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    const removed = await this.inner.remove(ns, hashes);
    this.sink.removed(this.tier, ns, hashes, 'removed');
    return removed;
  }

  /** The wrapper owns the inner tier's listeners (set at construction); this is refused. */
  override setRemovalListener(): void {}

  /** As {@link setRemovalListener}. */
  override setFoundListener(): void {}
}

class EventedHostTier extends EventedBackend<HostMemoryTier> implements HostMemoryTier {
  readonly packedIndex: PackedHostIndex | undefined;

  constructor(inner: HostMemoryTier, sink: ChunkEventSink) {
    super(inner, sink, false);
    this.packedIndex = inner.packedIndex;
  }

  reserve(ns: NamespaceId, hash: ChunkHash, bytes: number, tokens: number): ReserveOutcome {
    const r = this.inner.reserve(ns, hash, bytes, tokens);
    if (typeof r === 'string') return r;
    const sink = this.sink;
    const tier = this.tier;
    const reservation: ChunkReservation = {
      view: r.view,
      commit: (opts) => {
        const outcome = r.commit(opts);
        if (outcome === 'stored') sink.stored(tier, ns, hash);
        return outcome;
      },
      abort: () => r.abort(),
    };
    return reservation;
  }
}
