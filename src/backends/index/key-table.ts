/**
 * The record store under the local-disk index (disk-index.ts): one 64-byte record per chunk in
 * one Int32Array, found by (namespace, hash) through a hash table of slot numbers whose chains
 * run through the records. No string, object or map entry per chunk. The layout of a record:
 * words 0–7 the hash (little-endian words of its 32 bytes), then the fields named by `F`; the
 * index on top owns the fields other than the key and the chain.
 */
import { randomBytes } from 'node:crypto';
import type { ChunkHash, NamespaceId } from '../core/types.ts';
import { bytesOfHex, hashOfWords, hashWord } from './hash-words.ts';

/** Int32 words per record. */
export const STRIDE = 16;
/** Word offsets of a record's fields after the hash. */
export const F = {
  /** Namespace id; 0 marks a free slot. */
  NS: 8,
  /** File size in bytes, u32. */
  BYTES: 9,
  PINS: 10,
  PREV: 11,
  NEXT: 12,
  /** Next record in the hash bucket, or in the free list. */
  CHAIN: 13,
  GEN: 14,
  FLAGS: 15,
} as const;
/** No slot. */
export const NONE = -1;
/** Slots are allocated in multiples of this. */
const SLOT_UNIT = 1024;
/** Arrays from this many bytes come from the table's allocator, when it has one. */
const LARGE_ARRAY_BYTES = 2 * 1024 * 1024;

/**
 * Memory for a table's large arrays: `bytes` zero-filled bytes (a multiple of 4), or null (or a
 * throw) to take Node's own. Memory backed by huge pages cuts the TLB misses of lookups in a
 * large table.
 */
export type IndexMemory = (bytes: number) => Uint8Array | null;

// A per-process seed mixed into bucket numbers, so that which hashes share a bucket cannot be
// chosen by whoever picks the hashes.
const SEED = randomBytes(4).readInt32LE(0);

function mix(h: number, w: number): number {
  h = Math.imul(h ^ w, 0x85ebca6b);
  return h ^ (h >>> 13);
}

/** A bucket hash of all eight words. */
export function bucketHash(
  w0: number,
  w1: number,
  w2: number,
  w3: number,
  w4: number,
  w5: number,
  w6: number,
  w7: number,
): number {
  let h = mix(mix(mix(mix(SEED, w0), w1), w2), w3);
  h = mix(mix(mix(mix(h, w4), w5), w6), w7);
  h = Math.imul(h ^ (h >>> 16), 0xc2b2ae35);
  return h ^ (h >>> 15);
}

/** Records by (namespace id, hash words), with slot allocation and namespace ids. */
export class KeyTable {
  /** The records; replaced (not grown in place) when the table grows. */
  rec: Int32Array = new Int32Array(0);
  buckets: Int32Array = new Int32Array(0);
  mask = 0;
  /** Slots ever used: records [0, top) are live or free. */
  top = 0;
  size = 0;
  #free = NONE;
  readonly #nsIds = new Map<NamespaceId, number>();
  readonly #nsNames: NamespaceId[] = [''];
  /** Each namespace id's 16 bytes as four little-endian words. */
  readonly #nsWords: Int32Array[] = [new Int32Array(4)];

  readonly #maxSlots: number;
  readonly #memory: IndexMemory | undefined;

  /**
   * @param maxSlots growth stops adding slots beyond this many (more are added one unit at a time).
   * @param memory where arrays of 2 MiB or more come from; default Node's own.
   */
  constructor(slots: number, maxSlots: number, memory?: IndexMemory) {
    this.#maxSlots = maxSlots;
    this.#memory = memory;
    this.resize(slots);
  }

  /** The id of `ns` if it has one, else undefined. */
  idOf(ns: NamespaceId): number | undefined {
    return this.#nsIds.get(ns);
  }

  /** The id of `ns`, registering it; -1 for a string that is not 32 lowercase hex digits. */
  nsId(ns: NamespaceId): number {
    let id = this.#nsIds.get(ns);
    if (id === undefined) {
      const raw = new Uint8Array(16);
      if (!bytesOfHex(ns, raw, 0, 16)) return NONE;
      id = this.#nsNames.length;
      this.#nsIds.set(ns, id);
      this.#nsNames.push(ns);
      this.#nsWords.push(new Int32Array(raw.buffer));
    }
    return id;
  }

  nsName(id: number): NamespaceId {
    return this.#nsNames[id]!;
  }

  /** The four words of namespace `id`. */
  nsWords(id: number): Int32Array {
    return this.#nsWords[id]!;
  }

  hashOf(slot: number): ChunkHash {
    return hashOfWords(this.rec, slot * STRIDE);
  }

  /** The slot of (ns, hash), or -1. */
  find(ns: NamespaceId, hash: ChunkHash): number {
    const id = this.#nsIds.get(ns);
    if (id === undefined) return NONE;
    return this.findWords(
      id,
      hashWord(hash, 0),
      hashWord(hash, 1),
      hashWord(hash, 2),
      hashWord(hash, 3),
      hashWord(hash, 4),
      hashWord(hash, 5),
      hashWord(hash, 6),
      hashWord(hash, 7),
    );
  }

  /** The slot of namespace id `nsId` and the hash words `words[at, at + 8)`, or -1. */
  findWordsAt(nsId: number, words: Int32Array, at: number): number {
    return this.findWords(
      nsId,
      words[at]!,
      words[at + 1]!,
      words[at + 2]!,
      words[at + 3]!,
      words[at + 4]!,
      words[at + 5]!,
      words[at + 6]!,
      words[at + 7]!,
    );
  }

  findWords(
    nsId: number,
    w0: number,
    w1: number,
    w2: number,
    w3: number,
    w4: number,
    w5: number,
    w6: number,
    w7: number,
  ): number {
    return this.walk(
      this.buckets[bucketHash(w0, w1, w2, w3, w4, w5, w6, w7) & this.mask]!,
      nsId,
      w0,
      w1,
      w2,
      w3,
      w4,
      w5,
      w6,
      w7,
    );
  }

  /** Follows a bucket chain from `s` to the record of the key, or -1. */
  walk(
    s: number,
    nsId: number,
    w0: number,
    w1: number,
    w2: number,
    w3: number,
    w4: number,
    w5: number,
    w6: number,
    w7: number,
  ): number {
    const r = this.rec;
    while (s !== NONE) {
      const b = s * STRIDE;
      if (
        r[b] === w0 &&
        r[b + 1] === w1 &&
        r[b + 2] === w2 &&
        r[b + 3] === w3 &&
        r[b + 4] === w4 &&
        r[b + 5] === w5 &&
        r[b + 6] === w6 &&
        r[b + 7] === w7 &&
        r[b + F.NS] === nsId
      ) {
        return s;
      }
      s = r[b + F.CHAIN]!;
    }
    return NONE;
  }

  /**
   * {@link walk} from the head of bucket `bucket`, and a record found further down its chain is
   * moved to the head: keys looked up again are then found in the first record read (two cache
   * misses in a large table instead of three or more). The writes hit lines the walk just read.
   */
  walkToFront(
    bucket: number,
    nsId: number,
    w0: number,
    w1: number,
    w2: number,
    w3: number,
    w4: number,
    w5: number,
    w6: number,
    w7: number,
  ): number {
    const r = this.rec;
    let prev = NONE;
    let s = this.buckets[bucket]!;
    while (s !== NONE) {
      const b = s * STRIDE;
      if (
        r[b] === w0 &&
        r[b + 1] === w1 &&
        r[b + 2] === w2 &&
        r[b + 3] === w3 &&
        r[b + 4] === w4 &&
        r[b + 5] === w5 &&
        r[b + 6] === w6 &&
        r[b + 7] === w7 &&
        r[b + F.NS] === nsId
      ) {
        if (prev !== NONE) {
          r[prev * STRIDE + F.CHAIN] = r[b + F.CHAIN]!;
          r[b + F.CHAIN] = this.buckets[bucket]!;
          this.buckets[bucket] = s;
        }
        return s;
      }
      prev = s;
      s = r[b + F.CHAIN]!;
    }
    return NONE;
  }

  /**
   * Allocates a record for a key that is not in the table (the caller checked), fills in its
   * hash and namespace and links it into its bucket; the other fields are the caller's.
   */
  insert(nsId: number, words: Int32Array, at: number): number {
    const slot = this.#alloc();
    const r = this.rec;
    const b = slot * STRIDE;
    for (let w = 0; w < 8; w++) r[b + w] = words[at + w]!;
    r[b + F.NS] = nsId;
    const bucket = this.#bucketOf(b);
    r[b + F.CHAIN] = this.buckets[bucket]!;
    this.buckets[bucket] = slot;
    this.size++;
    return slot;
  }

  /** Unlinks a live record from its bucket and frees its slot. */
  remove(slot: number): void {
    const r = this.rec;
    const b = slot * STRIDE;
    const bucket = this.#bucketOf(b);
    let s = this.buckets[bucket]!;
    if (s === slot) this.buckets[bucket] = r[b + F.CHAIN]!;
    else {
      while (s !== NONE && r[s * STRIDE + F.CHAIN] !== slot) s = r[s * STRIDE + F.CHAIN]!;
      if (s !== NONE) r[s * STRIDE + F.CHAIN] = r[b + F.CHAIN]!;
    }
    r[b + F.NS] = 0;
    r[b + F.FLAGS] = 0;
    r[b + F.PINS] = 0;
    r[b + F.CHAIN] = this.#free;
    this.#free = slot;
    this.size--;
  }

  /** Every live slot (of namespace `id`, or all with 0). */
  slots(id: number): number[] {
    const out: number[] = [];
    const r = this.rec;
    for (let s = 0; s < this.top; s++) {
      const n = r[s * STRIDE + F.NS]!;
      if (n !== 0 && (id === 0 || n === id)) out.push(s);
    }
    return out;
  }

  /** Forgets every record (namespace ids stay). */
  clear(slots: number): void {
    this.top = 0;
    this.size = 0;
    this.#free = NONE;
    this.resize(slots, true);
  }

  /**
   * Grows (or, with `fresh`, replaces) the arrays to hold `slots` records (a multiple of 1024,
   * at least `slots`); the buckets are the next power of two, so a chain holds one entry on
   * average.
   */
  resize(slots: number, fresh = false): void {
    const cap = Math.ceil(Math.max(SLOT_UNIT, slots) / SLOT_UNIT) * SLOT_UNIT;
    let buckets = SLOT_UNIT;
    while (buckets < cap) buckets *= 2;
    const rec = this.#int32s(cap * STRIDE);
    if (!fresh) rec.set(this.rec.subarray(0, Math.min(this.rec.length, rec.length)));
    this.rec = rec;
    if (this.buckets.length === buckets && !fresh) return;
    this.buckets = this.#int32s(buckets).fill(NONE);
    this.mask = buckets - 1;
    if (fresh) return;
    for (let s = 0; s < this.top; s++) {
      const b = s * STRIDE;
      if (rec[b + F.NS] === 0) continue;
      const bucket = this.#bucketOf(b);
      rec[b + F.CHAIN] = this.buckets[bucket]!;
      this.buckets[bucket] = s;
    }
  }

  /** Records allocated (used or not). */
  get capacity(): number {
    return this.rec.length / STRIDE;
  }

  /** `n` zeroed words, from the table's memory when they are many (Node's if it fails). */
  #int32s(n: number): Int32Array {
    const bytes = n * 4;
    let m: Uint8Array | null = null;
    if (bytes >= LARGE_ARRAY_BYTES && this.#memory !== undefined) {
      try {
        m = this.#memory(bytes);
      } catch {
        // e.g. more than one slab holds: the array is only slower in Node's memory.
      }
    }
    return m === null || m.byteLength !== bytes || m.byteOffset % 4 !== 0
      ? new Int32Array(n)
      : new Int32Array(m.buffer, m.byteOffset, n);
  }

  #bucketOf(b: number): number {
    const r = this.rec;
    return (
      bucketHash(
        r[b]!,
        r[b + 1]!,
        r[b + 2]!,
        r[b + 3]!,
        r[b + 4]!,
        r[b + 5]!,
        r[b + 6]!,
        r[b + 7]!,
      ) & this.mask
    );
  }

  #alloc(): number {
    if (this.#free !== NONE) {
      const s = this.#free;
      this.#free = this.rec[s * STRIDE + F.CHAIN]!;
      return s;
    }
    if (this.top === this.capacity) {
      // Half again, not double: at most a third of the records unused after a growth.
      this.resize(Math.max(this.top + 1, Math.min(Math.ceil(this.top * 1.5), this.#maxSlots)));
    }
    return this.top++;
  }
}
