import type { Target } from '../sim/planner.ts';
import { PLANNER_TIERS, type PlannerTier, type TierModelOverrides } from '../sim/tier-models.ts';
import type { SimFaults } from '../sim/types.ts';
import { parseBytes, tryParseBytes } from '../util/bytes.ts';

/**
 * Value parsers of `kvtier simulate`'s flags: sizes, rates, durations, per-tier lists, sweeps,
 * targets and faults. Each throws a {@link UsageError} naming the flag and what it accepts.
 */

/** A bad flag: the command prints its message and exits 2. */
export class UsageError extends Error {}

/** Fault names `--fault` accepts, each optionally `@STEP`. */
export const FAULT_NAMES = [
  'redis-outage',
  'sidecar-restart',
  'corrupt',
  'deadline',
  'evict',
] as const;

/** Engine step a fault fires at when `--fault NAME` gives no `@STEP`. */
export const DEFAULT_FAULT_STEP = 5;

/** The first line of an error's message. */
export function oneLine(err: unknown): string {
  const msg = err instanceof Error ? err.message : String(err);
  return msg.split('\n', 1)[0] ?? msg;
}

/** An integer flag >= `min`, or undefined when absent. */
export function intFlag(flag: string, raw: string | undefined, min: number): number | undefined {
  if (raw === undefined) return undefined;
  const n = Number(raw);
  if (!/^[0-9]+$/.test(raw) || !Number.isSafeInteger(n) || n < min) {
    throw new UsageError(`--${flag} must be an integer >= ${min}, got ${JSON.stringify(raw)}`);
  }
  return n;
}

/** A number flag >= 0 (> 0 with `positive`), or undefined when absent. */
export function numberFlag(
  flag: string,
  raw: string | undefined,
  positive = false,
): number | undefined {
  if (raw === undefined) return undefined;
  const n = Number(raw);
  if (raw.trim() === '' || !Number.isFinite(n) || n < 0 || (positive && n === 0)) {
    throw new UsageError(
      `--${flag} must be a number ${positive ? '> 0' : '>= 0'}, got ${JSON.stringify(raw)}`,
    );
  }
  return n;
}

/** A byte size flag, or undefined when absent. */
export function sizeFlag(flag: string, raw: string | undefined): number | undefined {
  if (raw === undefined) return undefined;
  try {
    return parseBytes(`--${flag}`, raw);
  } catch (err) {
    throw new UsageError(oneLine(err));
  }
}

/** A rate such as `3GB/s`, `700MB/s`, `2.5GiB/s` or plain bytes/s, in bytes/s. */
export function rateValue(flag: string, raw: string): number {
  const m = /^(.+?)(\/s)?$/i.exec(raw.trim());
  const n = m === null ? undefined : tryParseBytes((m[1] as string).trim());
  if (n === undefined || n <= 0)
    throw new UsageError(
      `--${flag} must give a rate > 0 such as 3GB/s or 700MiB/s, got ${JSON.stringify(raw)}`,
    );
  return n;
}

/** A duration such as `2ms`, `150us`, `1.5s` (plain numbers are ms), in ms. */
export function durationValue(flag: string, raw: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*(us|µs|ms|s|min)?\s*$/i.exec(raw);
  if (m === null)
    throw new UsageError(
      `--${flag} must give a duration such as 2ms, 150us or 1.5s, got ${JSON.stringify(raw)}`,
    );
  const unit = (m[2] ?? 'ms').toLowerCase();
  const scale =
    unit === 'us' || unit === 'µs' ? 1e-3 : unit === 's' ? 1e3 : unit === 'min' ? 6e4 : 1;
  return Number(m[1]) * scale;
}

function tierOf(flag: string, name: string, what: string): PlannerTier {
  if (!(PLANNER_TIERS as readonly string[]).includes(name))
    throw new UsageError(
      `--${flag} must look like ${what} with TIER one of ${PLANNER_TIERS.join(', ')}, got tier ${JSON.stringify(name)}`,
    );
  return name as PlannerTier;
}

/**
 * Per-tier model overrides from repeated `--bandwidth TIER=RATE`, `--latency TIER=DURATION` and
 * `--price TIER=USD_PER_GIB`.
 */
export function tierOverrides(
  bandwidth: readonly string[],
  latency: readonly string[],
  price: readonly string[],
): TierModelOverrides {
  const out: TierModelOverrides = {};
  const each = (
    flag: string,
    list: readonly string[],
    set: (t: PlannerTier, v: string) => void,
  ) => {
    for (const item of list) {
      const m = /^([a-z0-9]+)=(.+)$/.exec(item.trim());
      if (m === null)
        throw new UsageError(`--${flag} must look like TIER=VALUE, got ${JSON.stringify(item)}`);
      set(tierOf(flag, m[1] as string, 'TIER=VALUE'), m[2] as string);
    }
  };
  each('bandwidth', bandwidth, (t, v) => {
    out[t] = { ...out[t], readBytesPerSec: rateValue('bandwidth', v) };
  });
  each('latency', latency, (t, v) => {
    out[t] = { ...out[t], floorSeconds: durationValue('latency', v) / 1000 };
  });
  each('price', price, (t, v) => {
    const n = numberFlag('price', v.replace(/^\$/, ''));
    out[t] = { ...out[t], pricePerGiB: n as number };
  });
  return out;
}

/** One `--sweep TIER=SIZES`. */
export interface Sweep {
  tier: PlannerTier;
  /** Capacities in the planned model's bytes, ascending, distinct. */
  capacitiesBytes: number[];
}

/** Parses repeated `--sweep TIER=SIZE,SIZE,...`; a tier may be swept once. */
export function parseSweeps(raw: readonly string[]): Sweep[] {
  const out: Sweep[] = [];
  for (const item of raw) {
    const m = /^([a-z0-9]+)=(.+)$/.exec(item.trim());
    if (m === null)
      throw new UsageError(
        `--sweep must look like TIER=SIZES (e.g. cpu=8GiB,32GiB or disk=1TiB,4TiB), got ${JSON.stringify(item)}`,
      );
    const tier = tierOf('sweep', m[1] as string, 'TIER=SIZES');
    if (tier === 'peer')
      throw new UsageError(
        "--sweep peer=... has no capacity to sweep: the peer tier's chunks are in the other sidecars' tiers; give --peers with --engines N",
      );
    if (out.some((s) => s.tier === tier))
      throw new UsageError(`--sweep ${tier}=... is given twice; give its sizes once`);
    const sizes = (m[2] as string).split(',').map((v) => sizeFlag('sweep', v.trim()) as number);
    if (sizes.some((s) => s === 0)) throw new UsageError('--sweep capacities must be > 0');
    out.push({ tier, capacitiesBytes: [...new Set(sizes)].sort((a, b) => a - b) });
  }
  return out;
}

/**
 * Parses `--target`: `saved=N` (prompt tokens/s no longer computed), `share=P%` (of prompt
 * tokens), `ttft-p50=DURATION` or `ttft-p90=DURATION`.
 */
export function parseTarget(raw: string | undefined): Target | undefined {
  if (raw === undefined) return undefined;
  const m = /^(saved|share|ttft-p50|ttft-p90)=(.+)$/.exec(raw.trim());
  const bad = () =>
    new UsageError(
      `--target must be saved=TOKENS_PER_S, share=PERCENT%, ttft-p50=DURATION or ttft-p90=DURATION, got ${JSON.stringify(raw)}`,
    );
  if (m === null) throw bad();
  const v = m[2] as string;
  if (m[1] === 'saved') {
    const n = Number(v.replace(/(tokens)?\/s$/, ''));
    if (!Number.isFinite(n) || n <= 0) throw bad();
    return { kind: 'saved', tokensPerSec: n };
  }
  if (m[1] === 'share') {
    const n = Number(v.replace(/%$/, ''));
    if (!Number.isFinite(n) || n <= 0 || n > 100) throw bad();
    return { kind: 'share', fraction: n / 100 };
  }
  return { kind: m[1] as 'ttft-p50' | 'ttft-p90', ms: durationValue('target', v) };
}

/** Parses repeated `--fault NAME[@STEP]`. */
export function parseFaults(specs: readonly string[]): SimFaults | undefined {
  if (specs.length === 0) return undefined;
  const faults: SimFaults = {};
  for (const spec of specs) {
    const [name, at] = spec.split('@', 2) as [string, string | undefined];
    if (!(FAULT_NAMES as readonly string[]).includes(name)) {
      throw new UsageError(
        `--fault must be one of ${FAULT_NAMES.join(', ')} (optionally @STEP), got ${JSON.stringify(spec)}`,
      );
    }
    const step = at === undefined ? DEFAULT_FAULT_STEP : (intFlag('fault', at, 1) as number);
    if (name === 'redis-outage') faults.redisOutage = { atStep: step, forSteps: 5 };
    else if (name === 'sidecar-restart') faults.sidecarRestartAtStep = step;
    else if (name === 'corrupt') faults.corruptChunks = { atStep: step, count: 2 };
    else if (name === 'deadline') faults.lookupDeadlineAtStep = step;
    else faults.evictBetweenLookupAndLoadAtStep = step;
  }
  return faults;
}
