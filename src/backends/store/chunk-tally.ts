/** {@link ChunkTally}: the chunks and bytes a {@link StoreBackend} reports in its stats. */
import type { StoreTally } from './kv-store.ts';

/**
 * The chunks and object bytes (headers included) one instance stored minus what it removed, never
 * below 0, and set again from the store's own count by {@link recount}: a shared store is written
 * by other sidecars without telling this one.
 */
export class ChunkTally {
  #chunks = 0;
  #bytes = 0;
  #recounts = 0;
  /** While a recount runs: what was added since it began, added to its answer. */
  #delta: { chunks: number; bytes: number } | null = null;

  get chunks(): number {
    return this.#chunks;
  }

  get bytes(): number {
    return this.#bytes;
  }

  /** Times the counts were taken from the store. */
  get recounts(): number {
    return this.#recounts;
  }

  /** Adds `chunks` and `bytes` (negative for removals); neither goes below 0. */
  add(chunks: number, bytes: number): void {
    this.#chunks = Math.max(0, this.#chunks + chunks);
    this.#bytes = Math.max(0, this.#bytes + bytes);
    if (this.#delta !== null) {
      this.#delta.chunks += chunks;
      this.#delta.bytes += bytes;
    }
  }

  /** Everything removed (the store was cleared). */
  removeAll(): void {
    this.add(-this.#chunks, -this.#bytes);
  }

  /**
   * Sets the counts to `count()`'s answer plus what was added while it ran (puts that land during
   * the count may be counted twice). A rejection leaves the counts as they were and is rethrown.
   */
  async recount(count: () => Promise<StoreTally>): Promise<void> {
    const delta = { chunks: 0, bytes: 0 };
    this.#delta = delta;
    try {
      const n = await count();
      this.#chunks = Math.max(0, n.keys + delta.chunks);
      this.#bytes = Math.max(0, n.bytes + delta.bytes);
      this.#recounts++;
    } finally {
      if (this.#delta === delta) this.#delta = null;
    }
  }
}
