/**
 * Data-plane throughput on the host device with Llama-3-8B-shaped KV (32 layers, 8 KV heads,
 * head dim 128, bf16, block 16, chunk 256: 128 KiB per token, 32 MiB per chunk), against one
 * contiguous memcpy of the same bytes in the same run; and lookup latency while a load runs.
 *   npm run bench:dataplane        (KVTIER_BENCH_QUICK=1 moves 256 MiB instead of 1 GiB)
 * Prints a table and writes bench/results/dataplane.json.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes, randomFillSync } from 'node:crypto';
import { open, rm } from 'node:fs/promises';
import { cpus } from 'node:os';
import { createInterface } from 'node:readline';
import { LocalCpuBackend } from '../src/backends/local-cpu.ts';
import { DataPlane } from '../src/data-plane/data-plane.ts';
import { createFsCopyEngine } from '../src/data-plane/fs-copy-engine.ts';
import type { KvRegistration } from '../src/data-plane/kv-layout.ts';
import { LookupServer } from '../src/lookup-server/lookup-server.ts';
import { createNativeCopyEngine } from '../src/native/copy-engine.ts';
import { StorageManager } from '../src/storage-manager/storage-manager.ts';
import { percentile, printTable, writeResults } from './support/child.ts';

const QUICK = process.env.KVTIER_BENCH_QUICK === '1';
const MiB = 1024 * 1024;
const LAYERS = 32;
const BLOCK_TOKENS = 16;
const CHUNK_TOKENS = 256;
const BYTES_PER_TOKEN_PER_LAYER = 8 * 128 * 2; // K (and V) per token per layer
const BLOCK_BYTES = BLOCK_TOKENS * BYTES_PER_TOKEN_PER_LAYER; // 32 KiB
const CHUNK_BYTES = 2 * LAYERS * CHUNK_TOKENS * BYTES_PER_TOKEN_PER_LAYER; // 32 MiB
const CHUNKS = QUICK ? 8 : 32; // 256 MiB or 1 GiB moved each way
const BLOCKS_PER_CHUNK = CHUNK_TOKENS / BLOCK_TOKENS;
const REQUEST_BLOCKS = CHUNKS * BLOCKS_PER_CHUNK;
const NUM_BLOCKS = 2 * REQUEST_BLOCKS; // saved from the first half, loaded into the second
const REPEAT = QUICK ? 2 : 3;
const here = new URL('.', import.meta.url).pathname;
const ext = import.meta.url.endsWith('.ts') ? '.ts' : '.js';

function registration(path: string): KvRegistration {
  const region = NUM_BLOCKS * BLOCK_BYTES;
  return {
    engineId: 'bench-engine',
    device: 'host',
    modelId: 'meta-llama/Llama-3-8B',
    dtype: 'bfloat16',
    numKvHeads: 8,
    headDim: 128,
    tpSize: 1,
    tpRank: 0,
    mla: false,
    numBlocks: NUM_BLOCKS,
    blockSize: BLOCK_TOKENS,
    blockStrideBytes: BLOCK_BYTES,
    chunkSize: CHUNK_TOKENS,
    layers: Array.from({ length: LAYERS }, (_, l) => ({
      k: { path, offsetBytes: 2 * l * region },
      v: { path, offsetBytes: (2 * l + 1) * region },
    })),
  };
}

async function timed(fn: () => Promise<void>): Promise<number> {
  const t0 = performance.now();
  await fn();
  return performance.now() - t0;
}

/** A lookup client in another process that measures round trips until told to stop. */
async function startProber(
  endpoint: string,
  ns: string,
  hashes: string[],
): Promise<{ child: ChildProcess; collect: () => Promise<number[]> }> {
  const loader = ext === '.ts' ? ['--import', 'tsx'] : [];
  const child = spawn(
    process.execPath,
    [...loader, `${here}support/lookup-prober${ext}`, endpoint, ns, ...hashes],
    { stdio: ['pipe', 'pipe', 'inherit'] },
  );
  const rl = createInterface({ input: child.stdout! });
  const lines: string[] = [];
  let wake: (() => void) | undefined;
  rl.on('line', (l) => {
    lines.push(l);
    wake?.();
  });
  const next = async (prefix: string) => {
    for (;;) {
      const i = lines.findIndex((l) => l.startsWith(prefix));
      if (i >= 0) return lines.splice(i, 1)[0]!;
      await new Promise<void>((r) => {
        wake = r;
      });
    }
  };
  await next('ready');
  return {
    child,
    collect: async () => {
      child.stdin!.write('stop\n');
      const line = await next('latencies ');
      child.stdin!.end();
      return JSON.parse(line.slice('latencies '.length)) as number[];
    },
  };
}

async function main(): Promise<void> {
  const path = `/dev/shm/kvtier-bench-${process.pid}.kv`;
  const fileBytes = 2 * LAYERS * NUM_BLOCKS * BLOCK_BYTES;
  const fh = await open(path, 'w+');
  const fill = Buffer.allocUnsafe(64 * MiB);
  for (let off = 0; off < fileBytes; off += fill.length) {
    randomFillSync(fill);
    await fh.write(fill, 0, Math.min(fill.length, fileBytes - off), off);
  }
  await fh.close();

  const native = createNativeCopyEngine();
  const engine = native.engine ?? createFsCopyEngine();
  const engineName =
    native.engine !== null
      ? 'native (mmap + worker-thread memcpy)'
      : `fs fallback (${native.reason})`;
  const cpu = new LocalCpuBackend(
    { capacityBytes: (CHUNKS + 4) * CHUNK_BYTES + 64 * MiB, pageBytes: 2 * MiB },
    { name: 'cpu' },
  );
  const storage = new StorageManager({ tiers: [cpu], sweepIntervalMs: 0 });
  const dp = new DataPlane({ storage, copyEngine: engine, sweepIntervalMs: 0 });
  const server = new LookupServer({ endpoint: 'tcp://127.0.0.1:*', storage });
  await server.start();
  const rows: Record<string, unknown>[] = [];
  try {
    const layout = await dp.register(registration(path));
    const ns = layout.namespace.id;
    const saveBlocks = Array.from({ length: REQUEST_BLOCKS }, (_, i) => i);
    const loadBlocks = Array.from(
      { length: REQUEST_BLOCKS },
      (_, i) => REQUEST_BLOCKS + ((i * 7) % REQUEST_BLOCKS),
    );
    const moved = CHUNKS * CHUNK_BYTES;

    // Raw limit: one contiguous memcpy of the same number of bytes, warm buffers.
    const a = Buffer.allocUnsafeSlow(moved);
    const b = Buffer.allocUnsafeSlow(moved);
    a.fill(1);
    b.fill(2);
    let memcpyMs = Number.POSITIVE_INFINITY;
    for (let r = 0; r < REPEAT; r++)
      memcpyMs = Math.min(memcpyMs, await timed(async () => void a.copy(b)));

    let saveMs = Number.POSITIVE_INFINITY;
    let loadMs = Number.POSITIVE_INFINITY;
    let lat: number[] = [];
    for (let r = 0; r < REPEAT; r++) {
      const hashes = Array.from({ length: CHUNKS }, () => randomBytes(32));
      const hex = hashes.map((h) => h.toString('hex'));
      saveMs = Math.min(
        saveMs,
        await timed(async () => {
          const out = await dp.save({
            engineId: 'bench-engine',
            requestId: `s${r}`,
            blockIds: saveBlocks,
            chunkHashes: hex,
          });
          if (out.saved !== CHUNKS)
            throw new Error(`saved ${out.saved} of ${CHUNKS} chunks (${out.dropped} dropped)`);
        }),
      );
      const counts = Array<number>(CHUNKS).fill(CHUNK_TOKENS);
      const answer = await storage.lookup({
        lookupId: `l${r}`,
        namespaces: [ns],
        hashes: hex,
        tokenCounts: counts,
      });
      if (answer.hitChunks !== CHUNKS)
        throw new Error(`lookup found ${answer.hitChunks} of ${CHUNKS}`);
      // Lookups of a small prompt keep coming from another process while the big load runs.
      const probe = await startProber(server.endpoint, ns, hex.slice(0, 4));
      loadMs = Math.min(
        loadMs,
        await timed(async () => {
          const out = await dp.load({
            engineId: 'bench-engine',
            requestId: `l${r}`,
            lookupId: `l${r}`,
            blockIds: loadBlocks,
            chunkHashes: hex,
          });
          if (out.invalidBlockIds.length > 0)
            throw new Error(`${out.invalidBlockIds.length} blocks failed to load`);
        }),
      );
      lat = lat.concat(await probe.collect());
      await verify(path, saveBlocks, loadBlocks);
      await dp.requestFinished('bench-engine', `l${r}`);
      await cpu.clear();
    }
    lat.sort((x, y) => x - y);
    const gbs = (ms: number) => moved / (ms / 1000) / 1e9;
    rows.push({
      op: 'save (gather blocks → CPU tier)',
      bytes: moved,
      gbPerSec: gbs(saveMs),
      memcpyGbPerSec: gbs(memcpyMs),
      ratio: memcpyMs / saveMs,
    });
    rows.push({
      op: 'load (CPU tier → scatter blocks)',
      bytes: moved,
      gbPerSec: gbs(loadMs),
      memcpyGbPerSec: gbs(memcpyMs),
      ratio: memcpyMs / loadMs,
    });
    console.log(
      `\nData plane on the host device, ${moved / MiB} MiB each way, copy engine: ${engineName}; target ratio >= 0.80`,
    );
    printTable(
      ['op', 'GB/s', 'memcpy GB/s', 'ratio'],
      rows.map((r) => [
        String(r.op),
        (r.gbPerSec as number).toFixed(2),
        (r.memcpyGbPerSec as number).toFixed(2),
        (r.ratio as number).toFixed(2),
      ]),
    );
    const p99 = percentile(lat, 99);
    console.log(
      `\nLookup round trips during the loads: ${lat.length} samples, p50 ${(percentile(lat, 50) * 1000).toFixed(0)} µs, p99 ${(p99 * 1000).toFixed(0)} µs (target p99 < 5 ms)`,
    );
    const file = await writeResults('dataplane.json', {
      bench: 'dataplane',
      date: new Date().toISOString(),
      machine: { cpus: cpus().length, model: cpus()[0]?.model, node: process.version },
      quick: QUICK,
      copyEngine: engineName,
      shape: {
        layers: LAYERS,
        kvHeads: 8,
        headDim: 128,
        dtype: 'bfloat16',
        blockTokens: BLOCK_TOKENS,
        chunkTokens: CHUNK_TOKENS,
        chunkBytes: CHUNK_BYTES,
      },
      rows,
      lookupDuringLoad: { samples: lat.length, p50Ms: percentile(lat, 50), p99Ms: p99 },
    });
    console.log(`\nwrote ${file}`);
  } finally {
    await server.close();
    await dp.close();
    await storage.close();
    await rm(path, { force: true });
  }
}

/** Every loaded block equals the block it was saved from, in every layer's K and V. */
async function verify(path: string, from: number[], to: number[]): Promise<void> {
  const fh = await open(path, 'r');
  try {
    const x = Buffer.allocUnsafe(BLOCK_BYTES);
    const y = Buffer.allocUnsafe(BLOCK_BYTES);
    const region = NUM_BLOCKS * BLOCK_BYTES;
    for (let r = 0; r < 2 * LAYERS; r++) {
      for (let i = 0; i < from.length; i += 37) {
        await fh.read(x, 0, BLOCK_BYTES, r * region + from[i]! * BLOCK_BYTES);
        await fh.read(y, 0, BLOCK_BYTES, r * region + to[i]! * BLOCK_BYTES);
        if (!x.equals(y))
          throw new Error(`region ${r}: block ${to[i]} differs from saved block ${from[i]}`);
      }
    }
  } finally {
    await fh.close();
  }
}

await main();
