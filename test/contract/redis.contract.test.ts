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
    const srv = await server;
    const subject = await redisContractSubject(
      { kind: 'standalone', server: srv },
      // Per command: far above the cancellation tests' scaled settle bound, so that only a backend
      // that honours the signal passes them, and a 32 MiB value on a busy machine is no timeout.
      { timeoutMs: 20_000, reconnectMaxDelayMs: 100, maxChunkBytes: 40 * 1024 * 1024 },
    );
    // A frozen redis-server (SIGSTOP) keeps its connections and answers nothing.
    let stalled = false;
    return {
      ...subject,
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
        await subject.cleanup();
      },
    };
  },
  { downTimeoutMs: 3000 },
);
