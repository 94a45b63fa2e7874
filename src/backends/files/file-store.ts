/**
 * File helpers shared by the LocalDisk and FS backends: the on-disk layout, atomic publish
 * (temp file in the same directory, then rename), whole-object reads and a walk over a store's
 * directory tree. Per-operation deadlines come from `util/deadline.ts`.
 *
 * Layout: `<root>/<ns>/<hash[0..shardChars)>/<hash>.kvc` (no shard directory when
 * `shardChars` is 0). Temp files are `<final>.<pid>.<rand>.tmp` next to their final name, so a
 * rename publishes a whole object and a reader never sees a partial one.
 */
import { randomBytes } from 'node:crypto';
import * as nodeFs from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { KvtierError } from '../../errors.ts';
import { isChunkHash } from '../../hashing/chunk-hash.ts';
import { describe } from '../../util/validate.ts';
import type { ChunkHash, NamespaceId } from '../core/types.ts';
import { CHECKSUM_SYNC_MAX_BYTES, readFileCrc32cAsync } from '../format/checksum.ts';

/** Suffix of a published chunk object. */
export const OBJECT_SUFFIX = '.kvc';
/** Suffix of a temp file being written. */
export const TEMP_SUFFIX = '.tmp';
/** Most hex characters of the hash used for the shard directory. */
export const MAX_SHARD_CHARS = 8;

/**
 * When written data is made durable: `none` leaves it to the OS; `data` (default) fdatasyncs
 * the temp file before the rename; `always` also fsyncs the directory after the rename.
 */
export type FsyncPolicy = 'none' | 'data' | 'always';

/** Every {@link FsyncPolicy}, for validation. */
export const FSYNC_POLICIES: readonly FsyncPolicy[] = ['none', 'data', 'always'];

/**
 * The file-system calls the file backends make, as `node:fs/promises` spells them. Tests may
 * substitute a wrapper (e.g. one whose calls never settle, to stand for a hung NFS mount).
 */
export type FileSystem = Pick<
  typeof nodeFs,
  'open' | 'stat' | 'rename' | 'unlink' | 'mkdir' | 'readdir'
>;

/** The real file system. */
export const realFileSystem: FileSystem = nodeFs;

const NS_RE = /^[0-9a-f]{32}$/;
const SHARD_RE = /^[0-9a-f]+$/;

/** True when `ns` is a namespace id the chunk format can store: 32 lowercase hex digits. */
export function isStorableNamespace(ns: unknown): ns is NamespaceId {
  return typeof ns === 'string' && NS_RE.test(ns);
}

/**
 * Throws unless `ns` can name a directory. (A `ChunkHash` is valid by construction, so only the
 * namespace is checked.)
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming what is wrong.
 */
export function requireStorableNamespace(ns: unknown): void {
  if (!isStorableNamespace(ns)) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `namespace must be 32 lowercase hex digits, got ${describe(ns)}`,
    );
  }
}

/** Directory holding the object of (ns, hash). */
export function objectDir(root: string, ns: NamespaceId, hash: ChunkHash, shardChars: number) {
  return shardChars === 0 ? join(root, ns) : join(root, ns, hash.slice(0, shardChars));
}

/** Path of the object of (ns, hash); callers validate the key first. */
export function objectPath(
  root: string,
  ns: NamespaceId,
  hash: ChunkHash,
  shardChars: number,
): string {
  return join(objectDir(root, ns, hash, shardChars), `${hash}${OBJECT_SUFFIX}`);
}

/** A unique temp path next to `finalPath`. */
export function tempPathFor(finalPath: string): string {
  return `${finalPath}.${process.pid}.${randomBytes(6).toString('hex')}${TEMP_SUFFIX}`;
}

/** The `code` of a Node system error, if any. */
export function errnoOf(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

/** True for "no such file or directory". */
export function isNotFound(err: unknown): boolean {
  return errnoOf(err) === 'ENOENT';
}

/**
 * Payloads up to this size have their header (checksum) computed while the temp file is being
 * opened; larger ones only once their write is under way, which measured faster for 32 MiB
 * payloads on a 2-core machine (the checksum and the page-cache copy then share the cores less).
 */
export const EARLY_HEADER_MAX_BYTES = 8 * 1024 * 1024;

/** Options of {@link writeChunkFileAtomic}. */
export interface AtomicWriteOptions {
  readonly fsync: FsyncPolicy;
  /**
   * Creates the object's directory when it is missing; called at most once, after the first
   * create failed with ENOENT.
   */
  readonly makeDir: () => Promise<void>;
}

/**
 * Writes one chunk object to a temp file next to `finalPath` and renames it into place, so
 * readers see the whole object or nothing; the temp file is removed on failure. The checksum
 * overlaps the I/O: `makeHeader` (its payload checksum on the libuv pool or this thread) runs
 * beside the payload write (at `headerBytes`, on the I/O pool), and for a payload up to
 * {@link EARLY_HEADER_MAX_BYTES} beside the open as well; the header is written as soon as it is
 * ready, beside the payload write (the temp file is not visible to readers until the rename, so
 * the order of the two writes does not matter).
 * Returns the bytes written. @throws the underlying system error.
 */
export async function writeChunkFileAtomic(
  fs: FileSystem,
  finalPath: string,
  makeHeader: () => Uint8Array | Promise<Uint8Array>,
  headerBytes: number,
  payload: Uint8Array,
  opts: AtomicWriteOptions,
): Promise<number> {
  const makeChecked = async () => {
    const header = await makeHeader();
    if (header.byteLength !== headerBytes) {
      throw new KvtierError(
        'KVT_INTERNAL',
        `header is ${header.byteLength} bytes, expected ${headerBytes}`,
      );
    }
    return header;
  };
  let early = payload.byteLength <= EARLY_HEADER_MAX_BYTES ? makeChecked() : undefined;
  // Awaited on every path below; this only keeps an early failure from counting as unhandled.
  early?.catch(() => {});
  const temp = tempPathFor(finalPath);
  let fh: nodeFs.FileHandle;
  try {
    try {
      fh = await fs.open(temp, 'wx', 0o644);
    } catch (err) {
      if (!isNotFound(err)) throw err;
      await opts.makeDir();
      fh = await fs.open(temp, 'wx', 0o644);
    }
  } catch (err) {
    await early?.catch(() => {});
    throw err;
  }
  try {
    try {
      const payloadWrite = writeAllAt(fh, payload, headerBytes);
      early ??= makeChecked();
      const headerWrite = early.then((header) => writeAllAt(fh, header, 0));
      // Both settle before the file is closed, whichever fails.
      const writes = await Promise.allSettled([payloadWrite, headerWrite]);
      for (const w of writes) if (w.status === 'rejected') throw w.reason;
      if (opts.fsync !== 'none') await fh.datasync();
    } finally {
      await fh.close();
    }
    await fs.rename(temp, finalPath);
  } catch (err) {
    await fs.unlink(temp).catch(() => {});
    throw err;
  }
  if (opts.fsync === 'always') await syncDir(fs, dirname(finalPath));
  return headerBytes + payload.byteLength;
}

/** Positional write of all of `buf` at `position`, continued where the kernel wrote less. */
async function writeAllAt(fh: nodeFs.FileHandle, buf: Uint8Array, position: number): Promise<void> {
  let off = 0;
  while (off < buf.byteLength) {
    const { bytesWritten } = await fh.write(buf, off, buf.byteLength - off, position + off);
    if (bytesWritten <= 0) throw new KvtierError('KVT_BACKEND', 'write made no progress');
    off += bytesWritten;
  }
}

/** Makes a directory's entries (a rename into it) durable. */
async function syncDir(fs: FileSystem, dir: string): Promise<void> {
  const fh = await fs.open(dir, 'r');
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** A whole object read from a file, or why it could not be used. */
export type ReadResult =
  | {
      readonly kind: 'ok';
      readonly bytes: Buffer;
      readonly mtimeMs: number;
      /** CRC-32C of `bytes` from `checksumFrom` on, when it was computed while reading. */
      readonly crc32c?: number;
    }
  | { readonly kind: 'missing' }
  | { readonly kind: 'too-large'; readonly size: number };

/**
 * Reads a whole file into one Buffer with positional reads. A file that does not exist is
 * `missing`; one over `maxBytes` is `too-large` (never allocated). A file cut short while being
 * read yields the bytes that were there (the format check catches it). With `checksumFrom`, a
 * file over {@link CHECKSUM_SYNC_MAX_BYTES} is read and checksummed (CRC-32C of the bytes from
 * `checksumFrom` on, as `crc32c`) in one pass when the native addon is loaded. `alloc` gives the
 * buffer to read into (default `Buffer.allocUnsafe`): exactly the file's size, whatever it held
 * before is overwritten, or cleared where the file turned out shorter.
 * @throws the underlying system error other than ENOENT.
 */
export async function readObjectFile(
  fs: FileSystem,
  path: string,
  maxBytes: number,
  checksumFrom?: number,
  alloc: (bytes: number) => Buffer = Buffer.allocUnsafe,
): Promise<ReadResult> {
  let fh: nodeFs.FileHandle;
  try {
    fh = await fs.open(path, 'r');
  } catch (err) {
    if (isNotFound(err)) return { kind: 'missing' };
    throw err;
  }
  try {
    const st = await fh.stat();
    if (st.size > maxBytes) return { kind: 'too-large', size: st.size };
    const bytes = alloc(st.size);
    if (
      checksumFrom !== undefined &&
      st.size > CHECKSUM_SYNC_MAX_BYTES &&
      typeof fh.fd === 'number'
    ) {
      const crc32c = await readFileCrc32cAsync(fh.fd, bytes, 0, checksumFrom);
      if (crc32c !== null) return { kind: 'ok', bytes, mtimeMs: st.mtimeMs, crc32c };
    }
    let filled = 0;
    while (filled < bytes.byteLength) {
      const { bytesRead } = await fh.read(bytes, filled, bytes.byteLength - filled, filled);
      if (bytesRead === 0) break;
      filled += bytesRead;
    }
    // A reused buffer keeps nothing of what it held before, even past the end of the view.
    if (filled < bytes.byteLength) bytes.fill(0, filled);
    return { kind: 'ok', bytes: bytes.subarray(0, filled), mtimeMs: st.mtimeMs };
  } finally {
    await fh.close();
  }
}

/** One entry found by {@link listStore}. */
export type StoreEntry =
  | { readonly kind: 'object'; readonly ns: NamespaceId; readonly hash: ChunkHash; path: string }
  | { readonly kind: 'temp'; readonly path: string };

/**
 * Lists the objects and temp files under `root` in the layout of `shardChars`. Names that are
 * not a valid (ns, hash) in the right place are left out (never touched), as are directories
 * that vanish while being listed. `readdir` runs through `run` (a deadline, a limiter).
 * @throws the underlying system error for `root` itself (other than ENOENT, which lists nothing).
 */
export async function listStore(
  fs: FileSystem,
  root: string,
  shardChars: number,
  run: <T>(op: () => Promise<T>) => Promise<T> = (op) => op(),
  nsFilter?: NamespaceId,
): Promise<StoreEntry[]> {
  const out: StoreEntry[] = [];
  const rootDirs = await readDirs(fs, root, run, true);
  const nsNames = rootDirs.filter(
    (n) => isStorableNamespace(n) && (nsFilter === undefined || n === nsFilter),
  );
  await Promise.all(
    nsNames.map(async (ns) => {
      const nsDir = join(root, ns);
      if (shardChars === 0) {
        await listFiles(fs, nsDir, ns, '', run, out);
        return;
      }
      const shards = (await readDirs(fs, nsDir, run, false)).filter(
        (s) => s.length === shardChars && SHARD_RE.test(s),
      );
      await Promise.all(shards.map((s) => listFiles(fs, join(nsDir, s), ns, s, run, out)));
    }),
  );
  return out;
}

async function readDirs(
  fs: FileSystem,
  dir: string,
  run: <T>(op: () => Promise<T>) => Promise<T>,
  isRoot: boolean,
): Promise<string[]> {
  try {
    const ents = await run(() => fs.readdir(dir, { withFileTypes: true }));
    return ents.filter((e) => e.isDirectory()).map((e) => e.name);
  } catch (err) {
    if (isNotFound(err) || (!isRoot && errnoOf(err) === 'ENOTDIR')) return [];
    throw err;
  }
}

async function listFiles(
  fs: FileSystem,
  dir: string,
  ns: NamespaceId,
  shard: string,
  run: <T>(op: () => Promise<T>) => Promise<T>,
  out: StoreEntry[],
): Promise<void> {
  let names: string[];
  try {
    names = await run(() => fs.readdir(dir));
  } catch (err) {
    if (isNotFound(err) || errnoOf(err) === 'ENOTDIR') return;
    throw err;
  }
  for (const name of names) {
    const path = join(dir, name);
    if (name.endsWith(TEMP_SUFFIX)) {
      out.push({ kind: 'temp', path });
    } else if (name.endsWith(OBJECT_SUFFIX)) {
      const hash = name.slice(0, -OBJECT_SUFFIX.length);
      if (isChunkHash(hash) && hash.startsWith(shard)) out.push({ kind: 'object', ns, hash, path });
    }
  }
}
