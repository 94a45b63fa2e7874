/**
 * A/B of a file tier's batchedGet against the raw read of bench/tiers.ts (open, stat, read into
 * a reused buffer, close), interleaved round by round, with the page faults and CPU time each
 * pass took; and the parts of the tier's read: the native read with and without its CRC-32C, and
 * the file core the tiers share (ChunkFiles.read). Each variant reads into buffers of its own, so
 * interleaved passes leave each other's colder in the cache; KVTIER_GET_AB_ONLY=<variant> runs
 * one alone (compare CPU ms between separate runs then).
 * Run: node --import tsx bench/support/get-ab.ts <local-disk|fs> [chunkMiB] [chunks] [rounds]
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, open, readdir, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ChunkFiles } from '../../src/backends/files/chunk-files.ts';
import { realFileSystem } from '../../src/backends/files/file-store.ts';
import { BackendRegistry } from '../../src/backends/registry.ts';
import { type ChunkHash, chunkHash } from '../../src/hashing/chunk-hash.ts';
import { loadNative } from '../../src/native/native-addon.ts';
import { silentLogger } from '../../src/util/log.ts';

const MiB = 1024 * 1024;
const BATCH = 4;
const type = (process.argv[2] ?? 'local-disk') as 'local-disk' | 'fs';
const [mib = 2, n = 64, rounds = 5] = process.argv.slice(3).map(Number);
const size = mib * MiB;
const NS = 'be4c4be4c4be4c4be4c4be4c4be4c4b0';
const root = await mkdtemp(join(tmpdir(), 'kvtier-get-ab-'));
const options =
  type === 'fs'
    ? { path: join(root, 't'), fsync: 'none' }
    : { path: join(root, 't'), capacityBytes: 4 * n * size, fsync: 'none' };
const [backend] = await new BackendRegistry().createTiers([{ name: 't', type, options } as never]);
if (backend === undefined) throw new Error('no backend');
const hashes: ChunkHash[] = Array.from({ length: n }, (_, i) =>
  chunkHash(i.toString(16).padStart(64, 'a')),
);
const payload = randomBytes(size);
for (const h of hashes) await backend.put(NS, h, { tokens: 256, data: payload });
const rawPaths = Array.from({ length: n }, (_, i) => join(root, `${i}.raw`));
for (const p of rawPaths) await writeFile(p, payload);
const slots = Array.from({ length: BATCH }, () => Buffer.allocUnsafe(size));

async function rawPass(): Promise<void> {
  for (let i = 0; i < n; i += BATCH) {
    const g = [];
    for (let j = i; j < Math.min(n, i + BATCH); j++) {
      g.push(
        (async () => {
          const fh = await open(rawPaths[j]!, 'r');
          try {
            await fh.stat();
            await fh.read(slots[j % BATCH]!, 0, size, 0);
          } finally {
            await fh.close();
          }
        })(),
      );
    }
    await Promise.all(g);
  }
}
const tierFiles = (await readdir(join(root, 't'), { recursive: true }))
  .map((f) => join(root, 't', f))
  .filter((f) => f.endsWith('.kvc') || /[0-9a-f]{64}/.test(f));
const files: string[] = [];
for (const f of tierFiles)
  if ((await stat(f)).isFile() && (await stat(f)).size > size) files.push(f);
const objBytes = files.length > 0 ? (await stat(files[0]!)).size : 0;
const objSlots = Array.from({ length: BATCH }, () => Buffer.allocUnsafe(objBytes));
const native = loadNative().addon!.files;
function nativePass(crcFrom: number) {
  return async () => {
    for (let i = 0; i < files.length; i += BATCH) {
      const g = [];
      for (let j = i; j < Math.min(files.length, i + BATCH); j++)
        g.push(
          native.readFileCrc32c(
            files[j]!,
            objSlots[j % BATCH]!,
            objBytes,
            crcFrom === 0 ? objBytes : crcFrom,
          ),
        );
      for (const r of await Promise.all(g)) if (r.status !== 'ok') throw new Error(r.status);
    }
  };
}
// The file core the tiers share (pooled buffer, native read, checks, release) without a tier's
// index, limiter, deadlines and circuit breaker.
const hashOfFile = (f: string) => f.slice(f.lastIndexOf('/') + 1, -'.kvc'.length) as ChunkHash;
const core = new ChunkFiles({
  fs: realFileSystem,
  root: join(root, 't'),
  shardChars: 2,
  maxChunkBytes: objBytes,
  fsync: 'none',
  createRoot: false,
  tier: 'probe',
  log: silentLogger,
  onCorrupt: () => {},
});
async function chunkFilesPass(): Promise<void> {
  for (let i = 0; i < files.length; i += BATCH) {
    const g = [];
    for (let j = i; j < Math.min(files.length, i + BATCH); j++) {
      g.push(
        core
          .read(NS, hashOfFile(files[j]!), files[j]!, (fn) => fn(), objBytes)
          .then((r) => {
            if (r.kind !== 'ok') throw new Error(r.kind);
            r.chunk.release?.();
          }),
      );
    }
    await Promise.all(g);
  }
}
async function tierPass(): Promise<void> {
  for (let i = 0; i < n; i += BATCH) {
    const batch = hashes.slice(i, i + BATCH);
    const got = await backend!.batchedGet(NS, batch);
    for (const h of batch) {
      const c = got.get(h);
      if (c == null) throw new Error('miss');
      c.release?.();
    }
  }
}
async function measure(fn: () => Promise<void>) {
  const r0 = process.resourceUsage();
  const t0 = performance.now();
  await fn();
  const ms = performance.now() - t0;
  const r1 = process.resourceUsage();
  return {
    gbs: (n * size) / (ms * 1e6),
    minflt: r1.minorPageFault - r0.minorPageFault,
    cpuMs: (r1.userCPUTime + r1.systemCPUTime - r0.userCPUTime - r0.systemCPUTime) / 1000,
  };
}
const out: Record<string, { gbs: number; minflt: number; cpuMs: number }[]> = {
  raw: [],
  tier: [],
  nativeCrc: [],
  nativeNoCrc: [],
  chunkFiles: [],
};
await tierPass(); // warm-up: fills the read pool
await rawPass();
const passes: Record<string, () => Promise<void>> = {
  raw: rawPass,
  tier: tierPass,
  nativeCrc: nativePass(64),
  nativeNoCrc: nativePass(0),
  chunkFiles: chunkFilesPass,
};
// KVTIER_GET_AB_ONLY=tier (say) runs one variant, for strace -c.
const only = process.env.KVTIER_GET_AB_ONLY;
for (const k of Object.keys(out)) if (only !== undefined && k !== only) delete out[k];
for (let r = 0; r < rounds; r++) {
  for (const k of Object.keys(out)) out[k]!.push(await measure(passes[k]!));
}
console.log(`tier object files found: ${files.length} of ${objBytes} B`);
console.log(`${type} get, ${mib} MiB × ${n}, batches of ${BATCH}, ${rounds} interleaved rounds`);
for (const [k, xs] of Object.entries(out)) {
  const med = (f: (x: (typeof xs)[0]) => number) =>
    [...xs].map(f).sort((a, b) => a - b)[xs.length >> 1]!;
  console.log(
    `${k.padEnd(11)} GB/s median ${med((x) => x.gbs).toFixed(2)} [${xs.map((x) => x.gbs.toFixed(2)).join(' ')}]` +
      `  minor faults ${med((x) => x.minflt)}  CPU ms ${med((x) => x.cpuMs).toFixed(0)}`,
  );
}
await backend.close?.();
await rm(root, { recursive: true, force: true });
