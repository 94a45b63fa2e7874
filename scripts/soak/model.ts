/**
 * The data the soak run moves, derived from chunk hashes so that every byte a client loads or
 * gets back can be checked: the KV model of test/support/engine-process.ts (4 layers, K and V,
 * 128 stored bytes per block and region, 4 blocks of 4 tokens per chunk), prompts of chained
 * chunk hashes, and the PUT chunks and durable chunks by key number.
 */
import { createHash } from 'node:crypto';
import { readSync, writeSync } from 'node:fs';
import { type ChunkHash, chunkHash } from '../../src/hashing/chunk-hash.ts';
import { chunkBytes } from '../../test/support/durability.ts';
import {
  BLOCK_BYTES,
  BLOCK_SIZE,
  CHUNK_TOKENS,
  LAYERS,
  regionOffset,
  STRIDE,
} from '../../test/support/engine-process.ts';

export const BLOCKS_PER_CHUNK = CHUNK_TOKENS / BLOCK_SIZE;
export const REGIONS = 2 * LAYERS;
/** Prompts the clients share (same model, so the same namespace), and chunks per prompt. */
export const PROMPTS = 48;
export const CHUNKS_PER_PROMPT = 4;
/** Keys of the chunks clients PUT and GET in {@link PUT_NAMESPACE}. */
export const PUT_KEYS = 256;
export const PUT_NAMESPACE = 'a0a1a2a3a4a5a6a7a8a9aaabacadaeaf';
/** Keys of the chunks the coordinator PUTs and checks on disk, in {@link DURABLE_NAMESPACE}. */
export const DURABLE_KEYS = 1200;
export const DURABLE_NAMESPACE = 'd0d1d2d3d4d5d6d7d8d9dadbdcdddedf';
export const DURABLE_BYTES = 16 * 1024;

const sha = (s: string) => createHash('sha256').update(s).digest('hex');

/** Chained chunk hashes of prompt `p` (hex). */
export function promptHashes(p: number): string[] {
  const out: string[] = [];
  let h = sha(`kvtier-soak/prompt/${p}`);
  for (let i = 0; i < CHUNKS_PER_PROMPT; i++) {
    h = sha(`${h}/${i}`);
    out.push(h);
  }
  return out;
}

/** Hash and payload size of PUT key `k`. */
export function putChunk(k: number): { hash: string; bytes: number } {
  return { hash: sha(`kvtier-soak/put/${k}`), bytes: 8192 + (k % 8) * 4096 };
}

/** Hash of durable key `k` (payload: `chunkBytes(hash, DURABLE_BYTES)`). */
export function durableHash(k: number): ChunkHash {
  return chunkHash(sha(`kvtier-soak/durable/${k}`));
}

function blockBytes(hash: string, j: number, r: number): Buffer {
  return chunkBytes(`${hash}/${j}/${r}`, BLOCK_BYTES);
}

/** Writes chunk `hash`'s contents into `blockIds` (one chunk's blocks) of the KV file `fd`. */
export function writeChunk(fd: number, hash: string, blockIds: readonly number[]): void {
  blockIds.forEach((b, j) => {
    for (let r = 0; r < REGIONS; r++)
      writeSync(fd, blockBytes(hash, j, r), 0, BLOCK_BYTES, regionOffset(r) + b * STRIDE);
  });
}

/** Zeroes `blockIds` in every region. */
export function zeroBlocks(fd: number, blockIds: readonly number[]): void {
  const zero = Buffer.alloc(BLOCK_BYTES);
  for (const b of blockIds)
    for (let r = 0; r < REGIONS; r++)
      writeSync(fd, zero, 0, BLOCK_BYTES, regionOffset(r) + b * STRIDE);
}

/** True when `blockIds` hold exactly chunk `hash`'s contents. */
export function chunkMatches(fd: number, hash: string, blockIds: readonly number[]): boolean {
  const buf = Buffer.alloc(BLOCK_BYTES);
  return blockIds.every((b, j) => {
    for (let r = 0; r < REGIONS; r++) {
      readSync(fd, buf, 0, BLOCK_BYTES, regionOffset(r) + b * STRIDE);
      if (!buf.equals(blockBytes(hash, j, r))) return false;
    }
    return true;
  });
}
