/**
 * Reusable buffers for encoding whole chunk objects (header + payload) before a single-value
 * write (Redis SET, S3 PutObject). Filling freshly allocated multi-MiB memory costs more than the
 * checksum; chunks of one namespace all have the same size, so buffers are kept per exact size.
 *
 * A buffer must be released only once nothing can still read it (the client call that sends it
 * has settled), never on a caller-side timeout while the client may still be writing it.
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
      this.#pooledBytes -= bytes;
      return buf;
    }
    return Buffer.allocUnsafeSlow(bytes);
  }

  /** Returns a buffer for reuse (dropped when the pool is full). */
  release(buf: Buffer): void {
    const list = this.#free.get(buf.byteLength) ?? [];
    if (list.length >= this.#maxPerSize || this.#pooledBytes + buf.byteLength > this.#maxBytes)
      return;
    list.push(buf);
    this.#free.set(buf.byteLength, list);
    this.#pooledBytes += buf.byteLength;
  }

  /** Drops every idle buffer. */
  clear(): void {
    this.#free.clear();
    this.#pooledBytes = 0;
  }
}
