import { Cluster } from 'ioredis';
import { abortedError, closedError, KvtierError } from '../../errors.ts';
import { Deadline } from '../../util/deadline.ts';
import { createLogger, type Logger } from '../../util/log.ts';
import { BufferPool } from '../arena/buffer-pool.ts';
import { checkChunk } from '../core/chunk-check.ts';
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
import { decodeChunkObjectAsync } from '../format/chunk-format.ts';
import {
  type Client,
  clearNode,
  connect,
  countKeys,
  globEscape,
  type Removed,
  sizeSum,
  unlinkSized,
} from './redis-client.ts';
import { encodeFramedSet } from './redis-frame.ts';
import {
  type RedisBackendOptions,
  type ResolvedRedisBackendOptions,
  redisOptionsFromConfig,
  resolveRedisBackendOptions,
} from './redis-options.ts';

export {
  REDIS_BACKEND_DEFAULTS,
  type RedisBackendOptions,
  type RedisNodeAddress,
  type ResolvedRedisBackendOptions,
  redisOptionsFromConfig,
  resolveRedisBackendOptions,
} from './redis-options.ts';

/** Counters of {@link RedisBackend} (see `stats` for what `chunks`/`bytesUsed` mean). */
export interface RedisBackendStats extends BackendStats {
  /** Objects that failed to decode, were treated as misses and deleted. */
  readonly corruptObjects: number;
  /** Commands that failed or timed out (connection lost, server error). */
  readonly errors: number;
  /** Times `chunks` and `bytesUsed` were recounted from Redis (every (re)connection). */
  readonly recounts: number;
}

const LOST: readonly string[] = ['reconnecting', 'close', 'end'];

/**
 * Redis tier (ioredis): one key `<keyPrefix><ns>:<hash>` per chunk holding the whole chunk
 * object (header + payload), written by a single `SET … NX [PX ttl]`, so a write is atomic and
 * concurrent puts of one key leave one copy.
 *
 * Batching: every command is single-key and `enableAutoPipelining` is on, so the per-key
 * commands a batched call issues in one turn leave as one pipeline per node. That is the same
 * round trip as an explicit pipeline in standalone mode and, unlike one, also correct in cluster
 * mode where keys of one batch live on different nodes (multi-key commands would need hash tags,
 * which would put a whole namespace on one node).
 *
 * Outages: the offline queue is off and `maxRetriesPerRequest` is 0, so while Redis is
 * unreachable every call, puts included, fails at once (`KVT_BACKEND`) or within `timeoutMs`
 * (`KVT_TIMEOUT`), counted in `errors` (the tier's breaker answers them as misses and drops);
 * ioredis reconnects in the background with capped backoff, and the counts are taken again from
 * Redis once it is back.
 *
 * Redis evicts on its own (`maxmemory`) and cannot pin against it: `pin` pins nothing.
 */
export class RedisBackend implements StorageBackend {
  readonly name: string;
  readonly kind = 'redis';
  readonly capabilities: BackendCapabilities;
  /** The resolved options. */
  readonly options: ResolvedRedisBackendOptions;

  readonly #client: Client;
  readonly #pool = new BufferPool();
  readonly #onCorrupt: ((reason: string) => void) | undefined;
  readonly #log: Logger;
  #corruptObjects = 0;
  #errors = 0;
  #droppedPuts = 0;
  #chunks = 0;
  #bytes = 0;
  #recounts = 0;
  /** `start()` has counted what Redis holds; later connections recount in the background. */
  #started = false;
  /** While a recount runs: what this instance stored minus removed since it began. */
  #delta: { chunks: number; bytes: number } | null = null;
  #closing: Promise<void> | null = null;
  /** Last connection error, for the message of a failed `start()`. */
  #lastError: Error | null = null;

  /**
   * Connects in the background; `start()` waits for the first connection.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options.
   */
  constructor(options: RedisBackendOptions, ctx: BackendContext = { name: 'redis' }) {
    this.options = resolveRedisBackendOptions(options);
    this.name = ctx.name;
    this.#onCorrupt = options.onCorrupt;
    this.#log = options.log ?? ctx.log ?? createLogger('redis-backend');
    this.capabilities = Object.freeze({
      pinning: false,
      hostMemory: false,
      persistent: true,
      shared: true,
      evicts: true,
      maxChunkBytes: this.options.maxChunkBytes,
    });
    this.#client = connect(this.options);
    this.#client.on('error', (err: Error) => {
      this.#lastError = err;
      this.#log.debug('redis connection error', { tier: this.name, err });
    });
    // What this instance counted is only right until Redis restarts, evicts or is written by
    // another sidecar: recount on every (re)connection.
    this.#client.on('ready', () => {
      if (this.#started) void this.recount();
    });
  }

  /**
   * Sets `chunks` and `bytesUsed` to what Redis holds under this tier's key prefix now (SCAN and
   * STRLEN on every master): in `start()`, and in the background of every reconnection, where a
   * put that lands during the scan may be counted twice. Resolves once done; a failure leaves
   * the counts as they were.
   */
  async recount(): Promise<void> {
    if (this.#closing !== null || this.#client.status !== 'ready') return;
    const delta = { chunks: 0, bytes: 0 };
    this.#delta = delta;
    try {
      const n = await countKeys(this.#client, `${globEscape(this.options.keyPrefix)}*`);
      // Writes during the scan are added on top (a key the scan also saw counts twice).
      this.#chunks = Math.max(0, n.chunks + delta.chunks);
      this.#bytes = Math.max(0, n.bytes + delta.bytes);
      this.#recounts++;
    } catch (err) {
      this.#log.debug('redis recount failed', { tier: this.name, err });
    } finally {
      if (this.#delta === delta) this.#delta = null;
    }
  }

  /**
   * Waits until the connection is ready, then counts what Redis holds under the key prefix
   * (see {@link stats}).
   * @throws KvtierError `KVT_BACKEND` if it is not ready within `connectTimeoutMs`; `KVT_CLOSED`.
   */
  async start(): Promise<void> {
    await this.#connected();
    if (this.#started) return;
    await this.recount();
    this.#started = true;
  }

  async #connected(): Promise<void> {
    this.#open(undefined, 'start');
    if (this.#client.status === 'ready') return;
    const c = this.#client;
    const o = this.options;
    const d = new Deadline({ what: `${this.name} start`, timeoutMs: o.connectTimeoutMs });
    let onReady = (): void => {};
    let onEnd = (): void => {};
    const ready = new Promise<void>((resolve, reject) => {
      onReady = () => resolve();
      onEnd = () => reject(closedError(`backend ${this.name}`));
      c.on('ready', onReady);
      c.on('end', onEnd);
    });
    try {
      await d.race(ready);
    } catch (err) {
      if (!d.timedOut) throw err;
      // Never put the URL's credentials into a message.
      const where =
        o.cluster !== null
          ? `cluster ${o.cluster.map((n) => `${n.host}:${n.port}`).join(',')}`
          : o.url !== null
            ? o.url.replace(/\/\/[^@/]*@/, '//')
            : `${o.host}:${o.port}`;
      const last = this.#lastError === null ? '' : `; last error: ${this.#lastError.message}`;
      const msg = `${this.name}: redis at ${where} not ready within ${o.connectTimeoutMs} ms (connection ${c.status}${last})`;
      throw new KvtierError('KVT_BACKEND', msg);
    } finally {
      d.dispose();
      c.off('ready', onReady);
      c.off('end', onEnd);
    }
  }

  async batchedContains(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: ContainsOptions = {},
  ): Promise<number> {
    this.#ready(opts.signal, 'contains');
    if (hashes.length === 0) return 0;
    const c = this.#client;
    const results = await this.#bounded(
      'contains',
      opts.signal,
      Promise.allSettled(hashes.map((h) => c.exists(this.#key(ns, h)))),
    );
    let k = 0;
    for (const r of results) {
      if (r.status === 'rejected') {
        this.#errors++;
        if (k === 0) throw this.#failure('contains', r.reason);
        break;
      }
      if (r.value !== 1) break;
      k++;
    }
    return k;
  }

  async batchedGet(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: GetOptions = {},
  ): Promise<Map<ChunkHash, Chunk | null>> {
    this.#ready(opts.signal, 'get');
    const c = this.#client;
    const read = async (hash: ChunkHash): Promise<Chunk | null> => {
      const key = this.#key(ns, hash);
      const buf = await c.getBuffer(key);
      if (buf === null) return null;
      const decoded = await decodeChunkObjectAsync(ns, hash, buf);
      if (decoded.ok) return decoded.chunk;
      this.#corruptObjects++;
      this.#log.warn('corrupt redis object deleted', {
        tier: this.name,
        key,
        reason: decoded.reason,
      });
      await unlinkSized(c, key).then(
        (n) => this.#forget({ chunks: n > 0 ? 1 : 0, bytes: n }),
        () => this.#errors++,
      );
      this.#onCorrupt?.(decoded.reason);
      return null;
    };
    const unique = [...new Set(hashes)];
    const results = await this.#bounded('get', opts.signal, Promise.allSettled(unique.map(read)));
    const out = new Map<ChunkHash, Chunk | null>();
    let failed = 0;
    let firstError: unknown;
    results.forEach((r, i) => {
      if (r.status === 'fulfilled') {
        out.set(unique[i]!, r.value);
        return;
      }
      this.#errors++;
      if (failed++ === 0) firstError = r.reason;
      out.set(unique[i]!, null);
    });
    // Partial failures (one cluster node down) are misses; a total one is an outage.
    if (failed > 0 && failed === unique.length) throw this.#failure('get', firstError);
    return out;
  }

  /**
   * `SET … NX`. A chunk over `maxChunkBytes` is dropped (counted in `droppedPuts`); while Redis
   * is unreachable, or when the command fails or times out, the put rejects (`KVT_BACKEND`,
   * `KVT_TIMEOUT`; counted in `errors`) so that the tier's breaker and metrics see the fault.
   */
  async put(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    opts: PutOptions = {},
  ): Promise<PutOutcome> {
    this.#open(opts.signal, 'put');
    checkChunk(chunk);
    if (chunk.data.byteLength > this.options.maxChunkBytes) {
      this.#droppedPuts++;
      return 'dropped';
    }
    if (this.#client.status !== 'ready') {
      this.#errors++;
      this.#ready(opts.signal, 'put');
    }
    const key = this.#key(ns, hash);
    const c = this.#client;
    const set = await encodeFramedSet(this.#pool, key, ns, hash, chunk, this.options.ttlMs);
    c.sendCommand(set.command);
    const command = set.command.promise as Promise<string | null>;
    // The frame is reused only once Redis has replied (it has read every byte); after a failure
    // the socket may still be writing it, so it is left to the garbage collector.
    command.then(
      () => this.#pool.release(set.frame),
      () => {},
    );
    let reply: string | null;
    try {
      reply = await this.#bounded('put', opts.signal, command);
    } catch (err) {
      if (this.#closing !== null) throw closedError(`backend ${this.name}`);
      if (err instanceof KvtierError && (err.code === 'KVT_ABORTED' || err.code === 'KVT_TIMEOUT'))
        throw err;
      this.#errors++;
      throw this.#failure('put', err);
    }
    if (reply === null) return 'exists';
    this.#chunks++;
    this.#bytes += set.objectBytes;
    if (this.#delta !== null) {
      this.#delta.chunks++;
      this.#delta.bytes += set.objectBytes;
    }
    return 'stored';
  }

  /** Deletes each key with one single-key script (cluster-safe); returns how many existed. */
  async remove(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    this.#ready(undefined, 'remove');
    const c = this.#client;
    const unique = [...new Set(hashes)];
    try {
      const sizes = await this.#bounded(
        'remove',
        undefined,
        Promise.all(unique.map((h) => unlinkSized(c, this.#key(ns, h)))),
      );
      const removed = sizeSum(sizes);
      this.#forget(removed);
      return removed.chunks;
    } catch (err) {
      this.#errors++;
      throw this.#failure('remove', err);
    }
  }

  /** Redis cannot pin against its own eviction: pins nothing, returns 0. */
  pin(_ns: NamespaceId, _hashes: readonly ChunkHash[]): number {
    this.#open(undefined, 'pin');
    return 0;
  }

  /** No-op (nothing is ever pinned). */
  unpin(_ns: NamespaceId, _hashes: readonly ChunkHash[]): void {
    this.#open(undefined, 'unpin');
  }

  /**
   * SCAN + UNLINK of `<keyPrefix><ns>:*` (or `<keyPrefix>*`) on every master. Not bounded by
   * `timeoutMs` as a whole (each command is); keys written meanwhile may survive.
   * @throws KvtierError `KVT_BACKEND` when Redis fails; `KVT_CLOSED`.
   */
  async clear(ns?: NamespaceId): Promise<void> {
    this.#ready(undefined, 'clear');
    const pattern = `${globEscape(this.options.keyPrefix)}${ns === undefined ? '' : `${globEscape(ns)}:`}*`;
    const c = this.#client;
    const masters = c instanceof Cluster ? c.nodes('master') : [c];
    try {
      const removed = await Promise.all(masters.map((node) => clearNode(node, pattern)));
      if (ns === undefined) this.#forget({ chunks: this.#chunks, bytes: this.#bytes });
      else for (const r of removed) this.#forget(r);
    } catch (err) {
      this.#errors++;
      throw this.#failure('clear', err);
    }
  }

  /**
   * Counters. `chunks` and `bytesUsed` (object bytes, headers included) are what Redis held
   * under the key prefix when the connection was last (re)made ({@link recount}), plus what this
   * instance stored since, minus what it removed (remove, clear, corrupt objects), never below 0.
   * Between connections Redis expires, evicts and is written by other sidecars without telling
   * us. `capacityBytes` is null and `evictions` 0: eviction is Redis's own `maxmemory` policy.
   */
  stats(): RedisBackendStats {
    this.#open(undefined, 'stats');
    return {
      chunks: this.#chunks,
      bytesUsed: this.#bytes,
      capacityBytes: null,
      pinnedChunks: 0,
      evictions: 0,
      droppedPuts: this.#droppedPuts,
      corruptObjects: this.#corruptObjects,
      errors: this.#errors,
      recounts: this.#recounts,
    };
  }

  /**
   * 'up' while the ioredis connection is ready, 'down' otherwise (connecting, reconnecting).
   * In cluster mode, 'degraded' while the cluster is ready but a master connection is lost
   * (node connections open lazily, so one not yet opened is fine).
   */
  health(): BackendHealth {
    this.#open(undefined, 'health');
    const c = this.#client;
    if (c.status !== 'ready') return 'down';
    if (c instanceof Cluster && c.nodes('master').some((n) => LOST.includes(n.status)))
      return 'degraded';
    return 'up';
  }

  /** Disconnects (in-flight commands reject); idempotent. */
  close(): Promise<void> {
    this.#closing ??= Promise.resolve().then(() => {
      this.#client.disconnect();
    });
    return this.#closing;
  }

  /** The error a failed call rejects with: KVT_CLOSED once closing, else KVT_BACKEND. */
  #failure(op: string, cause: unknown): KvtierError {
    if (cause instanceof KvtierError) return cause;
    if (this.#closing !== null) return closedError(`backend ${this.name}`);
    const msg = cause instanceof Error ? cause.message : String(cause);
    // ioredis's own commandTimeout (the same timeoutMs) may fire before ours.
    const code = msg === 'Command timed out' ? 'KVT_TIMEOUT' : 'KVT_BACKEND';
    return new KvtierError(code, `${this.name} ${op}: redis failed: ${msg}`, { cause });
  }

  #forget(r: Removed): void {
    this.#chunks = Math.max(0, this.#chunks - r.chunks);
    this.#bytes = Math.max(0, this.#bytes - r.bytes);
    if (this.#delta !== null) {
      this.#delta.chunks -= r.chunks;
      this.#delta.bytes -= r.bytes;
    }
  }

  #key(ns: NamespaceId, hash: ChunkHash): string {
    return `${this.options.keyPrefix}${ns}:${hash}`;
  }

  #open(signal: AbortSignal | undefined, op: string): void {
    if (this.#closing !== null) throw closedError(`backend ${this.name}`);
    if (signal?.aborted === true) throw abortedError(signal, `${this.name} ${op}`);
  }

  /** Like #open, and fails fast while the connection is not ready. */
  #ready(signal: AbortSignal | undefined, op: string): void {
    this.#open(signal, op);
    if (this.#client.status !== 'ready') {
      throw new KvtierError(
        'KVT_BACKEND',
        `${this.name} ${op}: redis is unreachable (connection ${this.#client.status})`,
      );
    }
  }

  /**
   * Settles with `work`, or rejects at `timeoutMs` (KVT_TIMEOUT, counted in `errors`) or on the
   * caller's abort, whichever is first. ioredis commands cannot be cancelled: `work` runs on.
   */
  async #bounded<T>(op: string, signal: AbortSignal | undefined, work: Promise<T>): Promise<T> {
    const d = new Deadline({
      what: `${this.name} ${op}`,
      timeoutMs: this.options.timeoutMs,
      signal,
    });
    try {
      return await d.race(work);
    } catch (err) {
      if (d.timedOut) this.#errors++;
      throw err;
    } finally {
      d.dispose();
    }
  }
}

/**
 * Builds a {@link RedisBackend} from config options and waits for its connection.
 * @throws KvtierError `KVT_CONFIG` on bad options; `KVT_BACKEND` if Redis is not reachable
 *   within `connectTimeoutMs` (startup fails loudly rather than running without the tier).
 */
export const createRedisBackend: BackendFactory = async (options, ctx) => {
  const backend = new RedisBackend(redisOptionsFromConfig(options, ctx.name), ctx);
  try {
    await backend.start();
  } catch (err) {
    await backend.close();
    throw err;
  }
  return backend;
};
