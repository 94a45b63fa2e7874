/**
 * A second index of the host-memory tier keyed by a chunk hash's 32 bytes as they arrive on the
 * wire, so a lookup finds and pins its chunks without making a hex string per chunk (the
 * strings, and the map lookups hashing them, were most of a large lookup's cost, and the strings
 * an answered lookup kept alive filled the old generation).
 */
import { randomBytes } from 'node:crypto';
import { CHUNK_HASH_BYTES, type ChunkHash } from '../../hashing/chunk-hash.ts';
import type { NamespaceId } from '../core/types.ts';

/** The fields an entry carries for {@link PackedKeyIndex} (its links live in the entry). */
export interface PackedKeyed<E> {
  readonly ns: NamespaceId;
  /** The hash's 32 bytes as 8 little-endian int32 words. */
  readonly key: Int32Array;
  /** Next entry in the same bucket. */
  keyNext: E | null;
}

// A per-process seed mixed with every word, so that which hashes share a bucket cannot be
// chosen by whoever picks the hashes.
const SEED = randomBytes(4).readInt32LE(0);
const scratch = Buffer.alloc(CHUNK_HASH_BYTES);

/** The key words of a hex chunk hash. */
export function keyOfHash(hash: ChunkHash): Int32Array {
  scratch.write(hash, 0, CHUNK_HASH_BYTES, 'hex');
  const key = new Int32Array(8);
  for (let i = 0; i < 8; i++) key[i] = scratch.readInt32LE(i * 4);
  return key;
}

function mix(h: number, w: number): number {
  h = Math.imul(h ^ w, 0x85ebca6b);
  return h ^ (h >>> 13);
}

/** A smi bucket number from the 8 key words. */
function bucketOf(
  w0: number,
  w1: number,
  w2: number,
  w3: number,
  w4: number,
  w5: number,
  w6: number,
  w7: number,
): number {
  let h = mix(SEED, w0);
  h = mix(h, w1);
  h = mix(h, w2);
  h = mix(h, w3);
  h = mix(h, w4);
  h = mix(h, w5);
  h = mix(h, w6);
  h = mix(h, w7);
  h = Math.imul(h ^ (h >>> 16), 0xc2b2ae35);
  return (h ^ (h >>> 15)) & 0x3fffffff;
}

/**
 * Entries by (namespace, 32-byte hash), found from packed bytes: a map from a seeded 30-bit mix
 * of all 32 bytes to a chain of entries, each compared in full (words and namespace) before it
 * counts. Holds no copy of the keys; the entries own them.
 */
export class PackedKeyIndex<E extends PackedKeyed<E>> {
  readonly #buckets = new Map<number, E>();

  /** Adds `e` (not already present). */
  add(e: E): void {
    const k = e.key;
    const b = bucketOf(k[0]!, k[1]!, k[2]!, k[3]!, k[4]!, k[5]!, k[6]!, k[7]!);
    e.keyNext = this.#buckets.get(b) ?? null;
    this.#buckets.set(b, e);
  }

  /** Removes `e`; a no-op when absent. */
  delete(e: E): void {
    const k = e.key;
    const b = bucketOf(k[0]!, k[1]!, k[2]!, k[3]!, k[4]!, k[5]!, k[6]!, k[7]!);
    let cur: E | null = this.#buckets.get(b) ?? null;
    if (cur === e) {
      if (e.keyNext === null) this.#buckets.delete(b);
      else this.#buckets.set(b, e.keyNext);
      e.keyNext = null;
      return;
    }
    while (cur !== null) {
      if (cur.keyNext === e) {
        cur.keyNext = e.keyNext;
        e.keyNext = null;
        return;
      }
      cur = cur.keyNext;
    }
  }

  /** The entry of `ns` whose hash is the 32 bytes at `off` in `dv`, or undefined. */
  find(ns: NamespaceId, dv: DataView, off: number): E | undefined {
    const w0 = dv.getInt32(off, true);
    const w1 = dv.getInt32(off + 4, true);
    const w2 = dv.getInt32(off + 8, true);
    const w3 = dv.getInt32(off + 12, true);
    const w4 = dv.getInt32(off + 16, true);
    const w5 = dv.getInt32(off + 20, true);
    const w6 = dv.getInt32(off + 24, true);
    const w7 = dv.getInt32(off + 28, true);
    let e = this.#buckets.get(bucketOf(w0, w1, w2, w3, w4, w5, w6, w7)) ?? null;
    while (e !== null) {
      const k = e.key;
      if (
        k[0] === w0 &&
        k[1] === w1 &&
        k[2] === w2 &&
        k[3] === w3 &&
        k[4] === w4 &&
        k[5] === w5 &&
        k[6] === w6 &&
        k[7] === w7 &&
        e.ns === ns
      )
        return e;
      e = e.keyNext;
    }
    return undefined;
  }

  clear(): void {
    this.#buckets.clear();
  }
}
