/**
 * The schema of one tier in the config file, per built-in backend type. A tier is
 * `{ name?, type, health?, ...options }`; the options are the backend's `XOptions` as a config
 * file can give them (byte sizes as "8GiB", no callbacks). Bounds mirror each backend's options
 * resolver (test/unit/config-schema.test.ts checks they agree at the boundaries); the backends'
 * defaults stay in the backends (`*_DEFAULTS`), and the JSON Schema reports them from there.
 */
import * as v from 'valibot';
import {
  DEFAULT_PAGE_BYTES,
  MAX_SLAB_BYTES,
  MIN_PAGE_BYTES,
} from '../backends/arena/host-arena.ts';
import { FSYNC_POLICIES, MAX_SHARD_CHARS } from '../backends/files/file-store.ts';
import { CHUNK_HEADER_BYTES, CHUNK_MAX_PAYLOAD_BYTES } from '../backends/format/chunk-format.ts';
import { describe } from '../util/validate.ts';
import {
  type AnySchema,
  bool,
  bytes,
  int,
  objectMsg,
  oneOf,
  pattern,
  str,
  strict,
} from './schema-kit.ts';

const HOUR_MS = 3_600_000;
const MAX_REDIS_CHUNK_BYTES = 512 * 1024 ** 2 - 64 * 1024;

/** Health and circuit-breaker settings of a tier below host memory, or `false` for none. */
export const healthSchema = v.union(
  [
    v.literal(false),
    strict({
      timeoutMs: v.optional(int(1, 600_000)),
      failureThreshold: v.optional(int(1, 1000)),
      probeIntervalMs: v.optional(int(1, HOUR_MS)),
    }),
  ],
  (i) =>
    `must be false or an object { timeoutMs, failureThreshold, probeIntervalMs }, got ${describe(i.input)}`,
);

/** Tier names: what a metric label and a log component can carry. */
export const TIER_NAME_RULE = 'must match [a-zA-Z0-9_.-]{1,64}';

/** The keys every tier has, whatever its type. */
function common(type: v.GenericSchema<string>) {
  return {
    name: v.optional(pattern(/^[a-zA-Z0-9_.-]{1,64}$/, TIER_NAME_RULE)),
    type,
    health: v.optional(healthSchema),
  };
}

/** A tier of a type the config does not know (registered by an embedder): options unchecked here. */
export const genericTierSchema = v.looseObject(
  common(pattern(/^.+$/, 'must be a backend type name')),
  (i) => objectMsg(i, 'must be an object { name, type, ...options }'),
);

type Check = (o: Record<string, unknown>) => { key: string; message: string } | undefined;

/** A tier of built-in `type` with these option entries and cross-option checks. */
function tier<const E extends v.ObjectEntries>(type: string, options: E, checks: Check[] = []) {
  const entries = { ...common(v.literal(type)), ...options };
  const allowed = Object.keys(entries).join(', ');
  return v.pipe(
    strict(entries, `unknown ${type} option; allowed: ${allowed}`),
    v.rawCheck(({ dataset, addIssue }) => {
      if (!dataset.typed) return;
      const o = dataset.value as Record<string, unknown>;
      for (const c of checks) {
        const bad = c(o);
        if (bad === undefined) continue;
        addIssue({
          message: bad.message,
          path: [{ type: 'object', origin: 'value', input: o, key: bad.key, value: o[bad.key] }],
        });
      }
    }),
  );
}

const localCpu = tier(
  'local-cpu',
  {
    capacityBytes: bytes(MIN_PAGE_BYTES),
    pageBytes: v.optional(bytes(MIN_PAGE_BYTES, MAX_SLAB_BYTES)),
    slabBytes: v.optional(bytes(MIN_PAGE_BYTES, MAX_SLAB_BYTES)),
    prefault: v.optional(bool()),
  },
  [
    (o) => {
      const page = o.pageBytes as number | undefined;
      return page !== undefined && (page & (page - 1)) !== 0
        ? { key: 'pageBytes', message: `must be a power of two >= ${MIN_PAGE_BYTES}, got ${page}` }
        : undefined;
    },
    (o) => {
      const page = (o.pageBytes as number | undefined) ?? DEFAULT_PAGE_BYTES;
      return (o.capacityBytes as number) < page
        ? {
            key: 'capacityBytes',
            message: `must be at least one page (${page} bytes), got ${o.capacityBytes}`,
          }
        : undefined;
    },
    (o) => {
      const page = (o.pageBytes as number | undefined) ?? DEFAULT_PAGE_BYTES;
      const slab = o.slabBytes as number | undefined;
      return slab !== undefined && (slab < page || slab % page !== 0)
        ? {
            key: 'slabBytes',
            message: `must be a multiple of pageBytes (${page}), got ${slab}`,
          }
        : undefined;
    },
  ],
);

const memory = tier('memory', {
  capacityBytes: v.optional(v.nullable(bytes(1))),
  maxChunkBytes: v.optional(bytes(0)),
});

const localDisk = tier('local-disk', {
  path: str({ nonEmpty: true }),
  capacityBytes: bytes(CHUNK_HEADER_BYTES + 1),
  fsync: v.optional(oneOf(FSYNC_POLICIES)),
  ioConcurrency: v.optional(int(1, 1024)),
  shardChars: v.optional(int(0, MAX_SHARD_CHARS)),
  maxChunkBytes: v.optional(bytes(1)),
  maxChunks: v.optional(int(1, 1 << 24)),
  timeoutMs: v.optional(int(1, HOUR_MS)),
  journal: v.optional(bool()),
});

const fs = tier('fs', {
  path: str({ nonEmpty: true }),
  shardChars: v.optional(int(0, MAX_SHARD_CHARS)),
  ioConcurrency: v.optional(int(1, 1024)),
  timeoutMs: v.optional(int(1, HOUR_MS)),
  capacityBytes: v.optional(v.nullable(bytes(CHUNK_HEADER_BYTES + 1))),
  ttlMs: v.optional(v.nullable(int(1))),
  sweepIntervalMs: v.optional(int(1)),
  staleTempMs: v.optional(int(1)),
  fsync: v.optional(oneOf(FSYNC_POLICIES)),
  maxChunkBytes: v.optional(bytes(1)),
});

const redisNode = strict({ host: str({ nonEmpty: true }), port: int(1, 65535) });

const redis = tier(
  'redis',
  {
    url: v.optional(pattern(/^rediss?:\/\/./, 'must start with redis:// or rediss://')),
    host: v.optional(str({ nonEmpty: true })),
    port: v.optional(int(1, 65535)),
    cluster: v.optional(
      strict({
        nodes: v.pipe(
          v.array(
            redisNode,
            (i) => `must be a non-empty array of { host, port }, got ${describe(i.input)}`,
          ),
          v.minLength(1, 'must be a non-empty array of { host, port }'),
        ),
      }),
    ),
    username: v.optional(str()),
    password: v.optional(str()),
    db: v.optional(int(0, 65535)),
    tls: v.optional(
      v.union(
        [v.boolean(), v.record(v.string(), v.unknown())],
        'must be a boolean or an object of TLS options',
      ),
    ),
    keyPrefix: v.optional(str()),
    ttlMs: v.optional(int(1)),
    timeoutMs: v.optional(int(1, 600_000)),
    connectTimeoutMs: v.optional(int(1, 600_000)),
    reconnectMaxDelayMs: v.optional(int(1, 600_000)),
    maxChunkBytes: v.optional(bytes(0, MAX_REDIS_CHUNK_BYTES)),
  },
  [
    (o) =>
      o.cluster !== undefined &&
      (o.url !== undefined || o.host !== undefined || o.port !== undefined)
        ? { key: 'cluster', message: 'give either cluster or url/host/port, not both' }
        : undefined,
    (o) =>
      o.url !== undefined && (o.host !== undefined || o.port !== undefined)
        ? { key: 'url', message: 'give either url or host/port, not both' }
        : undefined,
    (o) =>
      o.cluster !== undefined && o.db !== undefined && o.db !== 0
        ? { key: 'db', message: `must be 0 in cluster mode, got ${o.db}` }
        : undefined,
  ],
);

const s3 = tier(
  's3',
  {
    bucket: str({ nonEmpty: true }),
    region: v.optional(str({ nonEmpty: true })),
    endpoint: v.optional(
      v.pipe(
        str({ nonEmpty: true }),
        v.check(
          (s) => URL.canParse(s),
          (i) =>
            `must be an absolute URL such as "http://127.0.0.1:9000", got ${describe(i.input)}`,
        ),
      ),
    ),
    forcePathStyle: v.optional(bool()),
    accessKeyId: v.optional(str({ nonEmpty: true })),
    secretAccessKey: v.optional(str({ nonEmpty: true })),
    sessionToken: v.optional(str({ nonEmpty: true })),
    keyPrefix: v.optional(pattern(/^(?!\/)/, 'must be a string not starting with "/"')),
    concurrency: v.optional(int(1, 1024)),
    timeoutMs: v.optional(int(1, 600_000)),
    maxAttempts: v.optional(int(1, 10)),
    createBucket: v.optional(bool()),
    maxChunkBytes: v.optional(bytes(1, CHUNK_MAX_PAYLOAD_BYTES)),
  },
  [
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
);

const pluginOptionsMsg = (i: v.BaseIssue<unknown>) =>
  `must be an object of plug-in settings, got ${describe(i.input)}`;

const moduleTier = v.pipe(
  strict(
    {
      ...common(v.literal('module')),
      module: str({ nonEmpty: true }),
      options: v.optional(
        v.pipe(
          v.unknown(),
          v.check((x) => !Array.isArray(x), pluginOptionsMsg),
          v.record(v.string(), v.unknown(), pluginOptionsMsg),
        ),
      ),
    },
    'unknown key for a module tier; put plug-in settings under "options"',
  ),
  v.description(
    'A plug-in backend: "module" is a package name or a path (relative to the config file); "options" go to its createBackend unchanged.',
  ),
);

/** The schema of a tier of each built-in type, by type name. */
export const BUILTIN_TIER_SCHEMAS: ReadonlyMap<string, AnySchema> = new Map<string, AnySchema>([
  ['local-cpu', localCpu],
  ['memory', memory],
  ['local-disk', localDisk],
  ['fs', fs],
  ['redis', redis],
  ['s3', s3],
  ['module', moduleTier],
]);
