/**
 * Lookups that wait for a save still in flight elsewhere (disaggregated prefill, docs/fleet.md
 * "Disaggregated prefill"): a LOOKUP whose config names `awaitChunks` and `awaitMs` is answered
 * once its first `awaitChunks` chunks are ready in host memory, or when `awaitMs` has passed
 * (then with what it holds). A producer engine's sidecar is still writing the chunks to the shared
 * tier, or still holds them only in its own memory when the consumer asks; each try is an
 * ordinary lookup walk (the shared tier, the peer tier asking the producer's sidecar), tried again
 * on a timer that backs off, never a busy loop. Nothing here blocks: the answer is a promise, and
 * the engine's client keeps answering "still loading, ask again" while it is pending.
 */
import { KvtierError } from '../errors.ts';
import { requireInt } from '../util/validate.ts';
import type { LookupInput, LookupOutcome } from './storage-types.ts';

/** How a waiting lookup ended (`kvtier_lookup_awaits_total{outcome}`). */
export type LookupAwaitOutcome = 'ready' | 'arrived' | 'timed_out' | 'canceled';

/** What the awaiter needs of the storage manager. */
export interface AwaitableStorage {
  lookup(input: LookupInput): LookupOutcome | Promise<LookupOutcome>;
  cancel(lookupId: string): boolean;
  readonly epoch: number;
}

export interface LookupAwaiterOptions {
  /** Longest wait a lookup may ask for, ms; longer asks are cut to it. Default 60 000. */
  maxAwaitMs?: number;
  /** First pause between tries, ms (doubling up to `maxPollMs`). Default 2. */
  firstPollMs?: number;
  /** Longest pause between tries, ms. Default 20. */
  maxPollMs?: number;
  /** Called once per waiting lookup with how it ended and how long it waited (ms). */
  onOutcome?: (outcome: LookupAwaitOutcome, waitedMs: number) => void;
  /** Monotonic ms (tests inject one). Default `performance.now`. */
  now?: () => number;
}

/** Defaults of {@link LookupAwaiterOptions}. */
export const LOOKUP_AWAIT_DEFAULTS = { maxAwaitMs: 60_000, firstPollMs: 2, maxPollMs: 20 } as const;

/** STATS' `lookupAwaits`: counts of waiting lookups by outcome, and the time they waited. */
export interface LookupAwaitStats {
  /** Lookups that named a wait. */
  total: number;
  /** Every awaited chunk was there at the first try. */
  ready: number;
  /** Every awaited chunk arrived while it waited. */
  arrived: number;
  /** The wait ran out: answered with what was there (a partial hit or a miss). */
  timedOut: number;
  /** Cancelled (CANCEL, a newer lookup with the same id, or close) while waiting. */
  canceled: number;
  /** Waiting now. */
  waiting: number;
  /** Sum of the time lookups waited, ms. */
  waitedMs: number;
}

/**
 * Runs the waiting lookups of one server. Owns a wait per lookup id: {@link cancel} (the
 * server's CANCEL) and a second lookup with the same id end the first.
 */
export class LookupAwaiter {
  readonly #storage: AwaitableStorage;
  readonly #maxAwaitMs: number;
  readonly #firstPollMs: number;
  readonly #maxPollMs: number;
  readonly #onOutcome: ((o: LookupAwaitOutcome, ms: number) => void) | undefined;
  readonly #now: () => number;
  readonly #waits = new Map<string, AbortController>();
  readonly #stats = { total: 0, ready: 0, arrived: 0, timedOut: 0, canceled: 0, waitedMs: 0 };
  #closed = false;

  /** @throws KvtierError `KVT_INVALID_ARGUMENT` for bad options. */
  constructor(storage: AwaitableStorage, opts: LookupAwaiterOptions = {}) {
    this.#storage = storage;
    const d = LOOKUP_AWAIT_DEFAULTS;
    this.#maxAwaitMs = requireInt('maxAwaitMs', opts.maxAwaitMs ?? d.maxAwaitMs, 1, 3_600_000);
    this.#firstPollMs = requireInt('firstPollMs', opts.firstPollMs ?? d.firstPollMs, 1, 60_000);
    this.#maxPollMs = requireInt('maxPollMs', opts.maxPollMs ?? d.maxPollMs, 1, 60_000);
    this.#onOutcome = opts.onOutcome;
    this.#now = opts.now ?? (() => performance.now());
  }

  /**
   * The lookup, answered once its first `awaitChunks` chunks are ready or `awaitMs` has passed.
   * A partial answer's pins are released before each new try; the answer returned keeps its pins
   * as any lookup's. Rejects as {@link AwaitableStorage.lookup}, and with `KVT_CLOSED` after
   * {@link close}.
   */
  async lookup(input: LookupInput, awaitChunks: number, awaitMs: number): Promise<LookupOutcome> {
    if (this.#closed) throw new KvtierError('KVT_CLOSED', 'lookup awaiter is closed');
    const id = input.lookupId;
    this.#waits.get(id)?.abort();
    const ac = new AbortController();
    this.#waits.set(id, ac);
    this.#stats.total++;
    const want = Math.max(1, Math.floor(awaitChunks));
    const t0 = this.#now();
    const deadline = t0 + Math.min(Math.max(0, awaitMs), this.#maxAwaitMs);
    let pause = this.#firstPollMs;
    let tries = 0;
    const end = (o: LookupAwaitOutcome, out: LookupOutcome): LookupOutcome => {
      const waited = this.#now() - t0;
      this.#stats[o === 'timed_out' ? 'timedOut' : o]++;
      this.#stats.waitedMs += waited;
      this.#onOutcome?.(o, waited);
      return out;
    };
    try {
      for (;;) {
        const out = await this.#storage.lookup(input);
        tries++;
        if (ac.signal.aborted) {
          this.#storage.cancel(id);
          return end('canceled', canceledOutcome(out.epoch));
        }
        if (out.status !== 'ok') return end('canceled', out);
        if (out.hitChunks >= want) return end(tries === 1 ? 'ready' : 'arrived', out);
        const left = deadline - this.#now();
        if (left <= 0) return end('timed_out', out);
        this.#storage.cancel(id); // the partial answer's pins: the next try pins again
        if (!(await pause_(Math.min(pause, left), ac.signal))) {
          return end('canceled', canceledOutcome(this.#storage.epoch));
        }
        pause = Math.min(pause * 2, this.#maxPollMs);
      }
    } finally {
      if (this.#waits.get(id) === ac) this.#waits.delete(id);
    }
  }

  /** Ends the wait of `lookupId` (answered as canceled); whether one was waiting. */
  cancel(lookupId: string): boolean {
    const ac = this.#waits.get(lookupId);
    if (ac === undefined) return false;
    this.#waits.delete(lookupId);
    ac.abort();
    return true;
  }

  /** A snapshot for STATS. */
  stats(): LookupAwaitStats {
    return { ...this.#stats, waiting: this.#waits.size };
  }

  /** Ends every wait (answered as canceled); later lookups reject with `KVT_CLOSED`. Idempotent. */
  close(): void {
    this.#closed = true;
    for (const ac of this.#waits.values()) ac.abort();
    this.#waits.clear();
  }
}

function canceledOutcome(epoch: number): LookupOutcome {
  return { status: 'canceled', epoch, hitTokens: 0, hitChunks: 0, tiers: [] };
}

/** Resolves true after `ms`, or false as soon as `signal` aborts. */
function pause_(ms: number, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted) return Promise.resolve(false);
  return new Promise((resolve) => {
    const onAbort = () => {
      clearTimeout(timer);
      resolve(false);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve(true);
    }, ms);
    signal.addEventListener('abort', onAbort, { once: true });
  });
}
