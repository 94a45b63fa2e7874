/**
 * The one deadline helper: every bounded call in kvtier (backends, the circuit breaker, the
 * server) runs under a {@link Deadline}, so a timeout and an abort mean the same thing and carry
 * the same codes everywhere (the request socket, src/protocol/request-socket.ts, words its
 * per-request deadlines the same way without a Deadline object per request):
 *
 * - the deadline passing rejects with `KVT_TIMEOUT` ("<what> timed out after <n> ms");
 * - a caller's signal firing rejects with `abortedError(signal, what)`: the signal's reason when
 *   it is a {@link KvtierError} (e.g. `KVT_CLOSED` from an owner's close, or an outer deadline's
 *   `KVT_TIMEOUT`), `KVT_TIMEOUT` for a `TimeoutError` reason, else `KVT_ABORTED`.
 *
 * The deadline's `signal` is an `AbortSignal` whose reason is that error, so work that takes a
 * signal stops with the same code. Two things are deliberately not used, measured on Node 20.20:
 * `AbortSignal.timeout` (about 14 µs and ~400 bytes per call, and its unref'd timer can be
 * neither cleared nor relied on to hold the process while something waits on it; a plain
 * `setTimeout` cleared on settle costs 0.7 µs, which matters on the lookup path) and
 * `AbortSignal.any` (it keeps a weak reference in every source per combined signal until that
 * source aborts: 100 MB after 1.8 M calls on one long-lived signal such as an owner's close
 * signal). Sources get one listener each, removed when the deadline is disposed.
 */
import { setMaxListeners } from 'node:events';
import { abortedError, KvtierError } from '../errors.ts';

/**
 * Where deadline timers come from. The default, {@link systemTimers}, is `setTimeout`; tests
 * inject a fake clock.
 */
export interface DeadlineTimers {
  /** Calls `onExpire` once `ms` have passed, unless the returned function is called first. */
  arm(ms: number, onExpire: () => void): () => void;
}

/** `setTimeout`/`clearTimeout`: a timer that holds the process only while it is armed. */
export const systemTimers: DeadlineTimers = Object.freeze({
  arm(ms: number, onExpire: () => void): () => void {
    const t = setTimeout(onExpire, ms);
    return () => clearTimeout(t);
  },
});

/** Largest delay a Node timer can arm (ms); longer deadlines are cut to it. */
export const MAX_DEADLINE_MS = 2 ** 31 - 1;

/** Options of a {@link Deadline}. */
export interface DeadlineOptions {
  /** Names the operation in errors, e.g. `tier "s3" get`. */
  what: string;
  /**
   * Milliseconds from now until the deadline passes; none when undefined. 0 passes at the next
   * turn of the timers. Cut to {@link MAX_DEADLINE_MS}.
   */
  timeoutMs?: number | undefined;
  /** The caller's signal(s): any of them firing ends the operation (undefined entries are skipped). */
  signal?: AbortSignal | readonly (AbortSignal | undefined)[] | undefined;
  /** Timer source; default {@link systemTimers}. */
  timers?: DeadlineTimers | undefined;
}

const noop = (): void => {};

/**
 * One operation's deadline: it ends when a caller's signal fires or `timeoutMs` passes, whichever
 * is first, with the {@link KvtierError} that the operation rejects with. Pass {@link signal} to
 * work that can stop early, {@link race} the work's promise against the deadline, and call
 * {@link dispose} in a `finally` (or use {@link withDeadline}, which does both). The signal is
 * made on first use only: a deadline nobody asks a signal of costs a timer and a listener per
 * caller's signal.
 */
export class Deadline {
  /** The deadline in ms, as given (undefined: none). */
  readonly timeoutMs: number | undefined;
  readonly #what: string;
  readonly #sources: AbortSignal[] = [];
  readonly #waiters = new Set<(err: KvtierError) => void>();
  #ac: AbortController | undefined;
  #error: KvtierError | undefined;
  #disarm = noop;
  #timedOut = false;
  #onSource = noop;

  /** @throws RangeError for a negative or non-finite `timeoutMs`. */
  constructor(opts: DeadlineOptions) {
    this.#what = opts.what;
    this.timeoutMs = opts.timeoutMs;
    const given = opts.signal;
    const sources = given === undefined ? [] : Array.isArray(given) ? given : [given];
    for (const s of sources as (AbortSignal | undefined)[]) {
      if (s === undefined) continue;
      if (s.aborted) {
        this.#error = abortedError(s, this.#what);
        this.#sources.length = 0;
        return;
      }
      this.#sources.push(s);
    }
    const ms = opts.timeoutMs;
    if (ms !== undefined) {
      if (!Number.isFinite(ms) || ms < 0)
        throw new RangeError(`timeoutMs must be a finite number >= 0, got ${ms}`);
      this.#disarm = (opts.timers ?? systemTimers).arm(
        Math.min(Math.ceil(ms), MAX_DEADLINE_MS),
        () => {
          this.#timedOut = true;
          this.#end(new KvtierError('KVT_TIMEOUT', `${this.#what} timed out after ${ms} ms`));
        },
      );
    }
    if (this.#sources.length > 0) {
      this.#onSource = () => {
        const fired = this.#sources.find((s) => s.aborted);
        this.#end(abortedError(fired, this.#what));
      };
      for (const s of this.#sources) s.addEventListener('abort', this.#onSource, { once: true });
    }
  }

  /**
   * Aborts when the deadline ends, with {@link error}'s value as its reason (already aborted
   * when it has ended). Give it to work that can stop early.
   */
  get signal(): AbortSignal {
    if (this.#ac === undefined) {
      this.#ac = new AbortController();
      // Shared by every piece of work under this deadline: many listeners by design.
      setMaxListeners(0, this.#ac.signal);
      if (this.#error !== undefined) this.#ac.abort(this.#error);
    }
    return this.#ac.signal;
  }

  /** True once the deadline passed before any caller's signal fired. */
  get timedOut(): boolean {
    return this.#timedOut;
  }

  /** True once the deadline passed or a caller's signal fired. */
  get ended(): boolean {
    return this.#error !== undefined;
  }

  /** Why the operation ended (`KVT_TIMEOUT`, the caller's abort error), or undefined while running. */
  error(): KvtierError | undefined {
    return this.#error;
  }

  /** @throws KvtierError {@link error} once the deadline passed or a caller aborted. */
  throwIfEnded(): void {
    if (this.#error !== undefined) throw this.#error;
  }

  /**
   * Settles with `op`, or rejects with {@link error} when the deadline ends first. `op` is not
   * cancelled by this (pass it {@link signal} for that): a late outcome is ignored, a late
   * rejection never surfaces as unhandled. Nothing of it is left once it settles.
   */
  race<T>(op: Promise<T>): Promise<T> {
    if (this.#error !== undefined) {
      op.catch(noop);
      return Promise.reject(this.#error);
    }
    return new Promise<T>((resolve, reject) => {
      this.#waiters.add(reject);
      op.then(
        (v) => {
          this.#waiters.delete(reject);
          resolve(v);
        },
        (err: unknown) => {
          this.#waiters.delete(reject);
          reject(err);
        },
      );
    });
  }

  /**
   * Clears the timer and removes the listeners on the caller's signals; idempotent. After it,
   * the deadline no longer ends.
   */
  dispose(): void {
    for (const s of this.#sources) s.removeEventListener('abort', this.#onSource);
    this.#sources.length = 0;
    this.#disarm();
    this.#disarm = noop;
  }

  #end(err: KvtierError): void {
    if (this.#error !== undefined) return;
    this.#error = err;
    this.dispose();
    // The work's own listeners see the abort before the race settles.
    this.#ac?.abort(err);
    for (const reject of this.#waiters) reject(err);
    this.#waiters.clear();
  }
}

/**
 * Runs `work` under a {@link Deadline} and disposes it when done. `work` is a promise already
 * under way (a file operation that cannot be cancelled) or a function given the deadline's
 * signal; the function is not called when a caller's signal has already fired.
 * @throws KvtierError `KVT_TIMEOUT` when the deadline passes first; the caller's abort error
 *   (`KVT_ABORTED`, or the signal's KvtierError reason) when a signal fires first; else what
 *   `work` rejects with.
 */
export async function withDeadline<T>(
  opts: DeadlineOptions,
  work: Promise<T> | ((signal: AbortSignal) => Promise<T>),
): Promise<T> {
  const d = new Deadline(opts);
  try {
    if (typeof work === 'function') {
      d.throwIfEnded();
      return await d.race(work(d.signal));
    }
    return await d.race(work);
  } finally {
    d.dispose();
  }
}
