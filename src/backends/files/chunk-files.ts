/**
 * The file-object core the local-disk and fs tiers share: where a chunk's file lives, reading
 * and verifying one (a corrupt object is counted, logged and reported once, here), writing one
 * atomically, and the set of operations a tier waits for on close. Each tier keeps its own
 * index (or none), eviction and error policy; the raw file operations are in file-store.ts.
 */
import { join } from 'node:path';
import type { NativeFileIo } from '../../native/file-io.ts';
import type { Logger } from '../../util/log.ts';
import { BufferPool } from '../arena/buffer-pool.ts';
import type { Chunk, ChunkHash, NamespaceId } from '../core/types.ts';
import {
  CHUNK_HEADER_BYTES,
  CHUNK_HEADER_CHECKSUM_AT,
  CHUNK_HEADER_CRC_AT,
  type ChunkDecodeFailure,
  decodeChunkObjectAsync,
  encodeChunkHeaderAsync,
  encodeChunkHeaderTemplate,
} from '../format/chunk-format.ts';
import {
  type FileSystem,
  type FsyncPolicy,
  isNotFound,
  OBJECT_SUFFIX,
  type ReadResult,
  readObjectFile,
  type StoreEntry,
  tempPathFor,
  writeChunkFileAtomic,
} from './file-store.ts';
import { nativeFilesFor } from './native-files.ts';

/** What the core needs of its tier. */
export interface ChunkFilesOptions {
  readonly fs: FileSystem;
  /** The store's root directory. */
  readonly root: string;
  readonly shardChars: number;
  /** Largest payload a file may hold; a larger file is read as corrupt (`length`), never allocated. */
  readonly maxChunkBytes: number;
  readonly fsync: FsyncPolicy;
  /**
   * Whether a write may create the root directory when it is missing (a local disk), or only
   * the namespace and shard directories under it (a shared mount that must not be recreated).
   */
  readonly createRoot: boolean;
  /** Tier name, for log lines. */
  readonly tier: string;
  readonly log: Logger;
  /** Called once per corrupt object found (after it is counted). */
  readonly onCorrupt: (reason: ChunkDecodeFailure) => void;
}

/** What reading one object came to. */
export type ChunkFileRead =
  | { readonly kind: 'ok'; readonly chunk: Chunk; readonly mtimeMs: number }
  | { readonly kind: 'missing' }
  /** Counted and reported; the caller deletes the file (`size` bytes). */
  | { readonly kind: 'corrupt'; readonly reason: ChunkDecodeFailure; readonly size: number };

/**
 * Objects at least this large are read into pooled buffers, handed out with a release hook
 * (`Chunk.release`); smaller ones into plain allocations.
 */
export const POOLED_READ_MIN_BYTES = 64 * 1024;
/** Most idle read buffers a tier keeps per object size. */
const READ_POOL_PER_SIZE = 16;
/**
 * Most idle read-buffer bytes a tier keeps in all: 128 MiB of payload plus each buffer's header,
 * so that four reads of 32 MiB chunks in flight (each buffer a header longer than 32 MiB) all
 * go back to the pool instead of the fourth being dropped and allocated (and faulted in) anew.
 */
const READ_POOL_MAX_BYTES = 128 * 1024 * 1024 + READ_POOL_PER_SIZE * CHUNK_HEADER_BYTES;

/** Runs one file operation (the tier adds its concurrency limit and deadline). */
export type FileOp = <T>(fn: () => Promise<T>) => Promise<T>;

const FSYNC_CODE = { none: 0, data: 1, always: 2 } as const;

/** Reading, verifying and writing chunk files under one root. */
export class ChunkFiles {
  readonly #o: ChunkFilesOptions;
  /** Buffers of chunks read and released, reused by later reads. */
  readonly #pool = new BufferPool(READ_POOL_PER_SIZE, READ_POOL_MAX_BYTES);
  readonly #alloc = (bytes: number): Buffer =>
    bytes >= POOLED_READ_MIN_BYTES ? this.#pool.acquire(bytes) : Buffer.allocUnsafe(bytes);
  readonly #native: NativeFileIo | null;
  readonly #rootPrefix: string;
  /** Size of the last object read, the guess for a read whose size the tier does not know. */
  #lastSize = 0;
  #corrupt = 0;

  constructor(o: ChunkFilesOptions) {
    this.#o = o;
    this.#native = nativeFilesFor(o.fs);
    // The root as `join` normalizes it, with its separator: names under it are hex digits, which
    // `join` leaves as they are ('.' becomes '', 'a//b/' becomes 'a/b/').
    this.#rootPrefix = join(o.root, 'x').slice(0, -1);
  }

  /**
   * Whether reads and writes run as one native task each (open, I/O with the checksum computed
   * beside it, close; for a write also sync and rename): a caller need not compute a header
   * ahead of a write then.
   */
  get native(): boolean {
    return this.#native !== null;
  }

  /** Corrupt objects found since start. */
  get corrupt(): number {
    return this.#corrupt;
  }

  /** The file of (ns, hash): `objectPath`'s result, by concatenation (a hot path). */
  path(ns: NamespaceId, hash: ChunkHash): string {
    const shard = this.#o.shardChars;
    return shard === 0
      ? `${this.#rootPrefix}${ns}/${hash}${OBJECT_SUFFIX}`
      : `${this.#rootPrefix}${ns}/${hash.slice(0, shard)}/${hash}${OBJECT_SUFFIX}`;
  }

  /** Idle read-buffer bytes held for reuse. */
  get pooledBytes(): number {
    return this.#pool.pooledBytes;
  }

  /**
   * Reads the object at `path` (through `run`) and verifies it against (ns, hash). A chunk read
   * into a pooled buffer carries `release` (see `Chunk.release`): its buffer is reused only once
   * released. A buffer whose read `run` stopped waiting for (a timeout, an abort) or whose bytes
   * failed verification is never reused.
   * @throws the system error (other than ENOENT) or whatever `run` throws (a timeout, an abort).
   */
  async read(
    ns: NamespaceId,
    hash: ChunkHash,
    path: string,
    run: FileOp,
    expectedBytes?: number,
  ): Promise<ChunkFileRead> {
    const max = CHUNK_HEADER_BYTES + this.#o.maxChunkBytes;
    const res =
      (this.#native === null
        ? null
        : await this.#readNative(this.#native, path, max, run, expectedBytes ?? this.#lastSize)) ??
      (await run(() => readObjectFile(this.#o.fs, path, max, CHUNK_HEADER_BYTES, this.#alloc)));
    if (res.kind === 'missing') return res;
    let reason: ChunkDecodeFailure = 'length';
    if (res.kind === 'ok') {
      const decoded = await decodeChunkObjectAsync(ns, hash, res.bytes, res.crc32c);
      if (decoded.ok) {
        const chunk = this.#leased(decoded.chunk, res.bytes);
        return { kind: 'ok', chunk, mtimeMs: res.mtimeMs };
      }
      reason = decoded.reason;
    }
    this.#corrupt++;
    this.#o.log.warn('corrupt object removed', { tier: this.#o.tier, path, reason });
    this.#o.onCorrupt(reason);
    return { kind: 'corrupt', reason, size: res.kind === 'ok' ? res.bytes.byteLength : res.size };
  }

  /**
   * One native task reads the whole object into a buffer of `size` bytes (the index's size, or
   * a guess) and checksums it as it reads; a second one when the guess was wrong. Null when the
   * file changed size while being read: the caller reads it the plain way.
   */
  async #readNative(
    native: NativeFileIo,
    path: string,
    max: number,
    run: FileOp,
    size: number,
  ): Promise<ReadResult | null> {
    for (let attempt = 0; attempt < 2; attempt++) {
      // A buffer whose read `run` stopped waiting for may still be written: never given back.
      const buf = this.#alloc(size);
      const r = await run(() => native.readFileCrc32c(path, buf, max, CHUNK_HEADER_BYTES));
      if (r.status === 'ok') {
        this.#lastSize = size;
        return { kind: 'ok', bytes: buf, mtimeMs: r.mtimeMs, crc32c: r.crc };
      }
      this.#giveBack(buf);
      if (r.status === 'missing') return { kind: 'missing' };
      if (r.status === 'too-large') return { kind: 'too-large', size: r.size };
      if (r.status !== 'size') return null;
      size = r.size;
    }
    return null;
  }

  #giveBack(buf: Buffer): void {
    if (buf.byteLength >= POOLED_READ_MIN_BYTES && buf.byteLength === buf.buffer.byteLength) {
      this.#pool.release(buf);
    }
  }

  /** The directories a write creates when the object's directory is missing. */
  #dirsOf(ns: NamespaceId, hash: ChunkHash): string[] {
    const { root, shardChars, createRoot } = this.#o;
    const dirs = createRoot ? [root, join(root, ns)] : [join(root, ns)];
    if (shardChars > 0) dirs.push(join(root, ns, hash.slice(0, shardChars)));
    return dirs;
  }

  /** `chunk` (a view into `bytes`) with a hook that gives `bytes` back to the pool, once. */
  #leased(chunk: Chunk, bytes: Buffer): Chunk {
    // Only a whole buffer the pool handed out goes back (a small or short read is left alone).
    if (
      bytes.byteLength < POOLED_READ_MIN_BYTES ||
      bytes.byteOffset !== 0 ||
      bytes.byteLength !== bytes.buffer.byteLength
    ) {
      return chunk;
    }
    let held = true;
    const release = () => {
      if (!held) return;
      held = false;
      this.#pool.release(bytes);
    };
    return { tokens: chunk.tokens, data: chunk.data, release };
  }

  /**
   * Starts encoding the header of `chunk` as the object of (ns, hash) (its payload checksum, on
   * the libuv pool for a large payload), for a {@link write} that may follow: a caller with a
   * round trip to make first (an existence check) overlaps the two. `chunk.data` must not change
   * until the write settles. Rejects as encoding throws.
   */
  header(ns: NamespaceId, hash: ChunkHash, chunk: Chunk): Promise<Uint8Array> {
    const header = encodeChunkHeaderAsync(ns, hash, chunk);
    // Awaited by the write that uses it; a caller that drops it must not see an unhandled rejection.
    header.catch(() => {});
    return header;
  }

  /**
   * Writes `chunk` as the object of (ns, hash) at `path`, atomically (temp file + rename);
   * `makeDir` creates its directory when missing. `header`, when given, is what {@link header}
   * returned for the same (ns, hash, chunk). Returns the bytes written.
   * @throws the system error.
   */
  async write(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    path: string,
    makeDir: () => Promise<void>,
    header?: Promise<Uint8Array>,
  ): Promise<number> {
    if (this.#native !== null) {
      // One task: create, payload with its checksum beside it, header, sync, close, rename.
      return this.#native.writeFileAtomic(
        tempPathFor(path),
        path,
        encodeChunkHeaderTemplate(ns, hash, chunk),
        chunk.data,
        {
          fsync: FSYNC_CODE[this.#o.fsync],
          makeDirs: this.#dirsOf(ns, hash),
          checksumAt: CHUNK_HEADER_CHECKSUM_AT,
          headerCrcAt: CHUNK_HEADER_CRC_AT,
        },
      );
    }
    return writeChunkFileAtomic(
      this.#o.fs,
      path,
      () => header ?? encodeChunkHeaderAsync(ns, hash, chunk),
      CHUNK_HEADER_BYTES,
      chunk.data,
      { fsync: this.#o.fsync, makeDir },
    );
  }
}

/** Operations in flight, which `close` waits for. */
export class TaskSet {
  readonly #tasks = new Set<Promise<unknown>>();

  /** Adds `p` until it settles; returns it. */
  track<T>(p: Promise<T>): Promise<T> {
    this.#tasks.add(p);
    const done = () => this.#tasks.delete(p);
    void p.then(done, done);
    return p;
  }

  /** Resolves once every task (including those added meanwhile) has settled. */
  async drain(): Promise<void> {
    while (this.#tasks.size > 0) await Promise.allSettled([...this.#tasks]);
  }
}

/** A file {@link statEntries} found, with what `stat` said of it. */
export interface FoundFile {
  readonly path: string;
  readonly size: number;
  readonly mtimeMs: number;
}

/** An object file {@link statEntries} found. */
export interface FoundObject extends FoundFile {
  readonly ns: NamespaceId;
  readonly hash: ChunkHash;
}

/**
 * Stats the entries of a store listing (`listStore`), each through `run`: object files (regular
 * files only) and temp files, with sizes and mtimes. A file gone meanwhile is skipped; any other
 * error goes to `onError`, which rethrows it (failing the whole scan) or returns (skipping it).
 */
export async function statEntries(
  fs: FileSystem,
  entries: readonly StoreEntry[],
  run: FileOp,
  onError: (err: unknown) => void,
): Promise<{ objects: FoundObject[]; temps: FoundFile[] }> {
  const objects: FoundObject[] = [];
  const temps: FoundFile[] = [];
  await Promise.all(
    entries.map(async (e) => {
      try {
        const st = await run(() => fs.stat(e.path));
        const found = { path: e.path, size: st.size, mtimeMs: st.mtimeMs };
        if (e.kind === 'temp') temps.push(found);
        else if (st.isFile()) objects.push({ ...found, ns: e.ns, hash: e.hash });
      } catch (err) {
        if (!isNotFound(err)) onError(err);
      }
    }),
  );
  return { objects, temps };
}
