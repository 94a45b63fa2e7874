/**
 * The one interface every storage tier implements. The storage manager talks to tiers only
 * through it, in the order the config lists them; nothing branches on a backend's class.
 */
import type { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { KvtierError } from '../../errors.ts';
import type { ChunkHash } from '../../hashing/chunk-hash.ts';
import type { Logger } from '../../util/log.ts';

export type { ChunkHash } from '../../hashing/chunk-hash.ts';

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
  /**
   * Present on a chunk a get returned in a buffer its backend reuses (the local-disk and fs tiers
   * read into pooled buffers): call it once done with `data`, which may then be overwritten by a
   * later get at any time. Optional to call (a chunk never released is garbage-collected, its
   * buffer is not reused); further calls do nothing. A caller that passes the chunk on must either
   * leave releasing to the receiver or not release it at all.
   */
  readonly release?: () => void;
}

/** Releases every chunk of a `batchedGet` result that has a {@link Chunk.release} hook. */
export function releaseChunks(chunks: Iterable<Chunk | null>): void {
  for (const c of chunks) c?.release?.();
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
  /**
   * Chunks live in other sidecars' tiers, reached over the network (the peer tier). A chunk that
   * came from another sidecar is never written to such a tier, and a request from another
   * sidecar never reads it, so that no chunk travels in a loop. Optional; absent means false.
   */
  readonly peers?: boolean;
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
  /** Host memory committed ahead of need so far (a host-memory tier with `prefault` on). */
  readonly prefaultedBytes?: number;
  /**
   * Usage per namespace id (tiers that index their chunks: host memory, local disk): the
   * {@link NAMESPACE_USAGE_LIMIT} namespaces holding the most bytes, the rest summed in
   * `namespacesOmitted`.
   */
  readonly namespaces?: Readonly<Record<NamespaceId, NamespaceUsage>>;
  /** What `namespaces` leaves out: how many namespaces, and their chunks and bytes together. */
  readonly namespacesOmitted?: NamespaceUsage & { readonly namespaces: number };
}

/** Chunks and bytes one namespace holds in one tier. */
export interface NamespaceUsage {
  readonly chunks: number;
  readonly bytes: number;
}

/** Namespaces a tier's stats name one by one (the rest are summed): bounds STATS and metrics. */
export const NAMESPACE_USAGE_LIMIT = 16;

/**
 * `usage` as {@link BackendStats}' `namespaces` and `namespacesOmitted`: the `limit` namespaces
 * with the most bytes (ties: by id), the others summed.
 */
export function boundedNamespaceUsage(
  usage: ReadonlyMap<NamespaceId, NamespaceUsage>,
  limit: number = NAMESPACE_USAGE_LIMIT,
): Pick<BackendStats, 'namespaces' | 'namespacesOmitted'> {
  const sorted = [...usage.entries()].sort(
    (a, b) => b[1].bytes - a[1].bytes || (a[0] < b[0] ? -1 : 1),
  );
  const namespaces: Record<NamespaceId, NamespaceUsage> = {};
  for (const [ns, u] of sorted.slice(0, limit)) namespaces[ns] = u;
  const rest = sorted.slice(limit);
  if (rest.length === 0) return { namespaces };
  let chunks = 0;
  let bytes = 0;
  for (const [, u] of rest) {
    chunks += u.chunks;
    bytes += u.bytes;
  }
  return { namespaces, namespacesOmitted: { namespaces: rest.length, chunks, bytes } };
}

/**
 * Why a tier dropped a chunk by itself: its capacity bound (`evicted`), a stored object found
 * corrupt or gone when read or by a start-up scan (`corrupt`), or its age (`expired`).
 */
export type SelfRemovalReason = 'evicted' | 'corrupt' | 'expired';

/**
 * Hears of each chunk a tier dropped by itself, not through `remove` or `clear` (the event
 * stream, docs/events.md). Called synchronously; must not throw or wait.
 */
export type RemovalListener = (ns: NamespaceId, hash: ChunkHash, reason: SelfRemovalReason) => void;

/**
 * Hears of each chunk a tier found it holds without a put (a start-up scan indexing a file the
 * tier's journal did not name). Called synchronously; must not throw or wait.
 */
export type FoundListener = (ns: NamespaceId, hash: ChunkHash) => void;

/** Chunks of one namespace, as a scan of a store yields them. */
export interface ChunkPage {
  readonly ns: NamespaceId;
  readonly hashes: readonly ChunkHash[];
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

  /**
   * Optional: sets the one {@link RemovalListener} (undefined removes it). A tier that evicts or
   * drops corrupt objects on its own implements it; one that never drops chunks by itself, or
   * cannot tell which (a remote store's own expiry), need not.
   */
  setRemovalListener?(listener: RemovalListener | undefined): void;

  /**
   * Optional: sets the one {@link FoundListener} (undefined removes it). A tier that indexes
   * chunks it finds in its store while it serves implements it.
   */
  setFoundListener?(listener: FoundListener | undefined): void;

  /**
   * Optional: the chunks the tier holds now, of `ns` or of every namespace, from an index in
   * memory (never a scan of a remote store): snapshots of the event stream. Synchronous.
   */
  listChunks?(ns?: NamespaceId): Iterable<readonly [NamespaceId, ChunkHash]>;

  /**
   * Optional: what the tier's store holds now, of `ns` or of every namespace, read from the store
   * itself (a shared store: what other sidecars wrote too), a page at a time; null when the store
   * cannot be listed (or the tier is bypassed). Snapshots of the event stream list shared tiers
   * with it. Costs store calls in proportion to what is stored: stop iterating, or abort, to stop
   * them. Chunks written or removed meanwhile may or may not be in it.
   */
  scanChunks?(
    ns: NamespaceId | undefined,
    opts: { readonly signal?: AbortSignal },
  ): AsyncIterable<ChunkPage> | null;

  stats(): BackendStats;

  health(): BackendHealth;

  /** Releases resources; idempotent (one stored promise). Calls after close reject with KVT_CLOSED. */
  close(): Promise<void>;
}

/**
 * A writable block of host memory for one chunk, not yet visible to readers (the in-place save
 * path: the copy engine gathers the engine's KV blocks straight into `view`). Settle it exactly
 * once, with `commit` or `abort`.
 */
export interface ChunkReservation {
  /** Exactly the reserved length; fill it before `commit`. Owned by the reservation until settled. */
  readonly view: Uint8Array;
  /**
   * Indexes the chunk. Returns `'exists'` (and frees the block) if the key was stored
   * meanwhile. With `pin`, the stored or existing chunk is pinned once.
   * @throws KvtierError `KVT_INTERNAL` if already settled; `KVT_CLOSED` after close.
   */
  commit(opts?: { pin?: boolean }): 'stored' | 'exists';
  /** Frees the block; a no-op once the tier is closed. @throws `KVT_INTERNAL` if already settled. */
  abort(): void;
}

/**
 * What {@link HostMemoryTier.reserve} returns: a reservation; `'exists'` when the key is already
 * stored (nothing reserved, the chunk is touched); `'dropped'` (counted) when there is no room.
 */
export type ReserveOutcome = ChunkReservation | 'exists' | 'dropped';

/**
 * The host-memory tier's port: a backend whose chunks live in host memory
 * (`capabilities.hostMemory`) and that can hand out arena room to be written in place. The
 * storage manager owns it as its first tier; only the manager calls `reserve` (through
 * `StorageManager.reserve`, which adds indexing, pinning and the write-through on commit).
 * Decorators forward it by deriving from `ForwardingBackend` and declaring this interface.
 */
export interface HostMemoryTier extends StorageBackend {
  /**
   * Reserves room for a chunk of `bytes` payload covering `tokens` tokens, evicting like `put`.
   * Never waits.
   * @throws KvtierError `KVT_CLOSED` after close; `KVT_INVALID_ARGUMENT` on bad sizes.
   */
  reserve(ns: NamespaceId, hash: ChunkHash, bytes: number, tokens: number): ReserveOutcome;
  /**
   * Optional lookup fast path keyed by packed hashes (32 bytes each, as on the wire), so that no
   * hex string is made per chunk. When absent the storage manager uses `batchedContains` and
   * `unpin`. A decorator offers it only when it observes it as it observes those two.
   */
  readonly packedIndex?: PackedHostIndex | undefined;
}

/**
 * {@link HostMemoryTier.packedIndex}: `batchedContains` with `pin` and `unpin` over hashes given
 * as packed bytes; `packed[from * 32, (from + count) * 32)` are the hashes. Same semantics as
 * the string forms; synchronous (host memory answers at once). The bytes are only read during
 * the call.
 */
export interface PackedHostIndex {
  /**
   * Counts hits from the first hash until the first miss; with `pin`, pins exactly those.
   * @throws KvtierError `KVT_CLOSED` after close.
   */
  contains(ns: NamespaceId, packed: Uint8Array, from: number, count: number, pin: boolean): number;
  /** Releases one pin on each hash, as `unpin`. @throws KvtierError `KVT_CLOSED` after close. */
  unpin(ns: NamespaceId, packed: Uint8Array, from: number, count: number): void;
  /**
   * Optional: `contains` with `pin` that also appends a handle of each chunk it pins to
   * `handles`, in order, so that the pins can be released by handle (`unpinHandles`) instead
   * of finding every hash again. Handles are opaque and only valid for `unpinHandles` of the
   * same index while their pins are held.
   * @throws KvtierError `KVT_CLOSED` after close.
   */
  containsPinned?(
    ns: NamespaceId,
    packed: Uint8Array,
    from: number,
    count: number,
    handles: unknown[],
  ): number;
  /**
   * Releases one pin on each of `handles[from, from + count)` (from `containsPinned`), as
   * `unpin` would for their hashes; returns false, releasing nothing, when it cannot (the caller
   * then releases them by hash).
   * @throws KvtierError `KVT_CLOSED` after close.
   */
  unpinHandles?(handles: readonly unknown[], from: number, count: number): boolean;
}

/** What a factory gets besides its own options (the part every backend constructor needs). */
export interface BackendContext {
  /** Tier name from the config. */
  readonly name: string;
  /** The tier's logger (see {@link PluginContext.log}); a built-in backend logs nothing without it. */
  readonly log?: Logger;
}

/**
 * Builds (and starts) a backend from its options; throws KVT_CONFIG on bad options. The registry
 * calls it with a full {@link PluginContext}; a factory that needs only the tier name takes this
 * narrower type.
 */
export type BackendFactory = (
  options: Record<string, unknown>,
  ctx: BackendContext,
) => Promise<StorageBackend>;

/**
 * The abort helpers of a {@link PluginContext}: the documented way for a backend to honour the
 * `signal` of `batchedContains`, `batchedGet` and `put` (docs/backends.md, "Signals").
 */
export interface AbortHelpers {
  /**
   * The error an aborted call rejects with: the signal's reason when it is a `KvtierError` (the
   * circuit breaker aborts with `KVT_TIMEOUT`), `KVT_TIMEOUT` for a `TimeoutError` reason
   * (`AbortSignal.timeout`), `KVT_ABORTED` otherwise. `what` names the operation in the message.
   */
  error(signal: AbortSignal | undefined, what: string): KvtierError;
  /** Throws {@link AbortHelpers.error} when `signal` has already fired; else returns. */
  throwIfAborted(signal: AbortSignal | undefined, what: string): void;
  /**
   * Settles like `work`, or rejects with {@link AbortHelpers.error} as soon as `signal` fires,
   * whichever comes first; the listener is removed either way. `work` keeps running in the
   * background when the signal wins: leave the store consistent when it lands.
   */
  race<T>(work: Promise<T>, signal: AbortSignal | undefined, what: string): Promise<T>;
}

/**
 * Everything a plug-in factory gets besides its options. Built by the registry per tier (also for
 * the built-in types, which read only `name`).
 */
export interface PluginContext extends BackendContext {
  /**
   * A child logger for this tier (component `<parent>.tier.<name>`, `kvtier.tier.<name>` under the sidecar); it follows the config's `logLevel`,
   * so use it instead of a logger of your own.
   */
  readonly log: Logger;
  /**
   * Absolute directory of the config file (`KVTIER_CONFIG` or `--config`), or the working
   * directory without one. Relative paths in your options resolve against it (`resolvePath`).
   */
  readonly configDir: string;
  /** `path` resolved against `configDir` (an absolute path is returned as is). */
  resolvePath(path: string): string;
  /** Abort helpers: the documented error for an aborted signal, and a race against it. */
  readonly abort: AbortHelpers;
  /**
   * The sidecar's metrics registry, for extra series of your own (the host already exports
   * every stat, latency and error per tier: add only what those do not say).
   */
  readonly metrics: PluginMetrics;
}

/** Labels and help of one extra series; see {@link PluginMetrics}. */
export interface PluginMetricConfig<L extends string> {
  /** Prometheus name; use `kvtier_<your kind>_<what>` with a unit suffix (`_bytes`, `_total`). */
  readonly name: string;
  readonly help: string;
  /** Label names; include `tier` and set it to `ctx.name` so that two tiers stay apart. */
  readonly labelNames?: readonly L[];
}

/**
 * Extra Prometheus series registered in the sidecar's own registry (scraped at `/metrics`).
 * Each method returns the metric already registered under that name when there is one (two tiers
 * of one plug-in share it), so calling it in every factory run is safe.
 * @throws KvtierError `KVT_CONFIG` when the name is taken by a metric of another type.
 */
export interface PluginMetrics {
  /** The prom-client registry itself (for anything the helpers do not cover). */
  readonly registry: Registry;
  counter<L extends string = never>(config: PluginMetricConfig<L>): Counter<L>;
  gauge<L extends string = never>(config: PluginMetricConfig<L>): Gauge<L>;
  /** `buckets` in the metric's unit (seconds for durations); default prom-client's. */
  histogram<L extends string = never>(
    config: PluginMetricConfig<L> & { readonly buckets?: readonly number[] },
  ): Histogram<L>;
}

/**
 * What a plug-in module exports as `createBackend` (or as its default export): builds and starts
 * the backend from the tier's `options` (as written in the config) and the {@link PluginContext}.
 * @throws KvtierError `KVT_CONFIG` on bad options, naming the option and what is allowed.
 */
export type PluginFactory = (
  options: Record<string, unknown>,
  ctx: PluginContext,
) => Promise<StorageBackend>;
