/**
 * Declarations of the LocalDisk tier: its options, declared once ({@link LOCAL_DISK_OPTIONS}:
 * {@link LocalDiskOptions}, their defaults, the resolver that validates them, the reader of a
 * tier's config object), and the shape of its stats.
 */
import type { Logger } from '../../util/log.ts';
import { bool, bytes, int, oneOf, str } from '../../util/schema-kit.ts';
import {
  defineTierOptions,
  type OptionsOf,
  type ResolvedOf,
  required,
  withDefault,
} from '../core/tier-options.ts';
import type { BackendStats } from '../core/types.ts';
import { FSYNC_POLICIES, MAX_SHARD_CHARS } from '../files/file-store.ts';
import { CHUNK_HEADER_BYTES } from '../format/chunk-format.ts';

const ENTRIES = {
  path: required(
    str({ nonEmpty: true }),
    'Directory of the store; created (with parents) if missing.',
  ),
  capacityBytes: required(
    bytes(CHUNK_HEADER_BYTES + 1),
    "Hard bound on stored bytes, headers included (the sum of the object files' sizes).",
  ),
  fsync: withDefault(
    oneOf(FSYNC_POLICIES),
    'data',
    'Durability of writes: none, data (fdatasync before the rename) or always (also the directory).',
  ),
  ioConcurrency: withDefault(int(1, 1024), 16, 'File operations running at once.'),
  shardChars: withDefault(
    int(0, MAX_SHARD_CHARS),
    2,
    'Hex characters of the hash naming the shard sub-directory.',
  ),
  maxChunkBytes: withDefault(
    bytes(1),
    1024 ** 3,
    'Largest chunk payload in bytes (never above what capacityBytes can hold).',
  ),
  maxChunks: withDefault(
    int(1, 1 << 24),
    1 << 20,
    'Most chunks indexed (least recently used beyond it are evicted).',
  ),
  timeoutMs: withDefault(
    int(1, 3_600_000),
    30_000,
    'Longest one read or write may take before it counts as a miss or drop, ms.',
  ),
  journal: withDefault(
    bool(),
    true,
    'Keep an index journal in the directory, so a restart reads one file instead of listing and stat-ing every object.',
  ),
};

/** LocalDisk options after defaults and validation. */
export type ResolvedLocalDiskOptions = ResolvedOf<typeof ENTRIES>;

/** The LocalDisk tier's options: names, types, bounds, defaults and descriptions. */
export const LOCAL_DISK_OPTIONS = defineTierOptions({
  type: 'local-disk',
  description:
    'A bounded store on a local disk: one file per chunk, evicted least recently used first.',
  options: ENTRIES,
  example: { path: '/var/cache/kvtier', capacityBytes: 1024 ** 3 },
  finish: (o): ResolvedLocalDiskOptions => ({
    ...o,
    maxChunkBytes: Math.min(o.maxChunkBytes, o.capacityBytes - CHUNK_HEADER_BYTES),
  }),
});

/** Options of {@link LocalDiskBackend}: the keys of {@link LOCAL_DISK_OPTIONS}, and hooks. */
export interface LocalDiskOptions extends OptionsOf<typeof ENTRIES> {
  /** Called with the format's reason each time a corrupt object is found (and removed). */
  onCorrupt?: (reason: string) => void;
  log?: Logger;
  /**
   * Where the index's large arrays (2 MiB or more: a 1M-chunk index has 64 MiB of records) come
   * from, zero-filled, or null for Node's own (the default). Not a config key: the sidecar passes
   * the native addon's slabs, whose huge pages spare a lookup in a large index most of its TLB
   * misses.
   */
  allocateIndexMemory?: (bytes: number) => Uint8Array | null;
}

/** Defaults of {@link LocalDiskOptions}. */
export const LOCAL_DISK_DEFAULTS = LOCAL_DISK_OPTIONS.defaults;

/**
 * Applies defaults and validates.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the bad option and what is allowed.
 */
export function resolveLocalDiskOptions(options: LocalDiskOptions): ResolvedLocalDiskOptions {
  return LOCAL_DISK_OPTIONS.resolve(options);
}

/**
 * Reads LocalDisk options from a plain config object (the keys of {@link LOCAL_DISK_OPTIONS};
 * not the callbacks).
 * @throws KvtierError `KVT_CONFIG` naming the tier and the bad or unknown option.
 */
export function localDiskOptionsFromConfig(
  raw: Record<string, unknown>,
  tier = 'local-disk',
): LocalDiskOptions {
  return LOCAL_DISK_OPTIONS.fromConfig(raw, tier);
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
