/**
 * Splits the 16-chunk lookup of the local-disk index into its parts, on in-memory indexes of
 * several sizes (no files): hex parsing of the hashes alone, probes without the LRU touch
 * (`find`), the whole `prefixHits` (parse, probe, touch), and that behind an `await` as
 * `batchedContains` is. Each p50 over 20,000 lookups of 16 random stored hashes, fresh strings.
 * Run: node --import tsx bench/support/index-probe-split.ts [sizes…]
 */
import { randomBytes } from 'node:crypto';
import type { NamespaceId } from '../../src/backends/core/types.ts';
import { hashWord } from '../../src/backends/index/hash-words.ts';
import { DiskIndex } from '../../src/backends/local-disk/disk-index.ts';
import type { ChunkHash } from '../../src/hashing/chunk-hash.ts';

const NS = 'be4c4be4c4be4c4be4c4be4c4be4c4b0' as NamespaceId;
const sizes = process.argv.slice(2).map(Number);
const LOOKUPS = 20_000;
const p50 = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;

for (const n of sizes.length > 0 ? sizes : [1024, 100_000, 1_000_000]) {
  const idx = new DiskIndex(2 ** 50, n + 1, () => {}, n);
  const stored: string[] = [];
  for (let i = 0; i < n; i++) {
    const h = randomBytes(32).toString('hex');
    stored.push(h);
    idx.add(NS, h as ChunkHash, 4096);
  }
  const queries = Array.from({ length: LOOKUPS }, () =>
    Array.from({ length: 16 }, () => stored[Math.floor(Math.random() * n)]!),
  );
  const t = {
    parse: [] as number[],
    find: [] as number[],
    prefixHits: [] as number[],
    awaited: [] as number[],
  };
  let sink = 0;
  for (const q of queries) {
    // Fresh strings each time, as decoded from a request; the four variants interleaved.
    let f = q.map((h) => Buffer.from(h, 'hex').toString('hex') as ChunkHash);
    let s = performance.now();
    for (const h of f) for (let w = 0; w < 8; w++) sink ^= hashWord(h, w);
    t.parse.push((performance.now() - s) * 1000);
    f = q.map((h) => Buffer.from(h, 'hex').toString('hex') as ChunkHash);
    s = performance.now();
    for (const h of f) sink ^= idx.find(NS, h);
    t.find.push((performance.now() - s) * 1000);
    f = q.map((h) => Buffer.from(h, 'hex').toString('hex') as ChunkHash);
    s = performance.now();
    sink ^= idx.prefixHits(NS, f, false);
    t.prefixHits.push((performance.now() - s) * 1000);
    f = q.map((h) => Buffer.from(h, 'hex').toString('hex') as ChunkHash);
    s = performance.now();
    sink ^= await (async () => idx.prefixHits(NS, f, false))();
    t.awaited.push((performance.now() - s) * 1000);
  }
  console.log(
    `n=${n}: p50 µs  parse ${p50(t.parse).toFixed(2)}  find (parse+probe) ${p50(t.find).toFixed(2)}` +
      `  prefixHits (parse+probe+touch) ${p50(t.prefixHits).toFixed(2)}  awaited ${p50(t.awaited).toFixed(2)}  (${sink & 1})`,
  );
}
