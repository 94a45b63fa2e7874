/**
 * Options of the Redis tier: {@link RedisBackendOptions}, their defaults in one place, the
 * resolver that validates them and the reader of a tier's config object.
 */
import type { ConnectionOptions as TlsOptions } from 'node:tls';
import { KvtierError } from '../../errors.ts';
import type { Logger } from '../../util/log.ts';
import { describe, requireInt, requireString } from '../../util/validate.ts';
import { optionsFromConfig } from '../core/config-options.ts';

/** One Redis node address. */
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
