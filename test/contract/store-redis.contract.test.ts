/**
 * The store contract against the Redis tier's own store (RedisStore) on a real redis-server: a
 * key prefix per subject, a second instance as a second client, stalled by freezing the server.
 */
import { after } from 'node:test';
import { type RedisServer, startRedis } from '../support/redis-server.ts';
import { REDIS_STORE_SETTLE_MS, redisStoreSubject } from '../support/redis-store-subject.ts';
import { describeStoreContract } from './store.contract.ts';

// One server for the whole suite (each subject has its own key prefix); started on first use.
let server: Promise<RedisServer> | undefined;
after(async () => (await server)?.stop());

describeStoreContract(
  'RedisStore store contract (standalone redis-server)',
  async () => {
    server ??= startRedis();
    return redisStoreSubject({ kind: 'standalone', server: await server });
  },
  { abortSettleMs: REDIS_STORE_SETTLE_MS },
);
