/**
 * The Redis tier: a {@link RedisStore} (redis-store.ts) under the four-method store wrapper
 * ({@link StoreBackend}), which encodes, verifies and counts.
 */
import { createLogger } from '../../util/log.ts';
import type { BackendContext, BackendFactory } from '../core/types.ts';
import { StoreBackend } from '../store/store-backend.ts';
import type { StoreBackendStats } from '../store/store-options.ts';
import {
  type RedisBackendOptions,
  type ResolvedRedisBackendOptions,
  redisOptionsFromConfig,
  resolveRedisBackendOptions,
} from './redis-options.ts';
import { RedisStore } from './redis-store.ts';

export {
  REDIS_BACKEND_DEFAULTS,
  type RedisBackendOptions,
  type RedisNodeAddress,
  type ResolvedRedisBackendOptions,
  redisOptionsFromConfig,
  resolveRedisBackendOptions,
} from './redis-options.ts';

/** Counters of {@link RedisBackend} (see `stats` for what `chunks`/`bytesUsed` mean). */
export interface RedisBackendStats extends StoreBackendStats {
  /** Times `chunks` and `bytesUsed` were recounted from Redis (every (re)connection). */
  readonly recounts: number;
}

/**
 * Store calls one batched call may have in flight. Redis answers one connection in order and
 * ioredis pipelines the commands of one turn, so the bound only caps memory, not parallelism.
 */
const REDIS_BATCH_CONCURRENCY = 4096;

/**
 * Redis tier (ioredis): one key `<keyPrefix><ns>:<hash>` per chunk holding the whole chunk
 * object, written by a single `SET … NX [PX ttl]` (see {@link RedisStore}). Every call runs under
 * `timeoutMs` (`KVT_TIMEOUT`, counted in `errors`); while Redis is unreachable calls fail at once
 * with `KVT_BACKEND` (the tier's breaker answers them as misses and drops).
 *
 * `stats().chunks` and `bytesUsed` (object bytes, headers included) are what Redis held under the
 * key prefix when the connection was last (re)made ({@link recount}, SCAN and STRLEN on every
 * master), plus what this instance stored since, minus what it removed. Between connections
 * Redis expires, evicts and is written by other sidecars without telling us. Redis evicts on its
 * own (`maxmemory`) and cannot pin against it: `pin` pins nothing.
 */
export class RedisBackend extends StoreBackend {
  /** The resolved options. */
  readonly options: ResolvedRedisBackendOptions;

  /**
   * Connects in the background; `start()` waits for the first connection and counts.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options.
   */
  constructor(options: RedisBackendOptions, ctx: BackendContext = { name: 'redis' }) {
    const o = resolveRedisBackendOptions(options);
    const log = options.log ?? ctx.log ?? createLogger('redis-backend');
    const store = new RedisStore(o, ctx.name, log);
    super(
      store,
      {
        kind: 'redis',
        maxChunkBytes: o.maxChunkBytes,
        timeoutMs: o.timeoutMs,
        concurrency: REDIS_BATCH_CONCURRENCY,
        ttlMs: o.ttlMs,
        ...(options.onCorrupt !== undefined ? { onCorrupt: options.onCorrupt } : {}),
        log,
      },
      ctx,
    );
    this.options = o;
    // What this instance counted is only right until Redis restarts, evicts or is written by
    // another sidecar: recount on every (re)connection.
    store.client.on('ready', () => {
      if (this.started) void this.recount();
    });
  }

  override stats(): RedisBackendStats {
    return { ...super.stats(), recounts: this.recounts };
  }
}

/**
 * Builds a {@link RedisBackend} from config options and waits for its connection.
 * @throws KvtierError `KVT_CONFIG` on bad options; `KVT_BACKEND` if Redis is not reachable
 *   within `connectTimeoutMs` (startup fails loudly rather than running without the tier).
 */
export const createRedisBackend: BackendFactory = (options, ctx) =>
  StoreBackend.started(new RedisBackend(redisOptionsFromConfig(options, ctx.name), ctx));
