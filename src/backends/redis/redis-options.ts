/**
 * Options of the Redis tier, declared once ({@link REDIS_OPTIONS}): {@link RedisBackendOptions},
 * their defaults, the resolver that validates them and the reader of a tier's config object.
 */
import type { ConnectionOptions as TlsOptions } from 'node:tls';
import * as v from 'valibot';
import { KvtierError } from '../../errors.ts';
import type { Logger } from '../../util/log.ts';
import { bytes, int, pattern, str, strict } from '../../util/schema-kit.ts';
import { describe } from '../../util/validate.ts';
import { defineTierOptions, type OptionsOf, optional, withDefault } from '../core/tier-options.ts';

/** One Redis node address. */
export interface RedisNodeAddress {
  host: string;
  port: number;
}

/** Redis caps a value at 512 MB; a chunk's header and framing need the rest. */
const MAX_CHUNK_BYTES = 512 * 1024 * 1024 - 64 * 1024;
const MAX_MS = 600_000;

const NODES_RULE = 'must be a non-empty array of { host, port }';
const TLS_RULE = 'must be a boolean or an object of TLS options';

const tlsSchema = v.union(
  [
    v.boolean(),
    v.pipe(
      v.record(v.string(), v.unknown()),
      v.check((x) => !Array.isArray(x), TLS_RULE),
    ),
  ],
  (i) => `${TLS_RULE}, got ${describe(i.input)}`,
) as unknown as v.GenericSchema<boolean | TlsOptions>;

const ENTRIES = {
  url: optional(
    pattern(/^rediss?:\/\/./, 'must start with redis:// or rediss://'),
    '`redis://[user:pass@]host:port[/db]` or `rediss://...` (TLS). Not with host/port or cluster.',
  ),
  host: withDefault(str({ nonEmpty: true }), '127.0.0.1', 'Standalone server host.'),
  port: withDefault(int(1, 65535), 6379, 'Standalone server port.'),
  cluster: optional(
    strict({
      nodes: v.pipe(
        v.array(
          strict({ host: str({ nonEmpty: true }), port: int(1, 65535) }),
          (i) => `${NODES_RULE}, got ${describe(i.input)}`,
        ),
        v.minLength(1, NODES_RULE),
      ),
    }),
    'Redis Cluster: seed nodes (the rest are discovered). Not with url or host/port.',
  ),
  username: optional(str(), 'ACL user (Redis 6+).'),
  password: optional(str(), 'AUTH password.'),
  db: withDefault(int(0, 65535), 0, 'Database index; cluster mode only has database 0.'),
  tls: optional(tlsSchema, 'TLS: true for defaults, or node tls.connect options.'),
  keyPrefix: withDefault(str(), 'kvtier:', 'Prefix of every key this backend writes.'),
  ttlMs: optional(int(1), 'Expire chunks this long after they are written, ms; absent: never.'),
  timeoutMs: withDefault(int(1, MAX_MS), 1000, 'Deadline of every call (the command timeout), ms.'),
  connectTimeoutMs: withDefault(
    int(1, MAX_MS),
    5000,
    'How long start waits for the first connection, ms.',
  ),
  reconnectMaxDelayMs: withDefault(int(1, MAX_MS), 2000, 'Cap of the reconnect backoff, ms.'),
  maxChunkBytes: withDefault(
    bytes(0, MAX_CHUNK_BYTES),
    256 * 1024 * 1024,
    'Largest chunk payload in bytes (Redis caps a value at 512 MB).',
  ),
};

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

/** The Redis tier's options: names, types, bounds, defaults and descriptions. */
export const REDIS_OPTIONS = defineTierOptions({
  type: 'redis',
  description: 'A Redis server or cluster: one value per chunk, written in one command.',
  options: ENTRIES,
  example: { host: '127.0.0.1', port: 6379 },
  checks: [
    (o) =>
      o.cluster !== undefined &&
      (o.url !== undefined || o.host !== undefined || o.port !== undefined)
        ? { key: 'cluster', message: 'give either cluster or url/host/port, not both' }
        : undefined,
    (o) =>
      o.url !== undefined && (o.host !== undefined || o.port !== undefined)
        ? { key: 'url', message: 'give either url or host/port, not both' }
        : undefined,
    (o) =>
      o.cluster !== undefined && o.db !== undefined && o.db !== 0
        ? { key: 'db', message: `must be 0 in cluster mode, got ${o.db}` }
        : undefined,
  ],
  finish: (o): ResolvedRedisBackendOptions => ({
    ...o,
    cluster: o.cluster?.nodes.map(({ host, port }) => ({ host, port })) ?? null,
    username: o.username ?? undefined,
    password: o.password ?? undefined,
    tls: o.tls === true ? {} : o.tls === false || o.tls === null ? undefined : o.tls,
  }),
});

/** Options of {@link RedisBackend}: the keys of {@link REDIS_OPTIONS}, and hooks code may give. */
export interface RedisBackendOptions extends OptionsOf<typeof ENTRIES> {
  /** Called with the reason whenever a stored object fails to decode (and is deleted). */
  onCorrupt?: (reason: string) => void;
  /** Logger; default a JSON logger for component 'redis-backend'. */
  log?: Logger;
}

/** Defaults of {@link RedisBackendOptions}. */
export const REDIS_BACKEND_DEFAULTS = REDIS_OPTIONS.defaults;

/**
 * Applies defaults and validates.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the bad option and what is allowed.
 */
export function resolveRedisBackendOptions(
  o: RedisBackendOptions = {},
): ResolvedRedisBackendOptions {
  const resolved = REDIS_OPTIONS.resolve(o);
  if (o.onCorrupt !== undefined && typeof o.onCorrupt !== 'function')
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `onCorrupt must be a function, got ${describe(o.onCorrupt)}`,
    );
  return resolved;
}

/**
 * Reads Redis options from a plain config object (the keys of {@link REDIS_OPTIONS}; not the
 * callbacks).
 * @throws KvtierError `KVT_CONFIG` naming the tier and the bad or unknown option.
 */
export function redisOptionsFromConfig(
  raw: Record<string, unknown>,
  tier = 'redis',
): RedisBackendOptions {
  return REDIS_OPTIONS.fromConfig(raw, tier);
}
