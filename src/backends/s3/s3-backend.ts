import {
  CreateBucketCommand,
  DeleteObjectCommand,
  DeleteObjectsCommand,
  GetObjectCommand,
  HeadBucketCommand,
  HeadObjectCommand,
  type HeadObjectCommandOutput,
  ListObjectsV2Command,
  PutObjectCommand,
  type S3Client,
} from '@aws-sdk/client-s3';
import { abortedError, closedError, KvtierError } from '../../errors.ts';
import { type Logger, silentLogger } from '../../util/log.ts';
import { describe } from '../../util/validate.ts';
import { BufferPool } from '../arena/buffer-pool.ts';
import { checkChunk } from '../core/chunk-check.ts';
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
} from '../core/types.ts';
import {
  CHUNK_HEADER_BYTES,
  chunkObjectBytes,
  decodeChunkObjectAsync,
  encodeChunkObjectIntoAsync,
} from '../format/chunk-format.ts';
import {
  type ResolvedS3BackendOptions,
  resolveS3BackendOptions,
  type S3BackendOptions,
  s3OptionsFromConfig,
} from './s3-options.ts';
import { failure, type Outcome, readBody, S3Requests } from './s3-requests.ts';

export {
  type ResolvedS3BackendOptions,
  resolveS3BackendOptions,
  S3_BACKEND_DEFAULTS,
  type S3BackendOptions,
  s3OptionsFromConfig,
} from './s3-options.ts';

/** S3's limit on keys per DeleteObjects request. */
const DELETE_BATCH = 1000;
const NS_RE = /^[0-9a-f]{32}$/;

function invalid(message: string): KvtierError {
  return new KvtierError('KVT_INVALID_ARGUMENT', message);
}

/** Stats of {@link S3Backend}: the common fields plus S3-specific counters. */
export interface S3BackendStats extends BackendStats {
  /** Objects that failed to decode (each was treated as a miss and deleted). */
  readonly corruptObjects: number;
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
export class S3Backend implements StorageBackend {
  readonly name: string;
  readonly kind = 's3';
  readonly capabilities: BackendCapabilities;
  readonly #o: ResolvedS3BackendOptions;
  readonly #s3: S3Requests;
  readonly #onCorrupt: ((reason: string) => void) | undefined;
  readonly #log: Logger;
  /** Latest put per key, so a second put of the key waits and then finds it. */
  readonly #putting = new Map<string, Promise<PutOutcome>>();
  /** Object buffers for puts, reused only after a PutObject that succeeded. */
  readonly #pool = new BufferPool();
  #corruptObjects = 0;
  #droppedPuts = 0;
  #chunks = 0;
  #bytesUsed = 0;
  #closing: Promise<void> | null = null;

  /** @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options. Call {@link start} before use. */
  constructor(options: S3BackendOptions, ctx: BackendContext = { name: 's3' }) {
    const o = resolveS3BackendOptions(options);
    this.#o = o;
    this.name = ctx.name;
    this.#onCorrupt = options.onCorrupt;
    this.#log = options.log ?? silentLogger;
    this.#s3 = new S3Requests(o, ctx.name, this.#log);
    this.capabilities = Object.freeze({
      pinning: false,
      hostMemory: false,
      persistent: true,
      shared: true,
      evicts: false,
      maxChunkBytes: o.maxChunkBytes,
    });
  }

  /**
   * The SDK client, owned by this backend (destroyed by `close`). For middleware such as
   * metrics or tracing; writes sent around the backend bypass its format and counters.
   */
  get client(): S3Client {
    return this.#s3.client;
  }

  /**
   * Checks the bucket, creating it with `createBucket`. An unreachable service does not fail
   * start (health reads 'degraded'/'down' until a request succeeds) unless it must create.
   * @throws KvtierError `KVT_CONFIG` when the bucket does not exist and `createBucket` is off;
   *   `KVT_BACKEND`/`KVT_TIMEOUT` when the bucket must be created and cannot be.
   */
  async start(): Promise<void> {
    this.#checkOpen(undefined, 'start');
    const Bucket = this.#o.bucket;
    const head = await this.#s3.request('start', (s) =>
      this.#s3.client.send(new HeadBucketCommand({ Bucket }), { abortSignal: s }),
    );
    if (head.ok) return;
    if (!head.notFound) {
      if (this.#o.createBucket) throw head.error;
      this.#log.warn('S3 unreachable at start', { tier: this.name, err: head.error });
      return;
    }
    if (!this.#o.createBucket)
      throw new KvtierError(
        'KVT_CONFIG',
        `S3 bucket "${Bucket}" does not exist (create it, or set createBucket: true)`,
      );
    const made = await this.#s3.request('start', (s) =>
      this.#s3.client.send(new CreateBucketCommand({ Bucket }), { abortSignal: s }),
    );
    if (!made.ok) throw failure(made, `creating S3 bucket "${Bucket}"`);
  }

  async batchedContains(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: ContainsOptions = {},
  ): Promise<number> {
    this.#checkOpen(opts.signal, 'contains');
    checkNamespace(ns);
    let firstMiss = hashes.length;
    // All HEADs are queued at once; those behind a known miss are skipped, not sent.
    const results = await Promise.all(
      hashes.map(async (hash, i) => {
        const r = await this.#head('contains', ns, hash, opts.signal, () => i > firstMiss);
        if (!r.ok && r.notFound) firstMiss = Math.min(firstMiss, i);
        return r;
      }),
    );
    for (const [i, r] of results.entries()) {
      if (r.ok) continue;
      if (r.notFound) return i;
      throw r.error;
    }
    return hashes.length;
  }

  /**
   * Gets whole objects and verifies them. Per-key failures are misses as long as one request
   * reached the service; when none did, the call rejects (`KVT_BACKEND`/`KVT_TIMEOUT`) so an
   * outage is not mistaken for misses.
   */
  async batchedGet(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: GetOptions = {},
  ): Promise<Map<ChunkHash, Chunk | null>> {
    this.#checkOpen(opts.signal, 'get');
    checkNamespace(ns);
    const out = new Map<ChunkHash, Chunk | null>(hashes.map((h) => [h, null]));
    const errors: KvtierError[] = [];
    let reached = 0;
    const Bucket = this.#o.bucket;
    const maxObjectBytes = CHUNK_HEADER_BYTES + this.#o.maxChunkBytes;
    await Promise.all(
      [...out.keys()].map(async (hash) => {
        const Key = this.#key(ns, hash);
        const r = await this.#s3.request(
          'get',
          async (s) => {
            const res = await this.#s3.client.send(new GetObjectCommand({ Bucket, Key }), {
              abortSignal: s,
            });
            if (res.Body === undefined) throw new Error('GetObject answered without a body');
            return readBody(res.Body, res.ContentLength, maxObjectBytes, CHUNK_HEADER_BYTES);
          },
          opts.signal,
        );
        if (!r.ok) {
          if (r.notFound) reached++;
          else errors.push(r.error);
          return;
        }
        reached++;
        const { bytes, crc32c } = r.value;
        const decoded = await decodeChunkObjectAsync(ns, hash, bytes, crc32c);
        if (decoded.ok) out.set(hash, decoded.chunk);
        else await this.#corrupt(ns, hash, decoded.reason, bytes.byteLength);
      }),
    );
    if (errors.length > 0 && reached === 0) throw errors[0]!;
    return out;
  }

  /**
   * Stores one chunk unless it already exists (HEAD, then one PutObject); both requests share
   * one `timeoutMs` deadline. A payload over `maxChunkBytes` is dropped and counted.
   * @throws KvtierError `KVT_BACKEND`/`KVT_TIMEOUT` when S3 fails; `KVT_INVALID_ARGUMENT` for a
   *   malformed chunk, namespace or hash.
   */
  async put(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    opts: PutOptions = {},
  ): Promise<PutOutcome> {
    this.#checkOpen(opts.signal, 'put');
    checkNamespace(ns);
    checkChunk(chunk);
    if (chunk.data.byteLength > this.#o.maxChunkBytes) {
      this.#droppedPuts++;
      return 'dropped';
    }
    const key = this.#key(ns, hash);
    const prev = this.#putting.get(key);
    const mine = (prev ?? Promise.resolve()).then(
      () => this.#putOnce(ns, hash, chunk, opts.signal),
      () => this.#putOnce(ns, hash, chunk, opts.signal),
    );
    this.#putting.set(key, mine);
    try {
      return await mine;
    } finally {
      if (this.#putting.get(key) === mine) this.#putting.delete(key);
    }
  }

  async #putOnce(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    signal: AbortSignal | undefined,
  ): Promise<PutOutcome> {
    const deadline = { at: 0 };
    // The object is encoded while the HEAD is in flight; its buffer goes back to the pool when
    // the SDK never saw it, or once a PutObject has succeeded (after a failed or aborted one the
    // SDK may still hold it, so it is left to the garbage collector).
    const Body = this.#pool.acquire(chunkObjectBytes(chunk.data.byteLength));
    const encoded = encodeChunkObjectIntoAsync(Body, ns, hash, chunk);
    encoded.catch(() => {});
    const head = await this.#head('put', ns, hash, signal, undefined, deadline).finally(() =>
      encoded.catch(() => {}),
    );
    if (!head.ok && head.notFound) {
      try {
        await encoded;
      } catch (err) {
        this.#pool.release(Body);
        throw err;
      }
    } else {
      this.#pool.release(Body);
      if (head.ok) return 'exists';
      throw head.error;
    }
    const Bucket = this.#o.bucket;
    const Key = this.#key(ns, hash);
    const put = await this.#s3.request(
      'put',
      (s) =>
        this.#s3.client.send(
          new PutObjectCommand({ Bucket, Key, Body, ContentLength: Body.byteLength }),
          { abortSignal: s },
        ),
      signal,
      undefined,
      deadline,
    );
    if (!put.ok) throw failure(put, `${this.name} put`);
    this.#pool.release(Body);
    this.#chunks++;
    this.#bytesUsed += Body.byteLength;
    return 'stored';
  }

  async remove(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    this.#checkOpen(undefined, 'remove');
    checkNamespace(ns);
    const unique = [...new Set(hashes)];
    const heads = await Promise.all(unique.map((h) => this.#head('remove', ns, h)));
    const keys: string[] = [];
    let bytes = 0;
    for (const [i, r] of heads.entries()) {
      if (r.ok) {
        keys.push(this.#key(ns, unique[i]!));
        bytes += r.value.ContentLength ?? 0;
      } else if (!r.notFound) throw r.error;
    }
    await this.#deleteKeys(keys);
    this.#forget(keys.length, bytes);
    return keys.length;
  }

  pin(_ns: NamespaceId, _hashes: readonly ChunkHash[]): number {
    this.#checkOpen(undefined, 'pin');
    return 0;
  }

  unpin(_ns: NamespaceId, _hashes: readonly ChunkHash[]): void {
    this.#checkOpen(undefined, 'unpin');
  }

  /**
   * Deletes every object under `<keyPrefix><ns>/`, or under `keyPrefix` when `ns` is omitted
   * (ListObjectsV2 pages, DeleteObjects in batches of 1000). Not bounded by one `timeoutMs`:
   * each request is.
   */
  async clear(ns?: NamespaceId): Promise<void> {
    this.#checkOpen(undefined, 'clear');
    if (ns !== undefined) checkNamespace(ns);
    const Bucket = this.#o.bucket;
    const Prefix = ns === undefined ? this.#o.keyPrefix : `${this.#o.keyPrefix}${ns}/`;
    let token: string | undefined;
    do {
      const ContinuationToken = token;
      const page = await this.#s3.request('clear', (s) =>
        this.#s3.client.send(new ListObjectsV2Command({ Bucket, Prefix, ContinuationToken }), {
          abortSignal: s,
        }),
      );
      if (!page.ok) throw failure(page, `${this.name} clear`);
      const objects = page.value.Contents ?? [];
      const keys = objects.flatMap((c) => (c.Key === undefined ? [] : [c.Key]));
      await this.#deleteKeys(keys);
      this.#forget(
        keys.length,
        objects.reduce((n, c) => n + (c.Size ?? 0), 0),
      );
      token = page.value.IsTruncated === true ? page.value.NextContinuationToken : undefined;
    } while (token !== undefined);
    if (ns === undefined) this.#forget(this.#chunks, this.#bytesUsed);
  }

  stats(): S3BackendStats {
    this.#checkOpen(undefined, 'stats');
    return {
      chunks: this.#chunks,
      bytesUsed: this.#bytesUsed,
      capacityBytes: null,
      pinnedChunks: 0,
      evictions: 0,
      droppedPuts: this.#droppedPuts,
      corruptObjects: this.#corruptObjects,
      requestFailures: this.#s3.failures,
      activeRequests: this.#s3.active,
      pendingRequests: this.#s3.pending,
    };
  }

  health(): BackendHealth {
    this.#checkOpen(undefined, 'health');
    return this.#s3.lastFailed ? 'degraded' : 'up';
  }

  /** Aborts requests in flight (they reject with `KVT_CLOSED`), then destroys the client. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      await this.#s3.close(closedError(`backend ${this.name}`));
    })();
    return this.#closing;
  }

  #key(ns: NamespaceId, hash: ChunkHash): string {
    return `${this.#o.keyPrefix}${ns}/${hash}`;
  }

  #checkOpen(signal: AbortSignal | undefined, op: string): void {
    if (this.#closing !== null) throw closedError(`backend ${this.name}`);
    if (signal?.aborted === true) throw abortedError(signal, `${this.name} ${op}`);
  }

  #forget(chunks: number, bytes: number): void {
    this.#chunks = Math.max(0, this.#chunks - chunks);
    this.#bytesUsed = Math.max(0, this.#bytesUsed - bytes);
  }

  #head(
    op: string,
    ns: NamespaceId,
    hash: ChunkHash,
    signal?: AbortSignal,
    skip?: () => boolean,
    deadline?: { at: number },
  ): Promise<Outcome<HeadObjectCommandOutput>> {
    const Bucket = this.#o.bucket;
    const Key = this.#key(ns, hash);
    return this.#s3.request(
      op,
      (s) => this.#s3.client.send(new HeadObjectCommand({ Bucket, Key }), { abortSignal: s }),
      signal,
      skip,
      deadline,
    );
  }

  async #corrupt(ns: NamespaceId, hash: ChunkHash, reason: string, bytes: number): Promise<void> {
    this.#corruptObjects++;
    this.#log.warn('corrupt S3 object: a miss, deleted', { tier: this.name, ns, hash, reason });
    try {
      this.#onCorrupt?.(reason);
    } catch (err) {
      this.#log.warn('onCorrupt callback threw', { tier: this.name, err });
    }
    const Bucket = this.#o.bucket;
    const Key = this.#key(ns, hash);
    const r = await this.#s3.request('delete', (s) =>
      this.#s3.client.send(new DeleteObjectCommand({ Bucket, Key }), { abortSignal: s }),
    );
    if (r.ok) this.#forget(1, bytes);
  }

  /** DeleteObjects in batches of 1000. @throws `KVT_BACKEND` when a key was not deleted. */
  async #deleteKeys(keys: readonly string[]): Promise<void> {
    const Bucket = this.#o.bucket;
    const batches: string[][] = [];
    for (let i = 0; i < keys.length; i += DELETE_BATCH)
      batches.push(keys.slice(i, i + DELETE_BATCH));
    await Promise.all(
      batches.map(async (batch) => {
        const Delete = { Objects: batch.map((Key) => ({ Key })), Quiet: true };
        const r = await this.#s3.request('delete', (s) =>
          this.#s3.client.send(new DeleteObjectsCommand({ Bucket, Delete }), { abortSignal: s }),
        );
        if (!r.ok) throw failure(r, `${this.name} delete`);
        const bad = r.value.Errors ?? [];
        if (bad.length > 0)
          throw new KvtierError(
            'KVT_BACKEND',
            `S3 did not delete ${bad.length} object(s); first ${bad[0]?.Key}: ${bad[0]?.Code}`,
          );
      }),
    );
  }
}

/**
 * @throws KvtierError `KVT_INVALID_ARGUMENT` unless ns is a lowercase hex id (a `ChunkHash` is
 *   valid by construction and not re-checked).
 */
function checkNamespace(ns: NamespaceId): void {
  if (typeof ns !== 'string' || !NS_RE.test(ns))
    throw invalid(`namespace must be 32 lowercase hex digits, got ${describe(ns)}`);
}

/**
 * Builds and starts an {@link S3Backend} from config options.
 * @throws `KVT_CONFIG` on bad options or a missing bucket; see {@link S3Backend.start}.
 */
export const createS3Backend: BackendFactory = async (options, ctx) => {
  const backend = new S3Backend(s3OptionsFromConfig(options, ctx.name), ctx);
  try {
    await backend.start();
  } catch (err) {
    await backend.close();
    throw err;
  }
  return backend;
};
