/**
 * Declarations of the LocalDisk tier: its options ({@link LocalDiskOptions}), their defaults in
 * one place, the resolver that validates them, the reader of a tier's config object, and the
 * shape of its stats.
 */
import type { Logger } from '../../util/log.ts';
import { requireBoolean, requireInt, requireOneOf, requireString } from '../../util/validate.ts';
import { optionsFromConfig } from '../core/config-options.ts';
import type { BackendStats } from '../core/types.ts';
import { FSYNC_POLICIES, type FsyncPolicy, MAX_SHARD_CHARS } from '../files/file-store.ts';
import { CHUNK_HEADER_BYTES } from '../format/chunk-format.ts';

/** Options of {@link LocalDiskBackend}. */
export interface LocalDiskOptions {
  /** Directory of the store; created (with parents) if missing. */
  path: string;
  /** Hard bound on stored bytes, headers included (the sum of the object files' sizes). */
  capacityBytes: number;
  /** Durability of writes; default 'data' (see {@link FsyncPolicy}). */
  fsync?: FsyncPolicy;
  /** File operations running at once; default 16. */
  ioConcurrency?: number;
  /** Hex characters of the hash naming the shard sub-directory, 0–8; default 2. */
  shardChars?: number;
  /** Largest chunk payload in bytes; default 1 GiB (never above what the capacity can hold). */
  maxChunkBytes?: number;
  /** Most chunks indexed (least recently used beyond it are evicted); default 2^20. */
  maxChunks?: number;
  /** Longest one read or write may take before it counts as a miss/drop, ms; default 30000. */
  timeoutMs?: number;
  /**
   * Keep an index journal in the directory, so a restart reads one file instead of listing and
   * `stat`ing every object before it knows them; default true.
   */
  journal?: boolean;
  /** Called with the format's reason each time a corrupt object is found (and removed). */
  onCorrupt?: (reason: string) => void;
  log?: Logger;
}

/** LocalDisk options after defaults and validation. */
export interface ResolvedLocalDiskOptions {
  readonly path: string;
  readonly capacityBytes: number;
  readonly fsync: FsyncPolicy;
  readonly ioConcurrency: number;
  readonly shardChars: number;
  readonly maxChunkBytes: number;
  readonly maxChunks: number;
  readonly timeoutMs: number;
  readonly journal: boolean;
}

/** Defaults of {@link LocalDiskOptions}. */
export const LOCAL_DISK_DEFAULTS = Object.freeze({
  fsync: 'data' as FsyncPolicy,
  ioConcurrency: 16,
  shardChars: 2,
  maxChunkBytes: 1024 ** 3,
  maxChunks: 1 << 20,
  timeoutMs: 30_000,
  journal: true,
});

const OPTION_KEYS: readonly string[] = [
  'path',
  'capacityBytes',
  'fsync',
  'ioConcurrency',
  'shardChars',
  'maxChunkBytes',
  'maxChunks',
  'timeoutMs',
  'journal',
];

/**
 * Applies defaults and validates.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the bad option and what is allowed.
 */
export function resolveLocalDiskOptions(options: LocalDiskOptions): ResolvedLocalDiskOptions {
  const d = LOCAL_DISK_DEFAULTS;
  const path = requireString('path', options.path, { nonEmpty: true });
  const capacityBytes = requireInt('capacityBytes', options.capacityBytes, CHUNK_HEADER_BYTES + 1);
  const maxChunkBytes = Math.min(
    requireInt('maxChunkBytes', options.maxChunkBytes ?? d.maxChunkBytes, 1),
    capacityBytes - CHUNK_HEADER_BYTES,
  );
  return {
    path,
    capacityBytes,
    fsync: requireOneOf('fsync', options.fsync ?? d.fsync, FSYNC_POLICIES),
    ioConcurrency: requireInt('ioConcurrency', options.ioConcurrency ?? d.ioConcurrency, 1, 1024),
    shardChars: requireInt('shardChars', options.shardChars ?? d.shardChars, 0, MAX_SHARD_CHARS),
    maxChunkBytes,
    maxChunks: requireInt('maxChunks', options.maxChunks ?? d.maxChunks, 1, 1 << 24),
    timeoutMs: requireInt('timeoutMs', options.timeoutMs ?? d.timeoutMs, 1, 3_600_000),
    journal: requireBoolean('journal', options.journal ?? d.journal),
  };
}

/**
 * Reads LocalDisk options from a plain config object (the keys of {@link LocalDiskOptions}
 * except the callbacks).
 * @throws KvtierError `KVT_CONFIG` naming the tier and the bad or unknown option.
 */
export function localDiskOptionsFromConfig(
  raw: Record<string, unknown>,
  tier = 'local-disk',
): LocalDiskOptions {
  return optionsFromConfig(raw, tier, 'local-disk', OPTION_KEYS, resolveLocalDiskOptions);
}

/** LocalDisk stats: the interface's plus counters of its own. */
export interface LocalDiskStats extends BackendStats {
  /** Objects found corrupt on read (each was a miss and was deleted). */
  readonly corruptObjects: number;
  /** Object files written since start. */
  readonly filesWritten: number;
  /** Reads or writes that failed with an I/O error or timed out. */
  readonly ioErrors: number;
  /** Whether the start-up scan has finished (until then, chunks it has not reached miss). */
  readonly indexComplete: boolean;
}
