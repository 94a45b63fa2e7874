/**
 * A reference {@link KvStore} for the store-level contract suite: a {@link MapService} stands for
 * the storage service (values by key, shared by every store opened over it, which can be stalled)
 * and each {@link MapStore} is one client of it. Every call waits for the service's turn (the
 * next macrotask, or the end of a stall) and stops at once when its signal fires; a put copies
 * the value in slices over several turns into a buffer of its own and publishes it in one step
 * only if the key is still absent, so a reader sees the whole value or none and two stores racing
 * on one key leave one value. Values may carry a TTL; expired values are gone on every read.
 */

import type {
  KvStore,
  KvStoreInfo,
  StoreCallOptions,
  StoreKey,
  StorePutOptions,
  StoreTally,
} from '../../src/backends/store/kv-store.ts';
import { abortedError, closedError } from '../../src/errors.ts';

/** Bytes a put copies per turn of the service. */
const SLICE_BYTES = 4 * 1024 * 1024;

interface Entry {
  readonly bytes: Uint8Array;
  /** `Date.now()` after which the value is gone; Infinity without a TTL. */
  readonly expiresAt: number;
}

/** The storage behind {@link MapStore}s: values by key; stalls on request. */
export class MapService {
  readonly #values = new Map<string, Entry>();
  #stall: { promise: Promise<void>; resolve: () => void } | null = null;

  /** Freezes the service: calls wait (or stop when their signal fires) until {@link unstall}. */
  stall(): void {
    if (this.#stall !== null) return;
    let resolve = (): void => {};
    const promise = new Promise<void>((r) => {
      resolve = r;
    });
    this.#stall = { promise, resolve };
  }

  /** Undoes {@link stall}. */
  unstall(): void {
    this.#stall?.resolve();
    this.#stall = null;
  }

  /**
   * Waits for the service's turn: the next macrotask, or the one after a stall ends.
   * @throws the abort error of `signal` as soon as it fires.
   */
  turn(signal: AbortSignal | undefined, what: string): Promise<void> {
    if (signal?.aborted === true) return Promise.reject(abortedError(signal, what));
    return new Promise<void>((resolve, reject) => {
      let immediate: NodeJS.Immediate | undefined;
      let done = false;
      const finish = (err?: unknown): void => {
        if (done) return;
        done = true;
        if (immediate !== undefined) clearImmediate(immediate);
        signal?.removeEventListener('abort', onAbort);
        if (err === undefined) resolve();
        else reject(err);
      };
      const onAbort = (): void => finish(abortedError(signal, what));
      const go = (): void => {
        immediate = setImmediate(() => finish());
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      if (this.#stall === null) go();
      else this.#stall.promise.then(() => (done ? undefined : go()));
    });
  }

  /** The live entry of `key` (an expired one is dropped). */
  read(key: string): Entry | undefined {
    const e = this.#values.get(key);
    if (e === undefined || e.expiresAt > Date.now()) return e;
    this.#values.delete(key);
    return undefined;
  }

  /** Publishes `bytes` under `key` unless a live value is there; true when written. */
  publish(key: string, bytes: Uint8Array, expiresAt: number): boolean {
    if (this.read(key) !== undefined) return false;
    this.#values.set(key, { bytes, expiresAt });
    return true;
  }

  /** Removes `key`; its size, or false when absent. */
  remove(key: string): number | false {
    const e = this.read(key);
    if (e === undefined) return false;
    this.#values.delete(key);
    return e.bytes.byteLength;
  }

  /** Live keys that start with `prefix`, with their sizes, in insertion order. */
  entries(prefix: string): [string, number][] {
    const out: [string, number][] = [];
    for (const key of [...this.#values.keys()]) {
      const e = this.read(key);
      if (e !== undefined && key.startsWith(prefix)) out.push([key, e.bytes.byteLength]);
    }
    return out;
  }
}

/** One client of a {@link MapService}; see the file's comment. */
export class MapStore implements KvStore {
  readonly info: KvStoreInfo;
  readonly service: MapService;
  #closed = false;

  constructor(
    service: MapService,
    info: KvStoreInfo = { persistent: true, shared: true, evicts: false, ttl: true },
  ) {
    this.service = service;
    this.info = Object.freeze({ ...info });
  }

  async get(key: StoreKey, opts: StoreCallOptions): Promise<Uint8Array | null> {
    await this.#turn(opts.signal, 'get');
    return this.service.read(key)?.bytes.slice() ?? null;
  }

  async has(key: StoreKey, opts: StoreCallOptions): Promise<boolean> {
    await this.#turn(opts.signal, 'has');
    return this.service.read(key) !== undefined;
  }

  async put(key: StoreKey, value: Uint8Array, opts: StorePutOptions): Promise<boolean> {
    await this.#turn(opts.signal, 'put');
    const copy = new Uint8Array(value.byteLength);
    for (let at = 0; at < value.byteLength; at += SLICE_BYTES) {
      if (at > 0) await this.#turn(opts.signal, 'put');
      copy.set(value.subarray(at, at + SLICE_BYTES), at);
    }
    const expiresAt = opts.ttlMs === undefined ? Number.POSITIVE_INFINITY : Date.now() + opts.ttlMs;
    return this.service.publish(key, copy, expiresAt);
  }

  async delete(key: StoreKey, opts: StoreCallOptions): Promise<number | false> {
    await this.#turn(opts.signal, 'delete');
    return this.service.remove(key);
  }

  async *list(
    prefix: string,
    opts: StoreCallOptions,
  ): AsyncIterable<{ key: StoreKey; bytes: number }> {
    await this.#turn(opts.signal, 'list');
    for (const [key, bytes] of this.service.entries(prefix)) yield { key: key as StoreKey, bytes };
  }

  async clear(prefix: string, opts: StoreCallOptions): Promise<StoreTally> {
    await this.#turn(opts.signal, 'clear');
    let keys = 0;
    let bytes = 0;
    for (const [key] of this.service.entries(prefix)) {
      const n = this.service.remove(key);
      if (n === false) continue;
      keys++;
      bytes += n;
    }
    return { keys, bytes };
  }

  async count(prefix: string, opts: StoreCallOptions): Promise<StoreTally> {
    await this.#turn(opts.signal, 'count');
    const entries = this.service.entries(prefix);
    return { keys: entries.length, bytes: entries.reduce((n, [, b]) => n + b, 0) };
  }

  async close(): Promise<void> {
    this.#closed = true;
  }

  async #turn(signal: AbortSignal | undefined, op: string): Promise<void> {
    if (this.#closed) throw closedError('map store');
    await this.service.turn(signal, `map store ${op}`);
    if (this.#closed) throw closedError('map store');
  }
}
