/**
 * The Redis tier's connection and key-deletion helpers: how the ioredis client (standalone or
 * cluster) is configured, and the atomic sized deletes that `remove` and `clear` use.
 */
import { Cluster, Redis, type RedisOptions } from 'ioredis';
import type { ResolvedRedisBackendOptions } from './redis-options.ts';

/**
 * Commands that skip auto-pipelining: an auto-pipeline is sent as one concatenated buffer, which
 * copies every multi-MiB SET value once more; a SET alone is written straight to the socket.
 */
const UNPIPELINED = ['set'];

/** Keys asked for per SCAN step and deleted per pipeline in `clear`. */
const SCAN_COUNT = 1000;

/**
 * Deletes one key and returns its size in bytes, -1 when it was missing (an empty value is 0
 * bytes and is deleted too): one atomic, cluster-safe step.
 */
const UNLINK_SIZED = `if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local n = redis.call('STRLEN', KEYS[1])
redis.call('UNLINK', KEYS[1])
return n`;

/** What a removal took away. */
export interface Removed {
  chunks: number;
  bytes: number;
}

export type Client = Redis | Cluster;

export function connect(o: ResolvedRedisBackendOptions): Client {
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

/** Deletes `key`; its size in bytes, or -1 when it was missing. */
export async function unlinkSized(c: Client, key: string): Promise<number> {
  const n = await c.eval(UNLINK_SIZED, 1, key);
  return typeof n === 'number' ? n : -1;
}

/** Keys and bytes of `sizes`, where -1 is a key that was missing. */
export function sizeSum(sizes: readonly number[]): Removed {
  let chunks = 0;
  let bytes = 0;
  for (const n of sizes) {
    if (n < 0) continue;
    chunks++;
    bytes += n;
  }
  return { chunks, bytes };
}

/** SCAN + one-key delete on one node (a multi-key UNLINK fails across slots in a cluster). */
export async function clearNode(node: Redis, pattern: string): Promise<Removed> {
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

/** SCAN + STRLEN on every master: how many keys match `pattern` and their total size. */
export async function countKeys(c: Client, pattern: string): Promise<Removed> {
  const masters = c instanceof Cluster ? c.nodes('master') : [c];
  const counted = await Promise.all(masters.map((node) => countNode(node, pattern)));
  return {
    chunks: counted.reduce((n, r) => n + r.chunks, 0),
    bytes: counted.reduce((n, r) => n + r.bytes, 0),
  };
}

/** SCAN + STRLEN on one node: how many keys match `pattern` and their total size. */
async function countNode(node: Redis, pattern: string): Promise<Removed> {
  const total: Removed = { chunks: 0, bytes: 0 };
  let cursor = '0';
  do {
    const [next, keys] = await node.scan(cursor, 'MATCH', pattern, 'COUNT', SCAN_COUNT);
    cursor = next;
    // Every key the SCAN returned counts, an empty value too (STRLEN 0).
    const sizes = await Promise.all(keys.map((k) => node.strlen(k)));
    const r = sizeSum(sizes);
    total.chunks += r.chunks;
    total.bytes += r.bytes;
  } while (cursor !== '0');
  return total;
}

/**
 * The keys matching `pattern` on every master, one SCAN reply at a time (masters one after
 * another). Stops between replies once `signal` fires.
 */
export async function* scanKeys(
  c: Client,
  pattern: string,
  signal?: AbortSignal,
): AsyncGenerator<string[]> {
  const masters = c instanceof Cluster ? c.nodes('master') : [c];
  for (const node of masters) {
    let cursor = '0';
    do {
      signal?.throwIfAborted();
      const [next, keys] = await node.scan(cursor, 'MATCH', pattern, 'COUNT', SCAN_COUNT);
      cursor = next;
      if (keys.length > 0) yield keys;
    } while (cursor !== '0');
  }
}

export function globEscape(s: string): string {
  return s.replace(/[*?[\]\\]/g, '\\$&');
}
