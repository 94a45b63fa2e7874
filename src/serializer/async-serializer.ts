/**
 * The serializer (the design card's `src/serializer`): the storage manager's admission gate for
 * prefetches (design decision 4). The storage manager builds and owns the one instance (its
 * `prefetchBudgetChunks` option) and closes it; the lookup walk runs each lookup's lower-tier
 * gets through `run` (storage-manager/prefetch.ts), weighted by the chunks they bring into host
 * memory, and trims a lookup whose prefetch exceeds the whole budget to what fits. It owns a
 * count of chunks ({@link WeightedSemaphore}), not the memory they stand for.
 */
import { setMaxListeners } from 'node:events';
import { abortedError, closedError } from '../errors.ts';
import { requireInt } from '../util/validate.ts';
import { WeightedSemaphore } from './weighted-semaphore.ts';

/** Options of {@link AsyncSerializer}. */
export interface AsyncSerializerOptions {
  /**
   * Chunk budget: the most chunks that admitted prefetches may materialise in host memory at
   * once. Integer >= 1; required (there is no safe default — it must match the allocator).
   */
  capacityChunks: number;
}

/** Options of one {@link AsyncSerializer.run} call. */
export interface RunOptions {
  /** Aborting it dequeues a waiting run, or aborts the signal handed to a running `fn`. */
  signal?: AbortSignal;
}

/**
 * Validates {@link AsyncSerializerOptions}.
 *
 * @throws KvtierError `KVT_INVALID_ARGUMENT` when `capacityChunks` is not an integer >= 1.
 */
export function resolveAsyncSerializerOptions(
  opts: AsyncSerializerOptions,
): Required<AsyncSerializerOptions> {
  return { capacityChunks: requireInt('capacityChunks', opts?.capacityChunks, 1) };
}

/**
 * Admits prefetches by chunk budget so that their total host-memory demand never exceeds what
 * the allocator can give.
 *
 * Without it, concurrent prefetches that allocate chunk by chunk can each hold part of a bounded
 * allocator while waiting for more: once total demand exceeds the budget every one waits forever.
 * Admitting a prefetch only when its whole demand fits makes that impossible, provided every
 * allocation from that budget goes through here and `weight` is the prefetch's full demand.
 *
 * Admission is strict FIFO (see {@link WeightedSemaphore}); a prefetch larger than the whole
 * budget fails at once with `KVT_CAPACITY`.
 */
export class AsyncSerializer {
  /** The chunk budget (`capacityChunks`). */
  readonly capacity: number;
  private readonly sem: WeightedSemaphore;
  private readonly running = new Set<AbortController>();
  private closed = false;

  /** @throws KvtierError `KVT_INVALID_ARGUMENT` for bad options. */
  constructor(opts: AsyncSerializerOptions) {
    const resolved = resolveAsyncSerializerOptions(opts);
    this.capacity = resolved.capacityChunks;
    this.sem = new WeightedSemaphore(this.capacity);
  }

  /** Chunks held by admitted runs. */
  get inUse(): number {
    return this.capacity - this.sem.available;
  }

  /** Chunks not held by any admitted run. */
  get available(): number {
    return this.sem.available;
  }

  /** Runs waiting for admission. */
  get waiters(): number {
    return this.sem.pending;
  }

  /**
   * Waits until `weight` chunks fit in the budget, runs `fn`, and releases the chunks when `fn`
   * settles, however it settles. `fn` gets a signal that aborts when `opts.signal` aborts or
   * the serializer is closed; `fn` owns everything it allocates and must free it before settling.
   *
   * Rejects with `KVT_INVALID_ARGUMENT` (bad weight), `KVT_CAPACITY` (weight > capacity, at
   * once), `KVT_CLOSED` (closed before or while waiting), the abort error of `opts.signal` when
   * aborted before `fn` starts, or whatever `fn` rejects with.
   */
  async run<T>(
    weight: number,
    fn: (signal: AbortSignal) => Promise<T>,
    opts: RunOptions = {},
  ): Promise<T> {
    if (this.closed) throw closedError('async serializer');
    const release = await this.sem.acquire(weight, opts);
    const callerSignal = opts.signal;
    const ac = new AbortController();
    // A prefetch hands it to every tier read it makes: many listeners by design.
    setMaxListeners(0, ac.signal);
    const onAbort = (): void => ac.abort(callerSignal?.reason);
    callerSignal?.addEventListener('abort', onAbort, { once: true });
    this.running.add(ac);
    try {
      // The grant may have raced an abort or close; do not start work nobody wants.
      if (callerSignal?.aborted === true) throw abortedError(callerSignal, 'prefetch');
      if (this.closed) throw closedError('async serializer');
      return await fn(ac.signal);
    } finally {
      callerSignal?.removeEventListener('abort', onAbort);
      this.running.delete(ac);
      release();
    }
  }

  /**
   * Rejects every waiting run with `KVT_CLOSED` and aborts the signals of running ones (their
   * chunks are released as each `fn` settles). Later `run` calls reject with `KVT_CLOSED`.
   * Idempotent.
   */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.sem.close();
    for (const ac of this.running) ac.abort(closedError('async serializer'));
  }
}
