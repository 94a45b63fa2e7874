import { join } from 'node:path';
import pLimit, { type LimitFunction } from 'p-limit';
import { abortedError, closedError, KvtierError } from '../errors.ts';
import { withDeadline } from '../util/deadline.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import {
  CHUNK_HEADER_BYTES,
  decodeChunkObjectAsync,
  encodeChunkHeaderAsync,
} from './chunk-format.ts';
import {
  errnoOf,
  type FileSystem,
  isNotFound,
  isStorableHash,
  isStorableNamespace,
  listStore,
  objectPath,
  readObjectFile,
  realFileSystem,
  requireStorableKey,
  writeChunkFileAtomic,
} from './file-store.ts';
import {
  type FsBackendOptions,
  fsOptionsFromConfig,
  type ResolvedFsBackendOptions,
  resolveFsBackendOptions,
} from './fs-options.ts';
import { checkChunk } from './local-cpu.ts';
import type {
  BackendCapabilities,
  BackendContext,
  BackendFactory,
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
} from './types.ts';

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

/** What one {@link FsBackend.sweep} found and did. */
export interface FsSweepReport {
  /** Objects left after the sweep, and their bytes. */
  readonly chunks: number;
  readonly bytes: number;
  /** Objects deleted because their TTL had passed. */
  readonly expired: number;
  /** Objects deleted (oldest first) to get under `capacityBytes`. */
  readonly evicted: number;
  /** Stale temp files deleted. */
  readonly tempsRemoved: number;
}

interface Found {
  readonly path: string;
  readonly size: number;
  readonly mtimeMs: number;
}

/**
 * A chunk store in a directory shared by several sidecars (NFS, Lustre, a 3FS mount): one file
 * per chunk in the stored chunk format, sharded by hash prefix, published atomically (temp file
 * + rename). There is no authoritative index: contains stats files, gets read and verify them,
 * and an object written or deleted by another instance is seen at once. Every file operation
 * races a `timeoutMs` timer, so a hung mount costs a lookup at most that (a miss). Pins are not
 * supported (another sidecar could delete anyway). An optional size bound and TTL are enforced
 * by a background sweep.
 */
export class FsBackend implements StorageBackend {
  readonly name: string;
  readonly kind = 'fs';
  readonly capabilities: BackendCapabilities;
  /** The options in force. */
  readonly options: ResolvedFsBackendOptions;

  readonly #fs: FileSystem;
  readonly #limit: LimitFunction;
  readonly #onCorrupt: (reason: string) => void;
  readonly #log: Logger;
  readonly #now: () => number;
  readonly #writes = new Map<string, Promise<PutOutcome>>();
  readonly #tasks = new Set<Promise<unknown>>();
  #sweepTimer: NodeJS.Timeout | undefined;
  #probeTimer: NodeJS.Timeout | undefined;
  #sweeping: Promise<FsSweepReport> | null = null;
  /** Objects and bytes counted by the last sweep, plus and minus this instance's own changes. */
  readonly #known = { chunks: 0, bytes: 0 };
  #lastSweepAtMs: number | null = null;
  #evictions = 0;
  #droppedPuts = 0;
  #corrupt = 0;
  #ioErrors = 0;
  #timeouts = 0;
  #health: BackendHealth = 'up';
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
    this.#onCorrupt = raw.onCorrupt ?? (() => {});
    this.#log = raw.log ?? silentLogger;
    this.#now = raw.now ?? Date.now;
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
    let firstMiss = hashes.length;
    const found = await this.#track(
      Promise.all(
        hashes.map(async (hash, i) => {
          const hit = await this.#exists(ns, hash, opts.signal, () => i >= firstMiss);
          if (!hit && i < firstMiss) firstMiss = i;
          return hit;
        }),
      ),
    );
    const k = found.indexOf(false);
    return k === -1 ? found.length : k;
  }

  async batchedGet(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: GetOptions = {},
  ): Promise<Map<ChunkHash, Chunk | null>> {
    this.#open(opts.signal, 'get');
    const out = new Map<ChunkHash, Chunk | null>();
    const reads: Promise<void>[] = [];
    for (const hash of hashes) {
      if (out.has(hash)) continue;
      out.set(hash, null);
      if (!isStorableNamespace(ns) || !isStorableHash(hash)) continue;
      reads.push(
        this.#read(ns, hash, opts.signal).then((chunk) => {
          out.set(hash, chunk);
        }),
      );
    }
    await this.#track(Promise.all(reads));
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
    requireStorableKey(ns, hash);
    const key = `${ns}/${hash}`;
    const inflight = this.#writes.get(key);
    if (inflight !== undefined) {
      const outcome = await inflight;
      return outcome === 'dropped' ? this.#drop() : 'exists';
    }
    const write = this.#track(this.#store(ns, hash, chunk, opts.signal));
    this.#writes.set(key, write);
    try {
      return await write;
    } finally {
      this.#writes.delete(key);
    }
  }

  async remove(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    this.#open(undefined, 'remove');
    const paths = [...new Set(hashes)]
      .filter((h) => isStorableNamespace(ns) && isStorableHash(h))
      .map((h) => this.#path(ns, h));
    return this.#track(
      this.#unlinkAll(
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
    await this.#track(
      (async () => {
        const entries = await this.#list(ns);
        await this.#unlinkAll(
          entries.filter((e) => e.kind === 'object').map((e) => ({ path: e.path })),
          'clear',
        );
      })(),
    );
  }

  stats(): FsBackendStats {
    this.#open(undefined, 'stats');
    return {
      chunks: this.#known.chunks,
      bytesUsed: this.#known.bytes,
      capacityBytes: this.options.capacityBytes,
      pinnedChunks: 0,
      evictions: this.#evictions,
      droppedPuts: this.#droppedPuts,
      corruptObjects: this.#corrupt,
      ioErrors: this.#ioErrors,
      timeouts: this.#timeouts,
      lastSweepAtMs: this.#lastSweepAtMs,
    };
  }

  /**
   * 'down' from a file operation that failed (other than "not found") or timed out until a
   * background probe of the directory (every `probeIntervalMs`) or another operation succeeds.
   */
  health(): BackendHealth {
    this.#open(undefined, 'health');
    return this.#health;
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
      const run = this.#track(this.#sweep());
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
      clearTimeout(this.#probeTimer);
      while (this.#tasks.size > 0) await Promise.allSettled([...this.#tasks]);
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
    if (!isStorableNamespace(ns) || !isStorableHash(hash)) return false;
    try {
      // `skip` is asked once a slot is free: a miss found meanwhile makes the stat pointless.
      const path = this.#path(ns, hash);
      const st = await this.#op(async () => (skip() ? null : this.#fs.stat(path)), signal, 'stat');
      if (st === null) return false;
      this.#up();
      return st.isFile() && st.size > CHUNK_HEADER_BYTES && !this.#expired(st.mtimeMs);
    } catch (err) {
      if (signal?.aborted === true) throw err;
      if (!isNotFound(err)) this.#failed('stat', err);
      else this.#up();
      return false;
    }
  }

  async #read(ns: NamespaceId, hash: ChunkHash, signal: AbortSignal | undefined) {
    const path = this.#path(ns, hash);
    let res: Awaited<ReturnType<typeof readObjectFile>>;
    try {
      const max = CHUNK_HEADER_BYTES + this.options.maxChunkBytes;
      res = await this.#op(() => readObjectFile(this.#fs, path, max), signal, 'read');
    } catch (err) {
      if (signal?.aborted === true) throw err;
      this.#failed('read', err);
      return null;
    }
    this.#up();
    if (res.kind === 'missing') return null;
    if (res.kind === 'ok' && this.#expired(res.mtimeMs)) return null;
    const decoded =
      res.kind === 'ok'
        ? await decodeChunkObjectAsync(ns, hash, res.bytes)
        : ({ ok: false, reason: 'length' } as const);
    if (decoded.ok) return decoded.chunk;
    this.#corrupt++;
    this.#log.warn('corrupt object removed', { tier: this.name, path, reason: decoded.reason });
    this.#onCorrupt(decoded.reason);
    const size = res.kind === 'ok' ? res.bytes.byteLength : res.size;
    await this.#unlinkAll([{ path, size }], 'corrupt').catch(() => {});
    return null;
  }

  async #store(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    signal: AbortSignal | undefined,
  ): Promise<PutOutcome> {
    const path = this.#path(ns, hash);
    if (await this.#exists(ns, hash, signal)) return 'exists';
    if (chunk.data.byteLength > this.options.maxChunkBytes) return this.#drop();
    try {
      const bytes = await this.#op(
        () =>
          writeChunkFileAtomic(
            this.#fs,
            path,
            () => encodeChunkHeaderAsync(ns, hash, chunk),
            CHUNK_HEADER_BYTES,
            chunk.data,
            {
              fsync: this.options.fsync,
              makeDir: () => this.#makeDirs(ns, hash),
            },
          ),
        signal,
        'write',
      );
      this.#up();
      this.#known.chunks++;
      this.#known.bytes += bytes;
      return 'stored';
    } catch (err) {
      if (signal?.aborted === true) throw err;
      this.#failed('write', err);
      return this.#drop();
    }
  }

  /** Re-creates the namespace and shard directories, never the root (a vanished mount). */
  async #makeDirs(ns: NamespaceId, hash: ChunkHash): Promise<void> {
    const nsDir = join(this.options.path, ns);
    const dirs =
      this.options.shardChars === 0
        ? [nsDir]
        : [nsDir, join(nsDir, hash.slice(0, this.options.shardChars))];
    for (const dir of dirs) {
      try {
        await this.#fs.mkdir(dir);
      } catch (err) {
        if (errnoOf(err) !== 'EEXIST') throw err;
      }
    }
  }

  /**
   * Deletes files (stat first where the size is not known, for the byte count); returns how
   * many existed. @throws the first failure other than ENOENT, as a KvtierError.
   */
  async #unlinkAll(
    files: readonly { path: string; size?: number }[],
    what: string,
  ): Promise<number> {
    const results = await Promise.allSettled(
      files.map(async ({ path, size }) => {
        try {
          const bytes = size ?? (await this.#op(() => this.#fs.stat(path), undefined, what)).size;
          await this.#op(() => this.#fs.unlink(path), undefined, what);
          return bytes;
        } catch (err) {
          if (isNotFound(err)) return -1;
          this.#failed(what, err);
          throw err;
        }
      }),
    );
    let removed = 0;
    for (const r of results) {
      if (r.status === 'rejected') throw backendError(`${this.name} ${what}`, r.reason);
      if (r.value < 0) continue;
      removed++;
      this.#known.chunks = Math.max(0, this.#known.chunks - 1);
      this.#known.bytes = Math.max(0, this.#known.bytes - r.value);
    }
    if (files.length > 0) this.#up();
    return removed;
  }

  async #list(ns?: NamespaceId) {
    try {
      return await listStore(
        this.#fs,
        this.options.path,
        this.options.shardChars,
        (op) => this.#op(op, undefined, 'list'),
        ns,
      );
    } catch (err) {
      this.#failed('list', err);
      throw backendError(`${this.name} list`, err);
    }
  }

  async #sweep(): Promise<FsSweepReport> {
    const entries = await this.#list();
    const stat = async (path: string): Promise<Found | null> => {
      try {
        const st = await this.#op(() => this.#fs.stat(path), undefined, 'stat');
        return { path, size: st.size, mtimeMs: st.mtimeMs };
      } catch (err) {
        if (!isNotFound(err)) this.#failed('stat', err);
        return null;
      }
    };
    const objects = (
      await Promise.all(entries.filter((e) => e.kind === 'object').map((e) => stat(e.path)))
    ).filter((f): f is Found => f !== null);
    const temps = (
      await Promise.all(entries.filter((e) => e.kind === 'temp').map((e) => stat(e.path)))
    ).filter((f): f is Found => f !== null);
    const now = this.#now();
    const staleTemps = temps.filter((t) => now - t.mtimeMs > this.options.staleTempMs);
    const live = objects.filter((o) => !this.#expired(o.mtimeMs));
    const expired = objects.length - live.length;
    live.sort((a, b) => a.mtimeMs - b.mtimeMs);
    let bytes = live.reduce((sum, o) => sum + o.size, 0);
    let evict = 0;
    const cap = this.options.capacityBytes;
    while (cap !== null && bytes > cap && evict < live.length) bytes -= live[evict++]!.size;
    const doomed = [
      ...objects.filter((o) => this.#expired(o.mtimeMs)),
      ...live.slice(0, evict),
      ...staleTemps,
    ];
    await this.#unlinkAll(doomed, 'sweep').catch((err: unknown) =>
      this.#log.warn('fs sweep could not delete every file', { tier: this.name, err }),
    );
    this.#evictions += expired + evict;
    const report = {
      chunks: live.length - evict,
      bytes,
      expired,
      evicted: evict,
      tempsRemoved: staleTemps.length,
    };
    this.#known.chunks = report.chunks;
    this.#known.bytes = report.bytes;
    this.#lastSweepAtMs = this.#now();
    return report;
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
    return objectPath(this.options.path, ns, hash, this.options.shardChars);
  }

  #expired(mtimeMs: number): boolean {
    return this.options.ttlMs !== null && this.#now() - mtimeMs > this.options.ttlMs;
  }

  #drop(): 'dropped' {
    this.#droppedPuts++;
    return 'dropped';
  }

  #up(): void {
    if (this.#health === 'up') return;
    this.#health = 'up';
    clearTimeout(this.#probeTimer);
    this.#probeTimer = undefined;
    this.#log.info('fs tier reachable again', { tier: this.name });
  }

  #failed(op: string, err: unknown): void {
    if (errnoOf(err) === 'KVT_TIMEOUT') this.#timeouts++;
    else this.#ioErrors++;
    if (this.#health !== 'down')
      this.#log.warn(`fs ${op} failed; tier down`, { tier: this.name, err });
    this.#health = 'down';
    this.#scheduleProbe();
  }

  /** While down, stats the root every `probeIntervalMs` (bypassing the limiter, whose slots a hung mount may hold). */
  #scheduleProbe(): void {
    if (this.#probeTimer !== undefined || this.#closing !== null) return;
    this.#probeTimer = setTimeout(() => {
      const probe = withDeadline(
        { what: `${this.name} probe`, timeoutMs: this.options.timeoutMs },
        this.#fs.stat(this.options.path),
      );
      void this.#track(probe).then(
        (st) => {
          this.#probeTimer = undefined;
          if (st.isDirectory()) this.#up();
          else this.#scheduleProbe();
        },
        () => {
          this.#probeTimer = undefined;
          this.#scheduleProbe();
        },
      );
    }, this.options.probeIntervalMs);
    this.#probeTimer.unref();
  }

  #track<T>(p: Promise<T>): Promise<T> {
    this.#tasks.add(p);
    void p.then(
      () => this.#tasks.delete(p),
      () => this.#tasks.delete(p),
    );
    return p;
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
