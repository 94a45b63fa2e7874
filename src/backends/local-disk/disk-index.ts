/**
 * The local-disk tier's in-memory index and its byte bound, in typed arrays: no string, object or
 * map entry per chunk, so a million chunks cost about 68 bytes each and nothing for the garbage
 * collector to trace. Each chunk is one 64-byte record (one cache line) of a {@link KeyTable}:
 * its hash, a namespace id, its file size, pin count, recency links, hash-chain link, generation
 * and flags. The file path is derived from (namespace, hash) when needed. Accounting covers used,
 * reserved (writes under way) and pinned bytes. It never touches files: evicting a chunk hands
 * its key to `onEvict`, which deletes the file.
 *
 * Recency is a second-chance clock over a list through the records: a use stamps the record
 * (a counter in its flags word, in the cache line the lookup just read) instead of moving it, so
 * a hit costs no writes to its list neighbours (two more cache misses each in a large index).
 * Eviction takes the entry at the old end; one stamped since it got there is moved to the new
 * end unstamped and passed over, and one pinned leaves the list until it is unpinned. So the
 * entries evicted first are those not used since they reached the old end, in list order: least
 * recently used, except that among entries used since, the list (not the last use) orders them.
 * {@link DiskIndex.recencyOrder} (what the journal keeps over a restart) orders the stamped ones
 * by their last use.
 */

import type { ChunkHash, NamespaceId } from '../core/types.ts';
import { CHUNK_HEADER_BYTES } from '../format/chunk-format.ts';
import { hashWord } from '../index/hash-words.ts';
import { bucketHash, F, type IndexMemory, KeyTable, NONE, STRIDE } from '../index/key-table.ts';

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

const LISTED = 1; // in the recency list
const VERIFIED = 2;
/** The flags word above these bits: the use stamp (0: not used since it was last linked). */
const USE_SHIFT = 2;
const USE_MASK = 0x3fffffff;
/** Hashes a lookup parses and probes at once: independent memory accesses overlap. */
const GROUP = 16;
const GROUP_WORDS = new Int32Array(8 * GROUP);
const GROUP_SLOTS = new Int32Array(GROUP);
/** The first word of each group member's first record, read only to bring it into cache. */
const GROUP_SEEN = new Int32Array(GROUP);
const GROUP_BUCKETS = new Int32Array(GROUP);
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
  /** The last use stamp handed out (30 bits, wrapping; never 0). */
  #use = 0;

  /**
   * @param onEvict deletes the file of an entry the bound pushed out (already unindexed).
   * @param expectedChunks records to allocate at once (e.g. a journal's entry count).
   * @param memory where the large arrays come from (see {@link IndexMemory}); default Node's own.
   */
  constructor(
    capacityBytes: number,
    maxChunks: number,
    onEvict: (e: EvictedEntry) => void,
    expectedChunks = 0,
    memory?: IndexMemory,
  ) {
    this.#capacityBytes = capacityBytes;
    // Every object is at least a header, so more entries than that could never be used.
    this.#maxChunks = Math.min(maxChunks, Math.floor(capacityBytes / CHUNK_HEADER_BYTES));
    this.#onEvict = onEvict;
    this.#t = new KeyTable(Math.min(expectedChunks, this.#maxChunks), this.#maxChunks + 1, memory);
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
    const seen = GROUP_SEEN;
    const bucketOf = GROUP_BUCKETS;
    const buckets = t.buckets;
    const mask = t.mask;
    const rec = t.rec;
    let hits = 0;
    for (let base = 0; base < hashes.length; base += GROUP) {
      const g = Math.min(GROUP, hashes.length - base);
      // Computing first, then loading in tight loops of independent reads: the group's cache
      // (and TLB) misses on the buckets, then on the records, are in flight together.
      for (let i = 0; i < g; i++) {
        const h = hashes[base + i]!;
        const o = 8 * i;
        for (let w = 0; w < 8; w++) words[o + w] = hashWord(h, w);
        slots[i] = bucketHash(
          words[o]!,
          words[o + 1]!,
          words[o + 2]!,
          words[o + 3]!,
          words[o + 4]!,
          words[o + 5]!,
          words[o + 6]!,
          words[o + 7]!,
        );
      }
      for (let i = 0; i < g; i++) {
        const bucket = slots[i]! & mask;
        bucketOf[i] = bucket;
        slots[i] = buckets[bucket]!;
      }
      for (let i = 0; i < g; i++) {
        const s0 = slots[i]!;
        if (s0 !== NONE) seen[i] = rec[s0 * STRIDE]!;
      }
      let found = 0;
      for (; found < g; found++) {
        const o = 8 * found;
        const s = t.walkToFront(
          bucketOf[found]!,
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
   * makes it the most recent (or pins it). Returns the slot. `ns` must be a storable namespace id.
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
      else if ((this.#t.rec[found * STRIDE + F.FLAGS]! & LISTED) !== 0) {
        // Moved, not stamped: a journal replays its records in order to rebuild recency exactly.
        this.#unlink(found);
        this.#linkTail(found);
      }
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
    while (this.#t.size > this.#maxChunks && this.#evictOldest(slot));
    return slot;
  }

  /** Marks an entry recently used: stamps it, touching no other record. */
  touch(slot: number): void {
    const use = (this.#use + 1) & USE_MASK || 1;
    this.#use = use;
    const f = slot * STRIDE + F.FLAGS;
    const r = this.#t.rec;
    r[f] = (r[f]! & ((1 << USE_SHIFT) - 1)) | (use << USE_SHIFT);
  }

  /** Pins an entry: it cannot be evicted until as many {@link unpin}s. */
  pin(slot: number): void {
    const r = this.#t.rec;
    const b = slot * STRIDE;
    // It stays where it is in the list (no neighbour to write); eviction passes it over.
    if (r[b + F.PINS] === 0) {
      this.#pinnedChunks++;
      this.#pinnedBytes += r[b + F.BYTES]! >>> 0;
    }
    r[b + F.PINS]!++;
  }

  /** Releases one pin; ignores an unpinned entry. Unpinned, it counts as just used. */
  unpin(slot: number): void {
    const r = this.#t.rec;
    const b = slot * STRIDE;
    if (r[b + F.PINS] === 0) return;
    if (--r[b + F.PINS]! === 0) {
      this.#pinnedChunks--;
      this.#pinnedBytes -= r[b + F.BYTES]! >>> 0;
      if ((r[b + F.FLAGS]! & LISTED) !== 0) this.touch(slot);
      else this.#linkTail(slot);
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
      if (!this.#evictOldest()) return false;
    }
    this.#reservedBytes += bytes;
    return true;
  }

  unreserve(bytes: number): void {
    this.#reservedBytes -= bytes;
  }

  /** Evicts oldest first while over the bound (it may have been lowered since a restart). */
  trim(): void {
    while (this.#bytesUsed > this.#capacityBytes && this.#evictOldest());
  }

  /** Every live slot (of `ns`, or all), as a snapshot. */
  slots(ns?: NamespaceId): number[] {
    const id = ns === undefined ? 0 : this.#t.idOf(ns);
    return id === undefined ? [] : this.#t.slots(id);
  }

  /**
   * Live slots least recently used first: those not used since they reached the old end in list
   * order (the order eviction takes them), then those used since by their last use, then pinned
   * ones (in use).
   */
  recencyOrder(): Int32Array {
    const t = this.#t;
    const out = new Int32Array(t.size);
    const r = t.rec;
    let i = 0;
    let used = 0;
    for (let s = this.#head; s !== NONE; s = r[s * STRIDE + F.NEXT]!) {
      if (r[s * STRIDE + F.PINS] !== 0) continue;
      if (r[s * STRIDE + F.FLAGS]! >>> USE_SHIFT === 0) out[i++] = s;
      else used++;
    }
    if (used > 0) {
      const byUse = this.#byUse(used);
      out.set(byUse, i);
      i += byUse.length;
    }
    for (let s = 0; s < t.top; s++) {
      if (r[s * STRIDE + F.NS] !== 0 && r[s * STRIDE + F.PINS] !== 0) out[i++] = s;
    }
    return out;
  }

  /** The `n` listed unpinned stamped slots, least recently used (oldest stamp) first. */
  #byUse(n: number): Int32Array {
    const r = this.#t.rec;
    const now = this.#use;
    const slots = new Int32Array(n);
    const ages = new Int32Array(n);
    let k = 0;
    for (let s = this.#head; s !== NONE; s = r[s * STRIDE + F.NEXT]!) {
      const use = r[s * STRIDE + F.FLAGS]! >>> USE_SHIFT;
      if (use === 0 || r[s * STRIDE + F.PINS] !== 0) continue;
      slots[k] = s;
      ages[k++] = (now - use) & USE_MASK;
    }
    // Oldest first; a stamp is unique (until it wraps), so ages alone order them. Packed with the
    // position into one float when both fit its 53 bits, else sorted through a comparator.
    if (n < 1 << 23) {
      const keys = new Float64Array(n);
      for (let j = 0; j < n; j++) keys[j] = (USE_MASK - ages[j]!) * (1 << 23) + j;
      keys.sort();
      const out = new Int32Array(n);
      for (let j = 0; j < n; j++) out[j] = slots[keys[j]! % (1 << 23)]!;
      return out;
    }
    const idx = Int32Array.from({ length: n }, (_, j) => j);
    idx.sort((a, b) => ages[b]! - ages[a]!);
    return idx.map((j) => slots[j]!);
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

  /**
   * Evicts the entry at the old end, passing over (to the new end, unstamped) those used since
   * they got there and dropping pinned ones from the list; false, with nothing evicted, when the
   * list runs out or reaches `keep`.
   */
  #evictOldest(keep = NONE): boolean {
    const r = this.#t.rec;
    for (let s = this.#head; s !== NONE; s = this.#head) {
      const b = s * STRIDE;
      if (r[b + F.PINS] !== 0) this.#unlink(s);
      else if (r[b + F.FLAGS]! >>> USE_SHIFT !== 0) {
        this.#unlink(s);
        this.#linkTail(s);
      } else if (s === keep) return false;
      else {
        this.#evict(s);
        return true;
      }
    }
    return false;
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
    r[b + F.FLAGS] = (r[b + F.FLAGS]! & VERIFIED) | LISTED;
  }

  #linkHead(slot: number): void {
    const r = this.#t.rec;
    const b = slot * STRIDE;
    r[b + F.NEXT] = this.#head;
    r[b + F.PREV] = NONE;
    if (this.#head !== NONE) r[this.#head * STRIDE + F.PREV] = slot;
    else this.#tail = slot;
    this.#head = slot;
    r[b + F.FLAGS] = (r[b + F.FLAGS]! & VERIFIED) | LISTED;
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
