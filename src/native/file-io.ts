/**
 * The file functions of the native addon (native-cuda/src/file_io.cc), declared here and wrapped
 * by native-addon.ts as {@link NativeAddon.files}: each does a whole-object file operation as
 * one task on the libuv pool instead of a round trip per system call.
 */
import { requireInt, requireString } from '../util/validate.ts';

/** How a {@link NativeFileIo.readFileCrc32c} went. */
export type NativeReadStatus = 'ok' | 'missing' | 'size' | 'too-large' | 'short';

const READ_STATUS: readonly NativeReadStatus[] = ['ok', 'missing', 'size', 'too-large', 'short'];

/** Result of {@link NativeFileIo.readFileCrc32c}. */
export interface NativeRead {
  /**
   * `ok`: the file filled `dst` (`crc` is valid); `missing`: no such file; `size`: the file is
   * not `dst`'s length (nothing read; `size` says what it is); `too-large`: over `maxBytes`;
   * `short`: the file ended before `dst` was full (cut while being read).
   */
  readonly status: NativeReadStatus;
  /** The file's size in bytes (0 when missing). */
  readonly size: number;
  /** CRC-32C of `dst` from `crcFrom` on, when `status` is `ok`. */
  readonly crc: number;
  readonly mtimeMs: number;
}

/** Options of {@link NativeFileIo.writeFileAtomic}. */
export interface NativeWriteOptions {
  /** 0: no sync; 1: fdatasync before the rename; 2: also fsync the directory after it. */
  readonly fsync: 0 | 1 | 2;
  /** Directories to create, in order, when the temp file's directory is missing (may be empty). */
  readonly makeDirs: readonly string[];
  /** Offset in the header of the u64le payload CRC-32C to fill in. */
  readonly checksumAt: number;
  /** Offset in the header of the u32le CRC-32 (IEEE) of the header bytes before it, filled in. */
  readonly headerCrcAt: number;
}

/** The addon's file functions as the C++ side registers them. */
export interface RawFileIo {
  statFilesAsync(dir: string, names: string[]): Promise<Float64Array>;
  readFileCrc32cAsync(
    path: string,
    dst: Uint8Array,
    maxBytes: number,
    crcFrom: number,
  ): Promise<{ status: number; size: number; crc: number; mtimeMs: number }>;
  writeFileAtomicAsync(
    tempPath: string,
    finalPath: string,
    header: Uint8Array,
    payload: Uint8Array,
    fsync: number,
    makeDirs: string[],
    checksumAt: number,
    headerCrcAt: number,
  ): Promise<number>;
}

/** Names of {@link RawFileIo}'s functions, for the loader's check of an older build. */
export const RAW_FILE_FUNCTIONS: readonly (keyof RawFileIo)[] = [
  'statFilesAsync',
  'readFileCrc32cAsync',
  'writeFileAtomicAsync',
];

/** Whole-object file operations, each one libuv pool task. Errors carry the errno name as code. */
export interface NativeFileIo {
  /**
   * `lstat`s each of `names` in `dir`: per name `[size, mtimeMs, isFile (1/0)]`, size -1 when
   * it does not exist. A missing `dir` gives -1 for all.
   * @throws NativeError with the errno name of any other failure.
   */
  statFiles(dir: string, names: readonly string[]): Promise<Float64Array>;
  /**
   * Opens `path` and, when its size is exactly `dst.byteLength`, reads all of it into `dst`,
   * checksumming `dst[crcFrom..]` (CRC-32C) as the read goes on (each 256 KiB slice right after
   * it is read, by the same thread, while it is in the cache). `dst` must not be touched until it
   * settles.
   * @throws NativeError with the errno name of a failing open, stat or read (not ENOENT).
   */
  readFileCrc32c(
    path: string,
    dst: Uint8Array,
    maxBytes: number,
    crcFrom: number,
  ): Promise<NativeRead>;
  /**
   * Writes `header` then `payload` to `tempPath` (created exclusively), filling in the header's
   * payload checksum and self-check in a copy (see {@link NativeWriteOptions}; `header` is not
   * changed), syncs per `fsync`, renames it to `finalPath`; removes the temp file on failure.
   * `payload` must not change until it settles. Resolves with the bytes written.
   * @throws NativeError with the errno name of the failing call.
   */
  writeFileAtomic(
    tempPath: string,
    finalPath: string,
    header: Uint8Array,
    payload: Uint8Array,
    options: NativeWriteOptions,
  ): Promise<number>;
}

/** Wraps the raw functions; `fail` turns a raw error into a NativeError. */
export function wrapFileIo(raw: RawFileIo, fail: (err: unknown) => unknown): NativeFileIo {
  const rethrow = (err: unknown) => {
    throw fail(err);
  };
  const call = <T>(fn: () => Promise<T>): Promise<T> => {
    try {
      return fn().catch(rethrow);
    } catch (err) {
      return Promise.reject(fail(err));
    }
  };
  return {
    statFiles: (dir, names) =>
      call(() => raw.statFilesAsync(requireString('dir', dir, { nonEmpty: true }), [...names])),
    readFileCrc32c: (path, dst, maxBytes, crcFrom) =>
      call(async () => {
        const r = await raw.readFileCrc32cAsync(
          requireString('path', path, { nonEmpty: true }),
          dst,
          requireInt('maxBytes', maxBytes, 0, Number.MAX_SAFE_INTEGER),
          requireInt('crcFrom', crcFrom, 0, Number.MAX_SAFE_INTEGER),
        );
        return { ...r, status: READ_STATUS[r.status] ?? 'short' };
      }),
    writeFileAtomic: (tempPath, finalPath, header, payload, o) =>
      call(() =>
        raw.writeFileAtomicAsync(
          requireString('tempPath', tempPath, { nonEmpty: true }),
          requireString('finalPath', finalPath, { nonEmpty: true }),
          header,
          payload,
          requireInt('fsync', o.fsync, 0, 2),
          [...o.makeDirs],
          requireInt('checksumAt', o.checksumAt, 0),
          requireInt('headerCrcAt', o.headerCrcAt, 0),
        ),
      ),
  };
}
