import { LRUCache } from 'lru-cache';
import pLimit, { type LimitFunction } from 'p-limit';
import { abortedError, closedError } from '../errors.ts';
import { withDeadline } from '../util/deadline.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import {
  CHUNK_HEADER_BYTES,
  decodeChunkObjectAsync,
  encodeChunkHeaderAsync,
} from './chunk-format.ts';
import {
  type FileSystem,
  isNotFound,
  listStore,
  objectDir,
  objectPath,
  readObjectFile,
  realFileSystem,
  requireStorableKey,
  writeChunkFileAtomic,
} from './file-store.ts';
import { countPrefixHits, pinPresent } from './index-ops.ts';
import { checkChunk } from './local-cpu.ts';
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

interface Entry {
  readonly key: string;
  readonly ns: NamespaceId;
  readonly hash: ChunkHash;
  readonly path: string;
  /** File size: header + payload. */
  readonly bytes: number;
  pins: number;
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
  readonly #limit: LimitFunction;
  readonly #onCorrupt: (reason: string) => void;
  readonly #log: Logger;
  readonly #index = new Map<string, Entry>();
  /** Recency of unpinned entries; evicting from it deletes the file. */
  readonly #lru: LRUCache<string, Entry>;
  readonly #writes = new Map<string, Promise<PutOutcome>>();
  readonly #deletes = new Map<string, Promise<void>>();
  readonly #tasks = new Set<Promise<unknown>>();
  #bytesUsed = 0;
  #reservedBytes = 0;
  #pinnedBytes = 0;
  #pinnedChunks = 0;
  #evictions = 0;
  #droppedPuts = 0;
  #corrupt = 0;
  #filesWritten = 0;
  #ioErrors = 0;
  #health: BackendHealth = 'up';
  #closing: Promise<void> | null = null;

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
    this.#onCorrupt = raw.onCorrupt ?? (() => {});
    this.#log = raw.log ?? silentLogger;
    // Every object is at least a header, so more slots than that could never be used.
    this.#lru = new LRUCache<string, Entry>({
      max: Math.min(o.maxChunks, Math.floor(o.capacityBytes / CHUNK_HEADER_BYTES)),
      dispose: (e, _key, reason) => {
        if (reason === 'evict') this.#evicted(e);
      },
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
        const e = this.#index.get(keyOf(ns, h));
        if (e !== undefined) this.#touch(e);
        return e;
      },
      opts.pin === true ? (e) => this.#pinEntry(e) : undefined,
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
      const e = this.#index.get(keyOf(ns, hash));
      if (e === undefined) continue;
      this.#touch(e);
      reads.push(
        this.#read(e, opts.signal).then((chunk) => {
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
    const key = keyOf(ns, hash);
    const inflight = this.#writes.get(key);
    if (inflight !== undefined) {
      await this.#deadline(inflight, opts.signal, 'put').catch(() => {});
    }
    const existing = this.#index.get(key);
    if (existing !== undefined) {
      this.#touch(existing);
      if (opts.pin === true) this.#pinEntry(existing);
      return 'exists';
    }
    if (inflight !== undefined && this.#writes.has(key)) return this.#drop();
    const bytes = CHUNK_HEADER_BYTES + chunk.data.byteLength;
    if (chunk.data.byteLength > this.capabilities.maxChunkBytes || !this.#makeRoom(bytes)) {
      return this.#drop();
    }
    const write = this.#store(key, ns, hash, chunk, bytes, opts.pin === true);
    this.#writes.set(key, write);
    this.#tasks.add(write);
    void write.finally(() => {
      this.#tasks.delete(write);
      if (this.#writes.get(key) === write) this.#writes.delete(key);
    });
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
      const e = this.#index.get(keyOf(ns, hash));
      if (e === undefined) continue;
      this.#forget(e);
      deletes.push(this.#unlink(e));
    }
    await Promise.all(deletes);
    return deletes.length;
  }

  pin(ns: NamespaceId, hashes: readonly ChunkHash[]): number {
    this.#open(undefined, 'pin');
    return pinPresent(
      hashes,
      (h) => this.#index.get(keyOf(ns, h)),
      (e) => this.#pinEntry(e),
    );
  }

  unpin(ns: NamespaceId, hashes: readonly ChunkHash[]): void {
    this.#open(undefined, 'unpin');
    for (const hash of hashes) {
      const e = this.#index.get(keyOf(ns, hash));
      if (e === undefined || e.pins === 0) continue;
      e.pins--;
      if (e.pins === 0) {
        this.#pinnedChunks--;
        this.#pinnedBytes -= e.bytes;
        this.#lru.set(e.key, e);
      }
    }
  }

  async clear(ns?: NamespaceId): Promise<void> {
    this.#open(undefined, 'clear');
    const deletes: Promise<void>[] = [];
    for (const e of [...this.#index.values()]) {
      if (ns !== undefined && e.ns !== ns) continue;
      this.#forget(e);
      deletes.push(this.#unlink(e));
    }
    await Promise.all(deletes);
  }

  stats(): LocalDiskStats {
    this.#open(undefined, 'stats');
    return {
      chunks: this.#index.size,
      bytesUsed: this.#bytesUsed,
      capacityBytes: this.options.capacityBytes,
      pinnedChunks: this.#pinnedChunks,
      evictions: this.#evictions,
      droppedPuts: this.#droppedPuts,
      corruptObjects: this.#corrupt,
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
      while (this.#tasks.size > 0) await Promise.allSettled([...this.#tasks]);
      this.#lru.clear();
      this.#index.clear();
    })();
    return this.#closing;
  }

  async #load(): Promise<void> {
    const { path, shardChars } = this.options;
    await this.#fs.mkdir(path, { recursive: true });
    const found = await listStore(this.#fs, path, shardChars, this.#limit);
    const objects: { e: Entry; mtimeMs: number }[] = [];
    await Promise.all(
      found.map((f) =>
        this.#limit(async () => {
          try {
            if (f.kind === 'temp') {
              await this.#fs.unlink(f.path);
              return;
            }
            const st = await this.#fs.stat(f.path);
            if (!st.isFile()) return;
            const e: Entry = {
              key: keyOf(f.ns, f.hash),
              ns: f.ns,
              hash: f.hash,
              path: f.path,
              bytes: st.size,
              pins: 0,
            };
            objects.push({ e, mtimeMs: st.mtimeMs });
          } catch (err) {
            if (!isNotFound(err)) throw err;
          }
        }),
      ),
    );
    objects.sort((a, b) => a.mtimeMs - b.mtimeMs);
    for (const { e } of objects) {
      this.#index.set(e.key, e);
      this.#bytesUsed += e.bytes;
      this.#lru.set(e.key, e);
    }
    // The bound may have been lowered since these files were written.
    while (this.#bytesUsed > this.options.capacityBytes && this.#lru.pop() !== undefined) {}
    await Promise.all([...this.#deletes.values()]);
    this.#log.info('local disk index loaded', {
      tier: this.name,
      chunks: this.#index.size,
      bytes: this.#bytesUsed,
    });
  }

  async #read(e: Entry, signal: AbortSignal | undefined): Promise<Chunk | null> {
    let res: Awaited<ReturnType<typeof readObjectFile>>;
    try {
      res = await this.#deadline(
        this.#limit(() =>
          readObjectFile(this.#fs, e.path, CHUNK_HEADER_BYTES + this.options.maxChunkBytes),
        ),
        signal,
        'read',
      );
    } catch (err) {
      if (signal?.aborted === true) throw err;
      this.#ioFailed('read', err);
      return null;
    }
    this.#health = 'up';
    if (res.kind === 'missing') {
      // Deleted behind our back: forget it (unless it was replaced meanwhile).
      if (this.#index.get(e.key) === e) this.#forget(e);
      return null;
    }
    const decoded =
      res.kind === 'ok'
        ? await decodeChunkObjectAsync(e.ns, e.hash, res.bytes)
        : ({ ok: false, reason: 'length' } as const);
    if (decoded.ok) return decoded.chunk;
    this.#corrupt++;
    this.#log.warn('corrupt object removed', {
      tier: this.name,
      path: e.path,
      reason: decoded.reason,
    });
    this.#onCorrupt(decoded.reason);
    if (this.#index.get(e.key) === e) {
      this.#forget(e);
      await this.#unlink(e);
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
    this.#reservedBytes += bytes;
    let reserved = true;
    try {
      // A delete of the previous file of this key must not land after our rename.
      await this.#deletes.get(key);
      const path = objectPath(this.options.path, ns, hash, this.options.shardChars);
      await this.#limit(() =>
        writeChunkFileAtomic(
          this.#fs,
          path,
          () => encodeChunkHeaderAsync(ns, hash, chunk),
          CHUNK_HEADER_BYTES,
          chunk.data,
          {
            fsync: this.options.fsync,
            makeDir: async () => {
              await this.#fs.mkdir(
                objectDir(this.options.path, ns, hash, this.options.shardChars),
                {
                  recursive: true,
                },
              );
            },
          },
        ),
      );
      this.#filesWritten++;
      this.#health = 'up';
      this.#reservedBytes -= bytes;
      reserved = false;
      const e: Entry = { key, ns, hash, path, bytes, pins: 0 };
      this.#index.set(key, e);
      this.#bytesUsed += bytes;
      if (pin) this.#pinEntry(e);
      else this.#lru.set(key, e);
      return 'stored';
    } catch (err) {
      this.#ioFailed('write', err);
      return this.#drop();
    } finally {
      if (reserved) this.#reservedBytes -= bytes;
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

  #touch(e: Entry): void {
    if (e.pins === 0) this.#lru.get(e.key);
  }

  #pinEntry(e: Entry): void {
    if (e.pins === 0) {
      this.#lru.delete(e.key);
      this.#pinnedChunks++;
      this.#pinnedBytes += e.bytes;
    }
    e.pins++;
  }

  /** Takes an entry out of the index and the accounting; its file is the caller's concern. */
  #forget(e: Entry): void {
    this.#index.delete(e.key);
    this.#lru.delete(e.key);
    this.#bytesUsed -= e.bytes;
    if (e.pins > 0) {
      this.#pinnedChunks--;
      this.#pinnedBytes -= e.bytes;
    }
  }

  /** LRU eviction (count bound, or `pop` from {@link #makeRoom}): the entry has left the LRU. */
  #evicted(e: Entry): void {
    this.#index.delete(e.key);
    this.#bytesUsed -= e.bytes;
    this.#evictions++;
    void this.#unlink(e);
  }

  #unlink(e: Entry): Promise<void> {
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
    this.#track(p);
    void p.then(() => {
      if (this.#deletes.get(e.key) === p) this.#deletes.delete(e.key);
    });
    return p;
  }

  /** Evicts unpinned chunks oldest first until `bytes` fit; false (nothing evicted) if they cannot. */
  #makeRoom(bytes: number): boolean {
    const cap = this.options.capacityBytes;
    if (cap - this.#pinnedBytes - this.#reservedBytes < bytes) return false;
    while (this.#bytesUsed + this.#reservedBytes + bytes > cap) {
      if (this.#lru.pop() === undefined) return false;
    }
    return true;
  }
}

/** Unambiguous composite key: the length prefix keeps (ns, hash) pairs from colliding. */
function keyOf(ns: NamespaceId, hash: ChunkHash): string {
  return `${ns.length}:${ns}${hash}`;
}

/** Opens a {@link LocalDiskBackend} from config options. @throws `KVT_CONFIG` on bad options. */
export const createLocalDiskBackend: BackendFactory = async (options, ctx) =>
  LocalDiskBackend.open(localDiskOptionsFromConfig(options, ctx.name), ctx);
