import { Agent as HttpAgent } from 'node:http';
import { Agent as HttpsAgent } from 'node:https';
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
  S3Client,
  type S3ClientConfig,
} from '@aws-sdk/client-s3';
import pLimit, { type LimitFunction } from 'p-limit';
import { abortedError, closedError, isKvtierError, KvtierError } from '../errors.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import { describe, requireBoolean, requireInt, requireString } from '../util/validate.ts';
import { CHUNK_MAX_PAYLOAD_BYTES, decodeChunkObject, encodeChunkObject } from './chunk-format.ts';
import { optionsFromConfig } from './config-options.ts';
import { checkChunk } from './local-cpu.ts';
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
} from './types.ts';

/** Options of {@link S3Backend}. */
export interface S3BackendOptions {
  /** Bucket holding the chunk objects (required). */
  bucket: string;
  /** Signing region; default 'us-east-1'. */
  region?: string;
  /** Custom endpoint URL for self-hosted S3 (MinIO, Ceph, s3rver), e.g. 'http://127.0.0.1:9000'. */
  endpoint?: string;
  /** Path-style addressing (`host/bucket/key`); default true when `endpoint` is set, else false. */
  forcePathStyle?: boolean;
  /** Static credentials; give both or neither (then the SDK's default provider chain is used). */
  accessKeyId?: string;
  secretAccessKey?: string;
  sessionToken?: string;
  /** Prefix of every object key; an object is `<keyPrefix><ns>/<hash>`. Default 'kvtier/'. */
  keyPrefix?: string;
  /** Most S3 requests in flight at once (also the HTTP agent's socket bound); default 32. */
  concurrency?: number;
  /**
   * Per-request deadline in ms (SDK retries included); default 5000. A put (HEAD then PUT) shares
   * one deadline, so every call settles within `timeoutMs` of its first request starting.
   */
  timeoutMs?: number;
  /** SDK attempts per request, all within `timeoutMs`; default 2 (one retry). */
  maxAttempts?: number;
  /** Consecutive failed requests after which `health()` is 'down'; default 3. */
  failureThreshold?: number;
  /** Create the bucket on start when it does not exist; default false. */
  createBucket?: boolean;
  /** Largest payload in bytes; default and maximum 2 GiB (the chunk format's bound). */
  maxChunkBytes?: number;
  /** Called once per corrupt object found (it is then deleted and counted). */
  onCorrupt?: (reason: string) => void;
  log?: Logger;
}

/** S3 options after defaults and validation. */
export interface ResolvedS3BackendOptions {
  readonly bucket: string;
  readonly region: string;
  readonly endpoint: string | undefined;
  readonly forcePathStyle: boolean;
  readonly credentials:
    | { accessKeyId: string; secretAccessKey: string; sessionToken?: string }
    | undefined;
  readonly keyPrefix: string;
  readonly concurrency: number;
  readonly timeoutMs: number;
  readonly maxAttempts: number;
  readonly failureThreshold: number;
  readonly createBucket: boolean;
  readonly maxChunkBytes: number;
}

/** Defaults of {@link S3BackendOptions}, in one place. */
export const S3_BACKEND_DEFAULTS = Object.freeze({
  region: 'us-east-1',
  keyPrefix: 'kvtier/',
  concurrency: 32,
  timeoutMs: 5000,
  maxAttempts: 2,
  failureThreshold: 3,
  createBucket: false,
  maxChunkBytes: CHUNK_MAX_PAYLOAD_BYTES,
});

const CONFIG_KEYS: readonly string[] = [
  'bucket',
  'region',
  'endpoint',
  'forcePathStyle',
  'accessKeyId',
  'secretAccessKey',
  'sessionToken',
  'keyPrefix',
  'concurrency',
  'timeoutMs',
  'maxAttempts',
  'failureThreshold',
  'createBucket',
  'maxChunkBytes',
];

/** S3's limit on keys per DeleteObjects request. */
const DELETE_BATCH = 1000;
const NS_RE = /^[0-9a-f]{32}$/;
const HASH_RE = /^[0-9a-f]{64}$/;

function invalid(message: string): KvtierError {
  return new KvtierError('KVT_INVALID_ARGUMENT', message);
}

function optString(name: string, v: unknown): string | undefined {
  return v === undefined ? undefined : requireString(name, v, { nonEmpty: true });
}

/**
 * Applies defaults and validates.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the bad option and what is allowed.
 */
export function resolveS3BackendOptions(o: S3BackendOptions): ResolvedS3BackendOptions {
  if (typeof o !== 'object' || o === null)
    throw invalid(`options must be an object, got ${describe(o)}`);
  const bucket = requireString('bucket', o.bucket, { nonEmpty: true });
  const endpoint = optString('endpoint', o.endpoint);
  if (endpoint !== undefined && !URL.canParse(endpoint))
    throw invalid(
      `endpoint must be an absolute URL such as "http://127.0.0.1:9000", got ${describe(endpoint)}`,
    );
  const accessKeyId = optString('accessKeyId', o.accessKeyId);
  const secretAccessKey = optString('secretAccessKey', o.secretAccessKey);
  const sessionToken = optString('sessionToken', o.sessionToken);
  if ((accessKeyId === undefined) !== (secretAccessKey === undefined))
    throw invalid(
      'accessKeyId and secretAccessKey must be given together (or neither, for the default chain)',
    );
  if (sessionToken !== undefined && accessKeyId === undefined)
    throw invalid('sessionToken needs accessKeyId and secretAccessKey');
  const keyPrefix = requireString('keyPrefix', o.keyPrefix ?? S3_BACKEND_DEFAULTS.keyPrefix);
  if (keyPrefix.startsWith('/'))
    throw invalid(`keyPrefix must not start with "/", got ${describe(keyPrefix)}`);
  const d = S3_BACKEND_DEFAULTS;
  return {
    bucket,
    region: requireString('region', o.region ?? d.region, { nonEmpty: true }),
    endpoint,
    forcePathStyle: requireBoolean('forcePathStyle', o.forcePathStyle ?? endpoint !== undefined),
    credentials:
      accessKeyId !== undefined && secretAccessKey !== undefined
        ? { accessKeyId, secretAccessKey, ...(sessionToken !== undefined ? { sessionToken } : {}) }
        : undefined,
    keyPrefix,
    concurrency: requireInt('concurrency', o.concurrency ?? d.concurrency, 1, 1024),
    timeoutMs: requireInt('timeoutMs', o.timeoutMs ?? d.timeoutMs, 1, 600_000),
    maxAttempts: requireInt('maxAttempts', o.maxAttempts ?? d.maxAttempts, 1, 10),
    failureThreshold: requireInt(
      'failureThreshold',
      o.failureThreshold ?? d.failureThreshold,
      1,
      1000,
    ),
    createBucket: requireBoolean('createBucket', o.createBucket ?? d.createBucket),
    maxChunkBytes: requireInt(
      'maxChunkBytes',
      o.maxChunkBytes ?? d.maxChunkBytes,
      1,
      CHUNK_MAX_PAYLOAD_BYTES,
    ),
  };
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

/** How one request ended: its value, a 404, or a failure (already counted in health). */
type Outcome<T> =
  | { ok: true; value: T }
  | { ok: false; notFound: true }
  | { ok: false; notFound: false; error: KvtierError };

/** Thrown for an outcome that must be a success. */
function failure(o: { ok: false; notFound: boolean; error?: KvtierError }, what: string): Error {
  return o.error ?? new KvtierError('KVT_BACKEND', `${what}: S3 answered 404 (no such bucket?)`);
}

/**
 * S3 tier: one object per chunk (`<keyPrefix><ns>/<hash>`, the stored chunk format), written
 * with one PutObject of known length (atomic), read with GetObject and verified; a corrupt or
 * misplaced object is a miss, is deleted and counted. Requests run under a concurrency bound,
 * each with a deadline. `health()` is 'degraded' after a failed request, 'down' after
 * `failureThreshold` consecutive ones and 'up' after any request that reaches the service
 * (calls made while down still try, so they double as probes). Shared and persistent; no pins
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
  readonly #client: S3Client;
  readonly #limit: LimitFunction;
  readonly #onCorrupt: ((reason: string) => void) | undefined;
  readonly #log: Logger;
  readonly #inflight = new Set<AbortController>();
  /** Latest put per key, so a second put of the key waits and then finds it. */
  readonly #putting = new Map<string, Promise<PutOutcome>>();
  #consecutiveFailures = 0;
  #requestFailures = 0;
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
    this.#limit = pLimit(o.concurrency);
    const agentOpts = { keepAlive: true, maxSockets: o.concurrency };
    const config: S3ClientConfig = {
      region: o.region,
      forcePathStyle: o.forcePathStyle,
      maxAttempts: o.maxAttempts,
      // Without these the SDK frames bodies as aws-chunked with trailing checksums, which
      // several S3-compatible servers store verbatim: silently corrupt objects.
      requestChecksumCalculation: 'WHEN_REQUIRED',
      responseChecksumValidation: 'WHEN_REQUIRED',
      requestHandler: {
        httpAgent: new HttpAgent(agentOpts),
        httpsAgent: new HttpsAgent(agentOpts),
        connectionTimeout: o.timeoutMs,
        requestTimeout: o.timeoutMs,
      },
      ...(o.endpoint !== undefined ? { endpoint: o.endpoint } : {}),
      ...(o.credentials !== undefined ? { credentials: o.credentials } : {}),
    };
    this.#client = new S3Client(config);
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
    return this.#client;
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
    const head = await this.#request('start', (s) =>
      this.#client.send(new HeadBucketCommand({ Bucket }), { abortSignal: s }),
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
    const made = await this.#request('start', (s) =>
      this.#client.send(new CreateBucketCommand({ Bucket }), { abortSignal: s }),
    );
    if (!made.ok) throw failure(made, `creating S3 bucket "${Bucket}"`);
  }

  async batchedContains(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: ContainsOptions = {},
  ): Promise<number> {
    this.#checkOpen(opts.signal, 'contains');
    checkKeys(ns, hashes);
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
    checkKeys(ns, hashes);
    const out = new Map<ChunkHash, Chunk | null>(hashes.map((h) => [h, null]));
    const errors: KvtierError[] = [];
    let reached = 0;
    const Bucket = this.#o.bucket;
    await Promise.all(
      [...out.keys()].map(async (hash) => {
        const Key = this.#key(ns, hash);
        const r = await this.#request(
          'get',
          async (s) => {
            const res = await this.#client.send(new GetObjectCommand({ Bucket, Key }), {
              abortSignal: s,
            });
            if (res.Body === undefined) throw new Error('GetObject answered without a body');
            return res.Body.transformToByteArray();
          },
          opts.signal,
        );
        if (!r.ok) {
          if (r.notFound) reached++;
          else errors.push(r.error);
          return;
        }
        reached++;
        const decoded = decodeChunkObject(ns, hash, r.value);
        if (decoded.ok) out.set(hash, decoded.chunk);
        else await this.#corrupt(ns, hash, decoded.reason, r.value.byteLength);
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
    checkKeys(ns, [hash]);
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
    const head = await this.#head('put', ns, hash, signal, undefined, deadline);
    if (head.ok) return 'exists';
    if (!head.notFound) throw head.error;
    const Body = encodeChunkObject(ns, hash, chunk);
    const Bucket = this.#o.bucket;
    const Key = this.#key(ns, hash);
    const put = await this.#request(
      'put',
      (s) =>
        this.#client.send(
          new PutObjectCommand({ Bucket, Key, Body, ContentLength: Body.byteLength }),
          { abortSignal: s },
        ),
      signal,
      undefined,
      deadline,
    );
    if (!put.ok) throw failure(put, `${this.name} put`);
    this.#chunks++;
    this.#bytesUsed += Body.byteLength;
    return 'stored';
  }

  async remove(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    this.#checkOpen(undefined, 'remove');
    checkKeys(ns, hashes);
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
    if (ns !== undefined) checkKeys(ns, []);
    const Bucket = this.#o.bucket;
    const Prefix = ns === undefined ? this.#o.keyPrefix : `${this.#o.keyPrefix}${ns}/`;
    let token: string | undefined;
    do {
      const ContinuationToken = token;
      const page = await this.#request('clear', (s) =>
        this.#client.send(new ListObjectsV2Command({ Bucket, Prefix, ContinuationToken }), {
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
      requestFailures: this.#requestFailures,
      activeRequests: this.#limit.activeCount,
      pendingRequests: this.#limit.pendingCount,
    };
  }

  health(): BackendHealth {
    this.#checkOpen(undefined, 'health');
    if (this.#consecutiveFailures === 0) return 'up';
    return this.#consecutiveFailures >= this.#o.failureThreshold ? 'down' : 'degraded';
  }

  /** Aborts requests in flight (they reject with `KVT_CLOSED`), then destroys the client. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      const err = closedError(`backend ${this.name}`);
      for (const ac of this.#inflight) ac.abort(err);
      // Runs after every queued request, each of which settles at once once closed.
      await this.#limit(() => undefined);
      this.#client.destroy();
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
    return this.#request(
      op,
      (s) => this.#client.send(new HeadObjectCommand({ Bucket, Key }), { abortSignal: s }),
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
    const r = await this.#request('delete', (s) =>
      this.#client.send(new DeleteObjectCommand({ Bucket, Key }), { abortSignal: s }),
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
        const r = await this.#request('delete', (s) =>
          this.#client.send(new DeleteObjectsCommand({ Bucket, Delete }), { abortSignal: s }),
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

  /**
   * Runs one request under the concurrency bound, with a deadline of `timeoutMs` from when it
   * starts (or the shared `deadline`, set by its first request). Rejects only for the caller's
   * abort or close; S3 failures come back as outcomes and update health. With `skip` true when
   * its turn comes, a request settles as a 404 without being sent (the answer no longer needs
   * it). The caller is answered as soon as the deadline passes; the slot stays taken until the
   * SDK call ends, so the bound on requests in flight holds.
   */
  #request<T>(
    op: string,
    run: (signal: AbortSignal) => Promise<T>,
    signal?: AbortSignal,
    skip?: () => boolean,
    deadline?: { at: number },
  ): Promise<Outcome<T>> {
    const what = `${this.name} ${op}`;
    return new Promise<Outcome<T>>((resolve, reject) => {
      const onQueuedAbort = () => reject(abortedError(signal, what));
      signal?.addEventListener('abort', onQueuedAbort, { once: true });
      const task = async (): Promise<void> => {
        signal?.removeEventListener('abort', onQueuedAbort);
        if (this.#closing !== null) return reject(closedError(`backend ${this.name}`));
        if (signal?.aborted === true) return reject(abortedError(signal, what));
        if (skip?.() === true) return resolve({ ok: false, notFound: true });
        const now = Date.now();
        if (deadline !== undefined && deadline.at === 0) deadline.at = now + this.#o.timeoutMs;
        const ms = deadline === undefined ? this.#o.timeoutMs : Math.max(0, deadline.at - now);
        const ac = new AbortController();
        const timer = setTimeout(
          () => ac.abort(new KvtierError('KVT_TIMEOUT', `${what}: no answer from S3 in ${ms} ms`)),
          ms,
        );
        const onAbort = () => ac.abort(signal?.reason);
        signal?.addEventListener('abort', onAbort, { once: true });
        const settle = (err: unknown) => {
          const reason: unknown = ac.signal.reason;
          if (isKvtierError(reason, 'KVT_CLOSED')) return reject(reason);
          if (signal?.aborted === true) return reject(abortedError(signal, what));
          if (!ac.signal.aborted && isNotFound(err)) {
            this.#succeeded();
            return resolve({ ok: false, notFound: true });
          }
          resolve({ ok: false, notFound: false, error: this.#failed(what, reason ?? err) });
        };
        const onSettle = () => settle(undefined);
        ac.signal.addEventListener('abort', onSettle, { once: true });
        this.#inflight.add(ac);
        try {
          const value = await run(ac.signal);
          if (ac.signal.aborted) return;
          this.#succeeded();
          resolve({ ok: true, value });
        } catch (err) {
          if (!ac.signal.aborted) settle(err);
        } finally {
          clearTimeout(timer);
          this.#inflight.delete(ac);
          ac.signal.removeEventListener('abort', onSettle);
          signal?.removeEventListener('abort', onAbort);
        }
      };
      this.#limit(task).catch(reject);
    });
  }

  #succeeded(): void {
    if (this.#consecutiveFailures >= this.#o.failureThreshold)
      this.#log.info('S3 reachable again', { tier: this.name });
    this.#consecutiveFailures = 0;
  }

  #failed(what: string, err: unknown): KvtierError {
    this.#requestFailures++;
    this.#consecutiveFailures++;
    if (this.#consecutiveFailures === this.#o.failureThreshold)
      this.#log.error('S3 failing; health is down', { tier: this.name, err });
    if (err instanceof KvtierError) return err;
    const name = err instanceof Error ? err.name : 'Error';
    const msg = err instanceof Error ? err.message : String(err);
    const code =
      name === 'TimeoutError' && /timed? ?out/i.test(msg) ? 'KVT_TIMEOUT' : 'KVT_BACKEND';
    return new KvtierError(code, `${what} failed: ${name}: ${msg}`, { cause: err });
  }
}

function isNotFound(err: unknown): boolean {
  if (typeof err !== 'object' || err === null) return false;
  const e = err as { name?: unknown; $metadata?: { httpStatusCode?: unknown } };
  return e.$metadata?.httpStatusCode === 404 || e.name === 'NotFound' || e.name === 'NoSuchKey';
}

/** @throws KvtierError `KVT_INVALID_ARGUMENT` unless ns and hashes are lowercase hex ids. */
function checkKeys(ns: NamespaceId, hashes: readonly ChunkHash[]): void {
  if (typeof ns !== 'string' || !NS_RE.test(ns))
    throw invalid(`namespace must be 32 lowercase hex digits, got ${describe(ns)}`);
  for (const h of hashes)
    if (typeof h !== 'string' || !HASH_RE.test(h))
      throw invalid(`chunk hash must be 64 lowercase hex digits, got ${describe(h)}`);
}

/**
 * Reads S3 options from a plain config object (the keys of {@link S3BackendOptions} except the
 * callbacks).
 * @throws KvtierError `KVT_CONFIG` naming the tier and the bad or unknown option.
 */
export function s3OptionsFromConfig(raw: Record<string, unknown>, tier = 's3'): S3BackendOptions {
  return optionsFromConfig(raw, tier, 's3', CONFIG_KEYS, resolveS3BackendOptions);
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
