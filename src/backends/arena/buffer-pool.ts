/**
 * Reusable buffers for whole chunk objects (header + payload): encoded before a single-value
 * write (Redis SET, S3 PutObject), or read from a file (the local-disk and fs tiers). Filling
 * freshly allocated multi-MiB memory costs more than the checksum, and every such allocation is
 * external memory that drives the garbage collector; chunks of one namespace all have the same
 * size, so buffers are kept per exact size.
 *
 * A buffer must be released only once nothing can still read or write it (the client call that
 * sends it, or the read that fills it, has settled, and whoever it was handed to gave it back),
 * never on a caller-side timeout while the client may still be using it.
 */
export class BufferPool {
  readonly #free = new Map<number, Buffer[]>();
  readonly #maxPerSize: number;
  readonly #maxBytes: number;
  #pooledBytes = 0;

  /**
   * @param maxPerSize most idle buffers kept per size (default 4)
   * @param maxBytes most idle bytes kept in all (default 256 MiB)
   */
  constructor(maxPerSize = 4, maxBytes = 256 * 1024 * 1024) {
    this.#maxPerSize = maxPerSize;
    this.#maxBytes = maxBytes;
  }

  /** Idle bytes held. */
  get pooledBytes(): number {
    return this.#pooledBytes;
  }

  /** A buffer of exactly `bytes` bytes (contents undefined). */
  acquire(bytes: number): Buffer {
    const list = this.#free.get(bytes);
    const buf = list?.pop();
    if (buf !== undefined) {
      if (list!.length === 0) this.#free.delete(bytes);
      this.#pooledBytes -= bytes;
      return buf;
    }
    return Buffer.allocUnsafeSlow(bytes);
  }

  /**
   * Returns a buffer for reuse. It must be one {@link acquire} returned (a whole allocation of its
   * own, never a view into a shared one), released once. When the byte bound is reached, idle
   * buffers of the other sizes released least recently are dropped to make room (a workload that
   * moved to another chunk size is not held back by buffers of the old one); the buffer itself is
   * dropped when its size already has `maxPerSize` idle buffers or it is larger than the bound.
   */
  release(buf: Buffer): void {
    const size = buf.byteLength;
    const list = this.#free.get(size) ?? [];
    if (list.length >= this.#maxPerSize || size > this.#maxBytes) return;
    for (const [other, idle] of this.#free) {
      if (this.#pooledBytes + size <= this.#maxBytes) break;
      if (other === size) continue;
      while (idle.length > 0 && this.#pooledBytes + size > this.#maxBytes) {
        idle.pop();
        this.#pooledBytes -= other;
      }
      if (idle.length === 0) this.#free.delete(other);
    }
    if (this.#pooledBytes + size > this.#maxBytes) return;
    // Map order is release order: this size is now the most recent.
    this.#free.delete(size);
    this.#free.set(size, list);
    list.push(buf);
    this.#pooledBytes += size;
  }

  /** Drops every idle buffer. */
  clear(): void {
    this.#free.clear();
    this.#pooledBytes = 0;
  }
}
