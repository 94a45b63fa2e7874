import { KvtierError } from '../errors.ts';
import {
  CHUNK_HASH_BYTES,
  type ChunkHash,
  chunkHashesFromPacked,
  chunkHashFromBytes,
} from '../hashing/chunk-hash.ts';
import { HashSlabs, type SlabCopy } from './hash-slabs.ts';

/** The slabs large answered lookups keep their hashes in (one set per process). */
const SLABS = new HashSlabs();

/**
 * Kept hashes of at least this many bytes go into a slab, smaller ones into a byte string: a
 * slab copy saves the collector copying the bytes (measured: 64, 128 and 512 chunks gain), but
 * costs about as much as a small string (16 chunks: no gain).
 */
export const SLAB_MIN_BYTES = 1024;

/** Where {@link LookupHashes.view} copies hashes kept as a string: one buffer, reused. */
let scratch = Buffer.allocUnsafe(0);

/**
 * A lookup's chunk hashes, packed (32 bytes each, as on the wire); hex strings are made only
 * where a tier needs them. The bytes are borrowed while the lookup runs: they must not change.
 * An answered lookup that stays (holding pins until a LOAD, CANCEL or eviction) is
 * {@link LookupHashes.compact}ed: its hashes are copied into one byte string on the JS heap or,
 * from {@link SLAB_MIN_BYTES} on (32 chunks), into a shared slab outside it (hash-slabs.ts), which
 * {@link LookupHashes.free} gives back when the lookup is released. Not a string per chunk
 * (which filled the old generation), not the request's buffer (memory outside the heap that,
 * kept past a scavenge, is only given back by a full collection, and so forced one every few
 * thousand lookups), not a large byte string (copied by the collector from the young
 * generation to the old).
 */
export class LookupHashes {
  /** The borrowed bytes until compacted. */
  #packed: Uint8Array | undefined;
  /** The copy once compacted into a slab. */
  #copy: SlabCopy | undefined;
  /** The hashes' bytes as a one-byte string once compacted into one. */
  #latin1: string | undefined;
  /** Set by {@link free}: a later compaction keeps nothing. */
  #freed = false;
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

  /** The packed bytes (a copy once compacted into a string: read it, do not keep it). */
  get packed(): Uint8Array {
    return this.#packed ?? this.#copy?.view ?? Buffer.from(this.#latin1!, 'latin1');
  }

  /**
   * Hashes `[from, from + count)` as bytes, for reading at once: a view, or for hashes kept as a
   * string a copy in a buffer that the next `view` of any lookup overwrites.
   */
  view(from: number, count: number): Uint8Array {
    if (from < 0 || count < 0 || from + count > this.#length)
      throw new RangeError(
        `hashes ${from}..${from + count} asked of a lookup that keeps ${this.#length}`,
      );
    const bytes = this.#packed ?? this.#copy?.view;
    if (bytes !== undefined)
      return bytes.subarray(from * CHUNK_HASH_BYTES, (from + count) * CHUNK_HASH_BYTES);
    const n = count * CHUNK_HASH_BYTES;
    if (scratch.length < n) scratch = Buffer.allocUnsafe(Math.max(n, 2 * scratch.length, 4096));
    const start = from * CHUNK_HASH_BYTES;
    scratch.write(this.#latin1!.slice(start, start + n), 0, n, 'latin1');
    return scratch.subarray(0, n);
  }

  /**
   * Keeps only the first `n` hashes, copied into a string or a slab: the borrowed bytes are no
   * longer referenced. Call {@link free} when the lookup is released.
   */
  compact(n: number): void {
    const keep = Math.max(0, Math.min(n, this.#length));
    const bytes = keep * CHUNK_HASH_BYTES;
    const p = this.#packed;
    if (p === undefined) {
      if (this.#copy !== undefined) SLABS.shrink(this.#copy, bytes);
      else this.#latin1 = this.#latin1!.slice(0, bytes);
    } else if (this.#freed) {
      // Released before its answer settled: nothing reads its hashes.
      this.#latin1 = '';
      this.#packed = undefined;
    } else {
      if (bytes < SLAB_MIN_BYTES) {
        const b = Buffer.isBuffer(p) ? p : Buffer.from(p.buffer, p.byteOffset, p.byteLength);
        this.#latin1 = b.toString('latin1', 0, bytes);
      } else this.#copy = SLABS.copy(p.subarray(0, bytes));
      this.#packed = undefined;
    }
    this.#length = keep;
    this.#hex = this.#hex?.slice(0, keep);
  }

  /**
   * Releases the hashes with their lookup (idempotent): a slab copy's room is given back, and
   * from now on the hashes read as none (never another lookup's).
   */
  free(): void {
    this.#freed = true;
    this.#length = 0;
    this.#hex = undefined;
    if (this.#copy !== undefined) SLABS.free(this.#copy);
    if (this.#latin1 !== undefined) this.#latin1 = '';
  }

  /** Hashes `[from, to)` as hex. */
  hexSlice(from = 0, to = this.#length): ChunkHash[] {
    if (this.#hex !== undefined) return this.#hex.slice(from, to);
    if (from >= to) return [];
    return chunkHashesFromPacked(this.view(from, to - from));
  }

  /** Hash `i` as hex. */
  at(i: number): ChunkHash {
    return this.#hex?.[i] ?? chunkHashFromBytes(this.view(i, 1), 0);
  }
}
