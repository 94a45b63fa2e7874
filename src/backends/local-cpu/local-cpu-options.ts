import { type ResolvedHostArenaOptions, resolveHostArenaOptions } from '../arena/host-arena.ts';
import { checkPrefaultOptions, type PrefaultOptions } from '../arena/host-prefault.ts';
import { optionsFromConfig } from '../core/config-options.ts';

/** Options of the LocalCPU tier; see {@link HostArenaOptions} for the meaning of each. */
export interface LocalCpuOptions extends PrefaultOptions {
  /** Hard bound on host memory in bytes (rounded down to whole pages). */
  capacityBytes: number;
  /** Arena page size in bytes; power of two >= 4096. Default 65536. */
  pageBytes?: number;
  /** Arena slab size in bytes; multiple of pageBytes, <= 1 GiB. Default min(1 GiB, capacity). */
  slabBytes?: number;
  /** Where the arena's slabs come from (not a config key); see {@link HostArenaOptions}. */
  allocateSlab?: (bytes: number) => Uint8Array;
}

/** LocalCPU options after defaults and validation. */
export type ResolvedLocalCpuOptions = ResolvedHostArenaOptions;

const OPTION_KEYS: readonly string[] = ['capacityBytes', 'pageBytes', 'slabBytes', 'prefault'];

/**
 * Applies defaults and validates.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the bad option and what is allowed.
 */
export function resolveLocalCpuOptions(options: LocalCpuOptions): ResolvedLocalCpuOptions {
  checkPrefaultOptions(options);
  return resolveHostArenaOptions(options);
}

/**
 * Reads LocalCPU options from a plain config object (`capacityBytes`, `pageBytes`, `slabBytes`,
 * `prefault`; nothing else).
 * @throws KvtierError `KVT_CONFIG` naming the tier and the bad or unknown option.
 */
export function localCpuOptionsFromConfig(
  raw: Record<string, unknown>,
  tier = 'local-cpu',
): LocalCpuOptions {
  return optionsFromConfig(raw, tier, 'local-cpu', OPTION_KEYS, resolveLocalCpuOptions);
}
