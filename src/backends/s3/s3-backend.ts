/**
 * The S3 tier: an {@link S3Store} (s3-store.ts) under the four-method store wrapper
 * ({@link StoreBackend}), which encodes, verifies and counts.
 */
import type { S3Client } from '@aws-sdk/client-s3';
import { silentLogger } from '../../util/log.ts';
import type { BackendContext, BackendFactory } from '../core/types.ts';
import { StoreBackend } from '../store/store-backend.ts';
import type { StoreBackendStats } from '../store/store-options.ts';
import {
  resolveS3BackendOptions,
  type S3BackendOptions,
  s3OptionsFromConfig,
} from './s3-options.ts';
import { S3Store } from './s3-store.ts';

export {
  type ResolvedS3BackendOptions,
  resolveS3BackendOptions,
  S3_BACKEND_DEFAULTS,
  type S3BackendOptions,
  s3OptionsFromConfig,
} from './s3-options.ts';

/** Stats of {@link S3Backend}: the common fields plus S3-specific counters. */
export interface S3BackendStats extends StoreBackendStats {
  /** Requests that failed or timed out (404s are not failures). */
  readonly requestFailures: number;
  /** Requests running / waiting for a concurrency slot now. */
  readonly activeRequests: number;
  readonly pendingRequests: number;
}

/**
 * S3 tier: one object per chunk (`<keyPrefix><ns>/<hash>`, the stored chunk format), written
 * with one PutObject of known length (atomic), read with GetObject and verified; a corrupt or
 * misplaced object is a miss, is deleted and counted. Requests run under a concurrency bound,
 * each with a deadline from the deadline helper. `health()` is the backend's own view:
 * 'degraded' while the latest request failed, 'up' once one reaches the service; it never
 * reports 'down' by itself: the circuit breaker around the tier is its one health mechanism
 * (it opens after consecutive failures and probes). Shared and persistent; no pins
 * (a get reads whole objects), no eviction of its own (use a bucket lifecycle rule).
 *
 * `stats().chunks`/`bytesUsed` count what this instance stored minus what it removed (never
 * below 0): a shared bucket has no cheap exact count. Concurrent puts of one key through one
 * instance are serialized (one upload, the rest answer 'exists'); across instances both may
 * upload identical bytes, which is harmless.
 */
export class S3Backend extends StoreBackend {
  readonly #s3: S3Store;

  /** @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options. Call {@link start} before use. */
  constructor(options: S3BackendOptions, ctx: BackendContext = { name: 's3' }) {
    const o = resolveS3BackendOptions(options);
    const log = options.log ?? silentLogger;
    const store = new S3Store(o, ctx.name, log);
    super(
      store,
      {
        kind: 's3',
        maxChunkBytes: o.maxChunkBytes,
        concurrency: o.concurrency,
        ...(options.onCorrupt !== undefined ? { onCorrupt: options.onCorrupt } : {}),
        log,
      },
      ctx,
    );
    this.#s3 = store;
  }

  /**
   * The SDK client, owned by this backend (destroyed by `close`). For middleware such as
   * metrics or tracing; writes sent around the backend bypass its format and counters.
   */
  get client(): S3Client {
    return this.#s3.requests.client;
  }

  override stats(): S3BackendStats {
    return super.stats() as S3BackendStats;
  }
}

/**
 * Builds and starts an {@link S3Backend} from config options.
 * @throws `KVT_CONFIG` on bad options or a missing bucket; see {@link S3Backend.start}.
 */
export const createS3Backend: BackendFactory = (options, ctx) =>
  StoreBackend.started(new S3Backend(s3OptionsFromConfig(options, ctx.name), ctx));
