/**
 * A slow, faulty tier under a test's control: {@link GatedBackend} wraps a backend (a
 * {@link MemoryBackend} by default) and holds every `batchedGet` (and, when asked, every
 * `batchedContains`) on a {@link Gate} that the test opens, closes or steps one call at a time.
 * No timers are involved, so tests of "lookup returns null while a slower tier is prefetching,
 * then a number" are deterministic. Faults are plain fields the test flips at any time.
 */

import type {
  BackendCapabilities,
  BackendHealth,
  BackendStats,
  Chunk,
  ChunkHash,
  ContainsOptions,
  GetOptions,
  NamespaceId,
  PutOptions,
  PutOutcome,
  StorageBackend,
} from '../../src/backends/core/types.ts';
import { MemoryBackend } from '../../src/backends/memory/memory-backend.ts';
import { abortedError, closedError, KvtierError } from '../../src/errors.ts';

interface Waiter {
  resolve(): void;
  reject(err: unknown): void;
}

/**
 * A FIFO gate. While open, `wait()` resolves at once; while closed, callers queue until
 * `open()` (all pass) or `releaseNext()` (the oldest passes). An aborted waiter leaves the queue.
 */
export class Gate {
  #isOpen: boolean;
  readonly #waiters: Waiter[] = [];
  readonly #watchers: { count: number; resolve(): void }[] = [];

  /** @param open start open (default false: calls wait until the test lets them through). */
  constructor(open = false) {
    this.#isOpen = open;
  }

  get isOpen(): boolean {
    return this.#isOpen;
  }

  /** Calls currently held at the gate. */
  get waiting(): number {
    return this.#waiters.length;
  }

  /** Opens the gate and lets every waiting call through, in arrival order. */
  open(): void {
    this.#isOpen = true;
    for (const w of this.#waiters.splice(0)) w.resolve();
  }

  /** Closes the gate: later calls wait. Calls already through are unaffected. */
  close(): void {
    this.#isOpen = false;
  }

  /** Lets the oldest waiting call through; false when none is waiting (no credit is kept). */
  releaseNext(): boolean {
    const w = this.#waiters.shift();
    w?.resolve();
    return w !== undefined;
  }

  /** Resolves once at least `count` calls are waiting (at once if they already are). */
  whenWaiting(count = 1): Promise<void> {
    if (this.#waiters.length >= count) return Promise.resolve();
    return new Promise((resolve) => this.#watchers.push({ count, resolve }));
  }

  /** Rejects every waiting call with `err` (used on close). */
  rejectAll(err: unknown): void {
    for (const w of this.#waiters.splice(0)) w.reject(err);
  }

  /**
   * Passes at once when open, else waits for `open()`/`releaseNext()`.
   * @throws KvtierError `KVT_ABORTED`/`KVT_TIMEOUT` when `signal` aborts first (the waiter leaves).
   */
  async wait(signal?: AbortSignal, what = 'gated call'): Promise<void> {
    if (signal?.aborted === true) throw abortedError(signal, what);
    if (this.#isOpen) return;
    let onAbort: (() => void) | undefined;
    try {
      await new Promise<void>((resolve, reject) => {
        const waiter: Waiter = { resolve, reject };
        this.#waiters.push(waiter);
        onAbort = () => {
          const i = this.#waiters.indexOf(waiter);
          if (i !== -1) this.#waiters.splice(i, 1);
          reject(abortedError(signal, what));
        };
        signal?.addEventListener('abort', onAbort, { once: true });
        this.#notifyWatchers();
      });
    } finally {
      if (onAbort !== undefined) signal?.removeEventListener('abort', onAbort);
    }
  }

  #notifyWatchers(): void {
    for (let i = this.#watchers.length - 1; i >= 0; i--) {
      const w = this.#watchers[i]!;
      if (this.#waiters.length >= w.count) {
        this.#watchers.splice(i, 1);
        w.resolve();
      }
    }
  }
}

/** Options of {@link GatedBackend}. */
export interface GatedBackendOptions {
  /** Backend that holds the data; default a fresh unbounded {@link MemoryBackend}. Owned: closed with this. */
  inner?: StorageBackend;
  /** Tier name; default 'gated'. */
  name?: string;
  /** Hold `batchedContains` on the gate too (default false: only gets wait). */
  gateContains?: boolean;
  /** Start with the gate open (default false). */
  open?: boolean;
}

/** How many times each method was called (counted on entry, before gate or faults). */
export interface GatedCallCounts {
  contains: number;
  get: number;
  put: number;
  remove: number;
}

/**
 * A test backend with deterministic latency and injectable faults; see the file comment.
 *
 * Faults (checked when a call enters and again after it passes the gate):
 * - `down`: every call rejects (sync methods throw) with `KVT_BACKEND`; `health()` is 'down'.
 * - `failGets`: `batchedGet` rejects with `KVT_BACKEND`.
 * - `shortGets = n`: `batchedGet` returns the chunks of only the first `n` requested hashes and
 *   `null` for the rest, even when `batchedContains` promised them.
 */
export class GatedBackend implements StorageBackend {
  readonly name: string;
  readonly kind = 'gated';
  readonly gate: Gate;
  readonly inner: StorageBackend;
  readonly calls: GatedCallCounts = { contains: 0, get: 0, put: 0, remove: 0 };
  /** Whether `batchedContains` waits on the gate. */
  gateContains: boolean;
  /** Every call rejects with `KVT_BACKEND`. */
  down = false;
  /** `batchedGet` rejects with `KVT_BACKEND`. */
  failGets = false;
  /** Serve only the first `n` requested hashes of each `batchedGet`; null: serve all. */
  shortGets: number | null = null;
  #closing: Promise<void> | null = null;

  constructor(options: GatedBackendOptions = {}) {
    this.name = options.name ?? 'gated';
    this.inner = options.inner ?? new MemoryBackend({}, { name: this.name });
    this.gate = new Gate(options.open ?? false);
    this.gateContains = options.gateContains ?? false;
  }

  get capabilities(): BackendCapabilities {
    return this.inner.capabilities;
  }

  async batchedContains(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: ContainsOptions = {},
  ): Promise<number> {
    this.calls.contains++;
    this.#check('contains');
    if (this.gateContains) {
      await this.gate.wait(opts.signal, `${this.name} contains`);
      this.#check('contains');
    }
    return this.inner.batchedContains(ns, hashes, opts);
  }

  async batchedGet(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: GetOptions = {},
  ): Promise<Map<ChunkHash, Chunk | null>> {
    this.calls.get++;
    this.#check('get');
    await this.gate.wait(opts.signal, `${this.name} get`);
    this.#check('get');
    if (this.failGets) throw new KvtierError('KVT_BACKEND', `${this.name}: injected get failure`);
    const got = await this.inner.batchedGet(ns, hashes, opts);
    const keep = this.shortGets;
    if (keep === null) return got;
    const out = new Map<ChunkHash, Chunk | null>();
    hashes.forEach((hash, i) => {
      out.set(hash, i < keep ? (got.get(hash) ?? null) : null);
    });
    return out;
  }

  async put(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    opts?: PutOptions,
  ): Promise<PutOutcome> {
    this.calls.put++;
    this.#check('put');
    return this.inner.put(ns, hash, chunk, opts);
  }

  async remove(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    this.calls.remove++;
    this.#check('remove');
    return this.inner.remove(ns, hashes);
  }

  pin(ns: NamespaceId, hashes: readonly ChunkHash[]): number {
    this.#check('pin');
    return this.inner.pin(ns, hashes);
  }

  unpin(ns: NamespaceId, hashes: readonly ChunkHash[]): void {
    this.#check('unpin');
    this.inner.unpin(ns, hashes);
  }

  async clear(ns?: NamespaceId): Promise<void> {
    this.#check('clear');
    return this.inner.clear(ns);
  }

  stats(): BackendStats {
    this.#check('stats', false);
    return this.inner.stats();
  }

  health(): BackendHealth {
    this.#check('health', false);
    return this.down ? 'down' : this.inner.health();
  }

  /** Rejects calls held at the gate with `KVT_CLOSED` and closes the inner backend. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      this.gate.rejectAll(closedError(`backend ${this.name}`));
      await this.inner.close();
    })();
    return this.#closing;
  }

  #check(op: string, faults = true): void {
    if (this.#closing !== null) throw closedError(`backend ${this.name}`);
    if (faults && this.down)
      throw new KvtierError('KVT_BACKEND', `${this.name}: injected down (${op})`);
  }
}
