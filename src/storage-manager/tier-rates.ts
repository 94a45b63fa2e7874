/**
 * How fast each tier reads, as the storage manager measures it live, and the rule a lookup
 * applies with it ("never slower than recomputing"): a lookup that names the engine's prefill
 * rate claims a tier's hits only where fetching them beats computing them.
 *
 * A tier's rate is two figures: its per-request latency (the time of its probes, the
 * `batchedContains` each lookup sends it, which move no payload) and its read bandwidth (payload
 * bytes of its prefetch gets over their time less that latency). Each is a mean over recent
 * samples whose weight halves every `halfLifeMs`; an estimate whose samples have all but decayed
 * (less than {@link MIN_WEIGHT} of one left) counts as unmeasured again. An unmeasured tier is
 * assumed to win: its hits are fetched, which measures it; so a tier declined for being slow is
 * tried again once its estimate has gone stale, and a tier that recovered is found out.
 */
import type { NamespaceId } from '../backends/core/types.ts';
import { KvtierError } from '../errors.ts';

/** Options of {@link TierRates}. */
export interface TierRatesOptions {
  /** Time after which a sample counts half, ms; default 30 000. */
  halfLifeMs?: number;
  /** Monotonic clock, ms; default `performance.now`. */
  now?: () => number;
}

/** Defaults of {@link TierRatesOptions}. */
export const TIER_RATES_DEFAULTS = { halfLifeMs: 30_000 } as const;

/** Decayed sample weight under which an estimate is no longer trusted. */
export const MIN_WEIGHT = 0.1;

/** One tier's read rate. */
export interface TierRate {
  /** Read bandwidth, bytes/s; undefined while not measured. */
  readBytesPerSec: number | undefined;
  /** Per-request latency, seconds; undefined while not measured. */
  latencySeconds: number | undefined;
  /** `measured` live, `fixed` by {@link TierRates.fix}, or `none` yet. */
  source: 'measured' | 'fixed' | 'none';
}

/** A decayed mean of samples (`sum / weight`), each sample's weight halving every half-life. */
class Decayed {
  weight = 0;
  sum = 0;
  /** Second sum (bytes, for the bandwidth), decayed alike. */
  sum2 = 0;
  #at = 0;

  decayTo(nowMs: number, halfLifeMs: number): void {
    if (this.weight > 0 && nowMs > this.#at) {
      const f = 2 ** (-(nowMs - this.#at) / halfLifeMs);
      this.weight *= f;
      this.sum *= f;
      this.sum2 *= f;
    }
    this.#at = Math.max(this.#at, nowMs);
  }

  add(x: number, x2: number): void {
    this.weight += 1;
    this.sum += x;
    this.sum2 += x2;
  }
}

interface Entry {
  readonly probes: Decayed;
  readonly gets: Decayed;
  fixed: { readBytesPerSec: number; latencySeconds: number } | undefined;
}

/**
 * Live read rates of named tiers (the storage manager's: one per tier, by name). Samples are
 * recorded by the lookup walk (probes) and the prefetch (gets); nothing here waits or allocates
 * per call beyond a tier's first sample.
 */
export class TierRates {
  readonly #entries = new Map<string, Entry>();
  readonly #halfLifeMs: number;
  readonly #now: () => number;

  /** @throws KvtierError `KVT_INVALID_ARGUMENT` for a half-life that is not a positive number. */
  constructor(opts: TierRatesOptions = {}) {
    const h = opts.halfLifeMs ?? TIER_RATES_DEFAULTS.halfLifeMs;
    if (typeof h !== 'number' || !Number.isFinite(h) || h <= 0)
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `tierRates.halfLifeMs must be a positive number of ms, got ${String(h)}`,
      );
    this.#halfLifeMs = h;
    this.#now = opts.now ?? (() => performance.now());
  }

  #entry(tier: string): Entry {
    let e = this.#entries.get(tier);
    if (e === undefined) {
      e = { probes: new Decayed(), gets: new Decayed(), fixed: undefined };
      this.#entries.set(tier, e);
    }
    return e;
  }

  /** Records a probe of `tier` (a round trip that moved no payload) that took `seconds`. */
  recordProbe(tier: string, seconds: number): void {
    if (!(seconds >= 0) || !Number.isFinite(seconds)) return;
    const d = this.#entry(tier).probes;
    d.decayTo(this.#now(), this.#halfLifeMs);
    d.add(seconds, 0);
  }

  /** Records a get from `tier` that returned `bytes` of payload in `seconds`. */
  recordGet(tier: string, bytes: number, seconds: number): void {
    if (!(bytes > 0) || !(seconds >= 0) || !Number.isFinite(seconds)) return;
    const e = this.#entry(tier);
    const latency = this.#latency(e) ?? 0;
    // The transfer part of the get; a get faster than the probes' latency still took time.
    const transfer = Math.max(seconds - latency, seconds / 10, 1e-9);
    e.gets.decayTo(this.#now(), this.#halfLifeMs);
    e.gets.add(transfer, bytes);
  }

  /**
   * Fixes a tier's rate (the simulator's modeled tiers, or an operator's figures): measurements
   * are then ignored. `undefined` goes back to measuring.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` for a bandwidth that is not positive or a latency
   *   that is negative.
   */
  fix(tier: string, rate: { readBytesPerSec: number; latencySeconds: number } | undefined): void {
    if (rate !== undefined) {
      const { readBytesPerSec: bw, latencySeconds: lat } = rate;
      if (!(bw > 0) || !Number.isFinite(bw) || !(lat >= 0) || !Number.isFinite(lat))
        throw new KvtierError(
          'KVT_INVALID_ARGUMENT',
          `tier ${tier}: readBytesPerSec must be positive and latencySeconds non-negative, got ${bw} and ${lat}`,
        );
    }
    this.#entry(tier).fixed = rate === undefined ? undefined : { ...rate };
  }

  /** The rate of `tier` now. */
  rate(tier: string): TierRate {
    const e = this.#entries.get(tier);
    if (e === undefined)
      return { readBytesPerSec: undefined, latencySeconds: undefined, source: 'none' };
    if (e.fixed !== undefined) return { ...e.fixed, source: 'fixed' };
    const latencySeconds = this.#latency(e);
    const g = e.gets;
    g.decayTo(this.#now(), this.#halfLifeMs);
    const readBytesPerSec = g.weight >= MIN_WEIGHT && g.sum > 0 ? g.sum2 / g.sum : undefined;
    const source =
      latencySeconds === undefined && readBytesPerSec === undefined ? 'none' : 'measured';
    return { readBytesPerSec, latencySeconds, source };
  }

  #latency(e: Entry): number | undefined {
    const p = e.probes;
    p.decayTo(this.#now(), this.#halfLifeMs);
    return p.weight >= MIN_WEIGHT ? p.sum / p.weight : undefined;
  }

  /**
   * Seconds to fetch `bytes` from `tier` at its rate (latency plus transfer), or undefined while
   * its bandwidth is not known (then the tier is assumed to win, and its fetch measures it).
   */
  fetchSeconds(tier: string, bytes: number): number | undefined {
    const r = this.rate(tier);
    if (r.readBytesPerSec === undefined) return undefined;
    return (r.latencySeconds ?? 0) + bytes / r.readBytesPerSec;
  }
}

/** Namespaces whose bytes per token are remembered; past it the oldest is forgotten. */
const MAX_SHAPES = 1024;

/**
 * KV bytes per token of each namespace, from the chunks the manager sees (saves, puts,
 * prefetches): what a lookup's tokens weigh when a tier's bandwidth is compared with compute.
 */
export class ChunkShapes {
  readonly #bytesPerToken = new Map<NamespaceId, number>();

  /** Records a chunk of `bytes` payload over `tokens` tokens in `ns`. */
  record(ns: NamespaceId, bytes: number, tokens: number): void {
    if (!(bytes > 0) || !(tokens > 0)) return;
    const m = this.#bytesPerToken;
    const v = bytes / tokens;
    if (m.get(ns) === v) return;
    m.delete(ns);
    m.set(ns, v);
    if (m.size > MAX_SHAPES) m.delete(m.keys().next().value as NamespaceId);
  }

  /** Bytes per token of `ns`, or undefined when no chunk of it was seen. */
  bytesPerToken(ns: NamespaceId): number | undefined {
    return this.#bytesPerToken.get(ns);
  }
}
