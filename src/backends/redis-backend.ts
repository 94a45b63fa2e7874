import type { ConnectionOptions as TlsOptions } from 'node:tls';
import { Cluster, Redis, type RedisOptions } from 'ioredis';
import { abortedError, closedError, KvtierError } from '../errors.ts';
import { createLogger, type Logger } from '../util/log.ts';
import { describe, requireInt, requireString } from '../util/validate.ts';
import { BufferPool } from './buffer-pool.ts';
import { chunkObjectBytes, decodeChunkObject, encodeChunkObjectInto } from './chunk-format.ts';
import { optionsFromConfig } from './config-options.ts';
import { checkChunk } from './local-cpu.ts';
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
} from './types.ts';

/** One Redis node address. */
/**
 * Commands that skip auto-pipelining: an auto-pipeline is sent as one concatenated buffer, which
 * copies every multi-MiB SET value once more; a SET alone is written straight to the socket.
 */
const UNPIPELINED = ['set'];

export interface RedisNodeAddress {
  host: string;
  port: number;
}

/** Options of {@link RedisBackend}. Give `url`, or `host`/`port`, or `cluster`. */
export interface RedisBackendOptions {
  /** `redis://[user:pass@]host:port[/db]` or `rediss://…` (TLS). Not with `cluster`. */
  url?: string;
  /** Standalone server host; default '127.0.0.1'. */
  host?: string;
  /** Standalone server port; default 6379. */
  port?: number;
  /** Redis Cluster: seed nodes (the rest are discovered). */
  cluster?: { nodes: RedisNodeAddress[] };
  /** ACL user (Redis 6+), passed through to ioredis. */
  username?: string;
  /** AUTH password, passed through to ioredis. */
  password?: string;
  /** Database index; default 0. Cluster mode only has database 0. */
  db?: number;
  /** TLS: `true` for defaults, or node `tls.connect` options, passed through to ioredis. */
  tls?: boolean | TlsOptions;
  /** Prefix of every key this backend writes; default 'kvtier:'. */
  keyPrefix?: string;
  /** Expire chunks this long after they are written (ms); default none. */
  ttlMs?: number;
  /** Deadline of every call (ms), also ioredis's command timeout; default 1000. */
  timeoutMs?: number;
  /** How long `start()` waits for the first connection (ms); default 5000. */
  connectTimeoutMs?: number;
  /** Cap of the exponential reconnect backoff (ms); default 2000. */
  reconnectMaxDelayMs?: number;
  /** Largest chunk payload in bytes; default 256 MiB (Redis caps a value at 512 MB). */
  maxChunkBytes?: number;
  /** Called with the reason whenever a stored object fails to decode (and is deleted). */
  onCorrupt?: (reason: string) => void;
  /** Logger; default a JSON logger for component 'redis-backend'. */
  log?: Logger;
}

/** Redis options after defaults and validation. */
export interface ResolvedRedisBackendOptions {
  readonly url: string | null;
  readonly host: string;
  readonly port: number;
  readonly cluster: readonly RedisNodeAddress[] | null;
  readonly username: string | undefined;
  readonly password: string | undefined;
  readonly db: number;
  readonly tls: TlsOptions | undefined;
  readonly keyPrefix: string;
  readonly ttlMs: number | null;
  readonly timeoutMs: number;
  readonly connectTimeoutMs: number;
  readonly reconnectMaxDelayMs: number;
  readonly maxChunkBytes: number;
}

/** Defaults of {@link RedisBackendOptions}. */
export const REDIS_BACKEND_DEFAULTS = Object.freeze({
  host: '127.0.0.1',
  port: 6379,
  db: 0,
  keyPrefix: 'kvtier:',
  timeoutMs: 1000,
  connectTimeoutMs: 5000,
  reconnectMaxDelayMs: 2000,
  maxChunkBytes: 256 * 1024 * 1024,
});

const CONFIG_KEYS: readonly string[] = [
  'url',
  'host',
  'port',
  'cluster',
  'username',
  'password',
  'db',
  'tls',
  'keyPrefix',
  'ttlMs',
  'timeoutMs',
  'connectTimeoutMs',
  'reconnectMaxDelayMs',
  'maxChunkBytes',
];

const MAX_VALUE_BYTES = 512 * 1024 * 1024;
/** Keys asked for per SCAN step and deleted per pipeline in `clear`. */
const SCAN_COUNT = 1000;

function invalid(msg: string): KvtierError {
  return new KvtierError('KVT_INVALID_ARGUMENT', msg);
}

/**
 * Applies defaults and validates.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the bad option and what is allowed.
 */
export function resolveRedisBackendOptions(
  o: RedisBackendOptions = {},
): ResolvedRedisBackendOptions {
  const d = REDIS_BACKEND_DEFAULTS;
  const url = o.url === undefined ? null : requireString('url', o.url, { nonEmpty: true });
  if (url !== null && !/^rediss?:\/\//.test(url))
    throw invalid(`url must start with redis:// or rediss://, got ${describe(url)}`);
  let cluster: RedisNodeAddress[] | null = null;
  if (o.cluster !== undefined) {
    const nodes = (o.cluster as { nodes?: unknown } | null)?.nodes;
    if (!Array.isArray(nodes) || nodes.length === 0)
      throw invalid(
        `cluster.nodes must be a non-empty array of { host, port }, got ${describe(nodes)}`,
      );
    cluster = nodes.map((n: { host?: unknown; port?: unknown }, i) => ({
      host: requireString(`cluster.nodes[${i}].host`, n?.host, { nonEmpty: true }),
      port: requireInt(`cluster.nodes[${i}].port`, n?.port, 1, 65535),
    }));
    if (url !== null || o.host !== undefined || o.port !== undefined)
      throw invalid('give either cluster or url/host/port, not both');
  }
  if (url !== null && (o.host !== undefined || o.port !== undefined))
    throw invalid('give either url or host/port, not both');
  const db = requireInt('db', o.db ?? d.db, 0, 65535);
  if (cluster !== null && db !== 0) throw invalid(`db must be 0 in cluster mode, got ${db}`);
  let tls: TlsOptions | undefined;
  if (o.tls === true) tls = {};
  else if (typeof o.tls === 'object' && o.tls !== null && !Array.isArray(o.tls)) tls = o.tls;
  else if (o.tls !== undefined && o.tls !== false)
    throw invalid(`tls must be a boolean or an object of TLS options, got ${describe(o.tls)}`);
  if (o.onCorrupt !== undefined && typeof o.onCorrupt !== 'function')
    throw invalid(`onCorrupt must be a function, got ${describe(o.onCorrupt)}`);
  return {
    url,
    host: requireString('host', o.host ?? d.host, { nonEmpty: true }),
    port: requireInt('port', o.port ?? d.port, 1, 65535),
    cluster,
    username: o.username === undefined ? undefined : requireString('username', o.username),
    password: o.password === undefined ? undefined : requireString('password', o.password),
    db,
    tls,
    keyPrefix: requireString('keyPrefix', o.keyPrefix ?? d.keyPrefix),
    ttlMs: o.ttlMs === undefined ? null : requireInt('ttlMs', o.ttlMs, 1),
    timeoutMs: requireInt('timeoutMs', o.timeoutMs ?? d.timeoutMs, 1, 600_000),
    connectTimeoutMs: requireInt(
      'connectTimeoutMs',
      o.connectTimeoutMs ?? d.connectTimeoutMs,
      1,
      600_000,
    ),
    reconnectMaxDelayMs: requireInt(
      'reconnectMaxDelayMs',
      o.reconnectMaxDelayMs ?? d.reconnectMaxDelayMs,
      1,
      600_000,
    ),
    maxChunkBytes: requireInt(
      'maxChunkBytes',
      o.maxChunkBytes ?? d.maxChunkBytes,
      0,
      MAX_VALUE_BYTES - 64 * 1024,
    ),
  };
}

/** Counters of {@link RedisBackend} (see `stats` for what `chunks`/`bytesUsed` mean). */
export interface RedisBackendStats extends BackendStats {
  /** Objects that failed to decode, were treated as misses and deleted. */
  readonly corruptObjects: number;
  /** Commands that failed or timed out (connection lost, server error). */
  readonly errors: number;
}

/** Deletes one key and returns its size in bytes (0 when missing): one atomic, cluster-safe step. */
const UNLINK_SIZED = `local n = redis.call('STRLEN', KEYS[1])
if n > 0 then redis.call('UNLINK', KEYS[1]) end
return n`;

/** What a removal took away. */
interface Removed {
  chunks: number;
  bytes: number;
}

type Client = Redis | Cluster;

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
 * unreachable calls fail at once (`KVT_BACKEND`) or within `timeoutMs` (`KVT_TIMEOUT`) and puts
 * are dropped and counted; ioredis reconnects in the background with capped backoff.
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
    this.#log = options.log ?? createLogger('redis-backend');
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
  }

  /**
   * Waits until the connection is ready.
   * @throws KvtierError `KVT_BACKEND` if it is not ready within `connectTimeoutMs`; `KVT_CLOSED`.
   */
  async start(): Promise<void> {
    this.#open(undefined, 'start');
    if (this.#client.status === 'ready') return;
    const c = this.#client;
    await new Promise<void>((resolve, reject) => {
      const done = (err?: Error) => {
        clearTimeout(timer);
        c.off('ready', onReady);
        c.off('end', onEnd);
        if (err === undefined) resolve();
        else reject(err);
      };
      const onReady = () => done();
      const onEnd = () => done(closedError(`backend ${this.name}`));
      const o = this.options;
      // Never put the URL's credentials into a message.
      const where =
        o.cluster !== null
          ? `cluster ${o.cluster.map((n) => `${n.host}:${n.port}`).join(',')}`
          : o.url !== null
            ? o.url.replace(/\/\/[^@/]*@/, '//')
            : `${o.host}:${o.port}`;
      const timer = setTimeout(() => {
        const last = this.#lastError === null ? '' : `; last error: ${this.#lastError.message}`;
        const msg = `${this.name}: redis at ${where} not ready within ${o.connectTimeoutMs} ms (connection ${c.status}${last})`;
        done(new KvtierError('KVT_BACKEND', msg));
      }, o.connectTimeoutMs);
      c.on('ready', onReady);
      c.on('end', onEnd);
    });
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
      const decoded = decodeChunkObject(ns, hash, buf);
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

  async put(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    opts: PutOptions = {},
  ): Promise<PutOutcome> {
    this.#open(opts.signal, 'put');
    checkChunk(chunk);
    if (chunk.data.byteLength > this.options.maxChunkBytes || this.#client.status !== 'ready') {
      this.#droppedPuts++;
      return 'dropped';
    }
    const obj = this.#pool.acquire(chunkObjectBytes(chunk.data.byteLength));
    encodeChunkObjectInto(obj, ns, hash, chunk);
    const key = this.#key(ns, hash);
    const ttl = this.options.ttlMs;
    const c = this.#client;
    const command = ttl === null ? c.set(key, obj, 'NX') : c.set(key, obj, 'PX', ttl, 'NX');
    // The buffer is reused only once ioredis is done with the command, even if we stop waiting.
    command.then(
      () => this.#pool.release(obj),
      () => this.#pool.release(obj),
    );
    let reply: string | null;
    try {
      reply = await this.#bounded('put', opts.signal, command);
    } catch (err) {
      if (this.#closing !== null) throw closedError(`backend ${this.name}`);
      if (err instanceof KvtierError && err.code === 'KVT_ABORTED') throw err;
      if (!(err instanceof KvtierError && err.code === 'KVT_TIMEOUT')) this.#errors++;
      this.#droppedPuts++;
      this.#log.debug('redis put dropped', { tier: this.name, err: err as Error });
      return 'dropped';
    }
    if (reply === null) return 'exists';
    this.#chunks++;
    this.#bytes += obj.byteLength;
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
   * Counters. `chunks` and `bytesUsed` (object bytes, headers included) are this instance's
   * view: what it stored minus what it removed (remove, clear, corrupt objects), never below 0.
   * Redis expires, evicts and is written by other sidecars without telling us, so they are not
   * the store's size (ask Redis `INFO`/`DBSIZE` for that, off the hot path). `capacityBytes` is
   * null and `evictions` 0 for the same reason: eviction is Redis's own `maxmemory` policy.
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
    return new KvtierError('KVT_BACKEND', `${this.name} ${op}: redis failed: ${msg}`, { cause });
  }

  #forget(r: Removed): void {
    this.#chunks = Math.max(0, this.#chunks - r.chunks);
    this.#bytes = Math.max(0, this.#bytes - r.bytes);
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

  /** Settles with `work`, or rejects at `timeoutMs` (KVT_TIMEOUT) or on abort, whichever first. */
  async #bounded<T>(op: string, signal: AbortSignal | undefined, work: Promise<T>): Promise<T> {
    work.catch(() => {});
    let timer: NodeJS.Timeout | undefined;
    let onAbort: (() => void) | undefined;
    const stop = new Promise<never>((_, reject) => {
      const ms = this.options.timeoutMs;
      timer = setTimeout(() => {
        this.#errors++;
        reject(new KvtierError('KVT_TIMEOUT', `${this.name} ${op} timed out after ${ms} ms`));
      }, ms);
      if (signal !== undefined) {
        onAbort = () => reject(abortedError(signal, `${this.name} ${op}`));
        signal.addEventListener('abort', onAbort, { once: true });
      }
    });
    try {
      return await Promise.race([work, stop]);
    } finally {
      clearTimeout(timer);
      if (onAbort !== undefined) signal?.removeEventListener('abort', onAbort);
    }
  }
}

function connect(o: ResolvedRedisBackendOptions): Client {
  const retry = (times: number) => Math.min(50 * 2 ** Math.min(times, 10), o.reconnectMaxDelayMs);
  const common = {
    username: o.username,
    password: o.password,
    tls: o.tls,
    commandTimeout: o.timeoutMs,
    connectTimeout: o.connectTimeoutMs,
    maxRetriesPerRequest: 0,
  } satisfies RedisOptions;
  if (o.cluster !== null) {
    return new Cluster([...o.cluster], {
      enableOfflineQueue: false,
      enableAutoPipelining: true,
      autoPipeliningIgnoredCommands: UNPIPELINED,
      // Lost nodes are dropped (ioredis's default); when all are gone the cluster reconnects
      // from the seeds with this backoff, and its status shows the outage meanwhile.
      clusterRetryStrategy: retry,
      slotsRefreshTimeout: o.timeoutMs,
      redisOptions: common,
    });
  }
  const opts: RedisOptions = {
    ...common,
    db: o.db,
    enableOfflineQueue: false,
    enableAutoPipelining: true,
    autoPipeliningIgnoredCommands: UNPIPELINED,
    retryStrategy: retry,
  };
  if (o.url !== null) return new Redis(o.url, stripUndefined(opts));
  return new Redis({ ...stripUndefined(opts), host: o.host, port: o.port });
}

/** ioredis lets an explicit `undefined` override what the URL says (e.g. its password). */
function stripUndefined<T extends object>(o: T): T {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as T;
}

async function unlinkSized(c: Client, key: string): Promise<number> {
  const n = await c.eval(UNLINK_SIZED, 1, key);
  return typeof n === 'number' ? n : 0;
}

function sizeSum(sizes: readonly number[]): Removed {
  let chunks = 0;
  let bytes = 0;
  for (const n of sizes) {
    if (n > 0) chunks++;
    bytes += n;
  }
  return { chunks, bytes };
}

/** SCAN + one-key delete on one node (a multi-key UNLINK fails across slots in a cluster). */
async function clearNode(node: Redis, pattern: string): Promise<Removed> {
  const total: Removed = { chunks: 0, bytes: 0 };
  let cursor = '0';
  do {
    const [next, keys] = await node.scan(cursor, 'MATCH', pattern, 'COUNT', SCAN_COUNT);
    cursor = next;
    const r = sizeSum(await Promise.all(keys.map((k) => unlinkSized(node, k))));
    total.chunks += r.chunks;
    total.bytes += r.bytes;
  } while (cursor !== '0');
  return total;
}

function globEscape(s: string): string {
  return s.replace(/[*?[\]\\]/g, '\\$&');
}

/**
 * Reads Redis options from a plain config object (the keys of {@link RedisBackendOptions}
 * except `onCorrupt` and `log`).
 * @throws KvtierError `KVT_CONFIG` naming the tier and the bad or unknown option.
 */
export function redisOptionsFromConfig(
  raw: Record<string, unknown>,
  tier = 'redis',
): RedisBackendOptions {
  return optionsFromConfig<RedisBackendOptions>(
    raw,
    tier,
    'redis',
    CONFIG_KEYS,
    resolveRedisBackendOptions,
  );
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
