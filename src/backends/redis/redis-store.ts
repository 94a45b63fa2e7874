/**
 * The Redis tier's {@link KvStore}: one key `<keyPrefix><ns>:<hash>` per chunk (the store key's
 * `/` written as `:`, the tier's key format since its first release) holding the whole chunk
 * object, written by a single `SET … NX [PX ttl]` (atomic; concurrent puts of one key leave one
 * copy), read with `getBuffer` (never `get`, which decodes the bytes as UTF-8).
 *
 * Batching: every command is single-key and `enableAutoPipelining` is on, so the per-key commands
 * a batched call issues in one turn leave as one pipeline per node: the same round trip as an
 * explicit pipeline in standalone mode and, unlike one, also correct in cluster mode, where keys
 * of one batch live on different nodes (multi-key commands would need hash tags, which would put
 * a whole namespace on one node).
 *
 * Outages: the offline queue is off and `maxRetriesPerRequest` is 0, so while Redis is
 * unreachable every call fails at once (`KVT_BACKEND`) or within `timeoutMs` (`KVT_TIMEOUT`);
 * ioredis reconnects in the background with capped backoff.
 */
import { Cluster } from 'ioredis';
import { abortedError, closedError, KvtierError } from '../../errors.ts';
import { Deadline } from '../../util/deadline.ts';
import type { Logger } from '../../util/log.ts';
import { BufferPool } from '../arena/buffer-pool.ts';
import type { BackendHealth } from '../core/types.ts';
import {
  type KvStore,
  type KvStoreInfo,
  type StoreCallOptions,
  type StoredValue,
  type StoreGetOptions,
  type StoreKey,
  type StorePutOptions,
  type StoreTally,
  storeKeyParts,
} from '../store/kv-store.ts';
import {
  type Client,
  clearNode,
  connect,
  countKeys,
  globEscape,
  scanKeys,
  unlinkSized,
} from './redis-client.ts';
import { type FramedSet, framedSet } from './redis-frame.ts';
import { clusterNodeOf, REDIRECT, RedisGetReader } from './redis-get-reader.ts';
import type { ResolvedRedisBackendOptions } from './redis-options.ts';

const LOST: readonly string[] = ['reconnecting', 'close', 'end'];

/** A Redis (standalone or cluster) {@link KvStore}; see the file's comment. */
export class RedisStore implements KvStore {
  readonly info: KvStoreInfo = Object.freeze({
    persistent: true,
    shared: true,
    evicts: true,
    ttl: true,
  });
  /** The ioredis client (standalone or cluster), owned: disconnected by `close`. */
  readonly client: Client;
  readonly #o: ResolvedRedisBackendOptions;
  readonly #name: string;
  /** Frames of puts, reused once Redis has replied to them. */
  readonly #pool = new BufferPool();
  /** Frames lent by `valueBuffer`, by the value view the tier fills and passes to `put`. */
  readonly #frames = new WeakMap<Uint8Array, FramedSet>();
  /** The bulk `GET` path; null with TLS (ioredis reads then). */
  readonly #reader: RedisGetReader | null;
  #readerGets = 0;
  #redirects = 0;
  #closed = false;
  /** Last connection error, for the message of a failed `start()`. */
  #lastError: Error | null = null;

  /** Connects in the background; `start()` waits for the first connection. */
  constructor(o: ResolvedRedisBackendOptions, name: string, log: Logger) {
    this.#o = o;
    this.#name = name;
    this.client = connect(o);
    this.#reader = newReader(this.client, o, name);
    this.client.on('error', (err: Error) => {
      this.#lastError = err;
      log.debug('redis connection error', { tier: name, err });
    });
  }

  /**
   * Waits until the connection is ready: the first connection attempt either makes it (ready) or
   * fails (refused at once; a host that does not answer after `connectTimeoutMs`), and a failed
   * one fails the start rather than waiting for ioredis's reconnects.
   * @throws KvtierError `KVT_BACKEND` if the first attempt fails or the connection is not ready
   *   within `connectTimeoutMs`; `KVT_CLOSED`.
   */
  async start(): Promise<void> {
    const c = this.client;
    if (this.#closed) throw closedError(`backend ${this.#name}`);
    if (c.status === 'ready') return;
    const o = this.#o;
    const d = new Deadline({ what: `${this.#name} start`, timeoutMs: o.connectTimeoutMs });
    let onReady = (): void => {};
    let onLost = (): void => {};
    let onEnd = (): void => {};
    const ready = new Promise<void>((resolve, reject) => {
      onReady = () => resolve();
      onLost = () => reject(new KvtierError('KVT_BACKEND', this.#unreachable('is unreachable')));
      onEnd = () => reject(closedError(`backend ${this.#name}`));
      c.on('ready', onReady);
      c.on('reconnecting', onLost);
      c.on('end', onEnd);
    });
    try {
      await d.race(ready);
    } catch (err) {
      if (!d.timedOut) throw err;
      throw new KvtierError(
        'KVT_BACKEND',
        this.#unreachable(`not ready within ${o.connectTimeoutMs} ms`),
      );
    } finally {
      d.dispose();
      c.off('ready', onReady);
      c.off('reconnecting', onLost);
      c.off('end', onEnd);
    }
  }

  /** `<tier>: redis at <where> <what> (connection <status>; last error: ...)`, credentials left out. */
  #unreachable(what: string): string {
    const o = this.#o;
    const where =
      o.cluster !== null
        ? `cluster ${o.cluster.map((n) => `${n.host}:${n.port}`).join(',')}`
        : o.url !== null
          ? o.url.replace(/\/\/[^@/]*@/, '//')
          : `${o.host}:${o.port}`;
    const last = this.#lastError === null ? '' : `; last error: ${this.#lastError.message}`;
    return `${this.#name}: redis at ${where} ${what} (connection ${this.client.status}${last})`;
  }

  /**
   * `GET` through the bulk reader (redis-get-reader.ts) into a pooled buffer that the tier gives
   * back once it has copied the value; through ioredis when the reader cannot place the key (no
   * slot map yet, `MOVED`/`ASK`) or the connection uses TLS.
   */
  async get(key: StoreKey, opts: StoreGetOptions): Promise<Buffer | StoredValue | null> {
    this.#ready('get', opts.signal);
    const k = this.#key(key);
    if (this.#reader !== null) {
      const v = await this.#reader
        .get(k, opts.maxBytes ?? Number.MAX_SAFE_INTEGER, opts.crc32cFrom, opts.signal)
        .catch(this.#fail('get'));
      if (v !== REDIRECT) {
        this.#readerGets++;
        return v;
      }
      this.#redirects++;
    }
    return this.client.getBuffer(k).catch(this.#fail('get'));
  }

  async has(key: StoreKey, opts: StoreCallOptions): Promise<boolean> {
    this.#ready('contains', opts.signal);
    return (await this.client.exists(this.#key(key)).catch(this.#fail('contains'))) === 1;
  }

  /** A frame with room for the value (see redis-frame.ts); `put` sends it as it is. */
  valueBuffer(key: StoreKey, byteLength: number, opts: StorePutOptions): Uint8Array {
    const f = framedSet(this.#pool, this.#key(key), byteLength, opts.ttlMs ?? null);
    this.#frames.set(f.value, f);
    return f.value;
  }

  /** `SET … NX [PX ttl]`: true when set, false when the key existed. */
  async put(key: StoreKey, value: Uint8Array, opts: StorePutOptions): Promise<boolean> {
    const framed = this.#frames.get(value);
    if (framed !== undefined) this.#frames.delete(value);
    try {
      this.#ready('put', opts.signal);
    } catch (err) {
      if (framed !== undefined) this.#pool.release(framed.frame);
      throw err;
    }
    let reply: Promise<unknown>;
    if (framed !== undefined) {
      this.client.sendCommand(framed.command);
      reply = framed.command.promise;
      // Reused only once Redis has replied (it has read every byte).
      reply.then(
        () => this.#pool.release(framed.frame),
        () => {},
      );
    } else {
      const k = this.#key(key);
      const v = Buffer.from(value.buffer, value.byteOffset, value.byteLength);
      reply =
        opts.ttlMs === undefined
          ? this.client.set(k, v, 'NX')
          : this.client.set(k, v, 'PX', opts.ttlMs, 'NX');
    }
    return (await reply.catch(this.#fail('put'))) !== null;
  }

  /** One single-key script (cluster-safe): the bytes removed (0 for an empty value), false when missing. */
  async delete(key: StoreKey, opts: StoreCallOptions): Promise<number | false> {
    this.#ready('remove', opts.signal);
    const n = await unlinkSized(this.client, this.#key(key)).catch(this.#fail('remove'));
    return n >= 0 ? n : false;
  }

  /** SCAN + UNLINK of the prefix's keys on every master. */
  async clear(prefix: string): Promise<StoreTally> {
    this.#ready('clear');
    const c = this.client;
    const masters = c instanceof Cluster ? c.nodes('master') : [c];
    const removed = await Promise.all(masters.map((n) => clearNode(n, this.#pattern(prefix))));
    return {
      keys: removed.reduce((n, r) => n + r.chunks, 0),
      bytes: removed.reduce((n, r) => n + r.bytes, 0),
    };
  }

  /**
   * The prefix's keys on every master (SCAN, a reply at a time); keys that are not chunk keys
   * under this tier's `keyPrefix` are left out. No sizes (that would be a STRLEN per key).
   */
  async *list(prefix: string, opts: StoreCallOptions): AsyncGenerator<{ readonly key: StoreKey }> {
    this.#ready('list', opts.signal);
    const lead = this.#o.keyPrefix;
    try {
      for await (const keys of scanKeys(this.client, this.#pattern(prefix), opts.signal)) {
        for (const k of keys) {
          if (!k.startsWith(lead)) continue;
          const parts = storeKeyParts(k.slice(lead.length).replace(':', '/'));
          if (parts !== null) yield { key: `${parts.ns}/${parts.hash}` as StoreKey };
        }
      }
    } catch (err) {
      if (opts.signal?.aborted === true) throw abortedError(opts.signal, `${this.#name} list`);
      this.#fail('list')(err);
    }
  }

  /** SCAN + STRLEN of the prefix's keys on every master. */
  async count(prefix: string): Promise<StoreTally> {
    this.#ready('recount');
    const n = await countKeys(this.client, this.#pattern(prefix));
    return { keys: n.chunks, bytes: n.bytes };
  }

  /**
   * 'up' while the ioredis connection is ready, 'down' otherwise (connecting, reconnecting). In
   * cluster mode, 'degraded' while the cluster is ready but a master connection is lost (node
   * connections open lazily, so one not yet opened is fine).
   */
  health(): BackendHealth {
    const c = this.client;
    if (c.status !== 'ready') return 'down';
    if (c instanceof Cluster && c.nodes('master').some((n) => LOST.includes(n.status)))
      return 'degraded';
    return 'up';
  }

  /** Gets answered by the bulk reader, and those it handed to ioredis (`MOVED`, `ASK`, no slot map). */
  stats(): Readonly<Record<string, number>> {
    return { readerGets: this.#readerGets, readerRedirects: this.#redirects };
  }

  /** Disconnects (in-flight commands reject). */
  async close(): Promise<void> {
    this.#closed = true;
    this.#reader?.close();
    this.client.disconnect();
  }

  #key(key: StoreKey): string {
    return `${this.#o.keyPrefix}${key.replace('/', ':')}`;
  }

  #pattern(prefix: string): string {
    return `${globEscape(this.#o.keyPrefix)}${globEscape(prefix.replace('/', ':'))}*`;
  }

  /**
   * Fails fast after close (`KVT_CLOSED`), for a signal that has fired (nothing is sent), and
   * while the connection is not ready. A command once sent is not cancelled: it ends with Redis's
   * reply or the command timeout (`timeoutMs`), which bounds how long a call outlives its signal.
   */
  #ready(op: string, signal?: AbortSignal): void {
    if (this.#closed) throw closedError(`backend ${this.#name}`);
    if (signal?.aborted === true) throw abortedError(signal, `${this.#name} ${op}`);
    if (this.client.status !== 'ready') {
      throw new KvtierError(
        'KVT_BACKEND',
        `${this.#name} ${op}: redis is unreachable (connection ${this.client.status})`,
      );
    }
  }

  /** Turns an ioredis rejection into the tier's error (its own command timeout: KVT_TIMEOUT). */
  #fail(op: string): (err: unknown) => never {
    return (cause) => {
      if (cause instanceof KvtierError) throw cause;
      const msg = cause instanceof Error ? cause.message : String(cause);
      const code = msg === 'Command timed out' ? 'KVT_TIMEOUT' : 'KVT_BACKEND';
      throw new KvtierError(code, `${this.#name} ${op}: redis failed: ${msg}`, { cause });
    };
  }
}

/**
 * The bulk reader of `client`: the master of each key's slot, or the standalone server; null when
 * the connection uses TLS (given as `tls` or by a `rediss://` URL) or a Unix socket.
 */
function newReader(
  client: Client,
  o: ResolvedRedisBackendOptions,
  name: string,
): RedisGetReader | null {
  if (o.tls !== undefined) return null;
  const opts = {
    username: o.username,
    password: o.password,
    connectTimeoutMs: o.connectTimeoutMs,
    name,
  };
  if (client instanceof Cluster)
    return new RedisGetReader(
      clusterNodeOf(() => client.slots),
      opts,
    );
  // ioredis has parsed the URL (host, port, credentials, database) into its options.
  const c = client.options;
  if (c.tls !== undefined || c.path != null) return null;
  const node = `${c.host ?? '127.0.0.1'}:${c.port ?? 6379}`;
  return new RedisGetReader(() => node, {
    ...opts,
    username: c.username ?? undefined,
    password: c.password ?? undefined,
    db: c.db ?? 0,
  });
}
