/**
 * The S3 tier's {@link KvStore}: one object per chunk, `<keyPrefix><ns>/<hash>` (the store key as
 * it is under the prefix), written with one PutObject of known length (atomic) after a HEAD
 * (both share one `timeoutMs` deadline), read with GetObject into one pooled buffer of its
 * Content-Length (given back once the tier has copied the chunk) and checksummed as it arrives. Every request runs under the concurrency bound
 * with its own deadline (s3-requests.ts). No count: a shared bucket has no cheap one.
 *
 * Put-if-absent: the HEAD spares uploading an object that exists, and the PutObject is
 * conditional (`If-None-Match: *`), so two sidecars that both found the key absent do not both
 * write it: S3 answers the second 412 (false), or 409 while the first is still in progress (it
 * looks again after a short wait, within the put's deadline). A service that does not implement
 * conditional writes (501) gets plain PutObjects from then on, logged once: there, two sidecars
 * racing on one key may both answer true (each wrote a whole object; the last one stays).
 */
import { setTimeout as delay } from 'node:timers/promises';
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
} from '@aws-sdk/client-s3';
import { abortedError, closedError, KvtierError } from '../../errors.ts';
import type { Logger } from '../../util/log.ts';
import { BufferPool } from '../arena/buffer-pool.ts';
import type { BackendHealth } from '../core/types.ts';
import {
  type KvStore,
  type KvStoreInfo,
  type StoreCallOptions,
  type StoredValue,
  type StoreGetOptions,
  type StoreKey,
  type StoreTally,
  storeKeyParts,
} from '../store/kv-store.ts';
import type { ResolvedS3BackendOptions } from './s3-options.ts';
import { failure, type Outcome, readBody, S3Requests } from './s3-requests.ts';

/** S3's limit on keys per DeleteObjects request. */
const DELETE_BATCH = 1000;
/** First and longest wait before a put answered 409 (a conditional put in progress) looks again. */
const CONFLICT_RETRY_MS = 25;
const CONFLICT_RETRY_MAX_MS = 400;

/** An S3 (or S3-compatible) {@link KvStore}; see the file's comment. */
export class S3Store implements KvStore {
  readonly info: KvStoreInfo = Object.freeze({
    persistent: true,
    shared: true,
    evicts: false,
    ttl: false,
  });
  /** Requests of this store, bounded and deadlined; owns the SDK client. */
  readonly requests: S3Requests;
  readonly #o: ResolvedS3BackendOptions;
  readonly #name: string;
  readonly #log: Logger;
  /** Object buffers of gets, back once the tier has copied them into host memory. */
  readonly #pool = new BufferPool(32, 64 * 1024 * 1024);
  /** Whether puts are sent with `If-None-Match: *` (until the service answers 501 to one). */
  #conditional = true;

  constructor(o: ResolvedS3BackendOptions, name: string, log: Logger) {
    this.#o = o;
    this.#name = name;
    this.#log = log;
    this.requests = new S3Requests(o, name, log);
  }

  /**
   * Checks the bucket, creating it with `createBucket`.
   * @throws KvtierError `KVT_CONFIG` when the bucket does not exist and `createBucket` is off;
   *   `KVT_BACKEND`/`KVT_TIMEOUT` when the service cannot be reached (the registry may then start
   *   the tier down, and a later start checks again) or the bucket must be created and cannot be.
   */
  async start(): Promise<void> {
    const Bucket = this.#o.bucket;
    const s3 = this.requests;
    const head = await s3.request('start', (s) =>
      s3.client.send(new HeadBucketCommand({ Bucket }), { abortSignal: s }),
    );
    if (head.ok) return;
    if (!head.notFound) throw head.error;
    if (!this.#o.createBucket)
      throw new KvtierError(
        'KVT_CONFIG',
        `S3 bucket "${Bucket}" does not exist (create it, or set createBucket: true)`,
      );
    const made = await s3.request('start', (s) =>
      s3.client.send(new CreateBucketCommand({ Bucket }), { abortSignal: s }),
    );
    if (!made.ok) throw failure(made, `creating S3 bucket "${Bucket}"`);
  }

  async get(key: StoreKey, opts: StoreGetOptions): Promise<StoredValue | null> {
    const Bucket = this.#o.bucket;
    const Key = this.#key(key);
    const maxBytes = opts.maxBytes ?? Number.MAX_SAFE_INTEGER;
    const crcFrom = opts.crc32cFrom ?? 0;
    const r = await this.requests.request(
      'get',
      async (s) => {
        const res = await this.requests.client.send(new GetObjectCommand({ Bucket, Key }), {
          abortSignal: s,
        });
        if (res.Body === undefined) throw new Error('GetObject answered without a body');
        return readBody(res.Body, res.ContentLength, maxBytes, crcFrom, this.#pool);
      },
      opts.signal,
    );
    if (r.ok) return r.value;
    if (r.notFound) return null;
    throw r.error;
  }

  async has(key: StoreKey, opts: StoreCallOptions): Promise<boolean> {
    const r = await this.#head('contains', key, opts.signal);
    if (r.ok) return true;
    if (r.notFound) return false;
    throw r.error;
  }

  /**
   * HEAD, then one conditional PutObject of known length when the key is absent (see the file's
   * comment); one shared deadline.
   */
  put(key: StoreKey, value: Uint8Array, opts: StoreCallOptions): Promise<boolean> {
    return this.putFilling(key, value, Promise.resolve(), opts);
  }

  /** {@link put} with the HEAD sent while the wrapper encodes `value`. */
  async putFilling(
    key: StoreKey,
    value: Uint8Array,
    filled: Promise<void>,
    opts: StoreCallOptions,
  ): Promise<boolean> {
    const deadline = { at: 0 };
    const head = await this.#head('put', key, opts.signal, deadline);
    if (head.ok) return false;
    if (!head.notFound) throw head.error;
    await filled;
    for (let wait = CONFLICT_RETRY_MS; ; wait = Math.min(2 * wait, CONFLICT_RETRY_MAX_MS)) {
      const answer = await this.#putOnce(key, value, opts.signal, deadline);
      if (answer !== 'conflict') return answer === 'stored';
      // 409: another conditional put of the key is in progress. Once it ends the key is stored
      // (false) or still absent (ours is sent again); the shared deadline bounds the waiting.
      await delay(wait, undefined, opts.signal === undefined ? {} : { signal: opts.signal }).catch(
        () => {
          throw abortedError(opts.signal, `${this.#name} put`);
        },
      );
      const again = await this.#head('put', key, opts.signal, deadline);
      if (again.ok) return false;
      if (!again.notFound) throw again.error;
    }
  }

  /** One conditional PutObject, or a plain one once the service has answered 501 to one. */
  async #putOnce(
    key: StoreKey,
    value: Uint8Array,
    signal: AbortSignal | undefined,
    deadline: { at: number },
  ): Promise<'stored' | 'exists' | 'conflict'> {
    const answer = await this.#putObject(key, value, signal, deadline, this.#conditional);
    if (answer !== 'unsupported') return answer;
    if (this.#conditional)
      this.#log.warn('S3 service does not implement conditional writes; puts are plain', {
        tier: this.#name,
      });
    this.#conditional = false;
    return (await this.#putObject(key, value, signal, deadline, false)) as 'stored';
  }

  /** One PutObject, `If-None-Match: *` when `conditional`; what S3 answered. */
  async #putObject(
    key: StoreKey,
    value: Uint8Array,
    signal: AbortSignal | undefined,
    deadline: { at: number },
    conditional: boolean,
  ): Promise<'stored' | 'exists' | 'conflict' | 'unsupported'> {
    const Bucket = this.#o.bucket;
    const Key = this.#key(key);
    const IfNoneMatch = conditional ? '*' : undefined;
    const put = await this.requests.request(
      'put',
      (s) =>
        this.requests.client
          .send(
            new PutObjectCommand({
              Bucket,
              Key,
              Body: value,
              ContentLength: value.byteLength,
              IfNoneMatch,
            }),
            { abortSignal: s },
          )
          .then(
            () => 'stored' as const,
            (err: unknown) => {
              const status = httpStatus(err);
              if (conditional && status === 412) return 'exists' as const;
              if (conditional && status === 409) return 'conflict' as const;
              if (conditional && status === 501) return 'unsupported' as const;
              throw err;
            },
          ),
      signal,
      undefined,
      deadline,
    );
    if (!put.ok) throw failure(put, `${this.#name} put`);
    return put.value;
  }

  /** HEAD (for the size), then DeleteObject; false when there was no object. */
  async delete(key: StoreKey, opts: StoreCallOptions): Promise<number | false> {
    const head = await this.#head('remove', key, opts.signal);
    if (!head.ok) {
      if (head.notFound) return false;
      throw head.error;
    }
    const Bucket = this.#o.bucket;
    const Key = this.#key(key);
    const r = await this.requests.request(
      'delete',
      (s) =>
        this.requests.client.send(new DeleteObjectCommand({ Bucket, Key }), { abortSignal: s }),
      opts.signal,
    );
    if (!r.ok && !r.notFound) throw r.error;
    return head.value.ContentLength ?? 0;
  }

  /**
   * Deletes every object under `<keyPrefix><prefix>` (ListObjectsV2 pages, DeleteObjects in
   * batches of 1000). Each request is bounded by `timeoutMs`, not the whole.
   */
  async clear(prefix: string): Promise<StoreTally> {
    const s3 = this.requests;
    const Bucket = this.#o.bucket;
    const Prefix = `${this.#o.keyPrefix}${prefix}`;
    let keys = 0;
    let bytes = 0;
    let token: string | undefined;
    do {
      const ContinuationToken = token;
      const page = await s3.request('clear', (s) =>
        s3.client.send(new ListObjectsV2Command({ Bucket, Prefix, ContinuationToken }), {
          abortSignal: s,
        }),
      );
      if (!page.ok) throw failure(page, `${this.#name} clear`);
      const objects = page.value.Contents ?? [];
      const names = objects.flatMap((c) => (c.Key === undefined ? [] : [c.Key]));
      await this.#deleteKeys(names);
      keys += names.length;
      bytes += objects.reduce((n, c) => n + (c.Size ?? 0), 0);
      token = page.value.IsTruncated === true ? page.value.NextContinuationToken : undefined;
    } while (token !== undefined);
    return { keys, bytes };
  }

  /**
   * The objects under `<keyPrefix><prefix>` that are chunk keys, with their sizes, a
   * ListObjectsV2 page at a time (each request bounded by `timeoutMs`, not the whole).
   */
  async *list(
    prefix: string,
    opts: StoreCallOptions,
  ): AsyncGenerator<{ readonly key: StoreKey; readonly bytes: number }> {
    const s3 = this.requests;
    const Bucket = this.#o.bucket;
    const lead = this.#o.keyPrefix;
    const Prefix = `${lead}${prefix}`;
    let token: string | undefined;
    do {
      const ContinuationToken = token;
      const page = await s3.request(
        'list',
        (s) =>
          s3.client.send(new ListObjectsV2Command({ Bucket, Prefix, ContinuationToken }), {
            abortSignal: s,
          }),
        opts.signal,
      );
      if (!page.ok) throw failure(page, `${this.#name} list`);
      for (const c of page.value.Contents ?? []) {
        if (c.Key === undefined || !c.Key.startsWith(lead)) continue;
        const key = c.Key.slice(lead.length);
        if (storeKeyParts(key) !== null) yield { key: key as StoreKey, bytes: c.Size ?? 0 };
      }
      token = page.value.IsTruncated === true ? page.value.NextContinuationToken : undefined;
    } while (token !== undefined);
  }

  /** 'degraded' while the latest request failed, 'up' once one reaches the service. */
  health(): BackendHealth {
    return this.requests.lastFailed ? 'degraded' : 'up';
  }

  stats(): Readonly<Record<string, number>> {
    return {
      requestFailures: this.requests.failures,
      activeRequests: this.requests.active,
      pendingRequests: this.requests.pending,
    };
  }

  /** Aborts requests in flight (they reject with `KVT_CLOSED`), then destroys the client. */
  close(): Promise<void> {
    return this.requests.close(closedError(`backend ${this.#name}`));
  }

  #key(key: StoreKey): string {
    return `${this.#o.keyPrefix}${key}`;
  }

  #head(
    op: string,
    key: StoreKey,
    signal: AbortSignal | undefined,
    deadline?: { at: number },
  ): Promise<Outcome<HeadObjectCommandOutput>> {
    const Bucket = this.#o.bucket;
    const Key = this.#key(key);
    return this.requests.request(
      op,
      (s) => this.requests.client.send(new HeadObjectCommand({ Bucket, Key }), { abortSignal: s }),
      signal,
      undefined,
      deadline,
    );
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
        const r = await this.requests.request('delete', (s) =>
          this.requests.client.send(new DeleteObjectsCommand({ Bucket, Delete }), {
            abortSignal: s,
          }),
        );
        if (!r.ok) throw failure(r, `${this.#name} delete`);
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

/** The HTTP status of an SDK error, when it has one. */
function httpStatus(err: unknown): number | undefined {
  const status = (err as { $metadata?: { httpStatusCode?: unknown } } | null)?.$metadata
    ?.httpStatusCode;
  return typeof status === 'number' ? status : undefined;
}
