import { ForwardingBackend } from '../backends/core/forwarding-backend.ts';
import type {
  Chunk,
  ChunkHash,
  ChunkReservation,
  ContainsOptions,
  GetOptions,
  HostMemoryTier,
  NamespaceId,
  PackedHostIndex,
  PutOptions,
  PutOutcome,
  ReserveOutcome,
  StorageBackend,
} from '../backends/core/types.ts';
import { KvtierError } from '../errors.ts';
import { type Tally, tallyOf } from './counter-tally.ts';
import { type HistogramChild, histogramTallyOf } from './histogram-tally.ts';
import type { BackendOp, KvtierMetrics } from './metrics.ts';

/** Options of {@link instrumentBackend}. */
export interface InstrumentOptions {
  /** Monotonic clock in milliseconds; default `performance.now`. Tests inject one. */
  now?: () => number;
}

type Observe = HistogramChild;

/**
 * Wraps a backend so every call is measured per tier (label `tier` = `backend.name`), keeping
 * metrics out of backend code. Same name, kind and capabilities; every call is forwarded and
 * its result or error passed back unchanged.
 *
 * Recorded:
 * - `kvtier_backend_op_duration_seconds{tier,op}` for contains|get|put|remove|clear, failed
 *   calls included (a slow failure is still a slow call);
 * - hits and misses, in chunks: for `batchedContains` hits are the returned count and misses are
 *   1 when the count is below the number of hashes asked about, else 0 (a contains stops at its
 *   first miss, so it observes at most one); for `batchedGet`, non-null and null entries;
 * - bytes read (sum of returned payload lengths) and written (puts whose outcome is `stored`);
 * - `kvtier_backend_errors_total{tier,op,code}` with `KvtierError.code`, or `KVT_INTERNAL` for
 *   any other thrown value.
 *
 * `pin`, `unpin`, `stats`, `health` and `close` forward with no measurement (the wrapper derives
 * from {@link ForwardingBackend}). The wrapper does not own the backend beyond forwarding `close()`.
 * Use {@link instrumentHostTier} for the host-memory tier, so that its `reserve` is kept.
 */
export function instrumentBackend(
  backend: StorageBackend,
  metrics: KvtierMetrics,
  options: InstrumentOptions = {},
): StorageBackend {
  return new InstrumentedBackend(backend, metrics, options.now ?? (() => performance.now()));
}

/**
 * {@link instrumentBackend} for the host-memory tier: the result is a {@link HostMemoryTier} whose
 * `reserve` forwards (no JS-heap copy on the save path). A reservation's `commit` that stores
 * counts its bytes as written; a `reserve` that throws counts as a failed `put`.
 */
export function instrumentHostTier(
  tier: HostMemoryTier,
  metrics: KvtierMetrics,
  options: InstrumentOptions = {},
): HostMemoryTier {
  return new InstrumentedHostTier(tier, metrics, options.now ?? (() => performance.now()));
}

class InstrumentedBackend<T extends StorageBackend = StorageBackend> extends ForwardingBackend<T> {
  readonly #metrics: KvtierMetrics;
  readonly #now: () => number;
  // Label children bound once and tallied, so the hot path neither builds nor hashes label objects.
  readonly #duration: Record<BackendOp, Observe>;
  readonly #hits: Tally;
  readonly #misses: Tally;
  readonly #bytesRead: Tally;
  protected readonly bytesWritten: Tally;

  constructor(inner: T, metrics: KvtierMetrics, now: () => number) {
    super(inner);
    this.#metrics = metrics;
    this.#now = now;
    const tier = inner.name;
    const d = histogramTallyOf(metrics.backendOpDuration);
    this.#duration = {
      contains: d.child({ tier, op: 'contains' }),
      get: d.child({ tier, op: 'get' }),
      put: d.child({ tier, op: 'put' }),
      remove: d.child({ tier, op: 'remove' }),
      clear: d.child({ tier, op: 'clear' }),
    };
    this.#hits = tallyOf(metrics.backendHits).child({ tier });
    this.#misses = tallyOf(metrics.backendMisses).child({ tier });
    this.#bytesRead = tallyOf(metrics.backendBytesRead).child({ tier });
    this.bytesWritten = tallyOf(metrics.backendBytesWritten).child({ tier });
  }

  override async batchedContains(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts?: ContainsOptions,
  ): Promise<number> {
    const start = this.#now();
    let found: number;
    try {
      found = await this.inner.batchedContains(ns, hashes, opts);
    } catch (err) {
      this.failed('contains', start, err);
      throw err;
    }
    this.containsDone(start, found, hashes.length);
    return found;
  }

  /** Records a contains that started at `startMs` and found `found` of `asked` chunks. */
  protected containsDone(startMs: number, found: number, asked: number): void {
    this.#observe('contains', startMs);
    if (found > 0) this.#hits.n += found;
    if (found < asked) this.#misses.n++;
  }

  override async batchedGet(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts?: GetOptions,
  ): Promise<Map<ChunkHash, Chunk | null>> {
    const start = this.#now();
    let result: Map<ChunkHash, Chunk | null>;
    try {
      result = await this.inner.batchedGet(ns, hashes, opts);
    } catch (err) {
      this.failed('get', start, err);
      throw err;
    }
    this.#observe('get', start);
    let hits = 0;
    let misses = 0;
    let bytes = 0;
    for (const chunk of result.values()) {
      if (chunk === null) {
        misses++;
      } else {
        hits++;
        bytes += chunk.data.byteLength;
      }
    }
    if (hits > 0) this.#hits.n += hits;
    if (misses > 0) this.#misses.n += misses;
    if (bytes > 0) this.#bytesRead.n += bytes;
    return result;
  }

  override async put(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    opts?: PutOptions,
  ): Promise<PutOutcome> {
    const start = this.#now();
    let outcome: PutOutcome;
    try {
      outcome = await this.inner.put(ns, hash, chunk, opts);
    } catch (err) {
      this.failed('put', start, err);
      throw err;
    }
    this.#observe('put', start);
    if (outcome === 'stored') this.bytesWritten.n += chunk.data.byteLength;
    return outcome;
  }

  override async remove(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    const start = this.#now();
    try {
      const removed = await this.inner.remove(ns, hashes);
      this.#observe('remove', start);
      return removed;
    } catch (err) {
      this.failed('remove', start, err);
      throw err;
    }
  }

  override async clear(ns?: NamespaceId): Promise<void> {
    const start = this.#now();
    try {
      await this.inner.clear(ns);
      this.#observe('clear', start);
    } catch (err) {
      this.failed('clear', start, err);
      throw err;
    }
  }

  #observe(op: BackendOp, startMs: number): void {
    this.#duration[op].observe(Math.max(0, this.#now() - startMs) / 1000);
  }

  /** The injected clock, ms. */
  protected now(): number {
    return this.#now();
  }

  /** Records a failed call of `op` that started at `startMs`. */
  protected failed(op: BackendOp, startMs: number, err: unknown): void {
    this.#observe(op, startMs);
    const code = err instanceof KvtierError ? err.code : 'KVT_INTERNAL';
    this.#metrics.backendErrors.inc({ tier: this.name, op, code });
  }
}

class InstrumentedHostTier extends InstrumentedBackend<HostMemoryTier> implements HostMemoryTier {
  /** The inner tier's packed lookups, measured as `batchedContains` (unpins are not). */
  readonly packedIndex: PackedHostIndex | undefined;

  constructor(inner: HostMemoryTier, metrics: KvtierMetrics, now: () => number) {
    super(inner, metrics, now);
    const p = inner.packedIndex;
    this.packedIndex =
      p === undefined
        ? undefined
        : {
            contains: (ns, packed, from, count, pin) => {
              const start = this.now();
              let found: number;
              try {
                found = p.contains(ns, packed, from, count, pin);
              } catch (err) {
                this.failed('contains', start, err);
                throw err;
              }
              this.containsDone(start, found, count);
              return found;
            },
            unpin: (ns, packed, from, count) => p.unpin(ns, packed, from, count),
            ...(p.containsPinned !== undefined && p.unpinHandles !== undefined
              ? {
                  containsPinned: (ns, packed, from, count, handles) => {
                    const start = this.now();
                    let found: number;
                    try {
                      found = p.containsPinned!(ns, packed, from, count, handles);
                    } catch (err) {
                      this.failed('contains', start, err);
                      throw err;
                    }
                    this.containsDone(start, found, count);
                    return found;
                  },
                  unpinHandles: (handles, from, count) => p.unpinHandles!(handles, from, count),
                }
              : {}),
          };
  }

  reserve(ns: NamespaceId, hash: ChunkHash, bytes: number, tokens: number): ReserveOutcome {
    const start = this.now();
    let r: ReserveOutcome;
    try {
      r = this.inner.reserve(ns, hash, bytes, tokens);
    } catch (err) {
      this.failed('put', start, err);
      throw err;
    }
    if (typeof r === 'string') return r;
    const written = this.bytesWritten;
    const reservation: ChunkReservation = {
      view: r.view,
      commit: (opts) => {
        const outcome = r.commit(opts);
        if (outcome === 'stored') written.n += r.view.byteLength;
        return outcome;
      },
      abort: () => r.abort(),
    };
    return reservation;
  }
}
