/**
 * Lookup round trip and throughput against a kvtier sidecar in another process, compared with a
 * raw ZMQ DEALER/ROUTER echo of messages of the same size measured in the same run.
 *   npm run bench:lookup            (KVTIER_BENCH_QUICK=1 for a short run)
 * Prints a table and writes bench/results/lookup.json.
 */
import { randomBytes } from 'node:crypto';
import { cpus, loadavg } from 'node:os';
import * as zmq from 'zeromq';
import { LookupClient } from '../src/lookup-client/lookup-client.ts';
import { encodeRequest } from '../src/protocol/codec.ts';
import { percentile, printTable, spawnReady, stopChild, writeResults } from './support/child.ts';
import { childLoopStalls } from './support/loop-stall.ts';

const QUICK = process.env.KVTIER_BENCH_QUICK === '1';
const NS = 'b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0';
const SIZES = [16, 128, 512];
const RTT_SAMPLES = QUICK ? 500 : 5000;
/**
 * Untimed round trips before each timed series, the echo's and the lookup's alike: enough for V8
 * to optimise the sidecar's lookup path (with 200, the first series' p99 was mostly the
 * sidecar's JIT tiering up) and for the lookup registry (4096 lookups) to fill, so the series
 * measures the steady state a long-running sidecar serves in.
 */
const RTT_WARMUP = 5000;
const THROUGHPUT_LOOKUPS = QUICK ? 5000 : 50_000;
const INFLIGHT = [8, 64];
const here = new URL('.', import.meta.url).pathname;
// Children run the same build as this file: compiled JS under dist/, or TypeScript via tsx.
const ext = import.meta.url.endsWith('.ts') ? '.ts' : '.js';

function randomHashes(n: number): Buffer {
  return randomBytes(n * 32);
}

/** A minimal DEALER echo client: one socket, one send at a time, replies matched by arrival. */
class EchoClient {
  readonly sock = new zmq.Dealer({
    linger: 0,
    sendHighWaterMark: 100_000,
    receiveHighWaterMark: 100_000,
  });
  readonly #waiters: (() => void)[] = [];
  #sending: Promise<void> = Promise.resolve();
  constructor(endpoint: string) {
    this.sock.connect(endpoint);
    void (async () => {
      for await (const _ of this.sock) this.#waiters.shift()?.();
    })().catch(() => {});
  }
  roundTrip(msg: Buffer): Promise<void> {
    const done = new Promise<void>((r) => this.#waiters.push(r));
    this.#sending = this.#sending.then(() => this.sock.send(msg));
    return done;
  }
}

async function rttLoop(n: number, once: () => Promise<void>): Promise<number[]> {
  for (let i = 0; i < RTT_WARMUP; i++) await once();
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = process.hrtime.bigint();
    await once();
    out.push(Number(process.hrtime.bigint() - t0) / 1000);
  }
  return out.sort((a, b) => a - b);
}

async function throughput(
  total: number,
  inflight: number,
  once: (i: number) => Promise<void>,
): Promise<number> {
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: inflight }, async () => {
      while (next < total) await once(next++);
    }),
  );
  return total / ((performance.now() - t0) / 1000);
}

async function main(): Promise<void> {
  const stalls = childLoopStalls();
  const server = await spawnReady(`${here}support/lookup-server-child${ext}`);
  const echo = await spawnReady(`${here}support/echo-child${ext}`);
  const client = new LookupClient({
    endpoint: server.endpoint,
    namespaces: [NS],
    lookupTimeoutMs: 30_000,
  });
  const echoClient = new EchoClient(echo.endpoint);
  const payload = randomBytes(1024);
  const results: Record<string, unknown>[] = [];
  try {
    const prompts = new Map<number, { hashes: Buffer; counts: number[] }>();
    for (const n of SIZES) {
      const hashes = randomHashes(n);
      const counts = Array(n).fill(256);
      for (let i = 0; i < n; i++) {
        const outcome = await client.put(
          NS,
          hashes.toString('hex', i * 32, (i + 1) * 32),
          256,
          payload,
        );
        if (outcome === 'dropped') throw new Error('bench setup: put dropped');
      }
      prompts.set(n, { hashes, counts });
    }
    let seq = 0;
    const lookupOnce = (n: number) => async () => {
      const p = prompts.get(n)!;
      const a = await client.lookupAsync(`bench-${seq++}`, p.hashes, p.counts);
      if (a.hitChunks !== n)
        throw new Error(`expected ${n} hits, got ${a.hitChunks} (${a.status})`);
    };
    const requestSize = (n: number) => {
      const p = prompts.get(n)!;
      return encodeRequest({
        type: 'lookup',
        requestId: 1,
        lookupId: 'bench-000000',
        namespaces: [NS],
        hashes: p.hashes,
        tokenCounts: Uint32Array.from(p.counts),
        config: {},
      });
    };

    for (const n of SIZES) {
      const msg = requestSize(n);
      const raw = await rttLoop(RTT_SAMPLES, () => echoClient.roundTrip(msg));
      const kv = await rttLoop(RTT_SAMPLES, lookupOnce(n));
      results.push({
        kind: 'rtt',
        chunks: n,
        messageBytes: msg.length,
        lookupP50Us: percentile(kv, 50),
        lookupP99Us: percentile(kv, 99),
        echoP50Us: percentile(raw, 50),
        echoP99Us: percentile(raw, 99),
        p50Ratio: percentile(kv, 50) / percentile(raw, 50),
      });
    }
    for (const inflight of INFLIGHT) {
      const msg = requestSize(16);
      const rawRate = await throughput(THROUGHPUT_LOOKUPS, inflight, () =>
        echoClient.roundTrip(msg),
      );
      const p = prompts.get(16)!;
      const kvRate = await throughput(THROUGHPUT_LOOKUPS, inflight, async (i) => {
        const a = await client.lookupAsync(`tp-${inflight}-${i}`, p.hashes, p.counts);
        if (a.hitChunks !== 16) throw new Error(`expected 16 hits, got ${a.hitChunks}`);
      });
      results.push({
        kind: 'throughput',
        chunks: 16,
        inflight,
        lookupsPerSec: kvRate,
        echoPerSec: rawRate,
        ratio: kvRate / rawRate,
      });
    }
  } finally {
    await client.close();
    echoClient.sock.close();
    await stopChild(server.child);
    await stopChild(echo.child);
  }

  const watched = stalls.collect();
  const sidecarLoopStallMs = Math.max(0, ...watched.map((s) => s.maxMs));
  // The part of a stall the sidecar caused itself (its main thread on a CPU the whole time), and
  // how long it waited for a core in all: on a busy machine most of a long stall is waiting.
  const onCpu = watched.map((s) => s.maxOnCpuMs).filter((v) => v !== null);
  const waits = watched.map((s) => s.runqueueWaitMs).filter((v) => v !== null);
  const sidecarLoopStallOnCpuMs = onCpu.length > 0 ? Math.max(...onCpu) : null;
  const sidecarRunqueueWaitMs = waits.length > 0 ? waits.reduce((a, b) => a + b, 0) : null;
  console.log(`\nSidecar event-loop stall (max over the run): ${sidecarLoopStallMs.toFixed(2)} ms`);
  if (sidecarLoopStallOnCpuMs !== null)
    console.log(
      `  longest on a CPU (its own work or a synchronous collection): ${sidecarLoopStallOnCpuMs.toFixed(2)} ms; waited for a core: ${(sidecarRunqueueWaitMs! / 1000).toFixed(2)} s in all (load average ${loadavg()[0]!.toFixed(2)})`,
    );
  const rtt = results.filter((r) => r.kind === 'rtt');
  const tp = results.filter((r) => r.kind === 'throughput');
  const f = (x: unknown, d = 0) => (x as number).toFixed(d);
  console.log('\nLookup round trip, one request in flight (µs)');
  printTable(
    [
      'chunks',
      'msg bytes',
      'lookup p50',
      'lookup p99',
      'echo p50',
      'echo p99',
      'p50 ratio',
      'target',
    ],
    rtt.map((r) => [
      f(r.chunks),
      f(r.messageBytes),
      f(r.lookupP50Us),
      f(r.lookupP99Us),
      f(r.echoP50Us),
      f(r.echoP99Us),
      f(r.p50Ratio, 2),
      '<= 1.50',
    ]),
  );
  console.log('\nLookup throughput, 16-chunk lookups (all CPU hits)');
  printTable(
    ['in flight', 'lookups/s', 'echo msgs/s', 'ratio', 'target'],
    tp.map((r) => [
      f(r.inflight),
      f(r.lookupsPerSec),
      f(r.echoPerSec),
      f(r.ratio, 2),
      r.inflight === 64 ? '>= 20000/s' : '-',
    ]),
  );
  const out = {
    bench: 'lookup',
    date: new Date().toISOString(),
    machine: { cpus: cpus().length, model: cpus()[0]?.model, node: process.version },
    quick: QUICK,
    samples: { rtt: RTT_SAMPLES, throughput: THROUGHPUT_LOOKUPS },
    loadAverage: loadavg()[0],
    sidecarLoopStallMs,
    sidecarLoopStallOnCpuMs,
    sidecarRunqueueWaitMs,
    results,
  };
  await writeResults('lookup.json', out);
  console.log('\nwrote bench/results/lookup.json');
}

await main();
