/**
 * The local-disk tier's in-memory index and its byte bound, in typed arrays: no string, object or
 * map entry per chunk, so a million chunks cost about 70 bytes each and nothing for the garbage
 * collector to trace. Each chunk is one 64-byte record (one cache line) in one Int32Array: its
 * hash as eight words, its namespace as a small id, its file size, pin count, recency links,
 * hash-chain link, generation and flags. The file path is derived from (namespace, hash) when
 * needed. Recency of unpinned chunks is an intrusive list through the records; accounting covers
 * used, reserved (writes under way) and pinned bytes. It never touches files: evicting a chunk
 * hands its key to `onEvict`, which deletes the file.
 */
import { randomBytes } from 'node:crypto';
import { CHUNK_HEADER_BYTES } from './chunk-format.ts';
import { bytesOfHex, hashOfWords, hashWord } from './hash-words.ts';
import type { ChunkHash, NamespaceId } from './types.ts';

/** Unambiguous composite key: the length prefix keeps (ns, hash) pairs from colliding. */
export function diskKey(ns: NamespaceId, hash: ChunkHash): string {
  return `${ns.length}:${ns}${hash}`;
}

/** An entry that left the index through eviction (its file is the callback's to delete). */
export interface EvictedEntry {
  readonly ns: NamespaceId;
  readonly hash: ChunkHash;
  readonly bytes: number;
}

/** How a change to the index is reported to a journal: the slot still holds the key. */
export type IndexChange = (kind: 'add' | 'remove', slot: number) => void;

/** Options of {@link DiskIndex.add}. */
export interface AddOptions {
  /** Pin the entry once instead of making it the most recent. */
  readonly pin?: boolean;
  /** Put a new entry at the least-recent end (a chunk found on disk, not just used). */
  readonly leastRecent?: boolean;
  /** Whether the entry is known to match a file (false: from a journal, not yet checked). */
  readonly verified?: boolean;
}

// Record layout, in int32 words.
const STRIDE = 16;
const NS = 8; // namespace id; 0 marks a free slot
const BYTES = 9; // file size, u32
const PINS = 10;
const PREV = 11;
const NEXT = 12;
const CHAIN = 13; // next record in the hash bucket, or in the free list
const GEN = 14;
const FLAGS = 15;
const LISTED = 1; // in the recency list (live and unpinned)
const VERIFIED = 2;
const NONE = -1;
const MIN_SLOTS = 1024;

// A per-process seed mixed into bucket numbers, so that which hashes share a bucket cannot be
// chosen by whoever picks the hashes.
const SEED = randomBytes(4).readInt32LE(0);

function mix(h: number, w: number): number {
  h = Math.imul(h ^ w, 0x85ebca6b);
  return h ^ (h >>> 13);
}

function bucketHash(
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

/** Entries, recency and the byte bound of one local-disk tier. */
export class DiskIndex {
  #rec = new Int32Array(0);
  #buckets = new Int32Array(0);
  #mask = 0;
  /** Slots ever used (records [0, top) are live or free). */
  #top = 0;
  #free = NONE;
  #size = 0;
  #head = NONE; // least recently used
  #tail = NONE;
  readonly #nsIds = new Map<NamespaceId, number>();
  readonly #nsNames: NamespaceId[] = [''];
  /** Each namespace id's 16 bytes as four little-endian words. */
  readonly #nsWords: Int32Array[] = [new Int32Array(4)];
  readonly #capacityBytes: number;
  readonly #maxChunks: number;
  readonly #onEvict: (e: EvictedEntry) => void;
  #onChange: IndexChange | null = null;
  #bytesUsed = 0;
  #reservedBytes = 0;
  #pinnedBytes = 0;
  #pinnedChunks = 0;
  #evictions = 0;
  #gen = 0;

  /**
   * @param onEvict deletes the file of an entry the bound pushed out (already unindexed).
   * @param expectedChunks records to allocate at once (e.g. a journal's entry count).
   */
  constructor(
    capacityBytes: number,
    maxChunks: number,
    onEvict: (e: EvictedEntry) => void,
    expectedChunks = 0,
  ) {
    this.#capacityBytes = capacityBytes;
    // Every object is at least a header, so more entries than that could never be used.
    this.#maxChunks = Math.min(maxChunks, Math.floor(capacityBytes / CHUNK_HEADER_BYTES));
    this.#onEvict = onEvict;
    this.#resize(Math.max(MIN_SLOTS, Math.min(expectedChunks, this.#maxChunks)));
  }

  /** Grows the arrays to hold `n` entries without growing again (a journal's entry count). */
  ensureSlots(n: number): void {
    const want = Math.min(n, this.#maxChunks);
    if (want * STRIDE > this.#rec.length) this.#resize(want);
  }

  /** Sets who hears of every entry added and removed (a journal). */
  set onChange(fn: IndexChange | null) {
    this.#onChange = fn;
  }

  get size(): number {
    return this.#size;
  }
  get bytesUsed(): number {
    return this.#bytesUsed;
  }
  get pinnedChunks(): number {
    return this.#pinnedChunks;
  }
  get evictions(): number {
    return this.#evictions;
  }
  /** Bytes the index's arrays hold (records and buckets). */
  get arrayBytes(): number {
    return this.#rec.byteLength + this.#buckets.byteLength;
  }

  /** The slot of (ns, hash), or -1. */
  find(ns: NamespaceId, hash: ChunkHash): number {
    const id = this.#nsIds.get(ns);
    if (id === undefined) return NONE;
    return this.#findWords(
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
    return this.#findWords(
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

  /** Whether `slot` still holds the entry of generation `gen` (not removed or replaced since). */
  holds(slot: number, gen: number): boolean {
    const b = slot * STRIDE;
    return slot >= 0 && slot < this.#top && this.#rec[b + NS] !== 0 && this.#rec[b + GEN] === gen;
  }

  /** Whether `slot` holds an entry (any generation). */
  live(slot: number): boolean {
    return this.#rec[slot * STRIDE + NS] !== 0;
  }

  genOf(slot: number): number {
    return this.#rec[slot * STRIDE + GEN]!;
  }
  nsOf(slot: number): NamespaceId {
    return this.#nsNames[this.#rec[slot * STRIDE + NS]!]!;
  }
  hashOf(slot: number): ChunkHash {
    return hashOfWords(this.#rec, slot * STRIDE);
  }
  /** File size of the entry: header + payload. */
  bytesOf(slot: number): number {
    return this.#rec[slot * STRIDE + BYTES]! >>> 0;
  }
  isVerified(slot: number): boolean {
    return (this.#rec[slot * STRIDE + FLAGS]! & VERIFIED) !== 0;
  }
  markVerified(slot: number): void {
    this.#rec[slot * STRIDE + FLAGS]! |= VERIFIED;
  }

  /** Writes the entry's namespace (4 words) then its hash (8 words) into `out` at `at`. */
  writeKey(slot: number, out: Int32Array, at: number): void {
    const nsw = this.#nsWords[this.#rec[slot * STRIDE + NS]!]!;
    out[at] = nsw[0]!;
    out[at + 1] = nsw[1]!;
    out[at + 2] = nsw[2]!;
    out[at + 3] = nsw[3]!;
    const b = slot * STRIDE;
    for (let w = 0; w < 8; w++) out[at + 4 + w] = this.#rec[b + w]!;
  }

  /**
   * Indexes an object of `bytes` bytes; if (ns, hash) is already there, updates its size and
   * touches (or pins) it. Returns the slot. `ns` must be a storable namespace id.
   */
  add(ns: NamespaceId, hash: ChunkHash, bytes: number, opts: AddOptions = {}): number {
    const id = this.nsId(ns);
    if (id === NONE) throw new TypeError(`namespace ${ns} is not 32 lowercase hex digits`);
    for (let w = 0; w < 8; w++) SCRATCH[w] = hashWord(hash, w);
    return this.addWordsAt(id, SCRATCH, 0, bytes, opts);
  }

  /** {@link add} with the hash as the words `words[at, at + 8)` and the namespace as an id. */
  addWordsAt(
    nsId: number,
    words: Int32Array,
    at: number,
    bytes: number,
    opts: AddOptions = {},
  ): number {
    const found = this.findWordsAt(nsId, words, at);
    if (found !== NONE) {
      this.#resized(found, bytes);
      if (opts.verified === true) this.markVerified(found);
      if (opts.pin === true) this.pin(found);
      else this.touch(found);
      return found;
    }
    const slot = this.#alloc();
    const r = this.#rec;
    const b = slot * STRIDE;
    for (let w = 0; w < 8; w++) r[b + w] = words[at + w]!;
    r[b + NS] = nsId;
    r[b + BYTES] = bytes;
    r[b + PINS] = 0;
    r[b + GEN] = this.#gen = (this.#gen + 1) | 0;
    r[b + FLAGS] = opts.verified === false ? 0 : VERIFIED;
    const bucket = this.#bucketOf(b);
    r[b + CHAIN] = this.#buckets[bucket]!;
    this.#buckets[bucket] = slot;
    this.#size++;
    this.#bytesUsed += bytes;
    if (opts.pin === true) this.pin(slot);
    else if (opts.leastRecent === true) this.#linkHead(slot);
    else this.#linkTail(slot);
    this.#onChange?.('add', slot);
    while (this.#size > this.#maxChunks && this.#head !== NONE && this.#head !== slot) {
      this.#evict(this.#head);
    }
    return slot;
  }

  /** Marks an entry recently used. */
  touch(slot: number): void {
    const b = slot * STRIDE;
    if ((this.#rec[b + FLAGS]! & LISTED) === 0 || this.#tail === slot) return;
    this.#unlink(slot);
    this.#linkTail(slot);
  }

  pin(slot: number): void {
    const r = this.#rec;
    const b = slot * STRIDE;
    if (r[b + PINS] === 0) {
      if ((r[b + FLAGS]! & LISTED) !== 0) this.#unlink(slot);
      this.#pinnedChunks++;
      this.#pinnedBytes += r[b + BYTES]! >>> 0;
    }
    r[b + PINS]!++;
  }

  /** Releases one pin; ignores an unpinned entry. */
  unpin(slot: number): void {
    const r = this.#rec;
    const b = slot * STRIDE;
    if (r[b + PINS] === 0) return;
    if (--r[b + PINS]! === 0) {
      this.#pinnedChunks--;
      this.#pinnedBytes -= r[b + BYTES]! >>> 0;
      this.#linkTail(slot);
    }
  }

  /** Takes an entry out of the index and the accounting; its file is the caller's concern. */
  forget(slot: number): void {
    this.#remove(slot);
  }

  /**
   * Evicts unpinned entries oldest first until `bytes` more fit, then reserves them for a write
   * (release with {@link unreserve}); false, with nothing evicted or reserved, if they cannot fit.
   */
  reserve(bytes: number): boolean {
    const cap = this.#capacityBytes;
    if (cap - this.#pinnedBytes - this.#reservedBytes < bytes) return false;
    while (this.#bytesUsed + this.#reservedBytes + bytes > cap) {
      if (this.#head === NONE) return false;
      this.#evict(this.#head);
    }
    this.#reservedBytes += bytes;
    return true;
  }

  unreserve(bytes: number): void {
    this.#reservedBytes -= bytes;
  }

  /** Evicts oldest first while over the bound (it may have been lowered since a restart). */
  trim(): void {
    while (this.#bytesUsed > this.#capacityBytes && this.#head !== NONE) this.#evict(this.#head);
  }

  /** Every live slot (of `ns`, or all), as a snapshot. */
  slots(ns?: NamespaceId): number[] {
    const id = ns === undefined ? 0 : this.#nsIds.get(ns);
    if (id === undefined) return [];
    const out: number[] = [];
    const r = this.#rec;
    for (let s = 0; s < this.#top; s++) {
      const n = r[s * STRIDE + NS]!;
      if (n !== 0 && (id === 0 || n === id)) out.push(s);
    }
    return out;
  }

  /** Live slots least recently used first, pinned ones (in use) last. */
  recencyOrder(): Int32Array {
    const out = new Int32Array(this.#size);
    let i = 0;
    const r = this.#rec;
    for (let s = this.#head; s !== NONE; s = r[s * STRIDE + NEXT]!) out[i++] = s;
    for (let s = 0; s < this.#top; s++) {
      if (r[s * STRIDE + NS] !== 0 && r[s * STRIDE + PINS] !== 0) out[i++] = s;
    }
    return out;
  }

  /** Removes every entry not {@link markVerified} (nor added verified); returns how many. */
  sweepUnverified(): number {
    let n = 0;
    const r = this.#rec;
    for (let s = 0; s < this.#top; s++) {
      const b = s * STRIDE;
      if (r[b + NS] !== 0 && (r[b + FLAGS]! & VERIFIED) === 0) {
        this.#remove(s);
        n++;
      }
    }
    return n;
  }

  /** Moves the given slots, in the order given, to the least-recent end (those still listed). */
  moveToLeastRecent(order: Int32Array | number[]): void {
    const r = this.#rec;
    for (let i = order.length - 1; i >= 0; i--) {
      const s = order[i]!;
      if ((r[s * STRIDE + FLAGS]! & LISTED) === 0) continue;
      this.#unlink(s);
      this.#linkHead(s);
    }
  }

  clear(): void {
    this.#resize(MIN_SLOTS, true);
    this.#top = 0;
    this.#free = NONE;
    this.#size = 0;
    this.#head = NONE;
    this.#tail = NONE;
    this.#bytesUsed = 0;
    this.#pinnedBytes = 0;
    this.#pinnedChunks = 0;
  }

  #findWords(
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
    const r = this.#rec;
    let s = this.#buckets[bucketHash(w0, w1, w2, w3, w4, w5, w6, w7) & this.#mask]!;
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
        r[b + NS] === nsId
      ) {
        return s;
      }
      s = r[b + CHAIN]!;
    }
    return NONE;
  }

  #bucketOf(b: number): number {
    const r = this.#rec;
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
      ) & this.#mask
    );
  }

  #resized(slot: number, bytes: number): void {
    const b = slot * STRIDE;
    const old = this.#rec[b + BYTES]! >>> 0;
    if (old === bytes) return;
    this.#rec[b + BYTES] = bytes;
    this.#bytesUsed += bytes - old;
    if (this.#rec[b + PINS] !== 0) this.#pinnedBytes += bytes - old;
  }

  #alloc(): number {
    if (this.#free !== NONE) {
      const s = this.#free;
      this.#free = this.#rec[s * STRIDE + CHAIN]!;
      return s;
    }
    if (this.#top * STRIDE === this.#rec.length) {
      // Half again, not double: at most a third of the records unused after a growth.
      this.#resize(Math.max(this.#top + 1, Math.min(this.#top * 1.5, this.#maxChunks + 1)));
    }
    return this.#top++;
  }

  /**
   * Grows (or, with `fresh`, replaces) the arrays to hold `slots` records (a multiple of 1024,
   * at least `slots`); the buckets are the next power of two, so a chain holds one entry on
   * average.
   */
  #resize(slots: number, fresh = false): void {
    const cap = Math.ceil(Math.max(MIN_SLOTS, slots) / MIN_SLOTS) * MIN_SLOTS;
    let buckets = MIN_SLOTS;
    while (buckets < cap) buckets *= 2;
    const rec = new Int32Array(cap * STRIDE);
    if (!fresh) rec.set(this.#rec.subarray(0, Math.min(this.#rec.length, rec.length)));
    this.#rec = rec;
    if (this.#buckets.length === buckets && !fresh) return;
    this.#buckets = new Int32Array(buckets).fill(NONE);
    this.#mask = buckets - 1;
    if (fresh) return;
    for (let s = 0; s < this.#top; s++) {
      const b = s * STRIDE;
      if (rec[b + NS] === 0) continue;
      const bucket = this.#bucketOf(b);
      rec[b + CHAIN] = this.#buckets[bucket]!;
      this.#buckets[bucket] = s;
    }
  }

  #evict(slot: number): void {
    const e: EvictedEntry = {
      ns: this.nsOf(slot),
      hash: this.hashOf(slot),
      bytes: this.bytesOf(slot),
    };
    this.#remove(slot);
    this.#evictions++;
    this.#onEvict(e);
  }

  #remove(slot: number): void {
    const r = this.#rec;
    const b = slot * STRIDE;
    if (r[b + NS] === 0) return;
    this.#onChange?.('remove', slot);
    if ((r[b + FLAGS]! & LISTED) !== 0) this.#unlink(slot);
    const bytes = r[b + BYTES]! >>> 0;
    if (r[b + PINS] !== 0) {
      this.#pinnedChunks--;
      this.#pinnedBytes -= bytes;
    }
    this.#bytesUsed -= bytes;
    const bucket = this.#bucketOf(b);
    let s = this.#buckets[bucket]!;
    if (s === slot) this.#buckets[bucket] = r[b + CHAIN]!;
    else {
      while (s !== NONE && r[s * STRIDE + CHAIN] !== slot) s = r[s * STRIDE + CHAIN]!;
      if (s !== NONE) r[s * STRIDE + CHAIN] = r[b + CHAIN]!;
    }
    r[b + NS] = 0;
    r[b + FLAGS] = 0;
    r[b + PINS] = 0;
    r[b + CHAIN] = this.#free;
    this.#free = slot;
    this.#size--;
  }

  #linkTail(slot: number): void {
    const r = this.#rec;
    const b = slot * STRIDE;
    r[b + PREV] = this.#tail;
    r[b + NEXT] = NONE;
    if (this.#tail !== NONE) r[this.#tail * STRIDE + NEXT] = slot;
    else this.#head = slot;
    this.#tail = slot;
    r[b + FLAGS]! |= LISTED;
  }

  #linkHead(slot: number): void {
    const r = this.#rec;
    const b = slot * STRIDE;
    r[b + NEXT] = this.#head;
    r[b + PREV] = NONE;
    if (this.#head !== NONE) r[this.#head * STRIDE + PREV] = slot;
    else this.#tail = slot;
    this.#head = slot;
    r[b + FLAGS]! |= LISTED;
  }

  #unlink(slot: number): void {
    const r = this.#rec;
    const b = slot * STRIDE;
    const prev = r[b + PREV]!;
    const next = r[b + NEXT]!;
    if (prev !== NONE) r[prev * STRIDE + NEXT] = next;
    else this.#head = next;
    if (next !== NONE) r[next * STRIDE + PREV] = prev;
    else this.#tail = prev;
    r[b + FLAGS]! &= ~LISTED;
  }
}

const SCRATCH = new Int32Array(8);
