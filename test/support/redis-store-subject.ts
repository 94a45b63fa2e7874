/**
 * Store-contract subjects over a running `redis-server` or cluster (redis-server.ts starts them):
 * a {@link RedisStore} per subject with a key prefix of its own.
 */
import { randomBytes } from 'node:crypto';
import { resolveRedisBackendOptions } from '../../src/backends/redis/redis-options.ts';
import { RedisStore } from '../../src/backends/redis/redis-store.ts';
import { silentLogger } from '../../src/util/log.ts';
import type { StoreContractSubject } from '../contract/store.contract.ts';
import type { RedisCluster, RedisServer } from './redis-server.ts';

/**
 * A command the Redis store has sent is not cancelled: it ends with Redis's reply or this timeout,
 * so a call outlives its signal by at most this much while the server is frozen. Long enough for
 * a 32 MiB SET on a busy machine; the store contract's bound on settling after an abort is set
 * above it ({@link REDIS_STORE_SETTLE_MS}).
 */
export const REDIS_STORE_TIMEOUT_MS = 5000;
/** The store contract's `abortSettleMs` for {@link redisStoreSubject}'s stores. */
export const REDIS_STORE_SETTLE_MS = REDIS_STORE_TIMEOUT_MS + 3000;

/**
 * Builds a store-contract subject over a running server or cluster: a {@link RedisStore} with a
 * key prefix of its own, `open` (another client over the same keys), `stall`/`unstall` that
 * freeze a standalone server, and `cleanup` that deletes the subject's keys.
 */
export async function redisStoreSubject(
  target: { kind: 'standalone'; server: RedisServer } | { kind: 'cluster'; cluster: RedisCluster },
): Promise<StoreContractSubject> {
  const options = resolveRedisBackendOptions({
    ...(target.kind === 'standalone'
      ? { port: target.server.port }
      : { cluster: { nodes: target.cluster.nodes } }),
    keyPrefix: `kvt-store-${randomBytes(6).toString('hex')}:`,
    timeoutMs: REDIS_STORE_TIMEOUT_MS,
  });
  const open = async () => {
    const store = new RedisStore(options, `redis-${target.kind}`, silentLogger);
    try {
      await store.start();
    } catch (err) {
      await store.close();
      throw err;
    }
    return store;
  };
  const srv = target.kind === 'standalone' ? target.server : undefined;
  let stalled = false;
  const subject: StoreContractSubject = {
    store: await open(),
    open,
    cleanup: async () => {
      if (stalled) srv?.resume();
      const sweeper = await open();
      try {
        await sweeper.clear('');
      } finally {
        await sweeper.close();
      }
    },
  };
  if (srv !== undefined) {
    // A frozen redis-server (SIGSTOP) keeps its connections and answers nothing.
    subject.stall = async () => {
      stalled = true;
      srv.pause();
    };
    subject.unstall = async () => {
      stalled = false;
      srv.resume();
    };
  }
  return subject;
}
