import { abortedError, closedError } from '../../errors.ts';
import { checkChunk } from '../core/chunk-check.ts';
import { countPrefixHits, pinPresent } from '../core/index-ops.ts';
import type {
  BackendCapabilities,
  BackendContext,
  BackendFactory,
  BackendHealth,
  BackendStats,
  Chunk,
  ChunkHash,
  ContainsOptions,
  GetOptions,
  NamespaceId,
  PutOptions,
  PutOutcome,
  StorageBackend,
} from '../core/types.ts';
import {
  type MemoryBackendOptions,
  memoryOptionsFromConfig,
  resolveMemoryBackendOptions,
} from './memory-options.ts';

export {
  type MemoryBackendOptions,
  memoryOptionsFromConfig,
  type ResolvedMemoryBackendOptions,
  resolveMemoryBackendOptions,
} from './memory-options.ts';

interface Entry {
  readonly ns: NamespaceId;
  readonly hash: ChunkHash;
  readonly chunk: Chunk;
  pins: number;
}

/**
 * The simplest backend: private copies of chunks in a `Map`, for tests and as the reference
 * example of {@link StorageBackend}. Unbounded by default; with `capacityBytes` it evicts
 * unpinned chunks least-recently-used first and drops puts that cannot fit. Removing a pinned
 * chunk frees nothing a reader holds (its bytes are a private copy), so removal is immediate.
 * Returned chunks share the stored bytes: callers must not mutate them.
 */
export class MemoryBackend implements StorageBackend {
  readonly name: string;
  readonly kind = 'memory';
  readonly capabilities: BackendCapabilities;

  readonly #capacityBytes: number | null;
  /** Insertion order is recency order: a touch re-inserts. */
  readonly #entries = new Map<string, Entry>();
  #bytesUsed = 0;
  #pinnedBytes = 0;
  #pinnedChunks = 0;
  #evictions = 0;
  #droppedPuts = 0;
  #closing: Promise<void> | null = null;

  /** @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options. */
  constructor(options: MemoryBackendOptions = {}, ctx: BackendContext = { name: 'memory' }) {
    const o = resolveMemoryBackendOptions(options);
    this.name = ctx.name;
    this.#capacityBytes = o.capacityBytes;
    this.capabilities = Object.freeze({
      pinning: true,
      hostMemory: false,
      persistent: false,
      shared: false,
      evicts: o.capacityBytes !== null,
      maxChunkBytes: o.maxChunkBytes,
    });
  }

  async batchedContains(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: ContainsOptions = {},
  ): Promise<number> {
    this.#open(opts.signal, 'contains');
    return countPrefixHits(
      hashes,
      (h) => this.#touch(ns, h),
      opts.pin === true ? (e) => this.#pinEntry(e) : undefined,
    );
  }

  async batchedGet(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: GetOptions = {},
  ): Promise<Map<ChunkHash, Chunk | null>> {
    this.#open(opts.signal, 'get');
    const out = new Map<ChunkHash, Chunk | null>();
    for (const hash of hashes) out.set(hash, this.#touch(ns, hash)?.chunk ?? null);
    return out;
  }

  async put(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    opts: PutOptions = {},
  ): Promise<PutOutcome> {
    this.#open(opts.signal, 'put');
    checkChunk(chunk);
    const existing = this.#touch(ns, hash);
    if (existing !== undefined) {
      if (opts.pin === true) this.#pinEntry(existing);
      return 'exists';
    }
    const bytes = chunk.data.byteLength;
    if (bytes > this.capabilities.maxChunkBytes || !this.#makeRoom(bytes)) {
      this.#droppedPuts++;
      return 'dropped';
    }
    const e: Entry = {
      ns,
      hash,
      chunk: { tokens: chunk.tokens, data: new Uint8Array(chunk.data) },
      pins: 0,
    };
    this.#entries.set(keyOf(ns, hash), e);
    this.#bytesUsed += bytes;
    if (opts.pin === true) this.#pinEntry(e);
    return 'stored';
  }

  async remove(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    this.#open(undefined, 'remove');
    let removed = 0;
    for (const hash of hashes) {
      const e = this.#entries.get(keyOf(ns, hash));
      if (e === undefined) continue;
      this.#delete(e);
      removed++;
    }
    return removed;
  }

  pin(ns: NamespaceId, hashes: readonly ChunkHash[]): number {
    this.#open(undefined, 'pin');
    return pinPresent(
      hashes,
      (h) => this.#entries.get(keyOf(ns, h)),
      (e) => this.#pinEntry(e),
    );
  }

  unpin(ns: NamespaceId, hashes: readonly ChunkHash[]): void {
    this.#open(undefined, 'unpin');
    for (const hash of hashes) {
      const e = this.#entries.get(keyOf(ns, hash));
      if (e === undefined || e.pins === 0) continue;
      e.pins--;
      if (e.pins === 0) {
        this.#pinnedChunks--;
        this.#pinnedBytes -= e.chunk.data.byteLength;
      }
    }
  }

  async clear(ns?: NamespaceId): Promise<void> {
    this.#open(undefined, 'clear');
    for (const e of [...this.#entries.values()])
      if (ns === undefined || e.ns === ns) this.#delete(e);
  }

  stats(): BackendStats {
    this.#open(undefined, 'stats');
    return {
      chunks: this.#entries.size,
      bytesUsed: this.#bytesUsed,
      capacityBytes: this.#capacityBytes,
      pinnedChunks: this.#pinnedChunks,
      evictions: this.#evictions,
      droppedPuts: this.#droppedPuts,
    };
  }

  health(): BackendHealth {
    this.#open(undefined, 'health');
    return 'up';
  }

  close(): Promise<void> {
    this.#closing ??= Promise.resolve().then(() => this.#entries.clear());
    return this.#closing;
  }

  #open(signal: AbortSignal | undefined, op: string): void {
    if (this.#closing !== null) throw closedError(`backend ${this.name}`);
    if (signal?.aborted === true) throw abortedError(signal, `${this.name} ${op}`);
  }

  /** Looks up and marks most recently used. */
  #touch(ns: NamespaceId, hash: ChunkHash): Entry | undefined {
    const key = keyOf(ns, hash);
    const e = this.#entries.get(key);
    if (e !== undefined) {
      this.#entries.delete(key);
      this.#entries.set(key, e);
    }
    return e;
  }

  #pinEntry(e: Entry): void {
    if (e.pins === 0) {
      this.#pinnedChunks++;
      this.#pinnedBytes += e.chunk.data.byteLength;
    }
    e.pins++;
  }

  #delete(e: Entry): void {
    this.#entries.delete(keyOf(e.ns, e.hash));
    this.#bytesUsed -= e.chunk.data.byteLength;
    if (e.pins > 0) {
      this.#pinnedChunks--;
      this.#pinnedBytes -= e.chunk.data.byteLength;
    }
  }

  /** Evicts unpinned chunks oldest first until `bytes` fit; false (nothing evicted) if they cannot. */
  #makeRoom(bytes: number): boolean {
    const cap = this.#capacityBytes;
    if (cap === null) return true;
    if (cap - this.#pinnedBytes < bytes) return false;
    for (const e of this.#entries.values()) {
      if (this.#bytesUsed + bytes <= cap) break;
      if (e.pins > 0) continue;
      this.#delete(e);
      this.#evictions++;
    }
    return true;
  }
}

/** Unambiguous composite key: the length prefix keeps (ns, hash) pairs from colliding. */
function keyOf(ns: NamespaceId, hash: ChunkHash): string {
  return `${ns.length}:${ns}${hash}`;
}

/** Builds a {@link MemoryBackend} from config options. @throws `KVT_CONFIG` on bad options. */
export const createMemoryBackend: BackendFactory = async (options, ctx) =>
  new MemoryBackend(memoryOptionsFromConfig(options, ctx.name), ctx);
