/**
 * Options of the FS tier, declared once ({@link FS_OPTIONS}): {@link FsBackendOptions}, their
 * defaults, the resolver that validates them and the reader of a tier's config object.
 */
import type { Logger } from '../../util/log.ts';
import { bytes, int, nullable, oneOf, str } from '../../util/schema-kit.ts';
import {
  defineTierOptions,
  type OptionsOf,
  optional,
  type ResolvedOf,
  required,
  withDefault,
} from '../core/tier-options.ts';
import { type FileSystem, FSYNC_POLICIES, MAX_SHARD_CHARS } from '../files/file-store.ts';
import { CHUNK_HEADER_BYTES } from '../format/chunk-format.ts';

const HOUR_MS = 3_600_000;

const ENTRIES = {
  path: required(
    str({ nonEmpty: true }),
    'The shared directory (an NFS, Lustre or 3FS mount); created (with parents) if missing.',
  ),
  shardChars: withDefault(
    int(0, MAX_SHARD_CHARS),
    2,
    'Hex characters of the hash naming the shard sub-directory.',
  ),
  ioConcurrency: withDefault(int(1, 1024), 16, 'File operations running at once.'),
  timeoutMs: withDefault(
    int(1, HOUR_MS),
    5000,
    'Longest one file operation may take before it counts as a miss or drop, ms.',
  ),
  capacityBytes: optional(
    nullable(bytes(CHUNK_HEADER_BYTES + 1)),
    'Size bound enforced by the sweep (oldest mtime deleted first); null or absent: none.',
  ),
  ttlMs: optional(
    nullable(int(1)),
    'Objects older than this (by mtime) are misses and are deleted by the sweep, ms; null or absent: none.',
  ),
  sweepIntervalMs: withDefault(
    int(1),
    60_000,
    'Period of the background sweep when a bound or TTL is set, ms.',
  ),
  staleTempMs: withDefault(
    int(1),
    600_000,
    "Temp files older than this are a crashed writer's and deleted by the sweep, ms.",
  ),
  fsync: withDefault(
    oneOf(FSYNC_POLICIES),
    'data',
    'Durability of writes: none, data (fdatasync before the rename) or always (also the directory).',
  ),
  maxChunkBytes: withDefault(
    bytes(1),
    1024 ** 3,
    'Largest chunk payload in bytes (never above what capacityBytes can hold).',
  ),
};

/** FS options after defaults and validation. */
export type ResolvedFsBackendOptions = ResolvedOf<typeof ENTRIES>;

/** The FS tier's options: names, types, bounds, defaults and descriptions. */
export const FS_OPTIONS = defineTierOptions({
  type: 'fs',
  description: 'A shared filesystem (NFS, Lustre, 3FS): one file per chunk, shared by sidecars.',
  options: ENTRIES,
  example: { path: '/mnt/kvtier' },
  finish: (o): ResolvedFsBackendOptions =>
    o.capacityBytes === null
      ? o
      : { ...o, maxChunkBytes: Math.min(o.maxChunkBytes, o.capacityBytes - CHUNK_HEADER_BYTES) },
});

/** Options of {@link FsBackend}: the keys of {@link FS_OPTIONS}, and hooks code may give. */
export interface FsBackendOptions extends OptionsOf<typeof ENTRIES> {
  /** Called with the format's reason each time a corrupt object is found (and removed). */
  onCorrupt?: (reason: string) => void;
  log?: Logger;
  /** Clock for TTL and temp-file age, ms since the epoch; default `Date.now`. */
  now?: () => number;
  /** File-system calls; default the real `node:fs/promises` (tests stand in a hung mount). */
  fsImpl?: FileSystem;
}

/** Defaults of {@link FsBackendOptions}. */
export const FS_BACKEND_DEFAULTS = FS_OPTIONS.defaults;

/**
 * Applies defaults and validates.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the bad option and what is allowed.
 */
export function resolveFsBackendOptions(options: FsBackendOptions): ResolvedFsBackendOptions {
  return FS_OPTIONS.resolve(options);
}

/**
 * Reads FS options from a plain config object (the keys of {@link FS_OPTIONS}; not the
 * callbacks, clock or file-system hook).
 * @throws KvtierError `KVT_CONFIG` naming the tier and the bad or unknown option.
 */
export function fsOptionsFromConfig(raw: Record<string, unknown>, tier = 'fs'): FsBackendOptions {
  return FS_OPTIONS.fromConfig(raw, tier);
}
