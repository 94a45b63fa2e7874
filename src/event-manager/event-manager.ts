/**
 * The event manager (the design card's `src/event-manager`): the storage manager's record of the
 * lookups it runs. The storage manager builds and owns the one instance (its `maxLookups`,
 * `pinTtlMs` and `sweepIntervalMs` options) and closes it; its lookup walk
 * (storage-manager/lookup-walk.ts) registers every lookup here (`addPending`) and settles it
 * (`fulfil`, `fail`). Through the manager, CANCEL reaches a lookup (`cancel`), a LOAD or HOLD
 * takes its answer (`take`) and the sweep expires pins nobody used. An entry owns its result
 * until someone takes it; one nobody takes is disposed through its hooks (the lookup's pins
 * released). Generic in the result: it knows nothing of tiers or pins.
 */
import { abortedError, closedError, KvtierError } from '../errors.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import { requireInt, requireString } from '../util/validate.ts';

/**
 * State of one prefetch: `ongoing` while its work runs, `done` once it fulfilled and nobody has
 * taken the result yet, `not_found` when unknown, taken, cancelled, expired or failed.
 */
export type PrefetchState = 'ongoing' | 'done' | 'not_found';

/** Options of {@link EventManager}. */
export interface EventManagerOptions {
  /** Most entries (ongoing + done) held at once. Integer >= 1; default 4096. */
  maxEntries?: number;
  /**
   * Age after which `sweep()` expires an entry, in ms. An ongoing entry ages from `add`; a done
   * entry from the moment its work fulfilled, so a consumer always gets a full `ttlMs` to take
   * it. Integer >= 1; default 60_000.
   */
  ttlMs?: number;
  /** Clock in ms; default `Date.now`. Tests inject one. */
  now?: () => number;
  /** Period of the automatic sweep in ms; 0 = no timer (call `sweep()` yourself). Default 1000. */
  sweepIntervalMs?: number;
  /** Where failures of `abort`/`dispose` hooks are logged; default silent. */
  logger?: Logger;
}

/** Defaults of {@link EventManagerOptions}, in one place. */
export const EVENT_MANAGER_DEFAULTS = {
  maxEntries: 4096,
  ttlMs: 60_000,
  sweepIntervalMs: 1000,
} as const;

/** {@link EventManagerOptions} with every default applied and every value validated. */
export interface ResolvedEventManagerOptions {
  maxEntries: number;
  ttlMs: number;
  now: () => number;
  sweepIntervalMs: number;
  logger: Logger;
}

/**
 * Applies defaults and validates.
 *
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the bad option and what is allowed.
 */
export function resolveEventManagerOptions(
  opts: EventManagerOptions = {},
): ResolvedEventManagerOptions {
  const now = opts.now ?? Date.now;
  if (typeof now !== 'function') {
    throw new KvtierError('KVT_INVALID_ARGUMENT', 'now must be a function returning milliseconds');
  }
  return {
    maxEntries: requireInt('maxEntries', opts.maxEntries ?? EVENT_MANAGER_DEFAULTS.maxEntries, 1),
    ttlMs: requireInt('ttlMs', opts.ttlMs ?? EVENT_MANAGER_DEFAULTS.ttlMs, 1),
    now,
    sweepIntervalMs: requireInt(
      'sweepIntervalMs',
      opts.sweepIntervalMs ?? EVENT_MANAGER_DEFAULTS.sweepIntervalMs,
      0,
    ),
    logger: opts.logger ?? silentLogger,
  };
}

/**
 * Hooks of one prefetch. `abort` stops the work (it must still settle); `dispose` frees a result
 * nobody took (releases pins, frees host memory).
 */
export interface PrefetchHooks<T> {
  abort: () => void;
  dispose: (result: T) => void;
}

/** Options of {@link EventManager.wait}. */
export interface WaitOptions {
  /** Aborting it rejects this wait only; the prefetch itself goes on. */
  signal?: AbortSignal;
}

interface Waiter<T> {
  resolve: (result: T) => void;
  reject: (err: unknown) => void;
  cleanup: () => void;
}

interface Entry<T> {
  readonly id: string;
  readonly hooks: PrefetchHooks<T>;
  state: 'ongoing' | 'done';
  /** `now()` at add while ongoing, at fulfilment once done: what the TTL counts from. */
  since: number;
  result: T | undefined;
  /** Set once the entry leaves the map; a later fulfilment is then disposed, not stored. */
  removed: boolean;
  /** Pending `wait`s; created by the first one (most entries are never waited on). */
  waiters: Set<Waiter<T>> | undefined;
}

/**
 * An entry registered with {@link EventManager.addPending}, settled by its owner through
 * {@link EventManager.fulfil} or {@link EventManager.fail}. Opaque.
 */
export interface PendingPrefetch {
  readonly id: string;
}

/**
 * Tracks one entry per prefetch and owns each result until someone `take`s it.
 *
 * Ownership: every fulfilled result is either handed to exactly one `take` caller or passed to
 * `dispose` exactly once (on cancel, expiry, eviction or close — also when the work fulfils
 * after its entry was cancelled). `wait` and `result` only lend the value: a caller that keeps
 * it must `take` it, or it may be disposed under them by a sweep.
 *
 * Failure: when `work` rejects, the entry is removed (state `not_found`), pending `wait`s reject
 * with that same error, and nothing is disposed (there is no result). Work that rejects after
 * cancel is ignored.
 *
 * Bounds: at most `maxEntries` entries; finished entries expire after `ttlMs` (see
 * {@link EventManagerOptions.ttlMs}), so nothing stays forever if nobody takes it.
 */
export class EventManager<T> {
  private readonly opts: ResolvedEventManagerOptions;
  private readonly entries = new Map<string, Entry<T>>();
  /** Done entries in completion order (stale slots skipped lazily), so eviction is O(1). */
  private doneOrder: Entry<T>[] = [];
  private doneHead = 0;
  /** Entries in add order (stale slots skipped lazily), to find the oldest ongoing one in O(1). */
  private addOrder: Entry<T>[] = [];
  private addHead = 0;
  private ongoing = 0;
  private done = 0;
  private expired = 0;
  private evicted = 0;
  private closed = false;
  private readonly timer: NodeJS.Timeout | undefined;

  /** @throws KvtierError `KVT_INVALID_ARGUMENT` for bad options. */
  constructor(opts: EventManagerOptions = {}) {
    this.opts = resolveEventManagerOptions(opts);
    if (this.opts.sweepIntervalMs > 0) {
      this.timer = setInterval(() => this.sweep(), this.opts.sweepIntervalMs);
      this.timer.unref();
    }
  }

  /** Entries removed by `sweep()` (TTL) since construction. */
  get expiredTotal(): number {
    return this.expired;
  }

  /** Done entries dropped (and disposed) to make room for a new `add` since construction. */
  get evictedTotal(): number {
    return this.evicted;
  }

  /**
   * Registers a prefetch. From here the manager owns `work`'s result (see class docs). When
   * `add` throws, nothing was registered and the caller still owns `work`.
   *
   * When full: expired entries are swept, then the oldest done entries are disposed and dropped;
   * if only ongoing entries remain, it throws `KVT_CAPACITY`.
   *
   * @throws KvtierError `KVT_CLOSED` after close, `KVT_INVALID_ARGUMENT` for a bad or duplicate
   *   id or bad hooks, `KVT_CAPACITY` when full of ongoing entries.
   */
  add(id: string, work: Promise<T>, hooks: PrefetchHooks<T>): void {
    if (typeof work?.then !== 'function') {
      throw new KvtierError('KVT_INVALID_ARGUMENT', 'work must be a promise');
    }
    const entry = this.register(id, hooks);
    work.then(
      (result) => this.onFulfilled(entry, result),
      (err: unknown) => this.onRejected(entry, err),
    );
  }

  /**
   * {@link add} for work whose owner settles it synchronously: no promise, and the entry is
   * `done` as soon as {@link fulfil} returns. The same ownership rules hold (a result fulfilled
   * after the entry was cancelled is disposed). Settle each entry once.
   * @throws KvtierError as {@link add}.
   */
  addPending(id: string, hooks: PrefetchHooks<T>): PendingPrefetch {
    return this.register(id, hooks);
  }

  /** Settles an entry from {@link addPending} with its result (as if its work fulfilled). */
  fulfil(pending: PendingPrefetch, result: T): void {
    this.onFulfilled(pending as Entry<T>, result);
  }

  /** Settles an entry from {@link addPending} as failed (as if its work rejected). */
  fail(pending: PendingPrefetch, err: unknown): void {
    this.onRejected(pending as Entry<T>, err);
  }

  private register(id: string, hooks: PrefetchHooks<T>): Entry<T> {
    if (this.closed) throw closedError('event manager');
    requireString('id', id, { nonEmpty: true });
    if (typeof hooks?.abort !== 'function' || typeof hooks.dispose !== 'function') {
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        'hooks must have abort() and dispose() functions',
      );
    }
    if (this.entries.has(id)) {
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `prefetch id ${JSON.stringify(id)} is already present`,
      );
    }
    this.makeRoom();
    const entry: Entry<T> = {
      id,
      hooks,
      state: 'ongoing',
      since: this.opts.now(),
      result: undefined,
      removed: false,
      waiters: undefined,
    };
    this.entries.set(id, entry);
    this.addOrder.push(entry);
    if (this.addOrder.length - this.addHead > 2 * this.opts.maxEntries) {
      this.addOrder = this.addOrder.slice(this.addHead).filter((e) => !e.removed);
      this.addHead = 0;
    }
    this.ongoing++;
    return entry;
  }

  /** State of `id`. */
  state(id: string): PrefetchState {
    return this.entries.get(id)?.state ?? 'not_found';
  }

  /** The hooks `id` was registered with, while it is tracked (ongoing or done). */
  hooksOf(id: string): PrefetchHooks<T> | undefined {
    return this.entries.get(id)?.hooks;
  }

  /** The result of a done entry (lent, not handed over); `undefined` otherwise. */
  result(id: string): T | undefined {
    const e = this.entries.get(id);
    return e?.state === 'done' ? e.result : undefined;
  }

  /**
   * Resolves with the result once `id` is done (lent, not handed over — `take` it to keep it).
   *
   * Rejects with `KVT_NOT_FOUND` when `id` is unknown or gets cancelled, expired or evicted;
   * with the work's own error when it fails; `KVT_CLOSED` when the manager is or gets closed;
   * the abort error of `opts.signal` when it aborts (the prefetch itself goes on).
   */
  wait(id: string, opts: WaitOptions = {}): Promise<T> {
    if (this.closed) return Promise.reject(closedError('event manager'));
    const e = this.entries.get(id);
    if (e === undefined) return Promise.reject(notFound(id, 'unknown'));
    if (e.state === 'done') return Promise.resolve(e.result as T);
    const signal = opts.signal;
    if (signal?.aborted === true) return Promise.reject(abortedError(signal, 'prefetch wait'));
    return new Promise<T>((resolve, reject) => {
      const waiter: Waiter<T> = { resolve, reject, cleanup: noop };
      if (signal !== undefined) {
        const onAbort = (): void => {
          if (e.waiters?.delete(waiter) !== true) return;
          reject(abortedError(signal, 'prefetch wait'));
        };
        signal.addEventListener('abort', onAbort, { once: true });
        waiter.cleanup = () => signal.removeEventListener('abort', onAbort);
      }
      e.waiters ??= new Set();
      e.waiters.add(waiter);
    });
  }

  /**
   * Removes a done entry and hands its result to the caller, who now owns it (no `dispose`).
   * Returns `undefined`, changing nothing, when `id` is not done.
   */
  take(id: string): T | undefined {
    const e = this.entries.get(id);
    if (e?.state !== 'done') return undefined;
    const result = e.result as T;
    this.detach(e);
    return result;
  }

  /**
   * Removes `id`. Ongoing: calls `abort()` and disposes the result if the work still fulfils;
   * done: disposes the result now. Pending `wait`s reject with `KVT_NOT_FOUND`.
   * Returns false when `id` is unknown.
   */
  cancel(id: string): boolean {
    const e = this.entries.get(id);
    if (e === undefined) return false;
    this.discard(e, 'cancelled');
    return true;
  }

  /**
   * Expires entries older than `ttlMs`: ongoing ones are aborted (and disposed when they
   * settle), done ones disposed. Their `wait`s reject with `KVT_NOT_FOUND`.
   * Returns how many expired.
   */
  sweep(): number {
    const now = this.opts.now();
    let n = 0;
    for (const e of [...this.entries.values()]) {
      if (now - e.since < this.opts.ttlMs) continue;
      this.discard(e, 'expired');
      n++;
    }
    this.expired += n;
    return n;
  }

  /** Counts of ongoing and done entries. */
  sizes(): { ongoing: number; done: number } {
    return { ongoing: this.ongoing, done: this.done };
  }

  /**
   * Cancels every entry (aborts ongoing, disposes done; results arriving later are disposed),
   * rejects pending `wait`s with `KVT_CLOSED`, and stops the sweep timer. Later `add`/`wait`
   * reject with `KVT_CLOSED`. Idempotent.
   */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.timer !== undefined) clearInterval(this.timer);
    for (const e of [...this.entries.values()]) this.discard(e, 'closed');
  }

  /** The live entry added first, skipping (and dropping) stale slots. */
  private oldestLive(): Entry<T> | undefined {
    while (this.addHead < this.addOrder.length) {
      const e = this.addOrder[this.addHead]!;
      if (!e.removed) return e;
      this.addOrder[this.addHead++] = undefined as unknown as Entry<T>;
    }
    return undefined;
  }

  /** Frees a slot for `add`, or throws `KVT_CAPACITY`. */
  private makeRoom(): void {
    if (this.entries.size < this.opts.maxEntries) return;
    // A full sweep is O(entries): pay for it only when the oldest done entry has expired, or
    // when there is no done entry to evict (ongoing ones may have expired).
    const now = this.opts.now();
    const oldestDone =
      this.doneHead < this.doneOrder.length ? this.doneOrder[this.doneHead]! : undefined;
    const oldestAdded = this.oldestLive();
    if (
      oldestDone === undefined ||
      oldestDone.removed ||
      now - oldestDone.since >= this.opts.ttlMs ||
      (oldestAdded !== undefined && now - oldestAdded.since >= this.opts.ttlMs)
    ) {
      this.sweep();
    }
    while (this.entries.size >= this.opts.maxEntries && this.doneHead < this.doneOrder.length) {
      const e = this.doneOrder[this.doneHead]!;
      this.doneOrder[this.doneHead++] = undefined as unknown as Entry<T>;
      if (e.removed || e.state !== 'done') continue;
      this.discard(e, 'evicted');
      this.evicted++;
    }
    if (this.doneHead > 1024 && this.doneHead * 2 > this.doneOrder.length) {
      this.doneOrder = this.doneOrder.slice(this.doneHead);
      this.doneHead = 0;
    }
    if (this.entries.size >= this.opts.maxEntries) {
      throw new KvtierError(
        'KVT_CAPACITY',
        `event manager is full: ${this.ongoing} ongoing prefetches of at most ${this.opts.maxEntries}`,
      );
    }
  }

  private onFulfilled(entry: Entry<T>, result: T): void {
    if (entry.removed) {
      this.callHook(entry, 'dispose', result);
      return;
    }
    entry.state = 'done';
    entry.result = result;
    this.doneOrder.push(entry);
    if (this.doneOrder.length - this.doneHead > 2 * this.opts.maxEntries) {
      // Taken and cancelled entries leave stale slots; drop them (amortised O(1) per add).
      this.doneOrder = this.doneOrder.slice(this.doneHead).filter((e) => !e.removed);
      this.doneHead = 0;
    }
    entry.since = this.opts.now();
    this.ongoing--;
    this.done++;
    const waiters = entry.waiters;
    if (waiters === undefined) return;
    entry.waiters = undefined;
    for (const w of waiters) {
      w.cleanup();
      w.resolve(result);
    }
  }

  private onRejected(entry: Entry<T>, err: unknown): void {
    if (entry.removed) return;
    this.detach(entry);
    const waiters = entry.waiters;
    if (waiters === undefined) return;
    entry.waiters = undefined;
    for (const w of waiters) {
      w.cleanup();
      w.reject(err);
    }
  }

  /** Removes `e` from the map and counters without touching its result or waiters. */
  private detach(e: Entry<T>): void {
    this.entries.delete(e.id);
    e.removed = true;
    if (e.state === 'ongoing') this.ongoing--;
    else this.done--;
  }

  /**
   * Removes `e`, aborts or disposes it, and rejects its waiters: `KVT_CLOSED` when the manager
   * closes, else `KVT_NOT_FOUND` saying why.
   */
  private discard(e: Entry<T>, why: 'cancelled' | 'expired' | 'evicted' | 'closed'): void {
    this.detach(e);
    if (e.state === 'ongoing') {
      this.callHook(e, 'abort', undefined);
    } else {
      const result = e.result as T;
      e.result = undefined;
      this.callHook(e, 'dispose', result);
    }
    const waiters = e.waiters;
    if (waiters === undefined || waiters.size === 0) return;
    e.waiters = undefined;
    // Built only when someone waits: capturing a stack per discarded entry is costly.
    const err = why === 'closed' ? closedError('event manager') : notFound(e.id, why);
    for (const w of waiters) {
      w.cleanup();
      w.reject(err);
    }
  }

  /** A failing hook must not stop a sweep or close halfway, so it is logged and contained. */
  private callHook(e: Entry<T>, hook: 'abort' | 'dispose', result: T | undefined): void {
    try {
      if (hook === 'abort') e.hooks.abort();
      else e.hooks.dispose(result as T);
    } catch (err) {
      this.opts.logger.error(`prefetch ${hook} hook threw`, { id: e.id, err });
    }
  }
}

const noop = (): void => {};

function notFound(id: string, why = 'cancelled'): KvtierError {
  return new KvtierError('KVT_NOT_FOUND', `prefetch ${JSON.stringify(id)} not found (${why})`);
}
