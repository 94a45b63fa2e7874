/**
 * Payload checksums of the stored chunk format (docs/storage-format.md), each against memcpy of
 * the same bytes (Buffer.copy into a preallocated buffer) measured in the same run: CRC-32C in
 * the native addon (on this thread and on the libuv pool), in JavaScript, XXH64 in WebAssembly
 * (format version 1), zlib's CRC-32, and the encode/decode calls the backends make. Besides GB/s,
 * the event-loop stall while each runs back to back: monitorEventLoopDelay's max (1 ms
 * resolution) minus the resolution.
 *   npm run bench:checksum            (KVTIER_BENCH_QUICK=1 for a short run)
 * Prints a table and writes bench/results/checksum.json.
 */
import { randomFillSync } from 'node:crypto';
import { cpus } from 'node:os';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { setImmediate as turn } from 'node:timers/promises';
import { crc32 } from 'node:zlib';
import { CHECKSUM_XXH64, crc32cEngine, payloadChecksum } from '../src/backends/format/checksum.ts';
import {
  CHUNK_HEADER_BYTES,
  decodeChunkObjectAsync,
  encodeChunkObject,
  encodeChunkObjectIntoAsync,
} from '../src/backends/format/chunk-format.ts';
import { chunkHash } from '../src/hashing/chunk-hash.ts';
import { loadNative } from '../src/native/native-addon.ts';
import { crc32c } from '../src/util/crc32c.ts';
import { printTable, writeResults } from './support/child.ts';

const QUICK = process.env.KVTIER_BENCH_QUICK === '1';
const MiB = 1024 * 1024;
const SIZES = [2 * MiB, 32 * MiB];
/** Bytes processed per round and method. */
const BYTES_PER_ROUND = (QUICK ? 128 : 512) * MiB;
/** Rounds per figure: the median is reported with min and max. */
const ROUNDS = Math.max(5, Number(process.env.KVTIER_BENCH_ROUNDS ?? 5));
/** Calls per method while the event-loop stall is watched. */
const STALL_CALLS = QUICK ? 8 : 24;
const NS = 'b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0';
/** The slice the file tiers' native reads checksum at once (native-cuda/src/file_io.cc). */
const SLICE_BYTES = 256 * 1024;
const HASH = chunkHash('c1'.repeat(32));

let sink = 0;

interface Stat {
  median: number;
  min: number;
  max: number;
}

function stat(xs: number[]): Stat {
  const s = [...xs].sort((a, b) => a - b);
  return { median: s[Math.floor(s.length / 2)]!, min: s[0]!, max: s[s.length - 1]! };
}

interface Method {
  name: string;
  /** One call over the payload; a promise when it runs off this thread. */
  run: () => undefined | Promise<unknown>;
}

/** GB/s per round, ROUNDS rounds of about BYTES_PER_ROUND bytes each. */
async function rates(size: number, m: Method): Promise<number[]> {
  const reps = Math.max(4, Math.round(BYTES_PER_ROUND / size));
  for (let i = 0; i < 2; i++) await m.run();
  const out: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    const t0 = performance.now();
    for (let i = 0; i < reps; i++) {
      const p = m.run();
      if (p !== undefined) await p;
    }
    out.push((size * reps) / ((performance.now() - t0) / 1000) / 1e9);
  }
  return out;
}

/**
 * Longest event-loop stall (ms) per round while the method runs STALL_CALLS times a round,
 * yielding in between. On a shared machine a round's max also catches preemption and GC, hence
 * the median over rounds.
 */
async function stallsMs(m: Method): Promise<number[]> {
  const out: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    const h = monitorEventLoopDelay({ resolution: 1 });
    h.enable();
    for (let i = 0; i < STALL_CALLS; i++) {
      await m.run();
      await turn();
    }
    h.disable();
    out.push(Math.max(0, h.max / 1e6 - 1));
  }
  return out;
}

async function main(): Promise<void> {
  const native = loadNative().addon;
  const results: Record<string, unknown>[] = [];
  for (const size of SIZES) {
    const src = randomFillSync(Buffer.allocUnsafe(size));
    const dst = Buffer.allocUnsafe(size);
    const objDst = Buffer.allocUnsafe(size + CHUNK_HEADER_BYTES);
    const obj = encodeChunkObject(NS, HASH, { tokens: 256, data: src });
    const methods: Method[] = [
      {
        name: 'memcpy',
        run: () => {
          sink ^= src.copy(dst);
        },
      },
      ...(native === null
        ? []
        : ([
            {
              name: 'crc32c native, this thread',
              run: () => {
                sink ^= native.crc32c(src);
              },
            },
            {
              // As the file tiers' reads call it: each 256 KiB slice right after reading it.
              name: 'crc32c native, 256 KiB calls',
              run: () => {
                let c = 0;
                for (let at = 0; at < size; at += SLICE_BYTES) {
                  c = native.crc32c(src.subarray(at, at + SLICE_BYTES), c);
                }
                sink ^= c;
              },
            },
            {
              name: 'crc32c native, libuv pool',
              run: () =>
                native.crc32cAsync(src).then((c) => {
                  sink ^= c;
                }),
            },
          ] satisfies Method[])),
      {
        name: 'crc32c JavaScript',
        run: () => {
          sink ^= crc32c(src);
        },
      },
      {
        name: 'xxh64 wasm (format v1)',
        run: () => {
          sink ^= Number(payloadChecksum(CHECKSUM_XXH64, src) & 0xffn);
        },
      },
      {
        name: 'crc32 zlib',
        run: () => {
          sink ^= crc32(src);
        },
      },
      {
        name: 'decodeChunkObjectAsync',
        run: () =>
          decodeChunkObjectAsync(NS, HASH, obj).then((r) => {
            if (!r.ok) throw new Error(`bench: decode failed (${r.reason})`);
          }),
      },
      {
        name: 'encodeChunkObjectIntoAsync',
        run: () => encodeChunkObjectIntoAsync(objDst, NS, HASH, { tokens: 256, data: src }),
      },
    ];
    // memcpy is measured next to every method, so that each ratio compares one moment.
    for (const m of methods) {
      const mc = stat(await rates(size, methods[0]!));
      const gb = m === methods[0] ? mc : stat(await rates(size, m));
      results.push({
        sizeBytes: size,
        method: m.name,
        gbps: gb,
        memcpyGbps: mc,
        ratioToMemcpy: gb.median / mc.median,
        stallMs: stat(await stallsMs(m)),
      });
    }
  }

  const f = (x: number, d = 2) => x.toFixed(d);
  const engine = crc32cEngine();
  console.log(
    `\nPayload checksums (GB/s = 1e9 B/s, median [min-max] of ${ROUNDS} rounds; CRC-32C engine: ` +
      `${engine.engine}${engine.hardware ? ', CPU instructions' : ''}; stall = event-loop delay max - 1 ms, per round)`,
  );
  printTable(
    ['size', 'method', 'GB/s', 'min-max', 'memcpy GB/s', 'vs memcpy', 'stall ms', 'min-max'],
    results.map((r) => {
      const g = r.gbps as Stat;
      return [
        `${(r.sizeBytes as number) / MiB} MiB`,
        r.method as string,
        f(g.median),
        `${f(g.min)}-${f(g.max)}`,
        f((r.memcpyGbps as Stat).median),
        f(r.ratioToMemcpy as number),
        f((r.stallMs as Stat).median),
        `${f((r.stallMs as Stat).min)}-${f((r.stallMs as Stat).max)}`,
      ];
    }),
  );
  const file = await writeResults('checksum.json', {
    bench: 'checksum',
    date: new Date().toISOString(),
    machine: { cpus: cpus().length, model: cpus()[0]?.model, node: process.version },
    quick: QUICK,
    rounds: ROUNDS,
    bytesPerRound: BYTES_PER_ROUND,
    crc32c: engine,
    results,
    sink,
  });
  console.log(`\nwrote ${file}`);
}

await main();
