/**
 * {@link ChunkWriter}: how a {@link StoreBackend} writes a chunk: the chunk object encoded into a
 * pooled buffer (or the store's own, or while the store works), the store's put-if-absent under
 * the tier's deadline, puts of one key one after another, and a put that lands after its caller
 * stopped waiting still counted.
 */
import { KvtierError } from '../../errors.ts';
import { BufferPool } from '../arena/buffer-pool.ts';
import type { Chunk, ChunkHash, NamespaceId, PutOutcome } from '../core/types.ts';
import { chunkObjectBytes, encodeChunkObjectIntoAsync } from '../format/chunk-format.ts';
import type { ChunkTally } from './chunk-tally.ts';
import type { KvStore, StoreKey } from './kv-store.ts';

/** What a {@link ChunkWriter} writes through; the backend's own rules, passed in. */
export interface ChunkWriterOptions {
  readonly store: KvStore;
  /** Expiry of every put (ms), when the tier has one. */
  readonly ttlMs: number | undefined;
  /** Counts what lands. */
  readonly tally: ChunkTally;
  /** Throws when the backend is closed or `signal` has fired. */
  readonly open: (signal: AbortSignal | undefined) => void;
  /** Runs a store call under the tier's deadline and the caller's signal. */
  readonly bounded: <T>(
    signal: AbortSignal | undefined,
    work: (signal: AbortSignal | undefined) => Promise<T>,
  ) => Promise<T>;
  /** The error a store call's failure rejects with (counted by the backend). */
  readonly failure: (cause: unknown) => Error;
}

/** Writes chunk objects into a {@link KvStore} (see the file's comment). */
export class ChunkWriter {
  readonly #o: ChunkWriterOptions;
  /** Object buffers for puts, reused once a store `put` has resolved. */
  readonly #pool = new BufferPool();
  /** Latest put per key, so that a second put of the key waits and then finds it. */
  readonly #putting = new Map<StoreKey, Promise<PutOutcome>>();
  #latePuts = 0;

  constructor(o: ChunkWriterOptions) {
    this.#o = o;
  }

  /** Puts whose caller had stopped waiting (abort, deadline) and that the store then wrote. */
  get latePuts(): number {
    return this.#latePuts;
  }

  /**
   * Writes the chunk object of (ns, hash) under `key` unless the key exists; after any put of
   * the same key through this writer has settled.
   * @throws the caller's abort error, `KVT_TIMEOUT`, an encoding error, or `failure(...)`.
   */
  async put(
    key: StoreKey,
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    signal: AbortSignal | undefined,
  ): Promise<PutOutcome> {
    const prev = this.#putting.get(key);
    const once = () => this.#putOnce(key, ns, hash, chunk, signal);
    const mine = prev === undefined ? once() : prev.then(once, once);
    this.#putting.set(key, mine);
    try {
      return await mine;
    } finally {
      if (this.#putting.get(key) === mine) this.#putting.delete(key);
    }
  }

  async #putOnce(
    key: StoreKey,
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    signal: AbortSignal | undefined,
  ): Promise<PutOutcome> {
    const { store, ttlMs, tally } = this.#o;
    this.#o.open(signal);
    const bytes = chunkObjectBytes(chunk.data.byteLength);
    const lent = store.valueBuffer?.(key, bytes, { signal, ttlMs });
    const value = lent ?? this.#pool.acquire(bytes);
    const filled = encodeChunkObjectIntoAsync(value, ns, hash, chunk).then(() => undefined);
    filled.catch(() => {});
    const overlap = store.putFilling !== undefined;
    if (!overlap) {
      try {
        await filled;
      } catch (err) {
        if (lent === undefined) this.#pool.release(value as Buffer);
        throw err;
      }
    }
    let call: Promise<boolean> | undefined;
    let stored: boolean;
    try {
      stored = await this.#o.bounded(signal, (s) => {
        const o = { signal: s, ttlMs };
        const p = overlap ? store.putFilling!(key, value, filled, o) : store.put(key, value, o);
        call = p;
        // Reused only once the store is done with it and the encoder has finished writing it;
        // after a failure it may still be sending.
        if (lent === undefined)
          Promise.all([p, filled]).then(
            () => this.#pool.release(value as Buffer),
            () => {},
          );
        return p;
      });
    } catch (err) {
      // A chunk that could not be encoded is the caller's error, whatever the store said.
      const encodeError: unknown = await filled.catch((e: unknown) => e);
      if (encodeError !== undefined) throw encodeError;
      const gaveUp =
        err instanceof KvtierError && (err.code === 'KVT_ABORTED' || err.code === 'KVT_TIMEOUT');
      // The store's call runs on after the caller stopped waiting: what it writes is stored.
      if (gaveUp)
        call?.then(
          (late) => {
            if (!late) return;
            this.#latePuts++;
            tally.add(1, bytes);
          },
          () => {},
        );
      this.#o.open(undefined);
      throw gaveUp ? err : this.#o.failure(err);
    }
    if (!stored) return 'exists';
    tally.add(1, bytes);
    return 'stored';
  }
}
