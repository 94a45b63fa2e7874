import pLimit, { type LimitFunction } from 'p-limit';
import { abortedError, closedError } from '../errors.ts';
import { withDeadline } from '../util/deadline.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import { checkChunk } from './chunk-check.ts';
import { type ChunkFileRead, ChunkFiles, statEntries, TaskSet } from './chunk-files.ts';
import { CHUNK_HEADER_BYTES } from './chunk-format.ts';
import { type DiskEntry, DiskIndex, diskKey } from './disk-index.ts';
import {
  type FileSystem,
  isNotFound,
  listStore,
  objectDir,
  realFileSystem,
  requireStorableNamespace,
} from './file-store.ts';
import { countPrefixHits, pinPresent } from './index-ops.ts';
import {
  type LocalDiskOptions,
  localDiskOptionsFromConfig,
  type ResolvedLocalDiskOptions,
  resolveLocalDiskOptions,
} from './local-disk-options.ts';
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
  RemovalListener,
  StorageBackend,
} from './types.ts';

export {
  LOCAL_DISK_DEFAULTS,
  type LocalDiskOptions,
  localDiskOptionsFromConfig,
  type ResolvedLocalDiskOptions,
  resolveLocalDiskOptions,
} from './local-disk-options.ts';

/** LocalDisk stats: the interface's plus counters of its own. */
export interface LocalDiskStats extends BackendStats {
  /** Objects found corrupt on read (each was a miss and was deleted). */
  readonly corruptObjects: number;
  /** Object files written since start. */
  readonly filesWritten: number;
  /** Reads or writes that failed with an I/O error or timed out. */
  readonly ioErrors: number;
}

/**
 * A byte-bounded chunk store in a local directory, one file per chunk in the stored chunk
 * format. An in-memory index answers contains without I/O; it is rebuilt at {@link open} from
 * file names and sizes (oldest mtime first, so recency survives a restart approximately) and
 * objects are verified when read. Unpinned chunks are evicted least-recently-used first (their
 * files deleted) when a put needs room; a put that cannot fit is dropped and counted. Removing a
 * pinned chunk deletes it at once: readers hold private copies of the bytes.
 */
export class LocalDiskBackend implements StorageBackend {
  readonly name: string;
  readonly kind = 'local-disk';
  readonly capabilities: BackendCapabilities;
  /** The options in force. */
  readonly options: ResolvedLocalDiskOptions;

  readonly #fs: FileSystem;
  readonly #files: ChunkFiles;
  readonly #limit: LimitFunction;
  readonly #log: Logger;
  readonly #index: DiskIndex;
  readonly #writes = new Map<string, Promise<PutOutcome>>();
  readonly #deletes = new Map<string, Promise<void>>();
  readonly #tasks = new TaskSet();
  #droppedPuts = 0;
  #filesWritten = 0;
  #ioErrors = 0;
  #health: BackendHealth = 'up';
  #closing: Promise<void> | null = null;
  #onRemoved: RemovalListener | undefined;

  /**
   * Opens the store: creates the directory, deletes stray temp files and indexes every object
   * by name and size without reading it.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options; the system error when the
   *   directory cannot be created or listed.
   */
  static async open(
    options: LocalDiskOptions,
    ctx: BackendContext = { name: 'local-disk' },
    fs: FileSystem = realFileSystem,
  ): Promise<LocalDiskBackend> {
    const backend = new LocalDiskBackend(resolveLocalDiskOptions(options), options, ctx, fs);
    await backend.#load();
    return backend;
  }

  private constructor(
    o: ResolvedLocalDiskOptions,
    raw: LocalDiskOptions,
    ctx: BackendContext,
    fs: FileSystem,
  ) {
    this.options = o;
    this.name = ctx.name;
    this.#fs = fs;
    this.#limit = pLimit(o.ioConcurrency);
    this.#log = raw.log ?? silentLogger;
    this.#files = new ChunkFiles({
      fs,
      root: o.path,
      shardChars: o.shardChars,
      maxChunkBytes: o.maxChunkBytes,
      fsync: o.fsync,
      tier: ctx.name,
      log: this.#log,
      onCorrupt: raw.onCorrupt ?? (() => {}),
    });
    this.#index = new DiskIndex(o.capacityBytes, o.maxChunks, (e) => {
      this.#onRemoved?.(e.ns, e.hash, 'evicted');
      void this.#unlink(e);
    });
    this.capabilities = Object.freeze({
      pinning: true,
      hostMemory: false,
      persistent: true,
      shared: false,
      evicts: true,
      maxChunkBytes: o.maxChunkBytes,
    });
  }

  async batchedContains(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: ContainsOptions = {},
  ): Promise<number> {
    this.#open(opts.signal, 'contains');
    return countPrefixHits(
      hashes,
      (h) => {
        const e = this.#index.get(ns, h);
        if (e !== undefined) this.#index.touch(e);
        return e;
      },
      opts.pin === true ? (e) => this.#index.pin(e) : undefined,
    );
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
      const e = this.#index.get(ns, hash);
      if (e === undefined) continue;
      this.#index.touch(e);
      reads.push(
        this.#read(e, opts.signal).then((chunk) => {
          out.set(hash, chunk);
        }),
      );
    }
    await this.#tasks.track(Promise.all(reads));
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
    const key = diskKey(ns, hash);
    const inflight = this.#writes.get(key);
    if (inflight !== undefined) {
      await this.#deadline(inflight, opts.signal, 'put').catch(() => {});
    }
    const existing = this.#index.get(ns, hash);
    if (existing !== undefined) {
      this.#index.touch(existing);
      if (opts.pin === true) this.#index.pin(existing);
      return 'exists';
    }
    if (inflight !== undefined && this.#writes.has(key)) return this.#drop();
    const bytes = CHUNK_HEADER_BYTES + chunk.data.byteLength;
    if (chunk.data.byteLength > this.capabilities.maxChunkBytes || !this.#index.reserve(bytes)) {
      return this.#drop();
    }
    const write = this.#tasks.track(this.#store(key, ns, hash, chunk, bytes, opts.pin === true));
    this.#writes.set(key, write);
    const settled = () => {
      if (this.#writes.get(key) === write) this.#writes.delete(key);
    };
    void write.then(settled, settled);
    const signal = opts.signal;
    try {
      return await this.#deadline(write, signal, 'put');
    } catch (err) {
      // The write goes on and indexes itself if it succeeds; this caller only stops waiting.
      if (signal === undefined || !signal.aborted) return this.#drop();
      throw err;
    }
  }

  async remove(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    this.#open(undefined, 'remove');
    const deletes: Promise<void>[] = [];
    for (const hash of hashes) {
      const e = this.#index.get(ns, hash);
      if (e === undefined) continue;
      this.#index.forget(e);
      deletes.push(this.#unlink(e));
    }
    await Promise.all(deletes);
    return deletes.length;
  }

  pin(ns: NamespaceId, hashes: readonly ChunkHash[]): number {
    this.#open(undefined, 'pin');
    return pinPresent(
      hashes,
      (h) => this.#index.get(ns, h),
      (e) => this.#index.pin(e),
    );
  }

  unpin(ns: NamespaceId, hashes: readonly ChunkHash[]): void {
    this.#open(undefined, 'unpin');
    for (const hash of hashes) {
      const e = this.#index.get(ns, hash);
      if (e !== undefined) this.#index.unpin(e);
    }
  }

  /** Hears of chunks evicted for room and of objects found corrupt or gone when read. */
  setRemovalListener(listener: RemovalListener | undefined): void {
    this.#onRemoved = listener;
  }

  /** The chunks the index holds now. */
  *listChunks(ns?: NamespaceId): Generator<readonly [NamespaceId, ChunkHash]> {
    for (const e of this.#index.entries(ns)) yield [e.ns, e.hash];
  }

  async clear(ns?: NamespaceId): Promise<void> {
    this.#open(undefined, 'clear');
    const deletes: Promise<void>[] = [];
    for (const e of this.#index.entries(ns)) {
      this.#index.forget(e);
      deletes.push(this.#unlink(e));
    }
    await Promise.all(deletes);
  }

  stats(): LocalDiskStats {
    this.#open(undefined, 'stats');
    return {
      chunks: this.#index.size,
      bytesUsed: this.#index.bytesUsed,
      capacityBytes: this.options.capacityBytes,
      pinnedChunks: this.#index.pinnedChunks,
      evictions: this.#index.evictions,
      droppedPuts: this.#droppedPuts,
      corruptObjects: this.#files.corrupt,
      filesWritten: this.#filesWritten,
      ioErrors: this.#ioErrors,
    };
  }

  /** 'degraded' after an I/O error or timeout, until the next operation that succeeds. */
  health(): BackendHealth {
    this.#open(undefined, 'health');
    return this.#health;
  }

  /** Waits for reads, writes and deletes under way, then drops the index. Files stay. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      await this.#tasks.drain();
      this.#index.clear();
    })();
    return this.#closing;
  }

  async #load(): Promise<void> {
    const { path, shardChars } = this.options;
    await this.#fs.mkdir(path, { recursive: true });
    const found = await listStore(this.#fs, path, shardChars, this.#limit);
    const { objects, temps } = await statEntries(this.#fs, found, this.#limit, (err) => {
      throw err;
    });
    await Promise.all(
      temps.map((t) =>
        this.#limit(() => this.#fs.unlink(t.path)).catch((err: unknown) => {
          if (!isNotFound(err)) throw err;
        }),
      ),
    );
    objects.sort((a, b) => a.mtimeMs - b.mtimeMs);
    for (const f of objects) {
      const { ns, hash, path, size } = f;
      this.#index.add({ key: diskKey(ns, hash), ns, hash, path, bytes: size, pins: 0 });
    }
    // The bound may have been lowered since these files were written.
    this.#index.trim();
    await Promise.all([...this.#deletes.values()]);
    this.#log.info('local disk index loaded', {
      tier: this.name,
      chunks: this.#index.size,
      bytes: this.#index.bytesUsed,
    });
  }

  async #read(e: DiskEntry, signal: AbortSignal | undefined): Promise<Chunk | null> {
    let res: ChunkFileRead;
    try {
      res = await this.#files.read(e.ns, e.hash, e.path, (fn) =>
        this.#deadline(this.#limit(fn), signal, 'read'),
      );
    } catch (err) {
      if (signal?.aborted === true) throw err;
      this.#ioFailed('read', err);
      return null;
    }
    this.#health = 'up';
    if (res.kind === 'ok') return res.chunk;
    // Deleted behind our back, or corrupt: forget it (unless it was replaced meanwhile).
    if (this.#index.holds(e)) {
      this.#index.forget(e);
      this.#onRemoved?.(e.ns, e.hash, 'corrupt');
      if (res.kind === 'corrupt') await this.#unlink(e);
    }
    return null;
  }

  async #store(
    key: string,
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    bytes: number,
    pin: boolean,
  ): Promise<PutOutcome> {
    // Room for `bytes` was reserved by put; released here either way.
    let reserved = true;
    try {
      // A delete of the previous file of this key must not land after our rename.
      await this.#deletes.get(key);
      const path = this.#files.path(ns, hash);
      const dir = objectDir(this.options.path, ns, hash, this.options.shardChars);
      await this.#limit(() =>
        this.#files.write(ns, hash, chunk, path, async () => {
          await this.#fs.mkdir(dir, { recursive: true });
        }),
      );
      this.#filesWritten++;
      this.#health = 'up';
      this.#index.unreserve(bytes);
      reserved = false;
      this.#index.add({ key, ns, hash, path, bytes, pins: 0 }, pin);
      return 'stored';
    } catch (err) {
      this.#ioFailed('write', err);
      return this.#drop();
    } finally {
      if (reserved) this.#index.unreserve(bytes);
    }
  }

  #drop(): 'dropped' {
    this.#droppedPuts++;
    return 'dropped';
  }

  #ioFailed(op: string, err: unknown): void {
    this.#ioErrors++;
    this.#health = 'degraded';
    this.#log.warn(`local disk ${op} failed`, { tier: this.name, err });
  }

  #deadline<T>(op: Promise<T>, signal: AbortSignal | undefined, what: string): Promise<T> {
    return withDeadline(
      { what: `${this.name} ${what}`, timeoutMs: this.options.timeoutMs, signal },
      op,
    );
  }

  #open(signal: AbortSignal | undefined, op: string): void {
    if (this.#closing !== null) throw closedError(`backend ${this.name}`);
    if (signal?.aborted === true) throw abortedError(signal, `${this.name} ${op}`);
  }

  /** Deletes an entry's file, after any earlier delete of its key (a later rename must not be undone). */
  #unlink(e: DiskEntry): Promise<void> {
    const prev = this.#deletes.get(e.key);
    const p: Promise<void> = (async () => {
      await prev;
      try {
        await this.#limit(() => this.#fs.unlink(e.path));
      } catch (err) {
        if (!isNotFound(err)) this.#ioFailed('delete', err);
      }
    })();
    this.#deletes.set(e.key, p);
    this.#tasks.track(p);
    void p.then(() => {
      if (this.#deletes.get(e.key) === p) this.#deletes.delete(e.key);
    });
    return p;
  }
}

/** Opens a {@link LocalDiskBackend} from config options. @throws `KVT_CONFIG` on bad options. */
export const createLocalDiskBackend: BackendFactory = async (options, ctx) =>
  LocalDiskBackend.open(localDiskOptionsFromConfig(options, ctx.name), ctx);
