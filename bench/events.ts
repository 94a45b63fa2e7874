/**
 * The event stream's publish path against the raw limit of its socket, in one run:
 * - raw ZMQ: pre-encoded `[topic, seq, payload]` messages of the size a batch encodes to, sent on
 *   a PUB socket like the stream's (send timeout 0, one send queue) to a SUB socket;
 * - publish: chunk reports into the {@link EventPublisher}'s log, each batch sealed (encoded as
 *   msgpack) and published on the same kind of socket to the same kind of subscriber;
 * - encode only: the same batches sealed by an {@link EventLog} with no socket, for the
 *   encoding's share.
 * Two batch shapes: a save of 16 chunks written to two tiers (two `stored` events of 16 hashes
 * each) and a full batch (4096 hashes, one event). Messages go in bursts of BURST; each burst
 * is waited for at the subscriber (no message may be dropped). The subscriber counts messages
 * and does not decode them.
 *   npm run bench:events    (KVTIER_BENCH_QUICK=1 for a short run)
 * Prints a table with each rate's ratio to the raw limit and writes bench/results/events.json.
 */
import { randomBytes } from 'node:crypto';
import * as zmq from 'zeromq';
import type { ChunkHash, NamespaceId } from '../src/backends/core/types.ts';
import { EventLog } from '../src/event-stream/event-log.ts';
import { EventPublisher } from '../src/event-stream/event-publisher.ts';
import type { EventTier } from '../src/event-stream/event-types.ts';
import { SocketSendQueue } from '../src/protocol/send-queue.ts';
import { printTable, writeResults } from './support/child.ts';

const QUICK = process.env.KVTIER_BENCH_QUICK === '1';
const TRIALS = QUICK ? 3 : 7;
const BURST = 256;
const NS = randomBytes(16).toString('hex') as NamespaceId;
const CPU: EventTier = { name: 'cpu', medium: 'CPU' };
const REDIS: EventTier = { name: 'redis', medium: 'SHARED' };

interface Shape {
  readonly name: string;
  /** Batches per trial. */
  readonly batches: number;
  /** Reports one batch's chunks into `log` (`i`: the batch's index, for distinct hashes). */
  readonly report: (log: EventLog, i: number) => void;
  readonly eventsPerBatch: number;
  readonly hashesPerBatch: number;
}

function hashPool(n: number): ChunkHash[] {
  return Array.from({ length: n }, () => randomBytes(32).toString('hex') as ChunkHash);
}

const SAVE_POOL = hashPool(16 * 64);
const FULL_POOL = hashPool(4096 * 2);
const SHAPES: Shape[] = [
  {
    name: 'save: 16 chunks x 2 tiers',
    batches: QUICK ? 5_000 : 20_000,
    eventsPerBatch: 2,
    hashesPerBatch: 32,
    report(log, i) {
      const base = (i % 64) * 16;
      for (let k = 0; k < 16; k++) log.stored(CPU, NS, SAVE_POOL[base + k]!);
      for (let k = 0; k < 16; k++) log.stored(REDIS, NS, SAVE_POOL[base + k]!);
    },
  },
  {
    name: 'full batch: 4096 chunks',
    batches: QUICK ? 100 : 400,
    eventsPerBatch: 1,
    hashesPerBatch: 4096,
    report(log, i) {
      const base = (i % 2) * 4096;
      for (let k = 0; k < 4096; k++) log.stored(CPU, NS, FULL_POOL[base + k]!);
    },
  },
];

/** A SUB socket that counts what arrives; `until(n)` resolves once n messages have. */
class Counter {
  readonly sub = new zmq.Subscriber({ linger: 0, receiveHighWaterMark: 0 });
  received = 0;
  bytes = 0;
  #want = 0;
  #wake: (() => void) | undefined;
  readonly #loop: Promise<void>;

  constructor(endpoint: string) {
    this.sub.connect(endpoint);
    this.sub.subscribe();
    this.#loop = (async () => {
      try {
        for await (const frames of this.sub) {
          this.received++;
          this.bytes += frames[2]!.length;
          if (this.received >= this.#want) this.#wake?.();
        }
      } catch {
        // closed
      }
    })();
  }

  until(n: number): Promise<void> {
    this.#want = n;
    return this.received >= n ? Promise.resolve() : new Promise((r) => (this.#wake = r));
  }

  async close(): Promise<void> {
    this.sub.close();
    await this.#loop;
  }
}

/** Waits until a fresh subscriber sees messages (the slow joiner), then resets its count. */
async function connected(send: () => void, c: Counter): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (c.received === 0) {
    if (Date.now() > deadline) throw new Error('the subscriber never connected');
    send();
    await new Promise((r) => setTimeout(r, 20));
  }
  await new Promise((r) => setTimeout(r, 50));
  c.received = 0;
  c.bytes = 0;
}

/** Sends `batches` messages in bursts through `sendOne`; resolves seconds. */
async function drive(batches: number, c: Counter, sendOne: (i: number) => void): Promise<number> {
  const t0 = performance.now();
  for (let done = 0; done < batches; ) {
    const n = Math.min(BURST, batches - done);
    for (let k = 0; k < n; k++) sendOne(done + k);
    done += n;
    await c.until(done);
  }
  return (performance.now() - t0) / 1000;
}

/** One batch of the shape as it goes on the wire (for the raw case's message size). */
function samplePayload(shape: Shape): Buffer {
  let payload: Buffer | undefined;
  const log = new EventLog({ onBatch: (_s, p) => (payload = p), defer: () => {} });
  shape.report(log, 0);
  log.flush();
  return payload!;
}

async function rawTrial(shape: Shape): Promise<{ seconds: number; bytes: number }> {
  const pub = new zmq.Publisher({ linger: 0, sendTimeout: 0, sendHighWaterMark: 100_000 });
  await pub.bind('tcp://127.0.0.1:*');
  const q = new SocketSendQueue(pub, { immediate: true });
  const topic = Buffer.from('kvtier');
  const payload = samplePayload(shape);
  const seq = (i: number) => {
    const b = Buffer.allocUnsafe(8);
    b.writeBigUInt64BE(BigInt(i + 1));
    return b;
  };
  const c = new Counter(pub.lastEndpoint!);
  try {
    await connected(() => q.send([topic, seq(0), payload]), c);
    const seconds = await drive(shape.batches, c, (i) => q.send([topic, seq(i), payload]));
    if (q.dropped !== 0) throw new Error(`raw: ${q.dropped} messages dropped`);
    return { seconds, bytes: c.bytes };
  } finally {
    await c.close();
    pub.close();
  }
}

async function publishTrial(shape: Shape): Promise<{ seconds: number; bytes: number }> {
  const p = await EventPublisher.start({
    endpoint: 'tcp://127.0.0.1:*',
    replayEndpoint: null,
    topic: 'kvtier',
    bufferBatches: 10_000,
    bufferBytes: 16 * 1024 ** 2,
    sendHighWaterMark: 100_000,
    heartbeatMs: 0,
    snapshotScanMaxChunks: 0,
  });
  const c = new Counter(p.endpoint);
  try {
    await connected(() => {
      p.log.stored(CPU, NS, SAVE_POOL[0]!);
      p.log.flush();
    }, c);
    const seconds = await drive(shape.batches, c, (i) => {
      shape.report(p.log, i);
      p.log.flush();
    });
    if (p.sendDropped !== 0) throw new Error(`publish: ${p.sendDropped} messages dropped`);
    return { seconds, bytes: c.bytes };
  } finally {
    await c.close();
    await p.close();
  }
}

async function encodeTrial(shape: Shape): Promise<{ seconds: number; bytes: number }> {
  let bytes = 0;
  const log = new EventLog({
    bufferBatches: 16,
    onBatch: (_s, payload) => (bytes += payload.length),
    defer: () => {},
  });
  const t0 = performance.now();
  for (let i = 0; i < shape.batches; i++) {
    shape.report(log, i);
    log.flush();
  }
  return { seconds: (performance.now() - t0) / 1000, bytes };
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

const CASES: [string, (s: Shape) => Promise<{ seconds: number; bytes: number }>][] = [
  ['raw ZMQ, pre-encoded', rawTrial],
  ['publish (report, encode, send)', publishTrial],
  ['encode only (no socket)', encodeTrial],
];

interface Row {
  shape: string;
  path: string;
  batchesPerSec: number;
  eventsPerSec: number;
  hashesPerSec: number;
  mibPerSec: number;
  ratioToRaw: number;
}
const rows: Row[] = [];
for (const shape of SHAPES) {
  const rates = new Map<string, number[]>();
  const mib = new Map<string, number[]>();
  for (const [, fn] of CASES) await fn({ ...shape, batches: Math.ceil(shape.batches / 10) });
  // Trials interleaved across the paths: a noisy second on a shared machine hits them alike.
  for (let t = 0; t < TRIALS; t++) {
    for (const [path, fn] of CASES) {
      const { seconds, bytes } = await fn(shape);
      rates.set(path, [...(rates.get(path) ?? []), shape.batches / seconds]);
      mib.set(path, [...(mib.get(path) ?? []), bytes / 1024 ** 2 / seconds]);
    }
  }
  const raw = median(rates.get(CASES[0]![0])!);
  for (const [path] of CASES) {
    const r = median(rates.get(path)!);
    rows.push({
      shape: shape.name,
      path,
      batchesPerSec: Math.round(r),
      eventsPerSec: Math.round(r * shape.eventsPerBatch),
      hashesPerSec: Math.round(r * shape.hashesPerBatch),
      mibPerSec: Math.round(median(mib.get(path)!) * 10) / 10,
      ratioToRaw: Math.round((r / raw) * 100) / 100,
    });
  }
}
printTable(
  ['batch', 'path', 'batches/s', 'events/s', 'hashes/s', 'MiB/s', 'x raw'],
  rows.map((r) => [
    r.shape,
    r.path,
    r.batchesPerSec.toLocaleString('en-US'),
    r.eventsPerSec.toLocaleString('en-US'),
    r.hashesPerSec.toLocaleString('en-US'),
    r.mibPerSec.toFixed(1),
    r.ratioToRaw.toFixed(2),
  ]),
);
const file = await writeResults('events.json', {
  trials: TRIALS,
  burst: BURST,
  node: process.version,
  results: rows,
});
console.log(`wrote ${file}`);
