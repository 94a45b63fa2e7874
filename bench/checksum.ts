/**
 * Payload checksum candidates for the stored chunk format (docs/storage-format.md), each against
 * memcpy of the same bytes (Buffer.copy into a preallocated buffer) measured in the same run.
 *   npm run bench:checksum            (KVTIER_BENCH_QUICK=1 for a short run)
 * Prints a table and writes bench/results/checksum.json.
 */
import { randomFillSync } from 'node:crypto';
import { cpus } from 'node:os';
import { crc32 } from 'node:zlib';
import xxhash from 'xxhash-wasm';
import {
  CHUNK_HEADER_BYTES,
  chunkPayloadChecksum,
  decodeChunkObject,
  encodeChunkObject,
  encodeChunkObjectInto,
} from '../src/backends/chunk-format.ts';
import { chunkHash } from '../src/hashing/chunk-hash.ts';
import { printTable, writeResults } from './support/child.ts';

const QUICK = process.env.KVTIER_BENCH_QUICK === '1';
const MiB = 1024 * 1024;
const SIZES = [2 * MiB, 32 * MiB];
/** Bytes processed per trial and method; the median of TRIALS trials is reported. */
const BYTES_PER_TRIAL = (QUICK ? 256 : 1024) * MiB;
const TRIALS = QUICK ? 3 : 7;
const NS = 'b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0';
const HASH = chunkHash('c1'.repeat(32));
/** The 10% budget: a checksum may cost a tier at most this share of its throughput. */
const BUDGET = 0.1;
/**
 * Raw tier rates in GB/s from /work/shared/design.md "Numbers measured", for the cost column:
 * not measured here (bench:tiers measures the tiers themselves).
 */
const TIER_RATES: readonly { tier: string; gbps: number }[] = [
  { tier: 'Redis GET/SET', gbps: 0.5 },
  { tier: 'disk durable write', gbps: 0.6 },
  { tier: 'disk cold read', gbps: 0.9 },
  { tier: 'disk warm read', gbps: 10 },
];

let sink = 0;

function gbps(bytes: number, ms: number): number {
  return bytes / (ms / 1000) / 1e9;
}

/** Median GB/s of `fn` over the trials, each processing about BYTES_PER_TRIAL bytes. */
function measure(size: number, fn: () => void): number {
  const reps = Math.max(4, Math.round(BYTES_PER_TRIAL / size));
  for (let i = 0; i < 2; i++) fn();
  const rates: number[] = [];
  for (let t = 0; t < TRIALS; t++) {
    const t0 = performance.now();
    for (let i = 0; i < reps; i++) fn();
    rates.push(gbps(size * reps, performance.now() - t0));
  }
  rates.sort((a, b) => a - b);
  return rates[Math.floor(rates.length / 2)]!;
}

/** Share of a tier's throughput lost when every byte is also checksummed, one after the other. */
function serialCost(tierGbps: number, checksumGbps: number): number {
  return 1 - 1 / (1 + tierGbps / checksumGbps);
}

async function main(): Promise<void> {
  const xx = await xxhash();
  const results: Record<string, unknown>[] = [];
  for (const size of SIZES) {
    const src = randomFillSync(Buffer.allocUnsafe(size));
    const dst = Buffer.allocUnsafe(size);
    const objDst = Buffer.allocUnsafe(size + CHUNK_HEADER_BYTES);
    const obj = encodeChunkObject(NS, HASH, { tokens: 256, data: src });
    const memcpy = measure(size, () => {
      sink ^= src.copy(dst);
    });
    const candidates: { method: string; run: () => void }[] = [
      {
        method: 'crc32 (zlib)',
        run: () => {
          sink ^= crc32(src);
        },
      },
      {
        method: 'xxh64 one-shot',
        run: () => {
          sink ^= Number(xx.h64Raw(src) & 0xffn);
        },
      },
      {
        method: 'xxh64 sliced (used)',
        run: () => {
          sink ^= Number(chunkPayloadChecksum(src) & 0xffn);
        },
      },
      {
        method: 'decodeChunkObject',
        run: () => {
          const r = decodeChunkObject(NS, HASH, obj);
          if (!r.ok) throw new Error(`bench: decode failed (${r.reason})`);
          sink ^= r.chunk.data.byteLength;
        },
      },
      {
        method: 'encodeChunkObject',
        run: () => {
          sink ^= encodeChunkObject(NS, HASH, { tokens: 256, data: src }).length;
        },
      },
      {
        method: 'encodeChunkObjectInto',
        run: () => {
          sink ^= encodeChunkObjectInto(objDst, NS, HASH, { tokens: 256, data: src });
        },
      },
    ];
    results.push({ sizeBytes: size, method: 'memcpy', gbps: memcpy, ratioToMemcpy: 1 });
    for (const c of candidates) {
      const rate = measure(size, c.run);
      results.push({
        sizeBytes: size,
        method: c.method,
        gbps: rate,
        ratioToMemcpy: rate / memcpy,
        serialCostByTier: Object.fromEntries(
          TIER_RATES.map((t) => [t.tier, serialCost(t.gbps, rate)]),
        ),
      });
    }
  }

  const f = (x: unknown, d = 2) => (x as number).toFixed(d);
  console.log(`\nPayload checksum throughput (median of ${TRIALS} trials, GB/s = 1e9 B/s)`);
  printTable(
    ['size', 'method', 'GB/s', 'vs memcpy'],
    results.map((r) => [
      `${(r.sizeBytes as number) / MiB} MiB`,
      r.method as string,
      f(r.gbps),
      f(r.ratioToMemcpy),
    ]),
  );
  const used = results.filter((r) => r.method === 'xxh64 sliced (used)');
  console.log(
    `\nThroughput a tier loses to the used checksum when it runs serially (target <= ${BUDGET * 100}%;` +
      '\ntier rates are the reference numbers in design.md, not measured here)',
  );
  printTable(
    ['size', ...TIER_RATES.map((t) => `${t.tier} ${t.gbps} GB/s`)],
    used.map((r) => {
      const cost = r.serialCostByTier as Record<string, number>;
      return [
        `${(r.sizeBytes as number) / MiB} MiB`,
        ...TIER_RATES.map((t) => `${f((cost[t.tier] ?? 0) * 100, 1)}%`),
      ];
    }),
  );
  const out = {
    bench: 'checksum',
    date: new Date().toISOString(),
    machine: { cpus: cpus().length, model: cpus()[0]?.model, node: process.version },
    quick: QUICK,
    trials: TRIALS,
    bytesPerTrial: BYTES_PER_TRIAL,
    headerBytes: CHUNK_HEADER_BYTES,
    budget: BUDGET,
    tierRatesGbps: TIER_RATES,
    results,
    sink,
  };
  await writeResults('checksum.json', out);
  console.log('\nwrote bench/results/checksum.json');
}

await main();
