/**
 * The local-disk tier's in-memory index and its byte bound, in typed arrays: no string, object or
 * map entry per chunk, so a million chunks cost about 68 bytes each and nothing for the garbage
 * collector to trace. Each chunk is one 64-byte record (one cache line) of a {@link KeyTable}:
 * its hash, a namespace id, its file size, pin count, recency links, hash-chain link, generation
 * and flags. The file path is derived from (namespace, hash) when needed. Recency of unpinned
 * chunks is a list through the records; accounting covers used, reserved (writes under way) and
 * pinned bytes. It never touches files: evicting a chunk hands its key to `onEvict`, which
 * deletes the file.
 */

import type { ChunkHash, NamespaceId } from '../core/types.ts';
import { CHUNK_HEADER_BYTES } from '../format/chunk-format.ts';
import { hashWord } from '../index/hash-words.ts';
import { bucketHash, F, KeyTable, NONE, STRIDE } from '../index/key-table.ts';

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
  /** The caller knows the key is not indexed (a snapshot of distinct keys): not looked up. */
  readonly distinct?: boolean;
}

const LISTED = 1; // in the recency list (live and unpinned)
const VERIFIED = 2;
/** Hashes a lookup parses and probes at once: independent memory accesses overlap. */
const GROUP = 8;
const GROUP_WORDS = new Int32Array(8 * GROUP);
const GROUP_SLOTS = new Int32Array(GROUP);
const SCRATCH = new Int32Array(8);

/** Entries, recency and the byte bound of one local-disk tier. */
export class DiskIndex {
  readonly #t: KeyTable;
  #head = NONE; // least recently used
  #tail = NONE;
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
    this.#t = new KeyTable(Math.min(expectedChunks, this.#maxChunks), this.#maxChunks + 1);
  }

  /** Grows the arrays to hold `n` entries without growing again (a journal's entry count). */
  ensureSlots(n: number): void {
    const want = Math.min(n, this.#maxChunks);
    if (want > this.#t.capacity) this.#t.resize(want);
  }

  /** Sets who hears of every entry added and removed (a journal). */
  set onChange(fn: IndexChange | null) {
    this.#onChange = fn;
  }

  get size(): number {
    return this.#t.size;
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
    return this.#t.rec.byteLength + this.#t.buckets.byteLength;
  }

  /** The slot of (ns, hash), or -1. */
  find(ns: NamespaceId, hash: ChunkHash): number {
    return this.#t.find(ns, hash);
  }

  /** The slot of namespace id `nsId` and the hash words `words[at, at + 8)`, or -1. */
  findWordsAt(nsId: number, words: Int32Array, at: number): number {
    return this.#t.findWordsAt(nsId, words, at);
  }

  /** The id of `ns`, registering it; -1 for a string that is not 32 lowercase hex digits. */
  nsId(ns: NamespaceId): number {
    return this.#t.nsId(ns);
  }

  /**
   * Counts the hashes present from the first until the first miss, touching each (most recent
   * last) or, with `pin`, pinning each. Parses and probes a few hashes at a time, so that their
   * memory accesses overlap instead of waiting one after another.
   */
  prefixHits(ns: NamespaceId, hashes: readonly ChunkHash[], pin: boolean): number {
    const t = this.#t;
    const id = t.idOf(ns);
    if (id === undefined) return 0;
    const words = GROUP_WORDS;
    const slots = GROUP_SLOTS;
    let hits = 0;
    for (let base = 0; base < hashes.length; base += GROUP) {
      const g = Math.min(GROUP, hashes.length - base);
      for (let i = 0; i < g; i++) {
        const h = hashes[base + i]!;
        const o = 8 * i;
        for (let w = 0; w < 8; w++) words[o + w] = hashWord(h, w);
        slots[i] =
          t.buckets[
            bucketHash(
              words[o]!,
              words[o + 1]!,
              words[o + 2]!,
              words[o + 3]!,
              words[o + 4]!,
              words[o + 5]!,
              words[o + 6]!,
              words[o + 7]!,
            ) & t.mask
          ]!;
      }
      let found = 0;
      for (; found < g; found++) {
        const o = 8 * found;
        const s = t.walk(
          slots[found]!,
          id,
          words[o]!,
          words[o + 1]!,
          words[o + 2]!,
          words[o + 3]!,
          words[o + 4]!,
          words[o + 5]!,
          words[o + 6]!,
          words[o + 7]!,
        );
        if (s === NONE) break;
        slots[found] = s;
      }
      for (let i = 0; i < found; i++) {
        if (pin) this.pin(slots[i]!);
        else this.touch(slots[i]!);
      }
      hits += found;
      if (found < g) break;
    }
    return hits;
  }

  /** Chunks and file bytes per namespace, walking every record (a few ms per million). */
  usageByNamespace(): Map<NamespaceId, { chunks: number; bytes: number }> {
    const t = this.#t;
    const r = t.rec;
    const byId = new Map<number, { chunks: number; bytes: number }>();
    for (let b = 0, end = t.top * STRIDE; b < end; b += STRIDE) {
      const id = r[b + F.NS]!;
      if (id === 0) continue;
      const u = byId.get(id);
      const bytes = r[b + F.BYTES]! >>> 0;
      if (u === undefined) byId.set(id, { chunks: 1, bytes });
      else {
        u.chunks++;
        u.bytes += bytes;
      }
    }
    const out = new Map<NamespaceId, { chunks: number; bytes: number }>();
    for (const [id, u] of byId) out.set(t.nsName(id), u);
    return out;
  }

  /** Whether `slot` still holds the entry of generation `gen` (not removed or replaced since). */
  holds(slot: number, gen: number): boolean {
    const b = slot * STRIDE;
    const r = this.#t.rec;
    return slot >= 0 && slot < this.#t.top && r[b + F.NS] !== 0 && r[b + F.GEN] === gen;
  }

  /** Whether `slot` holds an entry (any generation). */
  live(slot: number): boolean {
    return this.#t.rec[slot * STRIDE + F.NS] !== 0;
  }
  genOf(slot: number): number {
    return this.#t.rec[slot * STRIDE + F.GEN]!;
  }
  nsOf(slot: number): NamespaceId {
    return this.#t.nsName(this.#t.rec[slot * STRIDE + F.NS]!);
  }
  hashOf(slot: number): ChunkHash {
    return this.#t.hashOf(slot);
  }
  /** File size of the entry: header + payload. */
  bytesOf(slot: number): number {
    return this.#t.rec[slot * STRIDE + F.BYTES]! >>> 0;
  }
  isVerified(slot: number): boolean {
    return (this.#t.rec[slot * STRIDE + F.FLAGS]! & VERIFIED) !== 0;
  }
  markVerified(slot: number): void {
    this.#t.rec[slot * STRIDE + F.FLAGS]! |= VERIFIED;
  }

  /** Writes the entry's namespace (4 words) then its hash (8 words) into `out` at `at`. */
  writeKey(slot: number, out: Int32Array, at: number): void {
    const r = this.#t.rec;
    const b = slot * STRIDE;
    out.set(this.#t.nsWords(r[b + F.NS]!), at);
    for (let w = 0; w < 8; w++) out[at + 4 + w] = r[b + w]!;
  }

  /**
   * Indexes an object of `bytes` bytes; if (ns, hash) is already there, updates its size and
   * touches (or pins) it. Returns the slot. `ns` must be a storable namespace id.
   */
  add(ns: NamespaceId, hash: ChunkHash, bytes: number, opts: AddOptions = {}): number {
    const id = this.#t.nsId(ns);
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
    const found = opts.distinct === true ? NONE : this.#t.findWordsAt(nsId, words, at);
    if (found !== NONE) {
      this.#resized(found, bytes);
      if (opts.verified === true) this.markVerified(found);
      if (opts.pin === true) this.pin(found);
      else this.touch(found);
      return found;
    }
    const slot = this.#t.insert(nsId, words, at);
    const r = this.#t.rec;
    const b = slot * STRIDE;
    r[b + F.BYTES] = bytes;
    r[b + F.PINS] = 0;
    r[b + F.GEN] = this.#gen = (this.#gen + 1) | 0;
    r[b + F.FLAGS] = opts.verified === false ? 0 : VERIFIED;
    this.#bytesUsed += bytes;
    if (opts.pin === true) this.pin(slot);
    else if (opts.leastRecent === true) this.#linkHead(slot);
    else this.#linkTail(slot);
    this.#onChange?.('add', slot);
    while (this.#t.size > this.#maxChunks && this.#head !== NONE && this.#head !== slot) {
      this.#evict(this.#head);
    }
    return slot;
  }

  /** Marks an entry recently used. */
  touch(slot: number): void {
    if ((this.#t.rec[slot * STRIDE + F.FLAGS]! & LISTED) === 0 || this.#tail === slot) return;
    this.#unlink(slot);
    this.#linkTail(slot);
  }

  pin(slot: number): void {
    const r = this.#t.rec;
    const b = slot * STRIDE;
    if (r[b + F.PINS] === 0) {
      if ((r[b + F.FLAGS]! & LISTED) !== 0) this.#unlink(slot);
      this.#pinnedChunks++;
      this.#pinnedBytes += r[b + F.BYTES]! >>> 0;
    }
    r[b + F.PINS]!++;
  }

  /** Releases one pin; ignores an unpinned entry. */
  unpin(slot: number): void {
    const r = this.#t.rec;
    const b = slot * STRIDE;
    if (r[b + F.PINS] === 0) return;
    if (--r[b + F.PINS]! === 0) {
      this.#pinnedChunks--;
      this.#pinnedBytes -= r[b + F.BYTES]! >>> 0;
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
    const id = ns === undefined ? 0 : this.#t.idOf(ns);
    return id === undefined ? [] : this.#t.slots(id);
  }

  /** Live slots least recently used first, pinned ones (in use) last. */
  recencyOrder(): Int32Array {
    const t = this.#t;
    const out = new Int32Array(t.size);
    let i = 0;
    const r = t.rec;
    for (let s = this.#head; s !== NONE; s = r[s * STRIDE + F.NEXT]!) out[i++] = s;
    for (let s = 0; s < t.top; s++) {
      if (r[s * STRIDE + F.NS] !== 0 && r[s * STRIDE + F.PINS] !== 0) out[i++] = s;
    }
    return out;
  }

  /**
   * Removes every entry not {@link markVerified} (nor added verified), telling `onSwept` of
   * each; returns how many.
   */
  sweepUnverified(onSwept?: (ns: NamespaceId, hash: ChunkHash) => void): number {
    let n = 0;
    const t = this.#t;
    for (let s = 0; s < t.top; s++) {
      const b = s * STRIDE;
      if (t.rec[b + F.NS] !== 0 && (t.rec[b + F.FLAGS]! & VERIFIED) === 0) {
        onSwept?.(this.nsOf(s), this.hashOf(s));
        this.#remove(s);
        n++;
      }
    }
    return n;
  }

  /** Moves the given slots, in the order given, to the least-recent end (those still listed). */
  moveToLeastRecent(order: Int32Array | number[]): void {
    const r = this.#t.rec;
    for (let i = order.length - 1; i >= 0; i--) {
      const s = order[i]!;
      if ((r[s * STRIDE + F.FLAGS]! & LISTED) === 0) continue;
      this.#unlink(s);
      this.#linkHead(s);
    }
  }

  clear(): void {
    this.#t.clear(0);
    this.#head = NONE;
    this.#tail = NONE;
    this.#bytesUsed = 0;
    this.#pinnedBytes = 0;
    this.#pinnedChunks = 0;
  }

  #resized(slot: number, bytes: number): void {
    const r = this.#t.rec;
    const b = slot * STRIDE;
    const old = r[b + F.BYTES]! >>> 0;
    if (old === bytes) return;
    r[b + F.BYTES] = bytes;
    this.#bytesUsed += bytes - old;
    if (r[b + F.PINS] !== 0) this.#pinnedBytes += bytes - old;
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
    const r = this.#t.rec;
    const b = slot * STRIDE;
    if (r[b + F.NS] === 0) return;
    this.#onChange?.('remove', slot);
    if ((r[b + F.FLAGS]! & LISTED) !== 0) this.#unlink(slot);
    const bytes = r[b + F.BYTES]! >>> 0;
    if (r[b + F.PINS] !== 0) {
      this.#pinnedChunks--;
      this.#pinnedBytes -= bytes;
    }
    this.#bytesUsed -= bytes;
    this.#t.remove(slot);
  }

  #linkTail(slot: number): void {
    const r = this.#t.rec;
    const b = slot * STRIDE;
    r[b + F.PREV] = this.#tail;
    r[b + F.NEXT] = NONE;
    if (this.#tail !== NONE) r[this.#tail * STRIDE + F.NEXT] = slot;
    else this.#head = slot;
    this.#tail = slot;
    r[b + F.FLAGS]! |= LISTED;
  }

  #linkHead(slot: number): void {
    const r = this.#t.rec;
    const b = slot * STRIDE;
    r[b + F.NEXT] = this.#head;
    r[b + F.PREV] = NONE;
    if (this.#head !== NONE) r[this.#head * STRIDE + F.PREV] = slot;
    else this.#tail = slot;
    this.#head = slot;
    r[b + F.FLAGS]! |= LISTED;
  }

  #unlink(slot: number): void {
    const r = this.#t.rec;
    const b = slot * STRIDE;
    const prev = r[b + F.PREV]!;
    const next = r[b + F.NEXT]!;
    if (prev !== NONE) r[prev * STRIDE + F.NEXT] = next;
    else this.#head = next;
    if (next !== NONE) r[next * STRIDE + F.PREV] = prev;
    else this.#tail = prev;
    r[b + F.FLAGS]! &= ~LISTED;
  }
}
