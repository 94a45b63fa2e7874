import { after } from 'node:test';
import { type RedisServer, redisContractSubject, startRedis } from '../support/redis-server.ts';
import { describeBackendContract } from './backend.contract.ts';

// One server for the whole suite (each subject has its own key prefix); started on first use.
let server: Promise<RedisServer> | undefined;
after(async () => (await server)?.stop());

describeBackendContract(
  'RedisBackend contract (standalone redis-server)',
  async () => {
    server ??= startRedis();
    return redisContractSubject(
      { kind: 'standalone', server: await server },
      { timeoutMs: 2000, reconnectMaxDelayMs: 100, maxChunkBytes: 40 * 1024 * 1024 },
    );
  },
  { downTimeoutMs: 3000 },
);
