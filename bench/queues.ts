/**
 * The hand-made queues against p-queue and p-limit doing the same job, on the same fake I/O
 * (every send or put resolves at once, so what is measured is the queue's own cost):
 * - the socket send queue (one send at a time, FIFO, bounded depth, drop when full);
 * - the write-through queue (N puts at a time, bounded by chunks and by bytes, drop when full).
 * Work arrives in bursts of BURST items and the queue is drained after each burst.
 *   npm run build && node dist/bench/queues.js   (KVTIER_BENCH_QUICK=1 for a short run)
 * Prints a table and writes bench/results/queues.json.
 */
import pLimit from 'p-limit';
import PQueue from 'p-queue';
import type { Chunk, StorageBackend } from '../src/backends/core/types.ts';
import { chunkHash } from '../src/hashing/chunk-hash.ts';
import { SocketSendQueue } from '../src/protocol/send-queue.ts';
import { WriteThroughQueue } from '../src/storage-manager/write-through.ts';
import { printTable, writeResults } from './support/child.ts';

const QUICK = process.env.KVTIER_BENCH_QUICK === '1';
const ITEMS = QUICK ? 50_000 : 400_000;
const BURST = 512;
const TRIALS = QUICK ? 3 : 7;
const CONCURRENCY = 4;
const CHUNK: Chunk = { data: new Uint8Array(4096), tokens: 256 } as unknown as Chunk;
/** Any valid hash: the fake tier ignores it. */
const HASH = chunkHash('0'.repeat(64));

/** Runs `burst(n)` for ITEMS items in bursts; resolves items per second. */
async function rate(burst: (n: number) => Promise<void>): Promise<number> {
  const t0 = performance.now();
  for (let done = 0; done < ITEMS; done += BURST) await burst(Math.min(BURST, ITEMS - done));
  return ITEMS / ((performance.now() - t0) / 1000);
}

function fakeSocket() {
  let sent = 0;
  let wake: (() => void) | undefined;
  let want = 0;
  return {
    closed: false,
    send(_m: Buffer | Buffer[]): Promise<void> {
      sent++;
      if (sent >= want) wake?.();
      return Promise.resolve();
    },
    until(n: number): Promise<void> {
      want = n;
      return sent >= n ? Promise.resolve() : new Promise((r) => (wake = r));
    },
  };
}

const MSG = Buffer.alloc(64);

async function sendHandMade(): Promise<number> {
  const socket = fakeSocket();
  const q = new SocketSendQueue(socket, { maxDepth: 100_000 });
  let total = 0;
  return rate(async (n) => {
    for (let i = 0; i < n; i++) q.send(MSG);
    total += n;
    await socket.until(total);
  });
}

async function sendPQueue(): Promise<number> {
  const socket = fakeSocket();
  const q = new PQueue({ concurrency: 1 });
  let dropped = 0;
  const send = (m: Buffer) => {
    if (q.size >= 100_000) {
      dropped++;
      return false;
    }
    q.add(() => socket.send(m)).catch(() => dropped++);
    return true;
  };
  return rate(async (n) => {
    for (let i = 0; i < n; i++) send(MSG);
    await q.onIdle();
  });
}

function fakeTier(): StorageBackend {
  return { name: 'fake', put: () => Promise.resolve('stored') } as unknown as StorageBackend;
}

async function writeHandMade(): Promise<number> {
  const q = new WriteThroughQueue({
    maxChunks: 1024,
    maxBytes: 1024 ** 3,
    concurrency: CONCURRENCY,
  });
  const targets = [fakeTier()];
  return rate(async (n) => {
    for (let i = 0; i < n; i++)
      q.enqueue({ ns: 'n', hash: HASH, chunk: CHUNK, targets, done: () => {} });
    await q.idle();
  });
}

/** p-queue with the write-through queue's bounds and accounting around it. */
async function writePQueue(): Promise<number> {
  const q = new PQueue({ concurrency: CONCURRENCY });
  const targets = [fakeTier()];
  let bytes = 0;
  const enqueue = (chunk: Chunk, done: () => void) => {
    const size = chunk.data.length;
    if (q.size + q.pending >= 1024 || bytes + size > 1024 ** 3) return false;
    bytes += size;
    void q.add(async () => {
      try {
        await Promise.all(targets.map((t) => t.put('n', HASH, chunk).catch(() => 'dropped')));
      } finally {
        bytes -= size;
        done();
      }
    });
    return true;
  };
  return rate(async (n) => {
    for (let i = 0; i < n; i++) enqueue(CHUNK, () => {});
    await q.onIdle();
  });
}

/** p-limit likewise (it has no idle promise: the burst's promises are awaited). */
async function writePLimit(): Promise<number> {
  const limit = pLimit(CONCURRENCY);
  const targets = [fakeTier()];
  let bytes = 0;
  return rate(async (n) => {
    const all: Promise<void>[] = [];
    for (let i = 0; i < n; i++) {
      if (limit.activeCount + limit.pendingCount >= 1024 || bytes + CHUNK.data.length > 1024 ** 3)
        continue;
      bytes += CHUNK.data.length;
      all.push(
        limit(async () => {
          try {
            await Promise.all(targets.map((t) => t.put('n', HASH, CHUNK).catch(() => 'dropped')));
          } finally {
            bytes -= CHUNK.data.length;
          }
        }),
      );
    }
    await Promise.all(all);
  });
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

const cases: [string, string, () => Promise<number>][] = [
  ['send queue', 'hand-made SocketSendQueue', sendHandMade],
  ['send queue', 'p-queue (concurrency 1)', sendPQueue],
  ['write-through', 'hand-made WriteThroughQueue', writeHandMade],
  ['write-through', `p-queue (concurrency ${CONCURRENCY})`, writePQueue],
  ['write-through', `p-limit (${CONCURRENCY})`, writePLimit],
];
const results: { job: string; impl: string; itemsPerSec: number }[] = [];
for (const [, , fn] of cases) await fn(); // warm-up
for (const [job, impl, fn] of cases) {
  const trials: number[] = [];
  for (let t = 0; t < TRIALS; t++) trials.push(await fn());
  results.push({ job, impl, itemsPerSec: Math.round(median(trials)) });
}
printTable(
  ['job', 'implementation', 'items/s (median)'],
  results.map((r) => [r.job, r.impl, r.itemsPerSec.toLocaleString('en-US')]),
);
const file = await writeResults('queues.json', {
  items: ITEMS,
  burst: BURST,
  trials: TRIALS,
  node: process.version,
  results,
});
console.log(`wrote ${file}`);
