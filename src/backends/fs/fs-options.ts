/**
 * Options of the FS tier: {@link FsBackendOptions}, their defaults in one place, the resolver
 * that validates them and the reader of a tier's config object.
 */
import type { Logger } from '../../util/log.ts';
import { requireInt, requireOneOf, requireString } from '../../util/validate.ts';
import { optionsFromConfig } from '../core/config-options.ts';
import {
  type FileSystem,
  FSYNC_POLICIES,
  type FsyncPolicy,
  MAX_SHARD_CHARS,
} from '../files/file-store.ts';
import { CHUNK_HEADER_BYTES } from '../format/chunk-format.ts';

/** Options of {@link FsBackend}. */
export interface FsBackendOptions {
  /** The shared directory (an NFS, Lustre or 3FS mount); created (with parents) if missing. */
  path: string;
  /** Hex characters of the hash naming the shard sub-directory, 0–8; default 2. */
  shardChars?: number;
  /** File operations running at once; default 16. */
  ioConcurrency?: number;
  /** Longest one file operation may take before it counts as a miss/drop, ms; default 5000. */
  timeoutMs?: number;
  /** Size bound enforced by the sweep (oldest mtime deleted first), bytes; default none. */
  capacityBytes?: number | null;
  /** Objects older than this (by mtime) are misses and are deleted by the sweep, ms; default none. */
  ttlMs?: number | null;
  /** Period of the background sweep when a bound or TTL is set, ms; default 60000. */
  sweepIntervalMs?: number;
  /** Temp files older than this are a crashed writer's and deleted by the sweep, ms; default 600000. */
  staleTempMs?: number;
  /** Durability of writes; default 'data' (see {@link FsyncPolicy}). */
  fsync?: FsyncPolicy;
  /** Largest chunk payload in bytes; default 1 GiB. */
  maxChunkBytes?: number;
  /** Called with the format's reason each time a corrupt object is found (and removed). */
  onCorrupt?: (reason: string) => void;
  log?: Logger;
  /** Clock for TTL and temp-file age, ms since the epoch; default `Date.now`. */
  now?: () => number;
  /** File-system calls; default the real `node:fs/promises` (tests stand in a hung mount). */
  fsImpl?: FileSystem;
}

/** FS options after defaults and validation. */
export interface ResolvedFsBackendOptions {
  readonly path: string;
  readonly shardChars: number;
  readonly ioConcurrency: number;
  readonly timeoutMs: number;
  readonly capacityBytes: number | null;
  readonly ttlMs: number | null;
  readonly sweepIntervalMs: number;
  readonly staleTempMs: number;
  readonly fsync: FsyncPolicy;
  readonly maxChunkBytes: number;
}

/** Defaults of {@link FsBackendOptions}. */
export const FS_BACKEND_DEFAULTS = Object.freeze({
  shardChars: 2,
  ioConcurrency: 16,
  timeoutMs: 5000,
  sweepIntervalMs: 60_000,
  staleTempMs: 600_000,
  fsync: 'data' as FsyncPolicy,
  maxChunkBytes: 1024 ** 3,
});

const OPTION_KEYS: readonly string[] = [
  'path',
  'shardChars',
  'ioConcurrency',
  'timeoutMs',
  'capacityBytes',
  'ttlMs',
  'sweepIntervalMs',
  'staleTempMs',
  'fsync',
  'maxChunkBytes',
];

const HOUR_MS = 3_600_000;

/**
 * Applies defaults and validates.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the bad option and what is allowed.
 */
export function resolveFsBackendOptions(options: FsBackendOptions): ResolvedFsBackendOptions {
  const d = FS_BACKEND_DEFAULTS;
  const optional = (name: string, v: number | null | undefined, min: number) =>
    v === undefined || v === null ? null : requireInt(name, v, min);
  const capacityBytes = optional('capacityBytes', options.capacityBytes, CHUNK_HEADER_BYTES + 1);
  let maxChunkBytes = requireInt('maxChunkBytes', options.maxChunkBytes ?? d.maxChunkBytes, 1);
  if (capacityBytes !== null)
    maxChunkBytes = Math.min(maxChunkBytes, capacityBytes - CHUNK_HEADER_BYTES);
  return {
    path: requireString('path', options.path, { nonEmpty: true }),
    shardChars: requireInt('shardChars', options.shardChars ?? d.shardChars, 0, MAX_SHARD_CHARS),
    ioConcurrency: requireInt('ioConcurrency', options.ioConcurrency ?? d.ioConcurrency, 1, 1024),
    timeoutMs: requireInt('timeoutMs', options.timeoutMs ?? d.timeoutMs, 1, HOUR_MS),
    capacityBytes,
    ttlMs: optional('ttlMs', options.ttlMs, 1),
    sweepIntervalMs: requireInt('sweepIntervalMs', options.sweepIntervalMs ?? d.sweepIntervalMs, 1),
    staleTempMs: requireInt('staleTempMs', options.staleTempMs ?? d.staleTempMs, 1),
    fsync: requireOneOf('fsync', options.fsync ?? d.fsync, FSYNC_POLICIES),
    maxChunkBytes,
  };
}

/**
 * Reads FS options from a plain config object (the keys of {@link FsBackendOptions} except the
 * callbacks, clock and file-system hook).
 * @throws KvtierError `KVT_CONFIG` naming the tier and the bad or unknown option.
 */
export function fsOptionsFromConfig(raw: Record<string, unknown>, tier = 'fs'): FsBackendOptions {
  return optionsFromConfig(raw, tier, 'fs', OPTION_KEYS, resolveFsBackendOptions);
}
