/** The options and counters of {@link StoreBackend} (store-backend.ts). */
import { KvtierError } from '../../errors.ts';
import type { Logger } from '../../util/log.ts';
import type { BackendStats } from '../core/types.ts';

/** Options of {@link StoreBackend}. */
export interface StoreBackendOptions {
  /** Backend type named in metrics and messages, e.g. 'redis'. */
  kind: string;
  /** Largest chunk payload in bytes; a larger put is dropped and counted. Default and most 2 GiB. */
  maxChunkBytes?: number;
  /**
   * Deadline of each call (ms), the whole batch of a batched call included: it then rejects with
   * `KVT_TIMEOUT` (counted in `errors`) while the store's calls run on. Default none (the store
   * bounds its own requests).
   */
  timeoutMs?: number;
  /** Most store calls one batched call has in flight; default 16. */
  concurrency?: number;
  /** Expire chunks this long after they are written (ms); needs a store with `info.ttl`. */
  ttlMs?: number | null;
  /** Called with the reason whenever a stored object fails verification (it is then deleted). */
  onCorrupt?: (reason: string) => void;
  /** Logger; default the context's, else silent. */
  log?: Logger;
}

/** Counters of a {@link StoreBackend}; the store's own counters are added to these. */
export interface StoreBackendStats extends BackendStats {
  /** Objects that failed verification, were treated as misses and deleted. */
  readonly corruptObjects: number;
  /** Store calls that failed, and calls that ran past `timeoutMs`. */
  readonly errors: number;
  /**
   * Puts whose caller stopped waiting (its abort, `timeoutMs`) and that the store wrote all the
   * same; they are in `chunks` and `bytesUsed` too.
   */
  readonly latePuts: number;
}

/** Store calls one batched call has in flight unless `concurrency` says otherwise. */
export const DEFAULT_CONCURRENCY = 16;

/** A failed store call as the error it rejects with: a KvtierError as is, else `KVT_BACKEND`. */
export function storeFailure(what: string, kind: string, cause: unknown): KvtierError {
  if (cause instanceof KvtierError) return cause;
  const msg = cause instanceof Error ? cause.message : String(cause);
  return new KvtierError('KVT_BACKEND', `${what}: ${kind} failed: ${msg}`, { cause });
}
