/**
 * Options of the S3 tier, declared once ({@link S3_OPTIONS}): {@link S3BackendOptions}, their
 * defaults, the resolver that validates them and the reader of a tier's config object. Health
 * is not an S3 option: the circuit breaker around the tier is its one health mechanism.
 */
import * as v from 'valibot';
import type { Logger } from '../../util/log.ts';
import { bool, bytes, int, pattern, str } from '../../util/schema-kit.ts';
import { describe } from '../../util/validate.ts';
import {
  defineTierOptions,
  type OptionsOf,
  optional,
  required,
  withDefault,
} from '../core/tier-options.ts';
import { CHUNK_MAX_PAYLOAD_BYTES } from '../format/chunk-format.ts';

const ENTRIES = {
  bucket: required(str({ nonEmpty: true }), 'Bucket holding the chunk objects.'),
  region: withDefault(str({ nonEmpty: true }), 'us-east-1', 'Signing region.'),
  endpoint: optional(
    v.pipe(
      str({ nonEmpty: true }),
      v.check(
        (s) => URL.canParse(s),
        (i) => `must be an absolute URL such as "http://127.0.0.1:9000", got ${describe(i.input)}`,
      ),
    ),
    'Custom endpoint URL for self-hosted S3 (MinIO, Ceph, s3rver), e.g. "http://127.0.0.1:9000".',
  ),
  forcePathStyle: optional(
    bool(),
    'Path-style addressing (host/bucket/key); default true when endpoint is set, else false.',
  ),
  accessKeyId: optional(
    str({ nonEmpty: true }),
    "Static credentials: give both keys or neither (then the SDK's default provider chain is used).",
  ),
  secretAccessKey: optional(str({ nonEmpty: true }), 'Static credentials: the secret key.'),
  sessionToken: optional(str({ nonEmpty: true }), 'Static credentials: a session token.'),
  keyPrefix: withDefault(
    pattern(/^(?!\/)/, 'must be a string not starting with "/"'),
    'kvtier/',
    'Prefix of every object key; an object is <keyPrefix><namespace>/<hash>.',
  ),
  concurrency: withDefault(
    int(1, 1024),
    32,
    "Most S3 requests in flight at once (also the HTTP agent's socket bound).",
  ),
  timeoutMs: withDefault(
    int(1, 600_000),
    5000,
    'Per-request deadline (SDK retries included), ms; a put (HEAD then PUT) shares one.',
  ),
  maxAttempts: withDefault(int(1, 10), 2, 'SDK attempts per request, all within timeoutMs.'),
  createBucket: withDefault(bool(), false, 'Create the bucket on start when it does not exist.'),
  maxChunkBytes: withDefault(
    bytes(1, CHUNK_MAX_PAYLOAD_BYTES),
    CHUNK_MAX_PAYLOAD_BYTES,
    "Largest payload in bytes (at most the chunk format's bound, 2 GiB).",
  ),
};

/** Options of {@link S3Backend}: the keys of {@link S3_OPTIONS}, and hooks code may give. */
export interface S3BackendOptions extends OptionsOf<typeof ENTRIES> {
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

/** The S3 tier's options: names, types, bounds, defaults and descriptions. */
export const S3_OPTIONS = defineTierOptions({
  type: 's3',
  description: 'An S3 bucket (AWS, MinIO, Ceph): one object per chunk, written in one PUT.',
  options: ENTRIES,
  example: { bucket: 'kvtier' },
  checks: [
    (o) =>
      (o.accessKeyId === undefined) !== (o.secretAccessKey === undefined)
        ? {
            key: o.accessKeyId === undefined ? 'accessKeyId' : 'secretAccessKey',
            message:
              'accessKeyId and secretAccessKey must be given together (or neither, for the default chain)',
          }
        : undefined,
    (o) =>
      o.sessionToken !== undefined && o.accessKeyId === undefined
        ? { key: 'sessionToken', message: 'needs accessKeyId and secretAccessKey' }
        : undefined,
  ],
  finish: ({ accessKeyId, secretAccessKey, sessionToken, ...o }): ResolvedS3BackendOptions => ({
    ...o,
    endpoint: o.endpoint ?? undefined,
    forcePathStyle: o.forcePathStyle ?? o.endpoint !== null,
    credentials:
      accessKeyId !== null && secretAccessKey !== null
        ? { accessKeyId, secretAccessKey, ...(sessionToken !== null ? { sessionToken } : {}) }
        : undefined,
  }),
});

/** Defaults of {@link S3BackendOptions}, in one place. */
export const S3_BACKEND_DEFAULTS = S3_OPTIONS.defaults;

/**
 * Applies defaults and validates.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the bad option and what is allowed.
 */
export function resolveS3BackendOptions(o: S3BackendOptions): ResolvedS3BackendOptions {
  return S3_OPTIONS.resolve(o);
}

/**
 * Reads S3 options from a plain config object (the keys of {@link S3_OPTIONS}; not the
 * callbacks).
 * @throws KvtierError `KVT_CONFIG` naming the tier and the bad or unknown option.
 */
export function s3OptionsFromConfig(raw: Record<string, unknown>, tier = 's3'): S3BackendOptions {
  return S3_OPTIONS.fromConfig(raw, tier);
}
