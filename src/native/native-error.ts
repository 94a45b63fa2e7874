/**
 * The errors of the `native-cuda` addon: its codes, the kvtier code each maps to, and the
 * wrapping of what it throws (native-addon.ts declares the addon's surface).
 */
import { KvtierError, type KvtierErrorCode } from '../errors.ts';

/**
 * Codes the addon puts on errors; file errors carry the errno name
 * instead (`'ENOENT'`, `'EACCES'`, ...).
 */
export type NativeErrorCode =
  | 'ERR_INVALID_ARG'
  | 'ERR_BAD_OP'
  | 'ERR_OUT_OF_RANGE'
  | 'ERR_OVERLAP'
  | 'ERR_MISALIGNED'
  | 'ERR_TOO_LARGE'
  | 'ERR_NO_CUDA'
  | 'ERR_CUDA'
  | 'ERR_INTERNAL';

const KVT_CODE_OF: Readonly<Record<string, KvtierErrorCode>> = {
  ERR_INVALID_ARG: 'KVT_INVALID_ARGUMENT',
  ERR_BAD_OP: 'KVT_INVALID_ARGUMENT',
  ERR_OUT_OF_RANGE: 'KVT_INVALID_ARGUMENT',
  ERR_OVERLAP: 'KVT_INVALID_ARGUMENT',
  ERR_MISALIGNED: 'KVT_INVALID_ARGUMENT',
  ERR_TOO_LARGE: 'KVT_TOO_LARGE',
  ERR_NO_CUDA: 'KVT_BACKEND',
  ERR_CUDA: 'KVT_BACKEND',
  ERR_SHORT_READ: 'KVT_BACKEND',
  ENOENT: 'KVT_NOT_FOUND',
  ENOTDIR: 'KVT_NOT_FOUND',
  ENOMEM: 'KVT_CAPACITY',
  EINVAL: 'KVT_INVALID_ARGUMENT',
};

/**
 * An error from the addon. `code` is the kvtier code callers branch on
 * (e.g. `KVT_INVALID_ARGUMENT` for a bad op, `KVT_NOT_FOUND` for a missing file); `nativeCode`
 * is the addon's own, finer code ({@link NativeErrorCode} or an errno name such as `'EACCES'`).
 */
export class NativeError extends KvtierError {
  readonly nativeCode: string;

  constructor(nativeCode: string, message: string, options?: { cause?: unknown }) {
    const code =
      KVT_CODE_OF[nativeCode] ?? (/^E[A-Z0-9]+$/.test(nativeCode) ? 'KVT_BACKEND' : 'KVT_INTERNAL');
    super(code, message, options);
    this.name = 'NativeError';
    this.nativeCode = nativeCode;
  }
}

/** The addon's thrown error as a {@link NativeError} (a KvtierError passes through). */
export function toNativeError(err: unknown): unknown {
  if (err instanceof KvtierError) return err;
  const code = (err as { code?: unknown } | null)?.code;
  if (err instanceof Error && typeof code === 'string') {
    return new NativeError(code, err.message, { cause: err });
  }
  return err;
}

/** Runs `fn`, rethrowing what the addon throws as a {@link NativeError}. */
export function guard<T>(fn: () => T): T {
  try {
    return fn();
  } catch (err) {
    throw toNativeError(err);
  }
}
