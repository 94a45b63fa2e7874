import { abortedError, closedError, KvtierError } from '../errors.ts';
import { requireInt } from '../util/validate.ts';

/**
 * Gives back the weight one grant holds. Idempotent: only the first call releases; later calls
 * are no-ops, so a `finally` that races an error path cannot over-release.
 */
export type Release = () => void;

/** Options of one `acquire` call. */
export interface AcquireOptions {
  /** Aborting it removes the waiter from the queue and rejects the acquire (`KVT_ABORTED`/`KVT_TIMEOUT`). */
  signal?: AbortSignal;
}

interface Waiter {
  readonly weight: number;
  readonly resolve: (release: Release) => void;
  readonly reject: (err: unknown) => void;
  /** Removes the abort listener; called once, whichever way the waiter leaves. */
  cleanup: () => void;
}

const noop = (): void => {};

/**
 * A counting semaphore whose grants have integer weights (chunks, pages, bytes...).
 *
 * - Strict FIFO: a waiter is served only when it is at the head of the queue and its weight fits.
 *   Smaller waiters behind a large one do not overtake it, so large requests never starve.
 * - A weight larger than the capacity can never be granted and is rejected at once with
 *   `KVT_CAPACITY` instead of waiting forever.
 * - An aborted waiter leaves the queue at once; if it was the head, the waiters behind it are
 *   served right away when they fit.
 * - Event-driven only: grants happen on `Release` calls and aborts, never on timers.
 *
 * `available`, `pending` and `pendingWeight` are cheap and meant for gauges.
 */
export class WeightedSemaphore {
  /** Total weight that may be held at once (integer >= 1). */
  readonly capacity: number;
  private held = 0;
  private waitingWeight = 0;
  private closed = false;
  /** Insertion-ordered, with O(1) removal of an aborted waiter from the middle. */
  private readonly queue = new Set<Waiter>();

  /**
   * @param capacity total weight, an integer >= 1.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` when `capacity` is not an integer >= 1.
   */
  constructor(capacity: number) {
    this.capacity = requireInt('capacity', capacity, 1);
  }

  /** Capacity minus the weight currently held (never negative). */
  get available(): number {
    return this.capacity - this.held;
  }

  /** Number of queued waiters. */
  get pending(): number {
    return this.queue.size;
  }

  /** Sum of the weights of the queued waiters. */
  get pendingWeight(): number {
    return this.waitingWeight;
  }

  /**
   * Waits until `weight` can be held, in FIFO order, and resolves with its `Release`.
   *
   * Rejects (never throws synchronously) with `KVT_INVALID_ARGUMENT` when `weight` is not an
   * integer >= 1, `KVT_CAPACITY` when `weight > capacity`, `KVT_CLOSED` after `close()` (or when
   * closed while waiting), and the `abortedError` of `signal` when it is (or becomes) aborted.
   * The caller owns the returned `Release` and must call it exactly once the work is done.
   */
  acquire(weight: number, opts: AcquireOptions = {}): Promise<Release> {
    try {
      this.check(weight);
    } catch (err) {
      return Promise.reject(err);
    }
    const signal = opts.signal;
    if (signal?.aborted === true) return Promise.reject(abortedError(signal, 'semaphore acquire'));
    if (this.queue.size === 0 && weight <= this.available) {
      return Promise.resolve(this.grant(weight));
    }
    return new Promise<Release>((resolve, reject) => {
      const waiter: Waiter = { weight, resolve, reject, cleanup: noop };
      if (signal !== undefined) {
        const onAbort = (): void => {
          if (!this.queue.delete(waiter)) return;
          this.waitingWeight -= weight;
          waiter.cleanup();
          reject(abortedError(signal, 'semaphore acquire'));
          // The aborted waiter may have been the head blocking others that now fit.
          this.drain();
        };
        signal.addEventListener('abort', onAbort, { once: true });
        waiter.cleanup = () => signal.removeEventListener('abort', onAbort);
      }
      this.queue.add(waiter);
      this.waitingWeight += weight;
    });
  }

  /**
   * Takes `weight` now if nobody is waiting and it fits; otherwise returns `null` (it never
   * jumps the queue).
   *
   * @throws KvtierError `KVT_INVALID_ARGUMENT` for a bad weight, `KVT_CAPACITY` when
   *   `weight > capacity`, `KVT_CLOSED` after `close()`.
   */
  tryAcquire(weight: number): Release | null {
    this.check(weight);
    if (this.queue.size > 0 || weight > this.available) return null;
    return this.grant(weight);
  }

  /**
   * Rejects every waiter with `KVT_CLOSED`; later `acquire`/`tryAcquire` fail with `KVT_CLOSED`.
   * Grants already held stay valid and their `Release` still works. Idempotent.
   */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    const waiters = [...this.queue];
    this.queue.clear();
    this.waitingWeight = 0;
    for (const w of waiters) {
      w.cleanup();
      w.reject(closedError('weighted semaphore'));
    }
  }

  private check(weight: number): void {
    requireInt('weight', weight, 1);
    if (weight > this.capacity) {
      throw new KvtierError(
        'KVT_CAPACITY',
        `weight ${weight} exceeds the semaphore capacity ${this.capacity}; it could never be granted`,
      );
    }
    if (this.closed) throw closedError('weighted semaphore');
  }

  private grant(weight: number): Release {
    this.held += weight;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.held -= weight;
      this.drain();
    };
  }

  /** Serves waiters from the head while the head fits; stops at the first that does not. */
  private drain(): void {
    for (const w of this.queue) {
      if (w.weight > this.available) return;
      this.queue.delete(w);
      this.waitingWeight -= w.weight;
      w.cleanup();
      w.resolve(this.grant(w.weight));
    }
  }
}
