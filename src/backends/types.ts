/**
 * The one interface every storage tier implements. The storage manager talks to tiers only
 * through it, in the order the config lists them; nothing branches on a backend's class.
 */

/** A chunk hash as 64 lowercase hex digits (32 bytes, see docs/protocol.md "Chunk hashing"). */
export type ChunkHash = string;

/** A namespace id as 32 lowercase hex digits (see src/namespace). */
export type NamespaceId = string;

/** One chunk's bytes and the number of tokens it covers. */
export interface Chunk {
  /** Tokens covered by the chunk (chunkSize, or fewer for a trailing partial chunk). */
  readonly tokens: number;
  /**
   * Payload bytes. A host-memory tier may hand out a view into its arena: such a view is valid
   * while the caller holds a pin on the chunk, or until the caller next yields to the event loop.
   * Callers that keep the bytes longer without a pin must copy them.
   */
  readonly data: Uint8Array;
}

/** What a backend can do; generic code branches on these, never on the backend's type. */
export interface BackendCapabilities {
  /** Pins keep chunks from being evicted or freed. */
  readonly pinning: boolean;
  /** Chunks live in host memory and can be served to loads directly (the CPU tier). */
  readonly hostMemory: boolean;
  /** Chunks survive a restart of the sidecar. */
  readonly persistent: boolean;
  /** Several sidecars may read and write the same store. */
  readonly shared: boolean;
  /** The backend evicts on its own under a capacity bound. */
  readonly evicts: boolean;
  /** Largest payload one chunk may have, in bytes. */
  readonly maxChunkBytes: number;
}

/** Point-in-time counters; gauges and totals since start. */
export interface BackendStats {
  readonly chunks: number;
  readonly bytesUsed: number;
  /** Hard bound in bytes, or null where the backend has none of its own. */
  readonly capacityBytes: number | null;
  readonly pinnedChunks: number;
  readonly evictions: number;
  /** Puts dropped because there was no room (e.g. full of pinned data). */
  readonly droppedPuts: number;
  /** Stored objects that failed verification on read (corrupt or misplaced) and were removed. */
  readonly corruptObjects?: number;
}

/** Health as seen by the backend itself; remote tiers report 'down' while bypassed. */
export type BackendHealth = 'up' | 'degraded' | 'down';

export interface ContainsOptions {
  /** Pin every chunk counted as a hit (refcounted; release with `unpin`). */
  readonly pin?: boolean;
  readonly signal?: AbortSignal;
}

export interface GetOptions {
  readonly signal?: AbortSignal;
}

export interface PutOptions {
  /** Pin the chunk once stored (or when it already existed). */
  readonly pin?: boolean;
  readonly signal?: AbortSignal;
}

/**
 * - `stored`: written; `exists`: already there (not rewritten);
 * - `dropped`: not stored for lack of room or a backend fault (counted, never waited on).
 */
export type PutOutcome = 'stored' | 'exists' | 'dropped';

export interface StorageBackend {
  /** Tier name from the config (unique per sidecar), used in metrics and results. */
  readonly name: string;
  /** Backend type, e.g. 'local-cpu'. */
  readonly kind: string;
  readonly capabilities: BackendCapabilities;

  /**
   * Counts contiguous hits from the first hash: returns k such that hashes[0..k) are all
   * present and hashes[k] is not (or k = hashes.length). With `pin`, exactly those k chunks
   * are pinned once each.
   */
  batchedContains(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts?: ContainsOptions,
  ): Promise<number>;

  /**
   * Fetches chunks without blocking the event loop. The result has one entry per requested
   * hash: the chunk, or `null` for an explicit miss. Never positional.
   */
  batchedGet(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts?: GetOptions,
  ): Promise<Map<ChunkHash, Chunk | null>>;

  /** Stores one chunk. Never waits for room: drops and counts instead. */
  put(ns: NamespaceId, hash: ChunkHash, chunk: Chunk, opts?: PutOptions): Promise<PutOutcome>;

  /** Removes chunks; a pinned chunk is removed from the index and freed on its last unpin. */
  remove(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number>;

  /** Pins present chunks (refcounted); returns how many of the hashes were pinned. */
  pin(ns: NamespaceId, hashes: readonly ChunkHash[]): number;

  /** Releases one pin on each hash; unknown or unpinned hashes are ignored. */
  unpin(ns: NamespaceId, hashes: readonly ChunkHash[]): void;

  /** Drops every chunk of `ns`, or of all namespaces when `ns` is omitted. */
  clear(ns?: NamespaceId): Promise<void>;

  stats(): BackendStats;

  health(): BackendHealth;

  /** Releases resources; idempotent (one stored promise). Calls after close reject with KVT_CLOSED. */
  close(): Promise<void>;
}

/** What a factory gets besides its own options. */
export interface BackendContext {
  /** Tier name from the config. */
  readonly name: string;
}

/** Builds (and starts) a backend from its options; throws KVT_CONFIG on bad options. */
export type BackendFactory = (
  options: Record<string, unknown>,
  ctx: BackendContext,
) => Promise<StorageBackend>;
