/**
 * For a GPU machine: host↔device bandwidth through the addon's batched device copies, against
 * one contiguous cudaMemcpy-sized copy of the same bytes (the raw limit), both from pinned
 * slabs. Copies Llama-3-8B-shaped blocks (32 KiB each) gathered into 32 MiB chunk pages.
 *   npm run build && node dist/bench/gpu/h2d-d2h.js
 * Prints a table and writes bench/results/gpu.json; exits with a clear line when CUDA is missing.
 */
import { cpus } from 'node:os';
import { loadNative } from '../../src/native/native-addon.ts';
import { printTable, writeResults } from '../support/child.ts';

const MiB = 1024 * 1024;
const TOTAL = Number(process.env.KVTIER_GPU_BYTES ?? 1024 * MiB);
const BLOCK = 32 * 1024;
const SLAB = 256 * MiB;
const REPEAT = 5;

async function main(): Promise<void> {
  const loaded = loadNative();
  if (loaded.addon === null) {
    console.error(`gpu bench: the native addon is not built: ${loaded.reason}`);
    process.exit(2);
  }
  const addon = loaded.addon;
  const probe = addon.probe();
  if (!probe.cuda.available) {
    console.error(`gpu bench: CUDA is not available here: ${probe.cuda.reason}`);
    process.exit(2);
  }
  const slabs = Array.from({ length: Math.ceil(TOTAL / SLAB) }, () => addon.allocSlab(SLAB));
  for (const s of slabs) new Uint8Array(s).fill(7);
  const dev = addon.cudaMalloc(TOTAL);
  const region = [{ ptr: dev, bytes: TOTAL }];
  try {
    const contiguous = new Float64Array(slabs.length * 5);
    for (let i = 0; i < slabs.length; i++) {
      contiguous.set([i, 0, 0, i * SLAB, Math.min(SLAB, TOTAL - i * SLAB)], i * 5);
    }
    // Block-granular ops in a scattered device order (as blocks of a paged KV cache are).
    const blocks = TOTAL / BLOCK;
    const perSlab = SLAB / BLOCK;
    const scattered = new Float64Array(blocks * 5);
    for (let i = 0; i < blocks; i++) {
      const d = (i * 7919) % blocks;
      scattered.set([Math.floor(i / perSlab), (i % perSlab) * BLOCK, 0, d * BLOCK, BLOCK], i * 5);
    }
    const rows: Record<string, number | string>[] = [];
    for (const direction of ['h2d', 'd2h'] as const) {
      const time = async (ops: Float64Array) => {
        let best = Number.POSITIVE_INFINITY;
        for (let r = 0; r < REPEAT; r++) {
          const t0 = performance.now();
          await addon.copyBatchDevice(direction, slabs, region, ops);
          best = Math.min(best, performance.now() - t0);
        }
        return TOTAL / (best / 1000) / 1e9;
      };
      const raw = await time(contiguous);
      const kv = await time(scattered);
      rows.push({
        direction,
        blockBytes: BLOCK,
        blocks,
        rawGBs: raw,
        blockGBs: kv,
        ratio: kv / raw,
      });
    }
    console.log(
      `\nHost↔device through the addon, ${TOTAL / MiB} MiB, pinned slabs, ${BLOCK / 1024} KiB blocks`,
    );
    printTable(
      ['direction', 'contiguous GB/s', 'blocks GB/s', 'ratio'],
      rows.map((r) => [
        String(r.direction),
        (r.rawGBs as number).toFixed(2),
        (r.blockGBs as number).toFixed(2),
        (r.ratio as number).toFixed(2),
      ]),
    );
    const file = await writeResults('gpu.json', {
      bench: 'gpu',
      date: new Date().toISOString(),
      machine: { cpus: cpus().length, model: cpus()[0]?.model },
      probe,
      rows,
    });
    console.log(`\nwrote ${file}`);
  } finally {
    addon.cudaFree(dev);
  }
}

await main();
