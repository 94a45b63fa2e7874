/**
 * The one base every backend decorator derives from (metrics, circuit breaker, test gates). It
 * implements {@link StorageBackend} by forwarding every member to the wrapped backend, so a
 * member added to the interface fails to compile here until it is forwarded, and a decorator
 * overrides only what it changes. A decorator of the host-memory tier declares
 * `implements HostMemoryTier` as well, which makes the compiler demand `reserve`.
 */
import type {
  BackendCapabilities,
  BackendHealth,
  BackendStats,
  Chunk,
  ChunkHash,
  ChunkPage,
  ContainsOptions,
  FoundListener,
  GetOptions,
  NamespaceId,
  PutOptions,
  PutOutcome,
  RemovalListener,
  StorageBackend,
} from './types.ts';

/**
 * Forwards every {@link StorageBackend} member to `inner`. `name` is read once at construction;
 * `kind` and `capabilities` are read from `inner` on each access (a tier that was down at start
 * takes its backend's once it has started). The wrapper does not own `inner` beyond forwarding
 * `close()`.
 * @typeParam T the wrapped backend's type (e.g. `HostMemoryTier`), kept for subclasses.
 */
export abstract class ForwardingBackend<T extends StorageBackend = StorageBackend>
  implements StorageBackend
{
  readonly name: string;
  /** The wrapped backend. */
  readonly inner: T;

  constructor(inner: T) {
    this.inner = inner;
    this.name = inner.name;
  }

  get kind(): string {
    return this.inner.kind;
  }

  get capabilities(): BackendCapabilities {
    return this.inner.capabilities;
  }

  batchedContains(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts?: ContainsOptions,
  ): Promise<number> {
    return this.inner.batchedContains(ns, hashes, opts);
  }

  batchedGet(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts?: GetOptions,
  ): Promise<Map<ChunkHash, Chunk | null>> {
    return this.inner.batchedGet(ns, hashes, opts);
  }

  put(ns: NamespaceId, hash: ChunkHash, chunk: Chunk, opts?: PutOptions): Promise<PutOutcome> {
    return this.inner.put(ns, hash, chunk, opts);
  }

  remove(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    return this.inner.remove(ns, hashes);
  }

  pin(ns: NamespaceId, hashes: readonly ChunkHash[]): number {
    return this.inner.pin(ns, hashes);
  }

  unpin(ns: NamespaceId, hashes: readonly ChunkHash[]): void {
    this.inner.unpin(ns, hashes);
  }

  clear(ns?: NamespaceId): Promise<void> {
    return this.inner.clear(ns);
  }

  /** Forwarded when the wrapped backend has it; else nothing (it drops nothing by itself). */
  setRemovalListener(listener: RemovalListener | undefined): void {
    this.inner.setRemovalListener?.(listener);
  }

  /** Forwarded when the wrapped backend has it; else nothing (it finds nothing by itself). */
  setFoundListener(listener: FoundListener | undefined): void {
    this.inner.setFoundListener?.(listener);
  }

  /** Forwarded when the wrapped backend has it; else an empty listing. */
  listChunks(ns?: NamespaceId): Iterable<readonly [NamespaceId, ChunkHash]> {
    return this.inner.listChunks?.(ns) ?? [];
  }

  /** Forwarded when the wrapped backend has it; else null (it cannot be listed). */
  scanChunks(
    ns: NamespaceId | undefined,
    opts: { readonly signal?: AbortSignal },
  ): AsyncIterable<ChunkPage> | null {
    return this.inner.scanChunks?.(ns, opts) ?? null;
  }

  stats(): BackendStats {
    return this.inner.stats();
  }

  health(): BackendHealth {
    return this.inner.health();
  }

  close(): Promise<void> {
    return this.inner.close();
  }
}
