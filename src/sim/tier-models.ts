import { KvtierError } from '../errors.ts';

/**
 * How long a KV load takes from each kind of tier, and what a GiB of it costs, for the planner.
 * A load from a tier below host memory reads the chunks from that tier into host memory, then
 * copies them into the GPU over the host link; a load from the CPU tier is the copy alone. A
 * read of `b` bytes from a tier takes `max(floor, b / bandwidth)`: the floor is the time of the
 * smallest read the benchmark measured, so the model reproduces both sizes it measured.
 *
 * Defaults come from `bench/results/summary-2026-11-23.json` (medians of 5 rounds on an idle
 * machine, the figure ids are in {@link TierModel.benchIds}; a later `npm run bench` writes
 * summary.json without moving them); they are loopback figures of a 2-core machine, so override them
 * for real hardware (`--bandwidth`, `--latency`). Prices are rough 3-year costs per GiB, an
 * assumption to override with `--price`.
 */

/** The load model and price of one tier type. */
export interface TierModel {
  /** Read bandwidth into host memory, bytes/s (the CPU tier: the GPU's host link instead). */
  readBytesPerSec: number;
  /** Least time one load from the tier takes, seconds. */
  floorSeconds: number;
  /** Rough cost of one GiB of the tier over 3 years, US dollars. */
  pricePerGiB: number;
  /** Where the numbers come from. */
  source: string;
  /** The `bench/results/summary-2026-11-23.json` figures the defaults are (bandwidth, floor), if any. */
  benchIds?: { bandwidth: string; floor: string };
}

const MIB2 = 2 * 1024 * 1024;

/** Tier types the planner models, in the order it reports them. */
export const PLANNER_TIERS = ['cpu', 'disk', 'fs', 'redis', 's3', 'peer'] as const;
/**
 * The tiers with a capacity of their own (the ones a run sizes and sweeps). The peer tier holds
 * nothing itself: its chunks are in the other sidecars' tiers.
 */
export const SIZED_TIERS = ['cpu', 'disk', 'fs', 'redis', 's3'] as const;
/** One of {@link PLANNER_TIERS}. */
export type PlannerTier = (typeof PLANNER_TIERS)[number];

/** Defaults per planner tier (the CPU tier's bandwidth is the GPU's host link, set per run). */
export const TIER_MODEL_DEFAULTS: Readonly<Record<PlannerTier, Readonly<TierModel>>> =
  Object.freeze({
    cpu: {
      readBytesPerSec: Number.NaN,
      floorSeconds: 144.927e-6,
      pricePerGiB: 4,
      source:
        'host link of the GPU preset; floor: lookup round trip p50 (bench lookup.p50.16); price: server DDR5',
    },
    disk: {
      readBytesPerSec: 3.621172047165059e9,
      floorSeconds: MIB2 / 7.1889457188720245e9,
      pricePerGiB: 0.1,
      source: 'bench tiers.disk.get.32 (bandwidth), tiers.disk.get.2 (floor); price: NVMe TLC',
      benchIds: { bandwidth: 'tiers.disk.get.32', floor: 'tiers.disk.get.2' },
    },
    fs: {
      readBytesPerSec: 3.149163429766377e9,
      floorSeconds: MIB2 / 7.624636571016589e9,
      pricePerGiB: 0.5,
      source:
        'bench tiers.fs.get.32, tiers.fs.get.2; price: replicated all-flash shared filesystem',
      benchIds: { bandwidth: 'tiers.fs.get.32', floor: 'tiers.fs.get.2' },
    },
    redis: {
      readBytesPerSec: 0.7097568234236957e9,
      floorSeconds: MIB2 / 0.9263669059090065e9,
      pricePerGiB: 10,
      source: 'bench tiers.redis.get.32, tiers.redis.get.2; price: DRAM on Redis hosts, replicated',
      benchIds: { bandwidth: 'tiers.redis.get.32', floor: 'tiers.redis.get.2' },
    },
    s3: {
      readBytesPerSec: 0.40230920158645844e9,
      floorSeconds: MIB2 / 0.3646265508368706e9,
      pricePerGiB: 0.9,
      source: 'bench tiers.s3.get.32, tiers.s3.get.2; price: 36 months of S3 Standard storage',
      benchIds: { bandwidth: 'tiers.s3.get.32', floor: 'tiers.s3.get.2' },
    },
    peer: {
      readBytesPerSec: 0.2492859430418229e9,
      floorSeconds: MIB2 / 0.2492859430418229e9,
      pricePerGiB: 0,
      source:
        "bench/results/peer.json (a lookup and load of 64 MiB from another sidecar over loopback ZMQ; floor: 2 MiB at that rate); no storage of its own: the other sidecars' tiers hold the chunks",
    },
  });

/** The kvtier tier type that stands for each planner tier in the sidecar the planner runs. */
export const SIDECAR_TIER_TYPE: Readonly<Record<PlannerTier, string>> = Object.freeze({
  cpu: 'local-cpu',
  disk: 'local-disk',
  fs: 'fs',
  redis: 'redis',
  s3: 's3',
  peer: 'peer',
});

/** Overrides of the defaults, per tier (`--bandwidth`, `--latency`, `--price`). */
export type TierModelOverrides = Partial<Record<PlannerTier, Partial<TierModel>>>;

/**
 * The models of every planner tier with overrides applied; the CPU tier reads at `hostLinkBytesPerSec`
 * unless overridden.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for a value that is not a positive finite number.
 */
export function resolveTierModels(
  hostLinkBytesPerSec: number,
  overrides: TierModelOverrides = {},
): Record<PlannerTier, TierModel> {
  const out = {} as Record<PlannerTier, TierModel>;
  for (const t of PLANNER_TIERS) {
    const d = TIER_MODEL_DEFAULTS[t];
    const m: TierModel = {
      ...d,
      ...(t === 'cpu' ? { readBytesPerSec: hostLinkBytesPerSec } : {}),
      ...overrides[t],
    };
    for (const k of ['readBytesPerSec', 'floorSeconds', 'pricePerGiB'] as const) {
      const v = m[k];
      if (!Number.isFinite(v) || v < 0 || (k === 'readBytesPerSec' && v === 0))
        throw new KvtierError(
          'KVT_INVALID_ARGUMENT',
          `tier ${t}: ${k} must be a positive number, got ${v}`,
        );
    }
    out[t] = m;
  }
  return out;
}

/**
 * Seconds a load takes: for each tier below host memory, `max(floor, bytes / bandwidth)` to
 * bring its chunks to host memory, then every byte over the host link (the CPU tier's model).
 * @param bytesByTier KV bytes of the planned model, by planner tier.
 */
export function loadDurationSeconds(
  bytesByTier: Partial<Record<PlannerTier, number>>,
  models: Record<PlannerTier, TierModel>,
): number {
  let total = 0;
  let seconds = 0;
  for (const t of PLANNER_TIERS) {
    const b = bytesByTier[t] ?? 0;
    if (b <= 0) continue;
    total += b;
    if (t !== 'cpu') seconds += Math.max(models[t].floorSeconds, b / models[t].readBytesPerSec);
  }
  if (total <= 0) return 0;
  return seconds + Math.max(models.cpu.floorSeconds, total / models.cpu.readBytesPerSec);
}

/** Cost of a configuration: capacity (bytes) per tier times its price per GiB. */
export function configurationCost(
  capacities: Partial<Record<PlannerTier, number>>,
  models: Record<PlannerTier, TierModel>,
): number {
  let c = 0;
  for (const t of PLANNER_TIERS) c += ((capacities[t] ?? 0) / 2 ** 30) * models[t].pricePerGiB;
  return c;
}
