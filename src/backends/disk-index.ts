/**
 * The local-disk tier's in-memory index and its byte bound: entries by (ns, hash), recency of
 * the unpinned ones, pins, and the accounting of used, reserved (writes under way) and pinned
 * bytes. It never touches files: evicting an entry hands it to `onEvict`, which deletes its file.
 */
import { LRUCache } from 'lru-cache';
import { CHUNK_HEADER_BYTES } from './chunk-format.ts';
import type { ChunkHash, NamespaceId } from './types.ts';

/** One indexed object file. */
export interface DiskEntry {
  readonly key: string;
  readonly ns: NamespaceId;
  readonly hash: ChunkHash;
  readonly path: string;
  /** File size: header + payload. */
  readonly bytes: number;
  pins: number;
}

/** Unambiguous composite key: the length prefix keeps (ns, hash) pairs from colliding. */
export function diskKey(ns: NamespaceId, hash: ChunkHash): string {
  return `${ns.length}:${ns}${hash}`;
}

/** Entries, recency and the byte bound of one local-disk tier. */
export class DiskIndex {
  readonly #entries = new Map<string, DiskEntry>();
  /** Recency of unpinned entries; evicting from it hands the entry to `onEvict`. */
  readonly #lru: LRUCache<string, DiskEntry>;
  readonly #capacityBytes: number;
  readonly #onEvict: (e: DiskEntry) => void;
  #bytesUsed = 0;
  #reservedBytes = 0;
  #pinnedBytes = 0;
  #pinnedChunks = 0;
  #evictions = 0;

  /** @param onEvict deletes the file of an entry the bound pushed out (already unindexed). */
  constructor(capacityBytes: number, maxChunks: number, onEvict: (e: DiskEntry) => void) {
    this.#capacityBytes = capacityBytes;
    this.#onEvict = onEvict;
    // Every object is at least a header, so more slots than that could never be used.
    this.#lru = new LRUCache<string, DiskEntry>({
      max: Math.min(maxChunks, Math.floor(capacityBytes / CHUNK_HEADER_BYTES)),
      dispose: (e, _key, reason) => {
        if (reason === 'evict') this.#evicted(e);
      },
    });
  }

  get size(): number {
    return this.#entries.size;
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

  get(ns: NamespaceId, hash: ChunkHash): DiskEntry | undefined {
    return this.#entries.get(diskKey(ns, hash));
  }

  /** The entry of `key` if it is still `e` (not removed or replaced meanwhile). */
  holds(e: DiskEntry): boolean {
    return this.#entries.get(e.key) === e;
  }

  /** Every entry (of `ns`, or all), as a snapshot. */
  entries(ns?: NamespaceId): DiskEntry[] {
    const all = [...this.#entries.values()];
    return ns === undefined ? all : all.filter((e) => e.ns === ns);
  }

  /** Indexes a stored object, pinned once or as the most recent. */
  add(e: DiskEntry, pin = false): void {
    this.#entries.set(e.key, e);
    this.#bytesUsed += e.bytes;
    if (pin) this.pin(e);
    else this.#lru.set(e.key, e);
  }

  /** Marks an entry recently used. */
  touch(e: DiskEntry): void {
    if (e.pins === 0) this.#lru.get(e.key);
  }

  pin(e: DiskEntry): void {
    if (e.pins === 0) {
      this.#lru.delete(e.key);
      this.#pinnedChunks++;
      this.#pinnedBytes += e.bytes;
    }
    e.pins++;
  }

  /** Releases one pin; ignores an unpinned entry. */
  unpin(e: DiskEntry): void {
    if (e.pins === 0) return;
    e.pins--;
    if (e.pins === 0) {
      this.#pinnedChunks--;
      this.#pinnedBytes -= e.bytes;
      this.#lru.set(e.key, e);
    }
  }

  /** Takes an entry out of the index and the accounting; its file is the caller's concern. */
  forget(e: DiskEntry): void {
    this.#entries.delete(e.key);
    this.#lru.delete(e.key);
    this.#bytesUsed -= e.bytes;
    if (e.pins > 0) {
      this.#pinnedChunks--;
      this.#pinnedBytes -= e.bytes;
    }
  }

  /**
   * Evicts unpinned entries oldest first until `bytes` more fit, then reserves them for a write
   * (release with {@link unreserve}); false, with nothing evicted or reserved, if they cannot fit.
   */
  reserve(bytes: number): boolean {
    const cap = this.#capacityBytes;
    if (cap - this.#pinnedBytes - this.#reservedBytes < bytes) return false;
    while (this.#bytesUsed + this.#reservedBytes + bytes > cap) {
      if (this.#lru.pop() === undefined) return false;
    }
    this.#reservedBytes += bytes;
    return true;
  }

  unreserve(bytes: number): void {
    this.#reservedBytes -= bytes;
  }

  /** Evicts oldest first while over the bound (it may have been lowered since a restart). */
  trim(): void {
    while (this.#bytesUsed > this.#capacityBytes && this.#lru.pop() !== undefined) {}
  }

  clear(): void {
    this.#lru.clear();
    this.#entries.clear();
  }

  /** LRU eviction (count bound, or `pop` for room): the entry has left the LRU. */
  #evicted(e: DiskEntry): void {
    this.#entries.delete(e.key);
    this.#bytesUsed -= e.bytes;
    this.#evictions++;
    this.#onEvict(e);
  }
}
