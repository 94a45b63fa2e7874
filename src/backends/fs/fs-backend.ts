import pLimit, { type LimitFunction } from 'p-limit';
import { abortedError, closedError, KvtierError } from '../../errors.ts';
import { Deadline, withDeadline } from '../../util/deadline.ts';
import { type Logger, silentLogger } from '../../util/log.ts';
import { checkChunk } from '../core/chunk-check.ts';
import { chunkPages } from '../core/chunk-pages.ts';
import type {
  BackendCapabilities,
  BackendContext,
  BackendFactory,
  BackendHealth,
  BackendStats,
  Chunk,
  ChunkHash,
  ChunkPage,
  ContainsOptions,
  GetOptions,
  NamespaceId,
  PutOptions,
  PutOutcome,
  StorageBackend,
} from '../core/types.ts';
import { type ChunkFileRead, ChunkFiles, type FileOp, TaskSet } from '../files/chunk-files.ts';
import {
  EARLY_HEADER_MAX_BYTES,
  errnoOf,
  type FileSystem,
  isNotFound,
  isStorableNamespace,
  realFileSystem,
  requireStorableNamespace,
} from '../files/file-store.ts';
import { CHUNK_HEADER_BYTES } from '../format/chunk-format.ts';
import { FsMaintenance, type FsSweepReport } from './fs-maintenance.ts';
import {
  type FsBackendOptions,
  fsOptionsFromConfig,
  type ResolvedFsBackendOptions,
  resolveFsBackendOptions,
} from './fs-options.ts';

export type { FsSweepReport } from './fs-maintenance.ts';
export {
  FS_BACKEND_DEFAULTS,
  type FsBackendOptions,
  fsOptionsFromConfig,
  type ResolvedFsBackendOptions,
  resolveFsBackendOptions,
} from './fs-options.ts';

/**
 * FS stats. No instance knows the whole shared store: `chunks` and `bytesUsed` are what the
 * last sweep (at open, then periodic when bounded) counted, plus this instance's own writes and
 * minus its own deletes since. Other instances' changes show up at the next sweep.
 */
export interface FsBackendStats extends BackendStats {
  /** Objects found corrupt on read (each was a miss and was deleted). */
  readonly corruptObjects: number;
  /** File operations that failed with an error other than "not found". */
  readonly ioErrors: number;
  /** File operations that did not settle within `timeoutMs`. */
  readonly timeouts: number;
  /** When the last sweep finished (the injected clock), or null. */
  readonly lastSweepAtMs: number | null;
}

/**
 * A chunk store in a directory shared by several sidecars (NFS, Lustre, a 3FS mount): one file
 * per chunk in the stored chunk format, sharded by hash prefix, published atomically (temp file
 * + rename). There is no authoritative index: contains stats files, gets read and verify them,
 * and an object written or deleted by another instance is seen at once. Every file operation
 * races a `timeoutMs` timer; a failed or timed-out operation fails its call (counted), which the
 * circuit breaker around the tier answers as a miss or a drop, so a hung or vanished mount costs
 * a lookup at most that and then nothing while the breaker is open. Pins are not supported
 * (another sidecar could delete anyway). An optional size bound and TTL are enforced by a
 * background sweep.
 */
export class FsBackend implements StorageBackend {
  readonly name: string;
  readonly kind = 'fs';
  readonly capabilities: BackendCapabilities;
  /** The options in force. */
  readonly options: ResolvedFsBackendOptions;

  readonly #fs: FileSystem;
  readonly #files: ChunkFiles;
  readonly #limit: LimitFunction;
  readonly #log: Logger;
  readonly #writes = new Map<string, Promise<PutOutcome>>();
  readonly #tasks = new TaskSet();
  #sweepTimer: NodeJS.Timeout | undefined;
  #sweeping: Promise<FsSweepReport> | null = null;
  readonly #maint: FsMaintenance;
  #droppedPuts = 0;
  #ioErrors = 0;
  #timeouts = 0;
  /** Whether the latest file operation failed (the backend's own view; see {@link health}). */
  #lastFailed = false;
  #closing: Promise<void> | null = null;

  /**
   * Opens the store: creates the directory if missing and sweeps it once (which counts what is
   * there for `stats()`, so start-up lists the whole store); when a bound or TTL is set, sweeps
   * again every `sweepIntervalMs` on an unref'd timer.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options; `KVT_BACKEND` or `KVT_TIMEOUT`
   *   when the directory cannot be created or listed.
   */
  static async open(
    options: FsBackendOptions,
    ctx: BackendContext = { name: 'fs' },
  ): Promise<FsBackend> {
    const backend = new FsBackend(resolveFsBackendOptions(options), options, ctx);
    await backend.#start();
    return backend;
  }

  private constructor(o: ResolvedFsBackendOptions, raw: FsBackendOptions, ctx: BackendContext) {
    this.options = o;
    this.name = ctx.name;
    this.#fs = raw.fsImpl ?? realFileSystem;
    this.#limit = pLimit(o.ioConcurrency);
    this.#log = raw.log ?? silentLogger;
    this.#files = new ChunkFiles({
      fs: this.#fs,
      root: o.path,
      shardChars: o.shardChars,
      maxChunkBytes: o.maxChunkBytes,
      fsync: o.fsync,
      createRoot: false,
      tier: ctx.name,
      log: this.#log,
      onCorrupt: raw.onCorrupt ?? (() => {}),
    });
    this.#maint = new FsMaintenance({
      fs: this.#fs,
      options: o,
      tier: ctx.name,
      log: this.#log,
      now: raw.now ?? Date.now,
      op: (what) => (fn) => this.#op(fn, undefined, what),
      failed: (what, err) => this.#failed(what, err),
      ok: () => this.#ok(),
    });
    this.capabilities = Object.freeze({
      pinning: false,
      hostMemory: false,
      persistent: true,
      shared: true,
      evicts: o.capacityBytes !== null || o.ttlMs !== null,
      maxChunkBytes: o.maxChunkBytes,
    });
  }

  async batchedContains(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: ContainsOptions = {},
  ): Promise<number> {
    this.#open(opts.signal, 'contains');
    // Checks run in parallel; once one misses, checks after it that have not started are skipped.
    // A failure before the first miss fails the call (the breaker answers it as a miss).
    let firstMiss = hashes.length;
    const found = await this.#tasks.track(
      Promise.all(
        hashes.map(async (hash, i) => {
          try {
            const hit = await this.#exists(ns, hash, opts.signal, () => i >= firstMiss);
            if (!hit && i < firstMiss) firstMiss = i;
            return hit;
          } catch (err) {
            if (opts.signal?.aborted === true) throw err;
            return err as KvtierError;
          }
        }),
      ),
    );
    for (const [i, r] of found.entries()) {
      if (r === false) return i;
      if (r !== true) throw r;
    }
    return found.length;
  }

  async batchedGet(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: GetOptions = {},
  ): Promise<Map<ChunkHash, Chunk | null>> {
    this.#open(opts.signal, 'get');
    const out = new Map<ChunkHash, Chunk | null>();
    const reads: Promise<void>[] = [];
    const errors: unknown[] = [];
    let reached = 0;
    // One deadline for the batch's reads: each would start its own at this moment anyway (a read
    // waiting for the concurrency limit is already under it), and one costs a timer and a
    // listener on the caller's signal instead of one per read.
    const deadline = new Deadline({
      what: `${this.name} read`,
      timeoutMs: this.options.timeoutMs,
      signal: opts.signal,
    });
    const run: FileOp = (fn) => deadline.race(this.#limit(fn));
    for (const hash of hashes) {
      if (out.has(hash)) continue;
      out.set(hash, null);
      if (!isStorableNamespace(ns)) continue;
      reads.push(
        this.#read(ns, hash, run, opts.signal).then(
          (chunk) => {
            reached++;
            out.set(hash, chunk);
          },
          (err: unknown) => {
            if (opts.signal?.aborted === true) throw err;
            errors.push(err);
          },
        ),
      );
    }
    try {
      await this.#tasks.track(Promise.all(reads));
    } finally {
      deadline.dispose();
    }
    // A read that failed is a miss, unless none reached the store: then the store is failing.
    if (errors.length > 0 && reached === 0) throw errors[0];
    return out;
  }

  async put(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    opts: PutOptions = {},
  ): Promise<PutOutcome> {
    this.#open(opts.signal, 'put');
    checkChunk(chunk);
    requireStorableNamespace(ns);
    const key = `${ns}/${hash}`;
    const inflight = this.#writes.get(key);
    if (inflight !== undefined) {
      const outcome = await inflight;
      return outcome === 'dropped' ? this.#drop() : 'exists';
    }
    const write = this.#tasks.track(this.#store(ns, hash, chunk, opts.signal));
    this.#writes.set(key, write);
    try {
      return await write;
    } finally {
      this.#writes.delete(key);
    }
  }

  async remove(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    this.#open(undefined, 'remove');
    const paths = isStorableNamespace(ns) ? [...new Set(hashes)].map((h) => this.#path(ns, h)) : [];
    return this.#tasks.track(
      this.#maint.unlinkAll(
        paths.map((path) => ({ path })),
        'remove',
      ),
    );
  }

  /** Pins are not supported (another sidecar may delete anyway): pins nothing, returns 0. */
  pin(_ns: NamespaceId, _hashes: readonly ChunkHash[]): number {
    this.#open(undefined, 'pin');
    return 0;
  }

  /** No-op: nothing is ever pinned. */
  unpin(_ns: NamespaceId, _hashes: readonly ChunkHash[]): void {
    this.#open(undefined, 'unpin');
  }

  /** Deletes the objects of `ns` (or all namespaces); other files in the directory stay. */
  async clear(ns?: NamespaceId): Promise<void> {
    this.#open(undefined, 'clear');
    if (ns !== undefined && !isStorableNamespace(ns)) return;
    await this.#tasks.track(
      (async () => {
        const entries = await this.#maint.list(ns);
        await this.#maint.unlinkAll(
          entries.filter((e) => e.kind === 'object').map((e) => ({ path: e.path })),
          'clear',
        );
      })(),
    );
  }

  /**
   * What the directory holds (of `ns`, or all): one listing of it, then pages of one namespace's
   * chunks. The listing runs under the tier's operation deadline.
   */
  scanChunks(
    ns: NamespaceId | undefined,
    opts: { readonly signal?: AbortSignal } = {},
  ): AsyncIterable<ChunkPage> | null {
    this.#open(opts.signal, 'scan');
    if (ns !== undefined && !isStorableNamespace(ns)) return chunkPages([]);
    const tasks = this.#tasks;
    const maint = this.#maint;
    return chunkPages(
      (async function* () {
        for (const e of await tasks.track(maint.list(ns))) if (e.kind === 'object') yield e;
      })(),
    );
  }

  stats(): FsBackendStats {
    this.#open(undefined, 'stats');
    return {
      chunks: this.#maint.known.chunks,
      bytesUsed: this.#maint.known.bytes,
      capacityBytes: this.options.capacityBytes,
      pinnedChunks: 0,
      evictions: this.#maint.evictions,
      droppedPuts: this.#droppedPuts,
      corruptObjects: this.#files.corrupt,
      ioErrors: this.#ioErrors,
      timeouts: this.#timeouts,
      lastSweepAtMs: this.#maint.lastSweepAtMs,
    };
  }

  /**
   * The backend's own view: 'degraded' while the latest file operation failed (other than "not
   * found") or timed out, 'up' once one succeeds. It never reports 'down' by itself: the circuit
   * breaker the host wraps the tier in is its one health mechanism (it opens after consecutive
   * failures, answers calls as misses and drops while open, and probes until the mount answers).
   */
  health(): BackendHealth {
    this.#open(undefined, 'health');
    return this.#lastFailed ? 'degraded' : 'up';
  }

  /**
   * Deletes expired objects (TTL), stale temp files, and the oldest objects beyond
   * `capacityBytes`; then `stats()` reports what it counted. Concurrent calls share one sweep.
   * @throws KvtierError `KVT_TIMEOUT`/`KVT_BACKEND` when the directory cannot be listed;
   *   `KVT_CLOSED` after close.
   */
  async sweep(): Promise<FsSweepReport> {
    this.#open(undefined, 'sweep');
    if (this.#sweeping === null) {
      const run = this.#tasks.track(this.#maint.sweep());
      this.#sweeping = run;
      void run.then(
        () => (this.#sweeping = null),
        () => (this.#sweeping = null),
      );
    }
    return this.#sweeping;
  }

  /** Stops the sweep and probe timers and waits for operations under way (each bounded). */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      clearInterval(this.#sweepTimer);
      await this.#tasks.drain();
    })();
    return this.#closing;
  }

  async #start(): Promise<void> {
    const { path } = this.options;
    try {
      await this.#fs.mkdir(path, { recursive: true });
    } catch (err) {
      throw new KvtierError('KVT_BACKEND', `cannot create directory ${path}: ${String(err)}`, {
        cause: err,
      });
    }
    await this.sweep();
    if (this.capabilities.evicts) {
      this.#sweepTimer = setInterval(() => {
        this.sweep().catch((err: unknown) =>
          this.#log.warn('fs sweep failed', { tier: this.name, err }),
        );
      }, this.options.sweepIntervalMs);
      this.#sweepTimer.unref();
    }
  }

  /** Present, not expired, and at least a header long (a shorter file is only a corrupt one). */
  async #exists(
    ns: NamespaceId,
    hash: ChunkHash,
    signal: AbortSignal | undefined,
    skip: () => boolean = () => false,
  ): Promise<boolean> {
    if (!isStorableNamespace(ns)) return false;
    try {
      // `skip` is asked once a slot is free: a miss found meanwhile makes the stat pointless.
      const path = this.#path(ns, hash);
      const st = await this.#op(async () => (skip() ? null : this.#fs.stat(path)), signal, 'stat');
      if (st === null) return false;
      this.#ok();
      return st.isFile() && st.size > CHUNK_HEADER_BYTES && !this.#maint.expired(st.mtimeMs);
    } catch (err) {
      if (signal?.aborted === true) throw err;
      if (!isNotFound(err)) throw this.#failed('stat', err);
      this.#ok();
      return false;
    }
  }

  async #read(ns: NamespaceId, hash: ChunkHash, run: FileOp, signal: AbortSignal | undefined) {
    const path = this.#path(ns, hash);
    let res: ChunkFileRead;
    try {
      res = await this.#files.read(ns, hash, path, run);
    } catch (err) {
      if (signal?.aborted === true) throw err;
      throw this.#failed('read', err);
    }
    this.#ok();
    if (res.kind === 'ok') {
      if (!this.#maint.expired(res.mtimeMs)) return res.chunk;
      res.chunk.release?.();
      return null;
    }
    if (res.kind === 'corrupt')
      await this.#maint.unlinkAll([{ path, size: res.size }], 'corrupt').catch(() => {});
    return null;
  }

  async #store(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    signal: AbortSignal | undefined,
  ): Promise<PutOutcome> {
    const path = this.#path(ns, hash);
    if (chunk.data.byteLength > this.options.maxChunkBytes) {
      return (await this.#exists(ns, hash, signal)) ? 'exists' : this.#drop();
    }
    // The header's checksum is computed while the existence check is in flight (for a payload
    // the atomic write would checksum beside its open anyway; see EARLY_HEADER_MAX_BYTES).
    // (A native write computes the checksum as it writes: no header ahead.)
    const header =
      chunk.data.byteLength <= EARLY_HEADER_MAX_BYTES && !this.#files.native
        ? this.#files.header(ns, hash, chunk)
        : undefined;
    if (await this.#exists(ns, hash, signal)) return 'exists';
    try {
      const bytes = await this.#op(
        () =>
          this.#files.write(ns, hash, chunk, path, () => this.#maint.makeDirs(ns, hash), header),
        signal,
        'write',
      );
      this.#ok();
      this.#maint.added(bytes);
      return 'stored';
    } catch (err) {
      if (signal?.aborted === true) throw err;
      throw this.#failed('write', err);
    }
  }

  /** One file operation through the concurrency limit, raced against `timeoutMs`. */
  #op<T>(fn: () => Promise<T>, signal: AbortSignal | undefined, what: string): Promise<T> {
    return withDeadline(
      {
        what: `${this.name} ${what}`,
        timeoutMs: this.options.timeoutMs,
        signal,
      },
      this.#limit(fn),
    );
  }

  #path(ns: NamespaceId, hash: ChunkHash): string {
    return this.#files.path(ns, hash);
  }

  #drop(): 'dropped' {
    this.#droppedPuts++;
    return 'dropped';
  }

  #ok(): void {
    if (!this.#lastFailed) return;
    this.#lastFailed = false;
    this.#log.info('fs tier reachable again', { tier: this.name });
  }

  /**
   * Counts a failed file operation and returns it as a KvtierError for the caller to throw (the
   * circuit breaker around the tier counts it and answers the call as a miss or a drop).
   */
  #failed(op: string, err: unknown): KvtierError {
    if (errnoOf(err) === 'KVT_TIMEOUT') this.#timeouts++;
    else this.#ioErrors++;
    if (!this.#lastFailed) this.#log.warn(`fs ${op} failed`, { tier: this.name, err });
    this.#lastFailed = true;
    return backendError(`${this.name} ${op}`, err);
  }

  #open(signal: AbortSignal | undefined, op: string): void {
    if (this.#closing !== null) throw closedError(`backend ${this.name}`);
    if (signal?.aborted === true) throw abortedError(signal, `${this.name} ${op}`);
  }
}

function backendError(what: string, err: unknown): KvtierError {
  if (err instanceof KvtierError) return err;
  return new KvtierError('KVT_BACKEND', `${what} failed: ${String(err)}`, { cause: err });
}

/** Opens an {@link FsBackend} from config options. @throws `KVT_CONFIG` on bad options. */
export const createFsBackend: BackendFactory = async (options, ctx) =>
  FsBackend.open(fsOptionsFromConfig(options, ctx.name), ctx);
