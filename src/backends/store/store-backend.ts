/**
 * {@link StoreBackend}: a full `StorageBackend` over a four-method {@link KvStore}: the stored
 * format and its checksum, verification on every read (a corrupt object is a miss, deleted and
 * counted), stats, batched calls under a concurrency bound, deadlines, serialized puts per key.
 */
import { abortedError, closedError, KvtierError } from '../../errors.ts';
import { Deadline } from '../../util/deadline.ts';
import { type Logger, silentLogger } from '../../util/log.ts';
import { requireInt } from '../../util/validate.ts';
import { checkChunk } from '../core/chunk-check.ts';
import { chunkPages } from '../core/chunk-pages.ts';
import type {
  BackendCapabilities,
  BackendContext,
  BackendHealth,
  Chunk,
  ChunkHash,
  ChunkPage,
  ContainsOptions,
  GetOptions,
  NamespaceId,
  PutOptions,
  PutOutcome,
  RemovalListener,
  StorageBackend,
} from '../core/types.ts';
import {
  CHUNK_HEADER_BYTES,
  CHUNK_MAX_PAYLOAD_BYTES,
  decodeChunkObjectAsync,
} from '../format/chunk-format.ts';
import { clearPrefix, settleBounded } from './bounded.ts';
import { ChunkTally } from './chunk-tally.ts';
import { ChunkWriter } from './chunk-writer.ts';
import {
  checkNamespace,
  type KvStore,
  kvStoreProblems,
  type StoreKey,
  storeKey,
  storeKeyParts,
  storeKeyPrefix,
} from './kv-store.ts';
import {
  DEFAULT_CONCURRENCY,
  type StoreBackendOptions,
  type StoreBackendStats,
  storeFailure,
} from './store-options.ts';

/** Listed keys as the chunks they name (null for a key that is not a chunk key). */
async function* chunksOf(keys: AsyncIterable<{ readonly key: string }>) {
  for await (const { key } of keys) yield storeKeyParts(key);
}

/**
 * A `StorageBackend` over a {@link KvStore} (see the file's comment). Capabilities: no pins (the
 * store is not asked to hold anything: `pin` pins nothing and returns 0), no host memory;
 * persistent, shared and evicts as the store's `info` says. `stats().chunks` and `bytesUsed`
 * count object bytes (headers included) that this instance stored minus what it removed, never
 * below 0, reset by {@link recount} when the store can `count`: a shared store is written by
 * other sidecars without telling us. `capacityBytes` is null and `evictions` 0.
 */
export class StoreBackend implements StorageBackend {
  readonly name: string;
  readonly kind: string;
  readonly capabilities: BackendCapabilities;
  /** The store this tier is built on; owned (closed by `close`). */
  readonly store: KvStore;

  readonly #timeoutMs: number | undefined;
  readonly #concurrency: number;
  readonly #ttlMs: number | undefined;
  readonly #onCorrupt: ((reason: string) => void) | undefined;
  readonly #log: Logger;
  readonly #tally = new ChunkTally();
  readonly #writer: ChunkWriter;
  #removalListener: RemovalListener | undefined;
  #corruptObjects = 0;
  #errors = 0;
  #droppedPuts = 0;
  #started = false;
  #closing: Promise<void> | null = null;

  /** @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options. Call {@link start} before use. */
  constructor(store: KvStore, options: StoreBackendOptions, ctx: BackendContext) {
    const problems = kvStoreProblems(store);
    if (problems.length > 0)
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `the ${options.kind} store is not a KvStore (docs/backends.md, the four-method store): ${problems.join('; ')}`,
      );
    this.store = store;
    this.name = ctx.name;
    this.kind = options.kind;
    const max = options.maxChunkBytes ?? CHUNK_MAX_PAYLOAD_BYTES;
    requireInt('maxChunkBytes', max, 0, CHUNK_MAX_PAYLOAD_BYTES);
    this.#concurrency = requireInt(
      'concurrency',
      options.concurrency ?? DEFAULT_CONCURRENCY,
      1,
      1 << 20,
    );
    if (options.timeoutMs !== undefined) requireInt('timeoutMs', options.timeoutMs, 1, 600_000);
    this.#timeoutMs = options.timeoutMs;
    const ttl = options.ttlMs ?? undefined;
    if (ttl !== undefined) {
      requireInt('ttlMs', ttl, 1);
      if (!store.info.ttl)
        throw new KvtierError('KVT_INVALID_ARGUMENT', `ttlMs: the ${this.kind} store has no TTLs`);
    }
    this.#ttlMs = ttl;
    this.#onCorrupt = options.onCorrupt;
    this.#log = options.log ?? ctx.log ?? silentLogger;
    this.capabilities = Object.freeze({
      pinning: false,
      hostMemory: false,
      persistent: store.info.persistent,
      shared: store.info.shared,
      evicts: store.info.evicts,
      maxChunkBytes: max,
    });
    this.#writer = new ChunkWriter({
      store,
      ttlMs: ttl,
      tally: this.#tally,
      open: (signal) => this.#open(signal, 'put'),
      bounded: (signal, work) => this.#bounded('put', signal, work),
      failure: (cause) => {
        this.#errors++;
        return this.#failure('put', cause);
      },
    });
  }

  /**
   * Starts `backend` ({@link start}) and returns it, closing it when the start fails: what a tier
   * factory returns.
   * @throws what {@link start} throws.
   */
  static async started<B extends StoreBackend>(backend: B): Promise<B> {
    try {
      await backend.start();
    } catch (err) {
      await backend.close();
      throw err;
    }
    return backend;
  }

  /** Whether {@link start} has finished. */
  get started(): boolean {
    return this.#started;
  }

  /** Times `chunks` and `bytesUsed` were taken from the store ({@link recount}). */
  get recounts(): number {
    return this.#tally.recounts;
  }

  /**
   * Starts the store, then counts what it holds ({@link recount}).
   * @throws what the store's `start` throws; `KVT_CLOSED`.
   */
  async start(): Promise<void> {
    this.#open(undefined, 'start');
    await this.store.start?.();
    if (this.#started) return;
    await this.recount();
    this.#started = true;
  }

  /**
   * Sets `chunks` and `bytesUsed` to what the store holds now (its `count`; nothing without one).
   * Puts that land during the count may be counted twice. A failure leaves the counts as they
   * were (logged at debug).
   */
  async recount(): Promise<void> {
    const count = this.store.count;
    if (this.#closing !== null || count === undefined) return;
    try {
      await this.#tally.recount(() => count.call(this.store, '', {}));
    } catch (err) {
      this.#log.debug(`${this.kind} recount failed`, { tier: this.name, err });
    }
  }

  async batchedContains(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: ContainsOptions = {},
  ): Promise<number> {
    this.#open(opts.signal, 'contains');
    checkNamespace(ns);
    if (hashes.length === 0) return 0;
    return this.#bounded('contains', opts.signal, async (signal) => {
      let firstMiss = hashes.length;
      // Calls behind a known miss are skipped when their turn comes, not sent.
      const results = await settleBounded(
        hashes,
        this.#concurrency,
        async (h, i) => {
          const present = await this.store.has(storeKey(ns, h), { signal });
          if (!present) firstMiss = Math.min(firstMiss, i);
          return present;
        },
        (i) => i > firstMiss,
      );
      let k = 0;
      for (const r of results) {
        if (!r.ok) {
          if ('skipped' in r) break;
          this.#errors++;
          if (k === 0) throw this.#failure('contains', r.error);
          break;
        }
        if (!r.value) break;
        k++;
      }
      return k;
    });
  }

  /**
   * Gets and verifies whole objects. A key whose store call fails is a miss as long as another
   * key's call succeeded; when every one failed the call rejects, so that an outage is not
   * mistaken for misses.
   */
  async batchedGet(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: GetOptions = {},
  ): Promise<Map<ChunkHash, Chunk | null>> {
    this.#open(opts.signal, 'get');
    checkNamespace(ns);
    const unique = [...new Set(hashes)];
    const out = new Map<ChunkHash, Chunk | null>();
    if (unique.length === 0) return out;
    const maxBytes = CHUNK_HEADER_BYTES + this.capabilities.maxChunkBytes;
    return this.#bounded('get', opts.signal, async (signal) => {
      const read = async (hash: ChunkHash): Promise<Chunk | null> => {
        const key = storeKey(ns, hash);
        const v = await this.store.get(key, { signal, maxBytes, crc32cFrom: CHUNK_HEADER_BYTES });
        if (v === null) return null;
        const bytes = v instanceof Uint8Array ? v : v.bytes;
        const crc = v instanceof Uint8Array ? undefined : v.crc32c;
        const release = v instanceof Uint8Array ? undefined : v.release;
        const decoded = await decodeChunkObjectAsync(ns, hash, bytes, crc);
        if (decoded.ok)
          return release === undefined ? decoded.chunk : { ...decoded.chunk, release };
        release?.();
        await this.#corrupt(ns, hash, key, decoded.reason, bytes.byteLength);
        return null;
      };
      const results = await settleBounded(unique, this.#concurrency, read);
      let failed = 0;
      let firstError: unknown;
      for (const [i, r] of results.entries()) {
        if (r.ok) {
          out.set(unique[i]!, r.value);
          continue;
        }
        this.#errors++;
        if (failed++ === 0) firstError = r.error;
        out.set(unique[i]!, null);
      }
      if (failed === unique.length) throw this.#failure('get', firstError);
      return out;
    });
  }

  /**
   * Encodes the chunk object and writes it with the store's put-if-absent. Puts of one key through
   * this instance run one after another. A payload over `maxChunkBytes` is dropped and counted.
   * @throws KvtierError `KVT_BACKEND`/`KVT_TIMEOUT` when the store fails (counted in `errors`);
   *   `KVT_INVALID_ARGUMENT` for a malformed chunk or namespace; `KVT_CLOSED`; the abort error.
   */
  async put(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    opts: PutOptions = {},
  ): Promise<PutOutcome> {
    this.#open(opts.signal, 'put');
    checkNamespace(ns);
    checkChunk(chunk);
    if (chunk.data.byteLength > this.capabilities.maxChunkBytes) {
      this.#droppedPuts++;
      return 'dropped';
    }
    return this.#writer.put(storeKey(ns, hash), ns, hash, chunk, opts.signal);
  }

  /** Deletes each key (bounded); returns how many existed. */
  async remove(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    this.#open(undefined, 'remove');
    checkNamespace(ns);
    const unique = [...new Set(hashes)];
    return this.#bounded('remove', undefined, async (signal) => {
      const results = await settleBounded(unique, this.#concurrency, (h) =>
        this.store.delete(storeKey(ns, h), { signal }),
      );
      let removed = 0;
      let bytes = 0;
      for (const r of results) {
        if (!r.ok) {
          this.#errors++;
          throw this.#failure('remove', r.error);
        }
        if (r.value === false) continue;
        removed++;
        if (typeof r.value === 'number') bytes += r.value;
      }
      this.#tally.add(-removed, -bytes);
      return removed;
    });
  }

  /** The store cannot hold chunks for a caller: pins nothing, returns 0. */
  pin(_ns: NamespaceId, _hashes: readonly ChunkHash[]): number {
    this.#open(undefined, 'pin');
    return 0;
  }

  /** No-op (nothing is ever pinned). */
  unpin(_ns: NamespaceId, _hashes: readonly ChunkHash[]): void {
    this.#open(undefined, 'unpin');
  }

  /**
   * Deletes every chunk of `ns`, or all, with the store's `clear`, else by `list` and `delete`.
   * Not bounded by `timeoutMs` as a whole; keys written meanwhile may survive.
   * @throws KvtierError `KVT_BACKEND` when the store fails or can neither clear nor list.
   */
  async clear(ns?: NamespaceId): Promise<void> {
    this.#open(undefined, 'clear');
    if (ns !== undefined) checkNamespace(ns);
    const prefix = storeKeyPrefix(ns);
    try {
      const removed = await clearPrefix(this.store, prefix, this.#concurrency, this.kind);
      if (ns === undefined) this.#tally.removeAll();
      else this.#tally.add(-removed.keys, -removed.bytes);
    } catch (err) {
      this.#errors++;
      throw this.#failure('clear', err);
    }
  }

  /**
   * What the store holds (its `list`, keys of `<ns>/` or all) as pages of one namespace's chunks;
   * null when the store has no `list`. Keys that are not chunk keys are skipped.
   */
  scanChunks(
    ns: NamespaceId | undefined,
    opts: { readonly signal?: AbortSignal } = {},
  ): AsyncIterable<ChunkPage> | null {
    this.#open(opts.signal, 'scan');
    if (ns !== undefined) checkNamespace(ns);
    const list = this.store.list;
    if (list === undefined) return null;
    return chunkPages(chunksOf(list.call(this.store, storeKeyPrefix(ns), { signal: opts.signal })));
  }

  /** Sets the one listener told of each corrupt object this tier deletes (reason `corrupt`). */
  setRemovalListener(listener: RemovalListener | undefined): void {
    this.#removalListener = listener;
  }

  /** Counters (see the class comment), then the store's own. */
  stats(): StoreBackendStats {
    this.#open(undefined, 'stats');
    return {
      chunks: this.#tally.chunks,
      bytesUsed: this.#tally.bytes,
      capacityBytes: null,
      pinnedChunks: 0,
      evictions: 0,
      droppedPuts: this.#droppedPuts,
      corruptObjects: this.#corruptObjects,
      errors: this.#errors,
      latePuts: this.#writer.latePuts,
      ...this.store.stats?.(),
    };
  }

  /** The store's own view; 'up' when it has none. */
  health(): BackendHealth {
    this.#open(undefined, 'health');
    return this.store.health?.() ?? 'up';
  }

  /** Closes the store (calls in flight reject with `KVT_CLOSED`); idempotent, one promise. */
  close(): Promise<void> {
    this.#closing ??= Promise.resolve().then(() => this.store.close());
    return this.#closing;
  }

  async #corrupt(
    ns: NamespaceId,
    hash: ChunkHash,
    key: StoreKey,
    reason: string,
    bytes: number,
  ): Promise<void> {
    this.#corruptObjects++;
    this.#log.warn(`corrupt ${this.kind} object: a miss, deleted`, {
      tier: this.name,
      ns,
      hash,
      reason,
    });
    try {
      const gone = await this.store.delete(key, {});
      if (gone !== false) this.#tally.add(-1, -(typeof gone === 'number' ? gone : bytes));
    } catch (err) {
      this.#errors++;
      this.#log.debug(`${this.kind} delete of a corrupt object failed`, { tier: this.name, err });
    }
    try {
      this.#onCorrupt?.(reason);
      this.#removalListener?.(ns, hash, 'corrupt');
    } catch (err) {
      this.#log.warn('corrupt-object callback threw', { tier: this.name, err });
    }
  }

  /** The error a failed call rejects with: KVT_CLOSED once closing, a KvtierError as is, else KVT_BACKEND. */
  #failure(op: string, cause: unknown): KvtierError {
    if (this.#closing !== null) return closedError(`backend ${this.name}`);
    return storeFailure(`${this.name} ${op}`, this.kind, cause);
  }

  #open(signal: AbortSignal | undefined, op: string): void {
    if (this.#closing !== null) throw closedError(`backend ${this.name}`);
    if (signal?.aborted === true) throw abortedError(signal, `${this.name} ${op}`);
  }

  /**
   * Runs `work` under one deadline (`timeoutMs` and the caller's signal): settles with it, or
   * rejects when the deadline ends first (a timeout is counted in `errors`). `work` gets the
   * deadline's signal for its store calls, which are not waited for.
   */
  async #bounded<T>(
    op: string,
    signal: AbortSignal | undefined,
    work: (signal: AbortSignal | undefined) => Promise<T>,
  ): Promise<T> {
    if (this.#timeoutMs === undefined && signal === undefined) return work(undefined);
    const d = new Deadline({ what: `${this.name} ${op}`, timeoutMs: this.#timeoutMs, signal });
    try {
      return await d.race(work(d.signal));
    } catch (err) {
      if (d.timedOut) this.#errors++;
      throw err;
    } finally {
      d.dispose();
    }
  }
}
