/**
 * Which file I/O the file tiers use: the native addon's whole-object operations (one libuv pool
 * task per read, write or directory of `stat`s) when it is loaded, otherwise `node:fs`, one
 * round trip per system call. `KVTIER_NATIVE_FILES=0` forces `node:fs` (tests run both paths).
 */

import type { NativeFileIo } from '../../native/file-io.ts';
import { loadNative } from '../../native/native-addon.ts';
import type { FileSystem } from './file-store.ts';
import { realFileSystem } from './file-store.ts';

let cached: NativeFileIo | null | undefined;

/**
 * The native file operations for a tier on `fs`: null when the tier runs on a substitute file
 * system (a test's wrapper must see every call), the addon is not loaded, or
 * `KVTIER_NATIVE_FILES=0`.
 */
export function nativeFilesFor(fs: FileSystem): NativeFileIo | null {
  if (fs !== realFileSystem) return null;
  if (cached === undefined) {
    cached = process.env.KVTIER_NATIVE_FILES === '0' ? null : (loadNative().addon?.files ?? null);
  }
  return cached;
}
