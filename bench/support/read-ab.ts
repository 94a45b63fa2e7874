/**
 * A/B of the file tiers' read path against the raw read of bench/tiers.ts, on the same files in
 * the page cache: raw (open, stat, read into a reused buffer, close), native read with the
 * CRC-32C, the same native read with nothing to checksum, and the CRC alone over the bytes.
 * Run: node --import tsx bench/support/read-ab.ts [chunkMiB] [files] [inFlight] [rounds]
 */
import { mkdtemp, open, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadNative } from '../../src/native/native-addon.ts';

const MiB = 1024 * 1024;
const [mib = 2, files = 64, inFlight = 4, rounds = 5] = process.argv.slice(2).map(Number);
const size = mib * MiB;
const addon = loadNative().addon;
if (addon === null) throw new Error('native addon not built');
const dir = await mkdtemp(join(tmpdir(), 'kvtier-read-ab-'));
const paths = Array.from({ length: files }, (_, i) => join(dir, `${i}.bin`));
const payload = Buffer.alloc(size, 7);
for (const p of paths) await writeFile(p, payload);
const slots = Array.from({ length: inFlight }, () => Buffer.allocUnsafe(size));

async function raw(i: number, slot: Buffer): Promise<void> {
  const fh = await open(paths[i]!, 'r');
  try {
    await fh.stat();
    await fh.read(slot, 0, size, 0);
  } finally {
    await fh.close();
  }
}
const nativeCrc = (i: number, slot: Buffer) =>
  addon.files.readFileCrc32c(paths[i]!, slot, size, 64).then(() => undefined);
const nativeNoCrc = (i: number, slot: Buffer) =>
  addon.files.readFileCrc32c(paths[i]!, slot, size, size).then(() => undefined);
const crcOnly = async (_i: number, slot: Buffer) => {
  addon.crc32c(slot);
};

async function pass(fn: (i: number, slot: Buffer) => Promise<void>): Promise<number> {
  const t0 = performance.now();
  for (let i = 0; i < files; i += inFlight) {
    const g = [];
    for (let j = 0; j < inFlight && i + j < files; j++) g.push(fn(i + j, slots[j]!));
    await Promise.all(g);
  }
  return (files * size) / ((performance.now() - t0) * 1e6);
}

const variants = { raw, nativeCrc, nativeNoCrc, crcOnly } as const;
const best: Record<string, number[]> = { raw: [], nativeCrc: [], nativeNoCrc: [], crcOnly: [] };
for (let r = 0; r < rounds; r++) {
  // Interleaved: every variant once per round, so the machine's state is shared.
  for (const [name, fn] of Object.entries(variants)) best[name]!.push(await pass(fn));
}
console.log(
  `${mib} MiB × ${files} files, ${inFlight} in flight, ${rounds} interleaved rounds (GB/s)`,
);
for (const [name, xs] of Object.entries(best)) {
  const s = [...xs].sort((a, b) => a - b);
  console.log(
    `${name.padEnd(12)} median ${s[s.length >> 1]!.toFixed(2)}  all ${xs.map((x) => x.toFixed(2)).join(' ')}`,
  );
}
await rm(dir, { recursive: true, force: true });
