/**
 * A/B of the file tiers' write against the raw write of bench/tiers.ts, interleaved round by
 * round (no fsync anywhere): raw (open 'w', write, close), raw plus a rename (write a temp
 * file, rename it into place), and the native whole-object write the tiers use (exclusive
 * temp file, header, payload with its CRC-32C, rename), and the local-disk and fs tiers' put as
 * bench/tiers.ts calls it.
 * Run: node --import tsx bench/support/put-ab.ts [chunkMiB] [files] [rounds]
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, open, rename, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { StorageBackend } from '../../src/backends/core/types.ts';
import { BackendRegistry } from '../../src/backends/registry.ts';
import { type ChunkHash, chunkHash } from '../../src/hashing/chunk-hash.ts';
import { loadNative } from '../../src/native/native-addon.ts';

const MiB = 1024 * 1024;
const [mib = 2, files = 64, rounds = 5] = process.argv.slice(2).map(Number);
const size = mib * MiB;
const addon = loadNative().addon;
if (addon === null) throw new Error('native addon not built');
const dir = await mkdtemp(join(tmpdir(), 'kvtier-put-ab-'));
const payload = randomBytes(size);
const header = Buffer.alloc(128);
let gen = 0;

async function rawWrite(path: string): Promise<void> {
  const fh = await open(path, 'w');
  try {
    await fh.write(payload, 0, size, 0);
  } finally {
    await fh.close();
  }
}
// The tiers as bench/tiers.ts builds them (registry, circuit breaker), each round new keys, the
// previous round's removed before it (untimed).
const NS = 'be4c4be4c4be4c4be4c4be4c4be4c4b0';
const tierRoot = await mkdtemp(join(tmpdir(), 'kvtier-put-ab-tiers-'));
const registry = new BackendRegistry();
const [disk] = await registry.createTiers([
  {
    name: 'disk',
    type: 'local-disk',
    options: { path: join(tierRoot, 'disk'), capacityBytes: 4 * files * size, fsync: 'none' },
  },
]);
const [fs] = await registry.createTiers([
  { name: 'fs', type: 'fs', options: { path: join(tierRoot, 'fs'), fsync: 'none' } },
]);
if (disk === undefined || fs === undefined) throw new Error('no tier');
const keyOf = (g: number, i: number) =>
  chunkHash(`${g.toString(16).padStart(32, '0')}${i.toString(16).padStart(32, '0')}`);
const tierPut = (t: StorageBackend) => async (i: number) => {
  const out = await t.put(NS, keyOf(gen, i), { tokens: 256, data: payload });
  if (out !== 'stored') throw new Error(out);
};
const variants: Record<string, (i: number) => Promise<void>> = {
  raw: (i) => rawWrite(join(dir, `raw-${gen}-${i}`)),
  rawRename: async (i) => {
    await rawWrite(join(dir, `rr-${gen}-${i}.tmp`));
    await rename(join(dir, `rr-${gen}-${i}.tmp`), join(dir, `rr-${gen}-${i}`));
  },
  native: (i) =>
    addon.files
      .writeFileAtomic(
        join(dir, `n-${gen}-${i}.tmp`),
        join(dir, `n-${gen}-${i}`),
        header,
        payload,
        {
          fsync: 0,
          makeDirs: [],
          checksumAt: 8,
          headerCrcAt: 120,
        },
      )
      .then(() => undefined),
  disk: tierPut(disk),
  fs: tierPut(fs),
};
const out: Record<string, number[]> = { raw: [], rawRename: [], native: [], disk: [], fs: [] };
const previous = new Map<string, ChunkHash[]>();
for (let r = 0; r < rounds; r++) {
  for (const [k, fn] of Object.entries(variants)) {
    gen++;
    const tier = k === 'disk' ? disk : k === 'fs' ? fs : undefined;
    if (tier !== undefined) {
      await tier.remove(NS, previous.get(k) ?? []);
      previous.set(
        k,
        Array.from({ length: files }, (_, i) => keyOf(gen, i)),
      );
    }
    const t0 = performance.now();
    // One put at a time, as bench/tiers.ts issues them.
    for (let i = 0; i < files; i++) await fn(i);
    out[k]!.push((files * size) / ((performance.now() - t0) * 1e6));
    await rm(dir, { recursive: true, force: true });
    await open(dir, 'r').catch(async () => (await import('node:fs/promises')).mkdir(dir));
  }
}
console.log(`${mib} MiB × ${files} puts, one at a time, ${rounds} interleaved rounds (GB/s)`);
for (const [k, xs] of Object.entries(out)) {
  const s = [...xs].sort((a, b) => a - b);
  console.log(
    `${k.padEnd(10)} median ${s[s.length >> 1]!.toFixed(2)}  all ${xs.map((x) => x.toFixed(2)).join(' ')}`,
  );
}
await rm(dir, { recursive: true, force: true });
await disk.close();
await fs.close();
await rm(tierRoot, { recursive: true, force: true });
