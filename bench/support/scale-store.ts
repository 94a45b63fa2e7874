/**
 * Local-disk stores of many small chunks for bench:scale, written straight to the directory as a
 * tier lays them out (valid objects: a restart verifies what it reads), so that a million chunks
 * take a minute rather than the much longer a million puts through the tier would.
 */
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Chunk } from '../../src/backends/core/types.ts';
import { objectDir, objectPath } from '../../src/backends/files/file-store.ts';
import { CHUNK_HEADER_BYTES, encodeChunkObject } from '../../src/backends/format/chunk-format.ts';
import { type ChunkHash, chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';

/** The namespace every bench:scale chunk is stored under. */
export const SCALE_NS = '5ca1e5ca1e5ca1e5ca1e5ca1e5ca1e00';
/** Payload bytes of each chunk: small, so a million fit on a development disk (4 KiB blocks). */
export const SCALE_PAYLOAD_BYTES = 256;
/** Bytes of each object file. */
export const SCALE_OBJECT_BYTES = CHUNK_HEADER_BYTES + SCALE_PAYLOAD_BYTES;
const DONE = 'kvtier-bench-store-complete';

/** The hash of chunk `i` of a store (`gen` tells apart chunks written later, by churn). */
export function scaleHash(i: number, gen = 0): ChunkHash {
  const h = createHash('sha256');
  h.update(`kvtier bench:scale ${gen} ${i}`);
  return chunkHashFromBytes(h.digest());
}

/** The chunk stored under scale hash `i`: its payload is derived from `i`. */
export function scaleChunk(i: number): Chunk {
  const data = Buffer.alloc(SCALE_PAYLOAD_BYTES, i & 0xff);
  data.writeUInt32LE(i >>> 0, 0);
  return { tokens: 16, data };
}

/**
 * Writes a store of `n` chunks at `dir` unless a complete one is there already (it is then left
 * as it is, journal included). Returns whether it wrote one.
 */
export function ensureScaleStore(dir: string, n: number, shardChars = 2): boolean {
  if (existsSync(join(dir, DONE))) return false;
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  const made = new Set<string>();
  for (let i = 0; i < n; i++) {
    const hash = scaleHash(i);
    const d = objectDir(dir, SCALE_NS, hash, shardChars);
    if (!made.has(d)) {
      mkdirSync(d, { recursive: true });
      made.add(d);
    }
    writeFileSync(
      objectPath(dir, SCALE_NS, hash, shardChars),
      encodeChunkObject(SCALE_NS, hash, scaleChunk(i)),
    );
  }
  writeFileSync(join(dir, DONE), `${n}\n`);
  return true;
}

/** Hashes of the objects in `shards` shard directories of the store (a random sample). */
export function sampleStoredHashes(dir: string, shards: number): ChunkHash[] {
  const nsDir = join(dir, SCALE_NS);
  const all = readdirSync(nsDir).sort(() => Math.random() - 0.5);
  const out: ChunkHash[] = [];
  for (const s of all.slice(0, shards)) {
    for (const name of readdirSync(join(nsDir, s))) {
      if (name.endsWith('.kvc')) out.push(name.slice(0, -4) as ChunkHash);
    }
  }
  return out;
}
