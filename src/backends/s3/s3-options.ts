/**
 * Options of the S3 tier: {@link S3BackendOptions}, their defaults in one place, the resolver
 * that validates them and the reader of a tier's config object. Health is not an S3 option: the
 * circuit breaker around the tier is its one health mechanism.
 */
import { KvtierError } from '../../errors.ts';
import type { Logger } from '../../util/log.ts';
import { describe, requireBoolean, requireInt, requireString } from '../../util/validate.ts';
import { optionsFromConfig } from '../core/config-options.ts';
import { CHUNK_MAX_PAYLOAD_BYTES } from '../format/chunk-format.ts';

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
  'createBucket',
  'maxChunkBytes',
];

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
    createBucket: requireBoolean('createBucket', o.createBucket ?? d.createBucket),
    maxChunkBytes: requireInt(
      'maxChunkBytes',
      o.maxChunkBytes ?? d.maxChunkBytes,
      1,
      CHUNK_MAX_PAYLOAD_BYTES,
    ),
  };
}

/**
 * Reads S3 options from a plain config object (the keys of {@link S3BackendOptions} except the
 * callbacks).
 * @throws KvtierError `KVT_CONFIG` naming the tier and the bad or unknown option.
 */
export function s3OptionsFromConfig(raw: Record<string, unknown>, tier = 's3'): S3BackendOptions {
  return optionsFromConfig(raw, tier, 's3', CONFIG_KEYS, resolveS3BackendOptions);
}
