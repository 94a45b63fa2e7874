import { resolve } from 'node:path';
import pLimit, { type LimitFunction } from 'p-limit';
import { abortedError, closedError } from '../../errors.ts';
import { Deadline, withDeadline } from '../../util/deadline.ts';
import { type Logger, silentLogger } from '../../util/log.ts';
import { checkChunk } from '../core/chunk-check.ts';
import type {
  BackendCapabilities,
  BackendContext,
  BackendFactory,
  BackendHealth,
  Chunk,
  ChunkHash,
  ContainsOptions,
  FoundListener,
  GetOptions,
  NamespaceId,
  PutOptions,
  PutOutcome,
  RemovalListener,
  StorageBackend,
} from '../core/types.ts';
import { boundedNamespaceUsage } from '../core/types.ts';
import { type ChunkFileRead, ChunkFiles, type FileOp, TaskSet } from '../files/chunk-files.ts';
import {
  type FileSystem,
  objectDir,
  realFileSystem,
  requireStorableNamespace,
} from '../files/file-store.ts';
import { KeyedUnlinks } from '../files/keyed-unlinks.ts';
import { nativeFilesFor } from '../files/native-files.ts';
import { CHUNK_HEADER_BYTES } from '../format/chunk-format.ts';
import { type DirLock, lockDirectory } from './dir-lock.ts';
import { DiskIndex, diskKey } from './disk-index.ts';
import { type IndexJournal, openJournal } from './disk-journal.ts';
import { type ScanResult, scanStore } from './disk-scan.ts';
import {
  type LocalDiskOptions,
  type LocalDiskStats,
  localDiskOptionsFromConfig,
  type ResolvedLocalDiskOptions,
  resolveLocalDiskOptions,
} from './local-disk-options.ts';

export type { LocalDiskOptions, LocalDiskStats } from './local-disk-options.ts';

/**
 * A byte-bounded chunk store in a local directory, one file per chunk in the stored chunk
 * format. A compact in-memory index (disk-index.ts) answers contains without I/O. At
 * {@link open} it is read back from the index journal (disk-journal.ts), and the tier serves at
 * once; a scan of the directory then runs in the background (disk-scan.ts), indexing files the
 * journal did not name (a miss until then) and removing entries whose files are gone. Objects are
 * verified when read: a missing or corrupt one is a miss and leaves the index. Unpinned chunks
 * are evicted least recently used first, by a second-chance clock (disk-index.ts), their files
 * deleted, when a put needs room; a put that cannot fit is dropped and counted. Removing a pinned
 * chunk deletes it at once: readers hold private copies of the bytes. One directory is one
 * tier's: two open at once keep separate indexes (each sees what the other wrote only after a
 * restart).
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
  readonly #deletes: KeyedUnlinks;
  readonly #tasks = new TaskSet();
  #journal: IndexJournal | null = null;
  #scan: Promise<ScanResult | null> = Promise.resolve(null);
  #indexComplete = false;
  #droppedPuts = 0;
  #filesWritten = 0;
  #ioErrors = 0;
  #health: BackendHealth = 'up';
  #closing: Promise<void> | null = null;
  #lock: DirLock | undefined;
  #onRemoved: RemovalListener | undefined;
  #onFound: FoundListener | undefined;

  /**
   * Opens the store: creates the directory, reads the index journal back (when there is one)
   * and starts the background scan (see {@link indexed}); the tier serves at once.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options; the system error when the
   *   directory cannot be created or the journal cannot be read or written.
   */
  static async open(
    options: LocalDiskOptions,
    ctx: BackendContext = { name: 'local-disk' },
    fs: FileSystem = realFileSystem,
  ): Promise<LocalDiskBackend> {
    const backend = new LocalDiskBackend(resolveLocalDiskOptions(options), options, ctx, fs);
    try {
      await backend.#load();
    } catch (err) {
      await backend.#lock?.release();
      throw err;
    }
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
    this.#deletes = new KeyedUnlinks({
      fs,
      run: this.#limit,
      tasks: this.#tasks,
      onError: (err) => this.#ioFailed('delete', err),
    });
    this.#log = raw.log ?? silentLogger;
    this.#files = new ChunkFiles({
      fs,
      root: o.path,
      shardChars: o.shardChars,
      maxChunkBytes: o.maxChunkBytes,
      fsync: o.fsync,
      createRoot: true,
      tier: ctx.name,
      log: this.#log,
      onCorrupt: raw.onCorrupt ?? (() => {}),
    });
    this.#index = new DiskIndex(
      o.capacityBytes,
      o.maxChunks,
      (e) => {
        this.#onRemoved?.(e.ns, e.hash, 'evicted');
        void this.#unlink(e.ns, e.hash);
      },
      0,
      raw.allocateIndexMemory,
    );
    this.capabilities = Object.freeze({
      pinning: true,
      hostMemory: false,
      persistent: true,
      shared: false,
      evicts: true,
      maxChunkBytes: o.maxChunkBytes,
    });
  }

  /**
   * Resolves once the start-up scan is over: every object file in the directory is indexed and
   * every entry whose file was not found is gone. Resolves with null when the scan failed
   * (logged; the tier goes on with the index it has) or the tier closed first.
   */
  indexed(): Promise<ScanResult | null> {
    return this.#scan;
  }

  async batchedContains(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: ContainsOptions = {},
  ): Promise<number> {
    this.#open(opts.signal, 'contains');
    const hits = this.#index.prefixHits(ns, hashes, opts.pin === true);
    if (hits > 0) this.#journal?.touched();
    return hits;
  }

  async batchedGet(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: GetOptions = {},
  ): Promise<Map<ChunkHash, Chunk | null>> {
    this.#open(opts.signal, 'get');
    const out = new Map<ChunkHash, Chunk | null>();
    const reads: Promise<void>[] = [];
    // One deadline for the batch's reads: each would start its own at this moment anyway (a read
    // waiting for the concurrency limit is already under it), and one costs a timer and a
    // listener on the caller's signal instead of one per read.
    const deadline = new Deadline({
      what: `${this.name} read`,
      timeoutMs: this.options.timeoutMs,
      signal: opts.signal,
    });
    const run: FileOp = (fn) => deadline.race(this.#limit(fn));
    try {
      for (const hash of hashes) {
        if (out.has(hash)) continue;
        out.set(hash, null);
        const slot = this.#index.find(ns, hash);
        if (slot < 0) continue;
        this.#index.touch(slot);
        this.#journal?.touched();
        reads.push(
          this.#read(ns, hash, slot, run, opts.signal).then((chunk) => {
            out.set(hash, chunk);
          }),
        );
      }
      await this.#tasks.track(Promise.all(reads));
    } finally {
      deadline.dispose();
    }
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
    const existing = this.#index.find(ns, hash);
    if (existing >= 0) {
      if (opts.pin === true) this.#index.pin(existing);
      else this.#index.touch(existing);
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
      const slot = this.#index.find(ns, hash);
      if (slot < 0) continue;
      this.#index.forget(slot);
      deletes.push(this.#unlink(ns, hash));
    }
    await Promise.all(deletes);
    return deletes.length;
  }

  pin(ns: NamespaceId, hashes: readonly ChunkHash[]): number {
    this.#open(undefined, 'pin');
    let pinned = 0;
    for (const hash of hashes) {
      const slot = this.#index.find(ns, hash);
      if (slot < 0) continue;
      this.#index.pin(slot);
      pinned++;
    }
    return pinned;
  }

  unpin(ns: NamespaceId, hashes: readonly ChunkHash[]): void {
    this.#open(undefined, 'unpin');
    for (const hash of hashes) {
      const slot = this.#index.find(ns, hash);
      if (slot >= 0) this.#index.unpin(slot);
    }
  }

  /** Hears of chunks evicted for room and of objects found corrupt or gone (read, scan). */
  setRemovalListener(listener: RemovalListener | undefined): void {
    this.#onRemoved = listener;
  }

  /** Hears of the objects the start-up scan indexes that the journal did not name. */
  setFoundListener(listener: FoundListener | undefined): void {
    this.#onFound = listener;
  }

  /** The chunks the index holds now (before the start-up scan is over: those indexed so far). */
  *listChunks(ns?: NamespaceId): Generator<readonly [NamespaceId, ChunkHash]> {
    for (const slot of this.#index.slots(ns)) {
      if (this.#index.live(slot)) yield [this.#index.nsOf(slot), this.#index.hashOf(slot)];
    }
  }

  async clear(ns?: NamespaceId): Promise<void> {
    this.#open(undefined, 'clear');
    const deletes: Promise<void>[] = [];
    for (const slot of this.#index.slots(ns)) {
      const [n, h] = [this.#index.nsOf(slot), this.#index.hashOf(slot)];
      this.#index.forget(slot);
      deletes.push(this.#unlink(n, h));
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
      indexComplete: this.#indexComplete,
      ...boundedNamespaceUsage(this.#index.usageByNamespace()),
    };
  }

  /** 'degraded' after an I/O error or timeout, until the next operation that succeeds. */
  health(): BackendHealth {
    this.#open(undefined, 'health');
    return this.#health;
  }

  /**
   * Writes the index journal's pending records now (they are otherwise written within 100 ms,
   * and at close); resolves once written. A no-op without a journal.
   */
  flushJournal(): Promise<void> {
    this.#open(undefined, 'flushJournal');
    return this.#journal?.flush() ?? Promise.resolve();
  }

  /**
   * Stops the start-up scan, waits for reads, writes and deletes under way, writes the journal
   * out, then drops the index. Files stay.
   */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      await this.#scan;
      await this.#tasks.drain();
      await this.#journal?.close();
      this.#index.clear();
      await this.#lock?.release();
    })();
    return this.#closing;
  }

  async #load(): Promise<void> {
    const { path, shardChars } = this.options;
    await this.#fs.mkdir(path, { recursive: true });
    // One sidecar per directory (dir-lock.ts); a file system given for tests is not locked.
    if (this.#fs === realFileSystem)
      this.#lock = await lockDirectory(resolve(path), this.name, this.#log);
    this.#journal = await openJournal({
      fs: this.#fs,
      root: path,
      shardChars,
      index: this.#index,
      log: this.#log,
      tier: this.name,
      enabled: this.options.journal,
    });
    // The bound may have been lowered since the journal was written.
    this.#index.trim();
    await this.#deletes.allSettled();
    this.#log.info('local disk index loaded', {
      tier: this.name,
      chunks: this.#index.size,
      bytes: this.#index.bytesUsed,
    });
    this.#scan = this.#tasks.track(this.#runScan());
  }

  async #runScan(): Promise<ScanResult | null> {
    await null; // open() returns before the scan does any work
    const native = nativeFilesFor(this.#fs);
    try {
      const res = await scanStore({
        fs: this.#fs,
        root: this.options.path,
        shardChars: this.options.shardChars,
        index: this.#index,
        run: this.#limit,
        busy: (ns, hash) => {
          const key = diskKey(ns, hash);
          return this.#writes.has(key) || this.#deletes.has(key);
        },
        stopped: () => this.#closing !== null,
        statMany: native === null ? undefined : (dir, names) => native.statFiles(dir, names),
        found: (ns, hash) => this.#onFound?.(ns, hash),
        swept: (ns, hash) => this.#onRemoved?.(ns, hash, 'corrupt'),
      });
      await this.#deletes.allSettled();
      if (!res.complete) return null;
      this.#indexComplete = true;
      this.#log.info('local disk scan complete', {
        tier: this.name,
        ...res,
        chunks: this.#index.size,
      });
      return res;
    } catch (err) {
      this.#ioFailed('scan', err);
      return null;
    }
  }

  async #read(
    ns: NamespaceId,
    hash: ChunkHash,
    slot: number,
    run: FileOp,
    signal: AbortSignal | undefined,
  ): Promise<Chunk | null> {
    const gen = this.#index.genOf(slot);
    let res: ChunkFileRead;
    try {
      res = await this.#files.read(
        ns,
        hash,
        this.#files.path(ns, hash),
        run,
        this.#index.bytesOf(slot),
      );
    } catch (err) {
      if (signal?.aborted === true) throw err;
      this.#ioFailed('read', err);
      return null;
    }
    this.#health = 'up';
    const held = this.#index.holds(slot, gen);
    if (res.kind === 'ok') {
      if (held) this.#index.markVerified(slot);
      return res.chunk;
    }
    // Deleted behind our back, or corrupt: forget it (unless it was replaced meanwhile).
    if (held) {
      this.#index.forget(slot);
      this.#onRemoved?.(ns, hash, 'corrupt');
      if (res.kind === 'corrupt') await this.#unlink(ns, hash);
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
      await this.#deletes.settled(key);
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
      this.#index.add(ns, hash, bytes, { pin });
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

  /** Deletes the file of (ns, hash), after any earlier delete of its key. */
  #unlink(ns: NamespaceId, hash: ChunkHash): Promise<void> {
    return this.#deletes.unlink(diskKey(ns, hash), this.#files.path(ns, hash));
  }
}

/**
 * The factory of {@link LocalDiskBackend}s from config options whose indexes take their large
 * arrays from `allocateIndexMemory` (default Node's own memory).
 * @throws `KVT_CONFIG` on bad options (from the factory).
 */
export function localDiskFactory(
  allocateIndexMemory?: (bytes: number) => Uint8Array | null,
): BackendFactory {
  return async (options, ctx) =>
    LocalDiskBackend.open(
      {
        ...localDiskOptionsFromConfig(options, ctx.name),
        ...(allocateIndexMemory !== undefined ? { allocateIndexMemory } : {}),
      },
      ctx,
    );
}

/** Opens a {@link LocalDiskBackend} from config options. @throws `KVT_CONFIG` on bad options. */
export const createLocalDiskBackend: BackendFactory = localDiskFactory();
