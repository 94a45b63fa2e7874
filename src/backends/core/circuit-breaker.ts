import { abortedError, closedError, isKvtierError, KvtierError } from '../../errors.ts';
import { chunkHash } from '../../hashing/chunk-hash.ts';
import { Deadline } from '../../util/deadline.ts';
import { type Logger, silentLogger } from '../../util/log.ts';
import { requireInt } from '../../util/validate.ts';
import { ForwardingBackend } from './forwarding-backend.ts';
import type {
  BackendHealth,
  Chunk,
  ChunkHash,
  ChunkPage,
  ContainsOptions,
  GetOptions,
  NamespaceId,
  PutOptions,
  PutOutcome,
  StorageBackend,
} from './types.ts';

export interface CircuitBreakerOptions {
  /**
   * Longest one call (a whole batched contains or get) may take before it counts as failed and
   * is answered as a miss; default 5000 ms. Size it for the largest batch a lookup prefetches.
   */
  timeoutMs?: number;
  /** Consecutive failures (errors or timeouts) that open the breaker; default 3. */
  failureThreshold?: number;
  /** While open, how often the backend is probed in the background; default 1000 ms. */
  probeIntervalMs?: number;
  log?: Logger;
  /**
   * Called for every call of the backend that failed or timed out and was answered as a miss or
   * a drop (contains, get, put, and the background probe, reported as `contains`), with the
   * error's code (`KVT_TIMEOUT` for a timeout). Calls whose error is thrown to the caller (remove)
   * are not reported here: the caller sees them. The sidecar counts them in
   * `kvtier_backend_errors_total`.
   */
  onFailure?: (op: 'contains' | 'get' | 'put', code: string) => void;
}

export interface ResolvedCircuitBreakerOptions {
  timeoutMs: number;
  failureThreshold: number;
  probeIntervalMs: number;
}

export const CIRCUIT_BREAKER_DEFAULTS: Readonly<ResolvedCircuitBreakerOptions> = {
  timeoutMs: 5000,
  failureThreshold: 3,
  probeIntervalMs: 1000,
};

/** Validates breaker options. @throws KVT_INVALID_ARGUMENT naming the bad option. */
export function resolveCircuitBreakerOptions(
  o: CircuitBreakerOptions = {},
): ResolvedCircuitBreakerOptions {
  return {
    timeoutMs: requireInt(
      'health.timeoutMs',
      o.timeoutMs ?? CIRCUIT_BREAKER_DEFAULTS.timeoutMs,
      1,
      600_000,
    ),
    failureThreshold: requireInt(
      'health.failureThreshold',
      o.failureThreshold ?? CIRCUIT_BREAKER_DEFAULTS.failureThreshold,
      1,
      1000,
    ),
    probeIntervalMs: requireInt(
      'health.probeIntervalMs',
      o.probeIntervalMs ?? CIRCUIT_BREAKER_DEFAULTS.probeIntervalMs,
      1,
      3_600_000,
    ),
  };
}

/** Namespace and key of the background probe: a lookup of a chunk nobody stores. */
const PROBE_NS = '00000000000000000000000000000000';
const PROBE_HASH = chunkHash('0'.repeat(64));

/** Counters of one breaker, for stats and tests. */
export interface BreakerCounters {
  /** Calls that failed or timed out. */
  failures: number;
  /** Calls answered as a miss (or dropped) without reaching the backend because the breaker was open. */
  bypassed: number;
  /** Times the breaker opened. */
  opened: number;
  /** Times a probe found the backend healthy again and closed the breaker. */
  restored: number;
  /** Puts that landed after their timeout (answered 'dropped') and were removed again. */
  lateWritesRemoved: number;
}

/**
 * Health state and circuit breaker around a (remote) backend. Every call is raced against
 * `timeoutMs`; a failure or timeout of contains/get is answered as a miss and of put as a drop,
 * so a slow or dead tier costs a lookup at most `timeoutMs`. After `failureThreshold` consecutive
 * failures the breaker opens: calls are answered as misses/drops at once without touching the
 * backend, `health()` reports 'down' (the storage manager then skips the tier), and a background
 * probe retries every `probeIntervalMs` until one succeeds, which closes the breaker.
 *
 * Deadlines come from the one helper (`util/deadline.ts`): the signal a guarded call gets aborts
 * with `KVT_TIMEOUT` at `timeoutMs`, or with the caller's abort. `pin`, `unpin` and `stats` are
 * forwarded unguarded ({@link ForwardingBackend}). The wrapper owns the backend it wraps and
 * closes it.
 */
export class CircuitBreakerBackend extends ForwardingBackend {
  readonly counters: BreakerCounters = {
    failures: 0,
    bypassed: 0,
    opened: 0,
    restored: 0,
    lateWritesRemoved: 0,
  };
  readonly #inner: StorageBackend;
  readonly #opts: ResolvedCircuitBreakerOptions;
  readonly #log: Logger;
  readonly #onFailure: CircuitBreakerOptions['onFailure'];
  #lastError: unknown;
  #consecutiveFailures = 0;
  #open = false;
  #probeTimer: NodeJS.Timeout | undefined;
  #probing = false;
  #closing: Promise<void> | undefined;

  constructor(inner: StorageBackend, opts: CircuitBreakerOptions = {}) {
    super(inner);
    this.#inner = inner;
    this.#opts = resolveCircuitBreakerOptions(opts);
    this.#log = opts.log ?? silentLogger;
    this.#onFailure = opts.onFailure;
  }

  /** Whether calls currently bypass the backend. */
  get isOpen(): boolean {
    return this.#open;
  }

  /** Null while calls bypass the backend (it cannot be listed then); else the backend's scan. */
  override scanChunks(
    ns: NamespaceId | undefined,
    opts: { readonly signal?: AbortSignal },
  ): AsyncIterable<ChunkPage> | null {
    return this.#open ? null : super.scanChunks(ns, opts);
  }

  override async batchedContains(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: ContainsOptions = {},
  ): Promise<number> {
    this.#checkOpen();
    if (hashes.length === 0) return 0;
    this.#followInner();
    if (this.#open) {
      this.counters.bypassed++;
      return 0;
    }
    const result = await this.#guard(
      'contains',
      (signal) => this.#inner.batchedContains(ns, hashes, { ...opts, signal }),
      opts.signal,
      (late) => {
        // A contains that answers after its timeout may have pinned chunks nobody will release.
        if (opts.pin === true && late > 0) this.#inner.unpin(ns, hashes.slice(0, late));
      },
    );
    return result ?? 0;
  }

  override async batchedGet(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: GetOptions = {},
  ): Promise<Map<ChunkHash, Chunk | null>> {
    this.#checkOpen();
    this.#followInner();
    if (!this.#open) {
      const got = await this.#guard(
        'get',
        (signal) => this.#inner.batchedGet(ns, hashes, { ...opts, signal }),
        opts.signal,
      );
      if (got !== undefined) return got;
    } else {
      this.counters.bypassed++;
    }
    const misses = new Map<ChunkHash, Chunk | null>();
    for (const h of hashes) misses.set(h, null);
    return misses;
  }

  override async put(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    opts: PutOptions = {},
  ): Promise<PutOutcome> {
    this.#checkOpen();
    this.#followInner();
    if (this.#open) {
      this.counters.bypassed++;
      return 'dropped';
    }
    return (
      (await this.#guard(
        'put',
        (signal) => this.#inner.put(ns, hash, chunk, { ...opts, signal }),
        opts.signal,
        (late) => {
          // The caller was told 'dropped': a write that lands after its timeout must not leave the
          // chunk behind, where it could outlive a CLEAR that ran in between.
          if (late === 'stored') this.#removeLate(ns, hash);
        },
      )) ?? 'dropped'
    );
  }

  override async remove(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    this.#checkOpen();
    if (this.#open)
      throw new KvtierError('KVT_BACKEND', `tier "${this.name}" is down; remove not attempted`);
    const n = await this.#guard('remove', () => this.#inner.remove(ns, hashes));
    if (n === undefined) {
      const cause = this.#lastError;
      throw new KvtierError(
        cause instanceof KvtierError ? cause.code : 'KVT_BACKEND',
        `tier "${this.name}" did not complete remove${cause instanceof Error ? `: ${cause.message}` : ''}`,
        { cause },
      );
    }
    return n;
  }

  override async clear(ns?: NamespaceId): Promise<void> {
    this.#checkOpen();
    if (this.#open)
      throw new KvtierError('KVT_BACKEND', `tier "${this.name}" is down; clear not attempted`);
    // Clearing a large remote store can take longer than one call's timeout; it is not raced.
    await this.#inner.clear(ns);
  }

  override health(): BackendHealth {
    if (this.#closing !== undefined) return 'down';
    this.#followInner();
    return this.#open ? 'down' : this.#inner.health();
  }

  /**
   * A backend that reports itself down (its connection lost) is bypassed at once, as after
   * `failureThreshold` failures: 'down' always means lookups skip the tier and its writes are
   * dropped, never that writes still try it.
   */
  #followInner(): void {
    if (this.#open || this.#closing !== undefined) return;
    let inner: BackendHealth;
    try {
      inner = this.#inner.health();
    } catch {
      inner = 'down';
    }
    if (inner === 'down') this.#trip('it reports itself down');
  }

  #trip(why: string): void {
    this.#open = true;
    this.counters.opened++;
    this.#log.debug('breaker open: bypassing the tier until a probe succeeds', {
      tier: this.name,
      why,
    });
    this.#scheduleProbe();
  }

  override close(): Promise<void> {
    this.#closing ??= (async () => {
      if (this.#probeTimer !== undefined) clearTimeout(this.#probeTimer);
      await this.#inner.close();
    })();
    return this.#closing;
  }

  #removeLate(ns: NamespaceId, hash: ChunkHash): void {
    this.counters.lateWritesRemoved++;
    this.#log.info('write landed after its timeout; removing it', { tier: this.name, ns, hash });
    this.#inner.remove(ns, [hash]).catch((err: unknown) => {
      this.#log.warn('late write not removed', { tier: this.name, error: String(err) });
    });
  }

  #checkOpen(): void {
    if (this.#closing !== undefined) throw closedError(`tier "${this.name}"`);
  }

  /**
   * Runs `call` under the deadline. Resolves its value, or undefined when it failed or timed out
   * (counted); rethrows aborts of the caller's signal and KVT_CLOSED.
   */
  async #guard<T>(
    op: string,
    call: (signal: AbortSignal) => Promise<T>,
    outer?: AbortSignal,
    onLate?: (late: T) => void,
  ): Promise<T | undefined> {
    const d = new Deadline({
      what: `tier "${this.name}" ${op}`,
      timeoutMs: this.#opts.timeoutMs,
      signal: outer,
    });
    let running: Promise<T>;
    try {
      if (outer?.aborted) throw abortedError(outer, `tier "${this.name}" ${op}`);
      running = call(d.signal);
    } catch (err) {
      d.dispose();
      throw err;
    }
    try {
      running.then(
        (v) => {
          if (d.timedOut) onLate?.(v);
        },
        () => {},
      );
      const v = await d.race(running);
      this.#success();
      return v;
    } catch (err) {
      if (outer?.aborted) throw abortedError(outer, `tier "${this.name}" ${op}`);
      if (d.timedOut) {
        this.#failure(op, d.error());
        return undefined;
      }
      if (isKvtierError(err, 'KVT_CLOSED')) throw err;
      this.#failure(op, err);
      return undefined;
    } finally {
      d.dispose();
    }
  }

  #success(): void {
    this.#consecutiveFailures = 0;
  }

  #failure(op: string, err: unknown): void {
    this.counters.failures++;
    this.#lastError = err;
    if (op === 'contains' || op === 'get' || op === 'put')
      this.#onFailure?.(op, err instanceof KvtierError ? err.code : 'KVT_INTERNAL');
    this.#consecutiveFailures++;
    // The tier's state changes are logged once each by the sidecar's TierWatch (warn down, info
    // back); single failures are counted in metrics and told here at debug.
    this.#log.debug('tier call failed', {
      tier: this.name,
      op,
      err,
      consecutive: this.#consecutiveFailures,
    });
    if (!this.#open && this.#consecutiveFailures >= this.#opts.failureThreshold)
      this.#trip(`${this.#consecutiveFailures} calls in a row failed`);
  }

  #scheduleProbe(): void {
    if (this.#closing !== undefined || this.#probeTimer !== undefined) return;
    this.#probeTimer = setTimeout(() => {
      this.#probeTimer = undefined;
      void this.#probe();
    }, this.#opts.probeIntervalMs);
    this.#probeTimer.unref();
  }

  /** One probe: a real round trip (a contains of a key nobody stores) under the timeout. */
  async #probe(): Promise<void> {
    if (this.#probing || this.#closing !== undefined) return;
    this.#probing = true;
    const d = new Deadline({ what: `tier "${this.name}" probe`, timeoutMs: this.#opts.timeoutMs });
    try {
      await d.race(this.#inner.batchedContains(PROBE_NS, [PROBE_HASH], { signal: d.signal }));
      if (this.#inner.health() === 'down')
        throw new KvtierError('KVT_BACKEND', 'backend reports down');
      this.#open = false;
      this.#consecutiveFailures = 0;
      this.counters.restored++;
      this.#log.debug('breaker closed: a probe succeeded', { tier: this.name });
    } catch (err) {
      const e = d.timedOut ? d.error() : err;
      this.#onFailure?.('contains', e instanceof KvtierError ? e.code : 'KVT_INTERNAL');
      this.#scheduleProbe();
    } finally {
      d.dispose();
      this.#probing = false;
    }
  }
}
