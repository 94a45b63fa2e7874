/**
 * Options of the LocalCPU tier, declared once ({@link LOCAL_CPU_OPTIONS}): {@link LocalCpuOptions},
 * their defaults, the resolver that validates them and the reader of a tier's config object. The
 * rules between sizes (a power-of-two page, whole pages per slab) are the arena's own
 * ({@link resolveHostArenaOptions}), reported here at the option they name.
 */

import { bool, bytes } from '../../util/schema-kit.ts';
import {
  DEFAULT_PAGE_BYTES,
  MAX_SLAB_BYTES,
  MIN_PAGE_BYTES,
  type ResolvedHostArenaOptions,
  resolveHostArenaOptions,
} from '../arena/host-arena.ts';
import { DEFAULT_PREFAULT, type PrefaultOptions } from '../arena/host-prefault.ts';
import {
  checkedBy,
  defineTierOptions,
  type OptionsOf,
  optional,
  required,
  withDefault,
} from '../core/tier-options.ts';

const ENTRIES = {
  capacityBytes: required(
    bytes(MIN_PAGE_BYTES),
    'Hard bound on host memory in bytes (rounded down to whole pages).',
  ),
  pageBytes: withDefault(
    bytes(MIN_PAGE_BYTES, MAX_SLAB_BYTES),
    DEFAULT_PAGE_BYTES,
    `Arena page size in bytes; a power of two >= ${MIN_PAGE_BYTES}.`,
  ),
  slabBytes: optional(
    bytes(MIN_PAGE_BYTES, MAX_SLAB_BYTES),
    'Arena slab size in bytes; a multiple of pageBytes. Default: min(1 GiB, capacityBytes).',
  ),
  prefault: withDefault(
    bool(),
    DEFAULT_PREFAULT,
    'Reserve every slab at start and commit its pages in the background, so that the first saves do not fault pages in.',
  ),
};

/** LocalCPU options after defaults and validation. */
export type ResolvedLocalCpuOptions = ResolvedHostArenaOptions;

/** The LocalCPU tier's options: names, types, bounds, defaults and descriptions. */
export const LOCAL_CPU_OPTIONS = defineTierOptions({
  type: 'local-cpu',
  description: 'Host memory: a fixed arena of pages, the tier lookups count from and loads read.',
  options: ENTRIES,
  checks: [checkedBy<typeof ENTRIES>(resolveHostArenaOptions)],
  example: { capacityBytes: 1024 ** 3 },
  finish: (o): ResolvedLocalCpuOptions =>
    resolveHostArenaOptions({
      capacityBytes: o.capacityBytes,
      pageBytes: o.pageBytes,
      ...(o.slabBytes !== null ? { slabBytes: o.slabBytes } : {}),
    }),
});

/**
 * Options of the LocalCPU tier: the keys of {@link LOCAL_CPU_OPTIONS} (see
 * {@link HostArenaOptions} for the sizes), and hooks code may give.
 */
export interface LocalCpuOptions extends OptionsOf<typeof ENTRIES>, PrefaultOptions {
  /** Where the arena's slabs come from (not a config key); see {@link HostArenaOptions}. */
  allocateSlab?: (bytes: number) => Uint8Array;
}

/**
 * Applies defaults and validates.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the bad option and what is allowed.
 */
export function resolveLocalCpuOptions(options: LocalCpuOptions): ResolvedLocalCpuOptions {
  return LOCAL_CPU_OPTIONS.resolve(options);
}

/**
 * Reads LocalCPU options from a plain config object (the keys of {@link LOCAL_CPU_OPTIONS};
 * nothing else).
 * @throws KvtierError `KVT_CONFIG` naming the tier and the bad or unknown option.
 */
export function localCpuOptionsFromConfig(
  raw: Record<string, unknown>,
  tier = 'local-cpu',
): LocalCpuOptions {
  return LOCAL_CPU_OPTIONS.fromConfig(raw, tier);
}
