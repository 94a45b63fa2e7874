/**
 * A tier that could not be reached when the sidecar started: it is down (lookups skip it, its
 * writes are dropped) and keeps trying to start in the background until a start succeeds, then
 * it is that backend and serves. The registry builds one for a tier below host memory whose
 * start failed for any reason but its config (see `BackendRegistry.createTiers`).
 */
import { closedError, KvtierError } from '../../errors.ts';
import { type Logger, silentLogger } from '../../util/log.ts';
import { closeQuietly, isConfigFailure } from './backend-check.ts';
import type {
  BackendCapabilities,
  BackendHealth,
  BackendStats,
  Chunk,
  ChunkHash,
  ChunkPage,
  FoundListener,
  NamespaceId,
  PutOutcome,
  RemovalListener,
  StorageBackend,
} from './types.ts';

/** Options of {@link LateStartBackend}. */
export interface LateStartOptions {
  /** The tier's name. */
  name: string;
  /** The tier's type from the config: its `kind` until it has started. */
  type: string;
  /**
   * Builds and starts the backend, as the registry does at start-up (a new one per try); rejects
   * when it cannot. Never called while a try is running.
   */
  start: () => Promise<StorageBackend>;
  /** Why the first try (at start-up) failed: the message of calls refused until a start succeeds. */
  reason?: unknown;
  /** A try still running (the first one, past its bound at start-up): awaited before any other. */
  running?: Promise<StorageBackend> | undefined;
  /** Time between a failed try and the next, ms (the breaker's `probeIntervalMs`). */
  retryIntervalMs: number;
  /** How long `close()` waits for a try still running, ms; its backend is closed when it lands. */
  closeWaitMs: number;
  /** The tier's logger: a try that fails on its config is logged at error, others at debug. */
  log?: Logger;
  /** Told of every failed try with its error's code (`KVT_INTERNAL` for a non-kvtier error). */
  onFailure?: (code: string) => void;
}

/** Capabilities of a tier that has not started: it holds nothing and promises nothing. */
const NOT_STARTED: BackendCapabilities = Object.freeze({
  pinning: false,
  hostMemory: false,
  persistent: false,
  shared: false,
  evicts: false,
  maxChunkBytes: 1,
});

const NO_STATS: BackendStats = Object.freeze({
  chunks: 0,
  bytesUsed: 0,
  capacityBytes: null,
  pinnedChunks: 0,
  evictions: 0,
  droppedPuts: 0,
});

/**
 * Until a start succeeds: `health()` is `'down'`; contains answers 0, get all misses, put
 * `'dropped'`, pin 0, without touching anything; remove and clear throw `KVT_BACKEND`; stats are
 * zeros; `kind` is the config's type and capabilities promise nothing. Listeners set meanwhile are
 * handed to the backend when it starts. Once started, every member is the started backend's
 * (`kind` and `capabilities` included). Tries run one at a time, `retryIntervalMs` apart, on an
 * unref'd timer. Owns the started backend and closes it.
 */
export class LateStartBackend implements StorageBackend {
  readonly name: string;
  readonly #type: string;
  readonly #start: () => Promise<StorageBackend>;
  readonly #retryMs: number;
  readonly #closeWaitMs: number;
  readonly #log: Logger;
  readonly #onFailure: ((code: string) => void) | undefined;
  #inner: StorageBackend | undefined;
  #running: Promise<unknown> | undefined;
  #timer: NodeJS.Timeout | undefined;
  #lastError: unknown;
  #loggedConfigError = '';
  #removal: RemovalListener | undefined;
  #found: FoundListener | undefined;
  #closing: Promise<void> | undefined;
  /** Tries that failed after the one at start-up failed or ran past its bound. */
  #tries = 0;

  constructor(opts: LateStartOptions) {
    this.name = opts.name;
    this.#type = opts.type;
    this.#start = opts.start;
    this.#retryMs = opts.retryIntervalMs;
    this.#closeWaitMs = opts.closeWaitMs;
    this.#log = opts.log ?? silentLogger;
    this.#onFailure = opts.onFailure;
    this.#lastError = opts.reason;
    if (opts.running !== undefined) this.#track(opts.running);
    else this.#schedule();
  }

  /** The started backend, once a start has succeeded (the tier then serves from it). */
  get backend(): StorageBackend | undefined {
    return this.#inner;
  }

  get kind(): string {
    return this.#inner?.kind ?? this.#type;
  }

  get capabilities(): BackendCapabilities {
    return this.#inner?.capabilities ?? NOT_STARTED;
  }

  batchedContains(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts?: Parameters<StorageBackend['batchedContains']>[2],
  ): Promise<number> {
    this.#checkOpen();
    return this.#inner?.batchedContains(ns, hashes, opts) ?? Promise.resolve(0);
  }

  batchedGet(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts?: Parameters<StorageBackend['batchedGet']>[2],
  ): Promise<Map<ChunkHash, Chunk | null>> {
    this.#checkOpen();
    if (this.#inner !== undefined) return this.#inner.batchedGet(ns, hashes, opts);
    return Promise.resolve(new Map(hashes.map((h) => [h, null])));
  }

  put(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    opts?: Parameters<StorageBackend['put']>[3],
  ): Promise<PutOutcome> {
    this.#checkOpen();
    return this.#inner?.put(ns, hash, chunk, opts) ?? Promise.resolve('dropped');
  }

  async remove(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    return this.#started('remove').remove(ns, hashes);
  }

  async clear(ns?: NamespaceId): Promise<void> {
    return this.#started('clear').clear(ns);
  }

  pin(ns: NamespaceId, hashes: readonly ChunkHash[]): number {
    this.#checkOpen();
    return this.#inner?.pin(ns, hashes) ?? 0;
  }

  unpin(ns: NamespaceId, hashes: readonly ChunkHash[]): void {
    this.#checkOpen();
    this.#inner?.unpin(ns, hashes);
  }

  setRemovalListener(listener: RemovalListener | undefined): void {
    this.#removal = listener;
    this.#inner?.setRemovalListener?.(listener);
  }

  setFoundListener(listener: FoundListener | undefined): void {
    this.#found = listener;
    this.#inner?.setFoundListener?.(listener);
  }

  listChunks(ns?: NamespaceId): Iterable<readonly [NamespaceId, ChunkHash]> {
    return this.#inner?.listChunks?.(ns) ?? [];
  }

  /** The started tier's scan; null until it has started. */
  scanChunks(
    ns: NamespaceId | undefined,
    opts: { readonly signal?: AbortSignal },
  ): AsyncIterable<ChunkPage> | null {
    return this.#inner?.scanChunks?.(ns, opts) ?? null;
  }

  stats(): BackendStats {
    this.#checkOpen();
    return this.#inner?.stats() ?? NO_STATS;
  }

  health(): BackendHealth {
    this.#checkOpen();
    return this.#inner?.health() ?? 'down';
  }

  close(): Promise<void> {
    this.#closing ??= (async () => {
      if (this.#timer !== undefined) clearTimeout(this.#timer);
      const running = this.#running;
      if (running !== undefined && this.#inner === undefined) {
        // A try that does not settle must not hold the shutdown; its backend is closed on landing.
        let timer: NodeJS.Timeout | undefined;
        const waited = new Promise<void>((resolve) => {
          timer = setTimeout(resolve, this.#closeWaitMs);
        });
        await Promise.race([running, waited]);
        clearTimeout(timer);
      }
      await this.#inner?.close();
    })();
    return this.#closing;
  }

  #track(attempt: Promise<StorageBackend>): void {
    const running = attempt.then(
      (backend) => this.#adopt(backend),
      (err: unknown) => this.#failed(err),
    );
    this.#running = running;
    void running.finally(() => {
      if (this.#running === running) this.#running = undefined;
    });
  }

  #try(): void {
    this.#timer = undefined;
    if (this.#closing !== undefined || this.#inner !== undefined || this.#running !== undefined)
      return;
    let attempt: Promise<StorageBackend>;
    try {
      attempt = this.#start();
    } catch (err) {
      attempt = Promise.reject(err);
    }
    this.#track(attempt);
  }

  async #adopt(backend: StorageBackend): Promise<void> {
    if (this.#closing !== undefined) {
      await closeQuietly(backend);
      return;
    }
    try {
      if (this.#removal !== undefined) backend.setRemovalListener?.(this.#removal);
      if (this.#found !== undefined) backend.setFoundListener?.(this.#found);
    } catch (err) {
      await closeQuietly(backend);
      this.#failed(err);
      return;
    }
    this.#inner = backend;
    this.#log.debug('tier started after being down at start', {
      tier: this.name,
      failedTries: this.#tries,
    });
  }

  #failed(err: unknown): void {
    this.#tries++;
    this.#lastError = err;
    this.#onFailure?.(err instanceof KvtierError ? err.code : 'KVT_INTERNAL');
    const msg = err instanceof Error ? err.message : String(err);
    if (isConfigFailure(err) && msg !== this.#loggedConfigError) {
      // Reachable now, but refused on its config (an S3 bucket that does not exist): say so once.
      this.#loggedConfigError = msg;
      this.#log.error('tier cannot start: its service answers, but refuses the config', {
        tier: this.name,
        err,
      });
    } else {
      this.#log.debug('tier still cannot start', { tier: this.name, err });
    }
    this.#schedule();
  }

  #schedule(): void {
    if (this.#closing !== undefined || this.#timer !== undefined) return;
    this.#timer = setTimeout(() => this.#try(), this.#retryMs);
    this.#timer.unref();
  }

  #started(op: string): StorageBackend {
    this.#checkOpen();
    if (this.#inner !== undefined) return this.#inner;
    const why = this.#lastError instanceof Error ? `: ${this.#lastError.message}` : '';
    throw new KvtierError(
      'KVT_BACKEND',
      `tier "${this.name}" has not started${why}; ${op} not attempted`,
    );
  }

  #checkOpen(): void {
    if (this.#closing !== undefined) throw closedError(`tier "${this.name}"`);
  }
}
