/**
 * The store contract against the Redis tier's own store (RedisStore) on a real redis-server: a
 * key prefix per subject, a second instance as a second client, stalled by freezing the server.
 */
import { randomBytes } from 'node:crypto';
import { after } from 'node:test';
import { resolveRedisBackendOptions } from '../../src/backends/redis/redis-options.ts';
import { RedisStore } from '../../src/backends/redis/redis-store.ts';
import { silentLogger } from '../../src/util/log.ts';
import { type RedisServer, startRedis } from '../support/redis-server.ts';
import { describeStoreContract } from './store.contract.ts';

// A command once sent is not cancelled: it ends with Redis's reply or this timeout, so a call
// outlives its signal by at most this much while the server is frozen. Long enough for a 32 MiB
// SET on a busy machine; the suite's bound on settling after an abort is set above it.
const COMMAND_TIMEOUT_MS = 5000;

// One server for the whole suite (each subject has its own key prefix); started on first use.
let server: Promise<RedisServer> | undefined;
after(async () => (await server)?.stop());

describeStoreContract(
  'RedisStore store contract (standalone redis-server)',
  async () => {
    server ??= startRedis();
    const srv = await server;
    const options = resolveRedisBackendOptions({
      port: srv.port,
      keyPrefix: `kvt-store-${randomBytes(6).toString('hex')}:`,
      timeoutMs: COMMAND_TIMEOUT_MS,
    });
    const open = async () => {
      const store = new RedisStore(options, 'redis', silentLogger);
      await store.start();
      return store;
    };
    let stalled = false;
    return {
      store: await open(),
      open,
      stall: async () => {
        stalled = true;
        srv.pause();
      },
      unstall: async () => {
        stalled = false;
        srv.resume();
      },
      cleanup: async () => {
        if (stalled) srv.resume();
        const sweeper = await open();
        try {
          await sweeper.clear('');
        } finally {
          await sweeper.close();
        }
      },
    };
  },
  { abortSettleMs: COMMAND_TIMEOUT_MS + 3000 },
);
