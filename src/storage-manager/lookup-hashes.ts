import { KvtierError } from '../errors.ts';
import {
  CHUNK_HASH_BYTES,
  type ChunkHash,
  chunkHashesFromPacked,
  chunkHashFromBytes,
} from '../hashing/chunk-hash.ts';

/**
 * A lookup's chunk hashes, packed (32 bytes each, as on the wire); hex strings are made only
 * where a tier needs them. An answered lookup that holds pins keeps just these bytes, not a
 * string per chunk: thousands of such lookups would otherwise fill the old generation.
 * The bytes are borrowed: they must not change while the lookup is held.
 */
export class LookupHashes {
  readonly packed: Uint8Array;
  readonly length: number;
  /** The hex form when the caller gave it (never made here for the whole list). */
  readonly #hex: readonly ChunkHash[] | undefined;

  private constructor(packed: Uint8Array, hex: readonly ChunkHash[] | undefined) {
    this.packed = packed;
    this.length = packed.length / CHUNK_HASH_BYTES;
    this.#hex = hex;
  }

  /**
   * Wraps packed bytes, or packs hex hashes (kept as given for the tiers that need hex).
   * @throws KvtierError `KVT_INVALID_ARGUMENT` for bytes not a multiple of 32 long, or text that
   *   is not a hash.
   */
  static of(hashes: readonly ChunkHash[] | Uint8Array): LookupHashes {
    if (hashes instanceof Uint8Array) {
      if (hashes.length % CHUNK_HASH_BYTES !== 0)
        throw new KvtierError(
          'KVT_INVALID_ARGUMENT',
          `packed hashes must be a multiple of ${CHUNK_HASH_BYTES} bytes, got ${hashes.length}`,
        );
      return new LookupHashes(hashes, undefined);
    }
    const packed = Buffer.allocUnsafe(hashes.length * CHUNK_HASH_BYTES);
    for (let i = 0; i < hashes.length; i++) {
      const h = hashes[i]!;
      if (
        typeof h !== 'string' ||
        h.length !== 2 * CHUNK_HASH_BYTES ||
        packed.write(h, i * CHUNK_HASH_BYTES, CHUNK_HASH_BYTES, 'hex') !== CHUNK_HASH_BYTES
      )
        throw new KvtierError('KVT_INVALID_ARGUMENT', `hash ${i} is not a chunk hash`);
    }
    return new LookupHashes(packed, hashes);
  }

  /** Hashes `[from, to)` as hex. */
  hexSlice(from = 0, to = this.length): ChunkHash[] {
    if (this.#hex !== undefined) return this.#hex.slice(from, to);
    if (from >= to) return [];
    return chunkHashesFromPacked(
      this.packed.subarray(from * CHUNK_HASH_BYTES, to * CHUNK_HASH_BYTES),
    );
  }

  /** Hash `i` as hex. */
  at(i: number): ChunkHash {
    return this.#hex?.[i] ?? chunkHashFromBytes(this.packed, i * CHUNK_HASH_BYTES);
  }

  /** The first `n` hashes (this list when it has no more). */
  prefix(n: number): LookupHashes {
    if (n >= this.length) return this;
    return new LookupHashes(this.packed.subarray(0, n * CHUNK_HASH_BYTES), this.#hex?.slice(0, n));
  }
}
