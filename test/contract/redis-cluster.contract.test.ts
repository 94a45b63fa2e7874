import { after } from 'node:test';
import {
  type RedisCluster,
  redisContractSubject,
  startRedisCluster,
} from '../support/redis-server.ts';
import { describeBackendContract } from './backend.contract.ts';

// One 3-master cluster for the whole suite (each subject has its own key prefix).
let cluster: Promise<RedisCluster> | undefined;
after(async () => (await cluster)?.stop());

describeBackendContract(
  'RedisBackend contract (3-master redis cluster)',
  async () => {
    cluster ??= startRedisCluster();
    return redisContractSubject(
      { kind: 'cluster', cluster: await cluster },
      { timeoutMs: 20_000, reconnectMaxDelayMs: 100, maxChunkBytes: 40 * 1024 * 1024 },
    );
  },
  { downTimeoutMs: 3000 },
);
