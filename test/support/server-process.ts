/**
 * A lookup server for cross-process tests, run as its own process:
 *
 *     node --import tsx test/support/server-process.ts
 *
 * Tiers: LocalCPU ('cpu', 64 MiB) and a GatedBackend ('gated', gate closed). It binds
 * `tcp://127.0.0.1:*` and prints `ready <endpoint>` on stdout, then reads commands, one per line,
 * on stdin and prints `ok <command>` once each is done:
 *
 * - `open` / `close`: opens or closes the gate of the lower tier;
 * - `clear-cpu`: drops every chunk from the CPU tier only (the lower tier keeps its copies);
 * - `flush`: waits until the write-through queue is idle (puts have reached the lower tier);
 * - `waiting <n>`: waits until at least n calls are held at the gate.
 *
 * An unknown command prints `error <command>`. Closing stdin or SIGTERM closes the server and
 * the storage, then exits 0.
 */
import { createInterface } from 'node:readline';
import { createTestStack } from './fixtures.ts';

const stack = await createTestStack();
process.stdout.write(`ready ${stack.server.endpoint}\n`);

let stopping: Promise<void> | undefined;
function shutdown(): Promise<void> {
  stopping ??= stack.close().then(() => process.exit(0));
  return stopping;
}
process.once('SIGTERM', () => void shutdown());

async function run(cmd: string): Promise<boolean> {
  const [name, arg] = cmd.split(' ');
  switch (name) {
    case 'open':
      stack.gated.gate.open();
      return true;
    case 'close':
      stack.gated.gate.close();
      return true;
    case 'clear-cpu':
      await stack.cpu.clear();
      return true;
    case 'flush':
      await stack.storage.writeQueue.idle();
      return true;
    case 'waiting': {
      const n = Number(arg);
      if (!Number.isInteger(n) || n < 1) return false;
      await stack.gated.gate.whenWaiting(n);
      return true;
    }
    default:
      return false;
  }
}

const lines = createInterface({ input: process.stdin });
lines.on('line', (line) => {
  const cmd = line.trim();
  if (cmd === '') return;
  run(cmd).then(
    (ok) => process.stdout.write(`${ok ? 'ok' : 'error'} ${cmd}\n`),
    (err: unknown) => process.stdout.write(`error ${cmd}: ${(err as Error).message}\n`),
  );
});
lines.on('close', () => void shutdown());
