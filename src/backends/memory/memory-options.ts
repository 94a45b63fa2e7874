/**
 * Options of the memory tier, declared once ({@link MEMORY_OPTIONS}): {@link MemoryBackendOptions},
 * their defaults, the resolver that validates them and the reader of a tier's config object.
 */
import { bytes, nullable } from '../../util/schema-kit.ts';
import { MAX_SLAB_BYTES } from '../arena/host-arena.ts';
import {
  defineTierOptions,
  type OptionsOf,
  optional,
  type ResolvedOf,
  withDefault,
} from '../core/tier-options.ts';

const ENTRIES = {
  capacityBytes: optional(
    nullable(bytes(1)),
    'Bound on stored payload bytes, evicting unpinned chunks least recently used first; null or absent: none.',
  ),
  maxChunkBytes: withDefault(
    bytes(0),
    MAX_SLAB_BYTES,
    'Largest chunk payload in bytes (never above capacityBytes).',
  ),
};

/** Memory backend options after defaults and validation. */
export type ResolvedMemoryBackendOptions = ResolvedOf<typeof ENTRIES>;

/** The memory tier's options: names, types, bounds, defaults and descriptions. */
export const MEMORY_OPTIONS = defineTierOptions({
  type: 'memory',
  description:
    'Private copies of chunks in a Map: for tests, and the reference example of a backend.',
  options: ENTRIES,
  example: {},
  finish: (o): ResolvedMemoryBackendOptions =>
    o.capacityBytes === null
      ? o
      : { ...o, maxChunkBytes: Math.min(o.maxChunkBytes, o.capacityBytes) },
});

/** Options of {@link MemoryBackend}: the keys of {@link MEMORY_OPTIONS}. */
export type MemoryBackendOptions = OptionsOf<typeof ENTRIES>;

/**
 * Applies defaults and validates.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the bad option and what is allowed.
 */
export function resolveMemoryBackendOptions(
  options: MemoryBackendOptions = {},
): ResolvedMemoryBackendOptions {
  return MEMORY_OPTIONS.resolve(options);
}

/**
 * Reads memory backend options from a plain config object (the keys of {@link MEMORY_OPTIONS}).
 * @throws KvtierError `KVT_CONFIG` naming the tier and the bad or unknown option.
 */
export function memoryOptionsFromConfig(
  raw: Record<string, unknown>,
  tier = 'memory',
): MemoryBackendOptions {
  return MEMORY_OPTIONS.fromConfig(raw, tier);
}
