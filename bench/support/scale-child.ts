/**
 * One bench:scale measurement in a fresh process (run with --expose-gc): opens the local-disk
 * tier over a store, times start to ready and to a complete index, measures memory per chunk,
 * times 16-chunk lookups, churns (puts of new chunks at the bound, each evicting one) for a
 * while and measures memory again, then closes (which leaves the journal for the next start).
 * Memory is the growth of RSS, and of V8 heap plus external memory (typed arrays), from before
 * the open, each after two full garbage collections.
 * Argument: a JSON object {dir, n, churnMs, lookups}; prints `result <json>`.
 */
import { performance } from 'node:perf_hooks';
import { LocalDiskBackend } from '../../src/backends/local-disk/local-disk-backend.ts';
import type { ChunkHash } from '../../src/hashing/chunk-hash.ts';
import { nativeSlabAllocator } from '../../src/native/host-slabs.ts';
import { percentile } from './child.ts';
import {
  SCALE_NS,
  SCALE_OBJECT_BYTES,
  sampleStoredHashes,
  scaleChunk,
  scaleHash,
} from './scale-store.ts';

interface Args {
  dir: string;
  n: number;
  churnMs: number;
  lookups: number;
}

const LOOKUP_CHUNKS = 16;
const WARMUP = 2000;
const CHURN_IN_FLIGHT = 8;
/** KVTIER_BENCH_SCALE_NATIVE_INDEX=0: the index in Node's own memory even with the addon built. */
const INDEX_MEMORY =
  process.env.KVTIER_BENCH_SCALE_NATIVE_INDEX === '0' ? undefined : nativeSlabAllocator();

function gc(): void {
  const g = (globalThis as { gc?: () => void }).gc;
  if (g === undefined) throw new Error('scale-child needs --expose-gc');
  g();
  g();
}

function memory() {
  gc();
  const m = process.memoryUsage();
  return { rss: m.rss, heap: m.heapUsed + m.external };
}

async function main(): Promise<void> {
  const a = JSON.parse(process.argv[2] ?? '{}') as Args;
  const m0 = memory();
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  const b = await LocalDiskBackend.open(
    {
      path: a.dir,
      capacityBytes: a.n * SCALE_OBJECT_BYTES,
      fsync: 'none',
      maxChunks: Math.max(a.n, 1 << 20),
      // As the sidecar opens the tier: the index's large arrays on the native addon's slabs.
      ...(INDEX_MEMORY !== undefined ? { allocateIndexMemory: INDEX_MEMORY } : {}),
    },
    { name: 'disk' },
  );
  const readyMs = performance.now() - t0;
  // CPU time of this process meanwhile (all its threads): less swayed by a busy machine.
  const cpu = process.cpuUsage(c0);
  const readyCpuMs = (cpu.user + cpu.system) / 1000;
  const chunksAtReady = b.stats().chunks;
  const scan = await b.indexed();
  const indexedMs = performance.now() - t0;
  const m1 = memory();
  const chunks = b.stats().chunks;

  // Lookups of chunks that are there, 16 random ones each.
  const shards = Math.max(1, Math.min(256, Math.ceil((20_000 * 256) / a.n)));
  const sample = sampleStoredHashes(a.dir, shards);
  const pick = (): ChunkHash[] =>
    Array.from({ length: LOOKUP_CHUNKS }, () => sample[Math.floor(Math.random() * sample.length)]!);
  const queries = Array.from({ length: a.lookups }, pick);
  for (let i = 0; i < WARMUP; i++) await b.batchedContains(SCALE_NS, queries[i % queries.length]!);
  const times: number[] = [];
  let hits = 0;
  for (const q of queries) {
    // Fresh strings, as a lookup's hashes are (decoded from the request just before).
    const fresh = q.map((h) => Buffer.from(h, 'hex').toString('hex') as ChunkHash);
    const t = performance.now();
    hits += await b.batchedContains(SCALE_NS, fresh);
    times.push((performance.now() - t) * 1000);
  }
  times.sort((x, y) => x - y);
  if (hits !== a.lookups * LOOKUP_CHUNKS) throw new Error(`lookups found ${hits} chunks`);

  // Churn: new chunks at the bound, each put evicting the least recently used one.
  let puts = 0;
  let dropped = 0;
  const gen = Date.now();
  const end = performance.now() + a.churnMs;
  await Promise.all(
    Array.from({ length: a.churnMs > 0 ? CHURN_IN_FLIGHT : 0 }, async () => {
      while (performance.now() < end) {
        const k = puts++;
        if ((await b.put(SCALE_NS, scaleHash(k, gen), scaleChunk(k))) === 'dropped') dropped++;
      }
    }),
  );
  const m2 = memory();
  const after = b.stats();
  const tc = performance.now();
  await b.close();
  const closeMs = performance.now() - tc;
  const out = {
    n: a.n,
    readyMs,
    readyCpuMs,
    chunksAtReady,
    indexedMs,
    scan,
    chunks,
    rssDelta: m1.rss - m0.rss,
    heapDelta: m1.heap - m0.heap,
    lookupChunks: LOOKUP_CHUNKS,
    lookups: a.lookups,
    lookupP50Us: percentile(times, 50),
    lookupP99Us: percentile(times, 99),
    churnMs: a.churnMs,
    churnPuts: puts,
    churnDropped: dropped,
    chunksAfterChurn: after.chunks,
    evictions: after.evictions,
    rssDeltaAfterChurn: m2.rss - m0.rss,
    heapDeltaAfterChurn: m2.heap - m0.heap,
    closeMs,
  };
  console.log(`result ${JSON.stringify(out)}`);
}

await main();
