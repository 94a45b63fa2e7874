/**
 * The fs tier's store-wide side: listing the shared directory, deleting files with the byte
 * accounting, re-creating an object's directories, and the sweep (TTL, size bound, stale temp
 * files) with the counts `stats()` reports. The per-chunk reads and writes stay in fs-backend.ts.
 */
import { join } from 'node:path';
import type { KvtierError } from '../../errors.ts';
import type { Logger } from '../../util/log.ts';
import type { ChunkHash, NamespaceId } from '../core/types.ts';
import { type FileOp, statEntries } from '../files/chunk-files.ts';
import {
  errnoOf,
  type FileSystem,
  isNotFound,
  listStore,
  type StoreEntry,
} from '../files/file-store.ts';
import type { ResolvedFsBackendOptions } from './fs-options.ts';

/** What one sweep found and did. */
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

/** What the maintenance side needs of its tier. */
export interface FsMaintenanceOptions {
  readonly fs: FileSystem;
  readonly options: ResolvedFsBackendOptions;
  /** Tier name, for messages and logs. */
  readonly tier: string;
  readonly log: Logger;
  readonly now: () => number;
  /** One file operation under the tier's concurrency limit and deadline; `what` names it. */
  readonly op: (what: string) => FileOp;
  /** Counts a failed operation and returns the error to throw. */
  readonly failed: (what: string, err: unknown) => KvtierError;
  /** Records that an operation reached the store. */
  readonly ok: () => void;
}

/**
 * Store-wide operations of one fs tier and the counts they keep. No instance knows the whole
 * shared store: `chunks` and `bytes` are what the last sweep counted, plus this instance's own
 * writes and minus its own deletes since.
 */
export class FsMaintenance {
  readonly #o: FsMaintenanceOptions;
  /** Objects and bytes counted by the last sweep, plus and minus this instance's own changes. */
  readonly known = { chunks: 0, bytes: 0 };
  #evictions = 0;
  #lastSweepAtMs: number | null = null;

  constructor(o: FsMaintenanceOptions) {
    this.#o = o;
  }

  /** Objects deleted by sweeps (expired or over the bound) since start. */
  get evictions(): number {
    return this.#evictions;
  }

  /** When the last sweep finished (the injected clock), or null. */
  get lastSweepAtMs(): number | null {
    return this.#lastSweepAtMs;
  }

  /** Whether an object last written at `mtimeMs` is past the TTL. */
  expired(mtimeMs: number): boolean {
    const ttl = this.#o.options.ttlMs;
    return ttl !== null && this.#o.now() - mtimeMs > ttl;
  }

  /** Counts an object this instance wrote. */
  added(bytes: number): void {
    this.known.chunks++;
    this.known.bytes += bytes;
  }

  /** Re-creates the namespace and shard directories, never the root (a vanished mount). */
  async makeDirs(ns: NamespaceId, hash: ChunkHash): Promise<void> {
    const { path, shardChars } = this.#o.options;
    const nsDir = join(path, ns);
    const dirs = shardChars === 0 ? [nsDir] : [nsDir, join(nsDir, hash.slice(0, shardChars))];
    for (const dir of dirs) {
      try {
        await this.#o.fs.mkdir(dir);
      } catch (err) {
        if (errnoOf(err) !== 'EEXIST') throw err;
      }
    }
  }

  /**
   * Deletes files (stat first where the size is not known, for the byte count); returns how
   * many existed. @throws the first failure other than ENOENT, as a KvtierError.
   */
  async unlinkAll(
    files: readonly { path: string; size?: number }[],
    what: string,
  ): Promise<number> {
    const { fs } = this.#o;
    const op = this.#o.op(what);
    const results = await Promise.allSettled(
      files.map(async ({ path, size }) => {
        try {
          const bytes = size ?? (await op(() => fs.stat(path))).size;
          await op(() => fs.unlink(path));
          return bytes;
        } catch (err) {
          if (isNotFound(err)) return -1;
          throw this.#o.failed(what, err);
        }
      }),
    );
    let removed = 0;
    for (const r of results) {
      if (r.status === 'rejected') throw r.reason;
      if (r.value < 0) continue;
      removed++;
      this.known.chunks = Math.max(0, this.known.chunks - 1);
      this.known.bytes = Math.max(0, this.known.bytes - r.value);
    }
    if (files.length > 0) this.#o.ok();
    return removed;
  }

  /** The store's objects and temp files (of `ns`, or all). @throws KvtierError when unlistable. */
  async list(ns?: NamespaceId): Promise<StoreEntry[]> {
    const { fs, options } = this.#o;
    try {
      return await listStore(fs, options.path, options.shardChars, this.#o.op('list'), ns);
    } catch (err) {
      throw this.#o.failed('list', err);
    }
  }

  /**
   * Deletes expired objects (TTL), stale temp files, and the oldest objects beyond
   * `capacityBytes`, then resets the counts to what it found.
   * @throws KvtierError when the directory cannot be listed.
   */
  async sweep(): Promise<FsSweepReport> {
    const { options, log, tier } = this.#o;
    const { objects, temps } = await statEntries(
      this.#o.fs,
      await this.list(),
      this.#o.op('stat'),
      (err) => this.#o.failed('stat', err),
    );
    const now = this.#o.now();
    const staleTemps = temps.filter((t) => now - t.mtimeMs > options.staleTempMs);
    const live = objects.filter((o) => !this.expired(o.mtimeMs));
    const expired = objects.length - live.length;
    live.sort((a, b) => a.mtimeMs - b.mtimeMs);
    let bytes = live.reduce((sum, o) => sum + o.size, 0);
    let evict = 0;
    const cap = options.capacityBytes;
    while (cap !== null && bytes > cap && evict < live.length) bytes -= live[evict++]!.size;
    const doomed = [
      ...objects.filter((o) => this.expired(o.mtimeMs)),
      ...live.slice(0, evict),
      ...staleTemps,
    ];
    await this.unlinkAll(doomed, 'sweep').catch((err: unknown) =>
      log.warn('fs sweep could not delete every file', { tier, err }),
    );
    this.#evictions += expired + evict;
    const report = {
      chunks: live.length - evict,
      bytes,
      expired,
      evicted: evict,
      tempsRemoved: staleTemps.length,
    };
    this.known.chunks = report.chunks;
    this.known.bytes = report.bytes;
    this.#lastSweepAtMs = this.#o.now();
    return report;
  }
}
