/**
 * The store contract against RedisStore in cluster mode (a local 3-master cluster): SET NX,
 * deletes, SCAN listings and clears across the masters, two clients of one cluster.
 */
import { after } from 'node:test';
import { type RedisCluster, startRedisCluster } from '../support/redis-server.ts';
import { REDIS_STORE_SETTLE_MS, redisStoreSubject } from '../support/redis-store-subject.ts';
import { describeStoreContract } from './store.contract.ts';

// One cluster for the whole suite (each subject has its own key prefix); started on first use.
let cluster: Promise<RedisCluster> | undefined;
after(async () => (await cluster)?.stop());

describeStoreContract(
  'RedisStore store contract (3-master redis cluster)',
  async () => {
    cluster ??= startRedisCluster();
    return redisStoreSubject({ kind: 'cluster', cluster: await cluster });
  },
  { abortSettleMs: REDIS_STORE_SETTLE_MS },
);
