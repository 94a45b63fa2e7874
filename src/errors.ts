/**
 * Stable error codes. Callers branch on `code`, never on message text.
 * The same strings travel in protocol error replies (see docs/protocol.md).
 */
export type KvtierErrorCode =
  | 'KVT_TIMEOUT'
  | 'KVT_CLOSED'
  | 'KVT_CAPACITY'
  | 'KVT_PROTOCOL'
  | 'KVT_TOO_LARGE'
  | 'KVT_INVALID_ARGUMENT'
  | 'KVT_UNKNOWN_NAMESPACE'
  | 'KVT_NOT_FOUND'
  | 'KVT_ABORTED'
  | 'KVT_BACKEND'
  | 'KVT_CORRUPT'
  | 'KVT_CONFIG'
  | 'KVT_UNAUTHENTICATED'
  | 'KVT_FORBIDDEN'
  | 'KVT_INTERNAL';

/** Every code, for validation of codes arriving over the wire. */
export const KVTIER_ERROR_CODES: readonly KvtierErrorCode[] = [
  'KVT_TIMEOUT',
  'KVT_CLOSED',
  'KVT_CAPACITY',
  'KVT_PROTOCOL',
  'KVT_TOO_LARGE',
  'KVT_INVALID_ARGUMENT',
  'KVT_UNKNOWN_NAMESPACE',
  'KVT_NOT_FOUND',
  'KVT_ABORTED',
  'KVT_BACKEND',
  'KVT_CORRUPT',
  'KVT_CONFIG',
  'KVT_UNAUTHENTICATED',
  'KVT_FORBIDDEN',
  'KVT_INTERNAL',
];

/** Base class of every error kvtier throws on purpose. */
export class KvtierError extends Error {
  readonly code: KvtierErrorCode;

  constructor(code: KvtierErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'KvtierError';
    this.code = code;
  }
}

/** Thrown by anything used after `close()`. */
export function closedError(what: string): KvtierError {
  return new KvtierError('KVT_CLOSED', `${what} is closed`);
}

/** The error an aborted operation rejects with; keeps the signal's reason as cause. */
export function abortedError(signal: AbortSignal | undefined, what: string): KvtierError {
  const reason: unknown = signal?.reason;
  if (reason instanceof KvtierError) return reason;
  if (reason instanceof Error && reason.name === 'TimeoutError') {
    return new KvtierError('KVT_TIMEOUT', `${what} timed out`, { cause: reason });
  }
  return new KvtierError('KVT_ABORTED', `${what} was aborted`, { cause: reason });
}

/** Narrowing helper: true when `err` is a KvtierError with the given code. */
export function isKvtierError(err: unknown, code?: KvtierErrorCode): err is KvtierError {
  return err instanceof KvtierError && (code === undefined || err.code === code);
}
