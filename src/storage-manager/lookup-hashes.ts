import { KvtierError } from '../errors.ts';
import {
  CHUNK_HASH_BYTES,
  type ChunkHash,
  chunkHashesFromPacked,
  chunkHashFromBytes,
} from '../hashing/chunk-hash.ts';

/** Where {@link LookupHashes.view} copies compacted hashes: one per process, reused by every call. */
let scratch = Buffer.allocUnsafe(0);

/**
 * A lookup's chunk hashes, packed (32 bytes each, as on the wire); hex strings are made only
 * where a tier needs them. The bytes are borrowed while the lookup runs: they must not change.
 * An answered lookup that stays (holding pins until a LOAD, CANCEL or eviction) is
 * {@link LookupHashes.compact}ed: its hashes then live in one byte string on the JS heap, with
 * nothing for the collector to trace, instead of a string per chunk (which filled the old
 * generation) or the request's buffer (memory outside the heap that, kept past a scavenge, is
 * only given back by a full collection, and so forced one every few thousand lookups).
 */
export class LookupHashes {
  #packed: Uint8Array | undefined;
  /** The hashes' bytes as a one-byte string once compacted. */
  #latin1: string | undefined;
  #length: number;
  /** The hex form when the caller gave it (never made here for the whole list). */
  #hex: readonly ChunkHash[] | undefined;

  private constructor(packed: Uint8Array, hex: readonly ChunkHash[] | undefined) {
    this.#packed = packed;
    this.#length = packed.length / CHUNK_HASH_BYTES;
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

  get length(): number {
    return this.#length;
  }

  /** The packed bytes (a fresh copy once compacted: read it, do not keep it). */
  get packed(): Uint8Array {
    return this.#packed ?? Buffer.from(this.#latin1!, 'latin1');
  }

  /**
   * Hashes `[from, from + count)` as bytes, for reading at once: a view of the borrowed bytes,
   * or once compacted a copy in a buffer that the next `view` of any lookup overwrites.
   */
  view(from: number, count: number): Uint8Array {
    const p = this.#packed;
    if (p !== undefined)
      return p.subarray(from * CHUNK_HASH_BYTES, (from + count) * CHUNK_HASH_BYTES);
    const bytes = count * CHUNK_HASH_BYTES;
    if (scratch.length < bytes)
      scratch = Buffer.allocUnsafe(Math.max(bytes, 2 * scratch.length, 4096));
    const start = from * CHUNK_HASH_BYTES;
    scratch.write(this.#latin1!.slice(start, start + bytes), 0, bytes, 'latin1');
    return scratch.subarray(0, bytes);
  }

  /**
   * Keeps only the first `n` hashes, copied into a one-byte string: the borrowed bytes are no
   * longer referenced. Later reads of `packed` copy them back out.
   */
  compact(n: number): void {
    const keep = Math.max(0, Math.min(n, this.#length));
    const p = this.#packed;
    if (p !== undefined) {
      const b = Buffer.isBuffer(p) ? p : Buffer.from(p.buffer, p.byteOffset, p.byteLength);
      this.#latin1 = b.toString('latin1', 0, keep * CHUNK_HASH_BYTES);
      this.#packed = undefined;
    } else this.#latin1 = this.#latin1!.slice(0, keep * CHUNK_HASH_BYTES);
    this.#length = keep;
    this.#hex = this.#hex?.slice(0, keep);
  }

  /** Hashes `[from, to)` as hex. */
  hexSlice(from = 0, to = this.#length): ChunkHash[] {
    if (this.#hex !== undefined) return this.#hex.slice(from, to);
    if (from >= to) return [];
    const bytes =
      this.#packed ??
      Buffer.from(this.#latin1!.slice(from * CHUNK_HASH_BYTES, to * CHUNK_HASH_BYTES), 'latin1');
    const base = this.#packed === undefined ? 0 : from * CHUNK_HASH_BYTES;
    return chunkHashesFromPacked(bytes.subarray(base, base + (to - from) * CHUNK_HASH_BYTES));
  }

  /** Hash `i` as hex. */
  at(i: number): ChunkHash {
    return this.#hex?.[i] ?? chunkHashFromBytes(this.view(i, 1), 0);
  }
}
