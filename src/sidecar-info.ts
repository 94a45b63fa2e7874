/**
 * What the sidecar says about itself beyond its statistics: each tier's bound and path (the
 * start-up line, PING) and how many of the chunks lookups asked each tier for it found (PING,
 * `kvtier stats --human`).
 */
import { resolve } from 'node:path';
import type { KvtierConfig } from './config/config.ts';
import type { KvtierMetrics } from './metrics/metrics.ts';

/** One tier as the start-up line and PING describe it. */
export interface TierSummary {
  name: string;
  type: string;
  /** Its byte bound, when it has one. */
  capacityBytes?: number;
  /** Where it keeps chunks (disk and file tiers). */
  path?: string;
}

/**
 * Chunks each tier found of those lookups asked it for (kvtier_backend_hits_total and
 * kvtier_backend_misses_total), read every second for PING, whose answer is built synchronously.
 */
export class HitCounts {
  readonly #metrics: KvtierMetrics;
  readonly #timer: NodeJS.Timeout;
  #counts = new Map<string, { hitChunks: number; lookedUpChunks: number }>();

  constructor(metrics: KvtierMetrics) {
    this.#metrics = metrics;
    this.#timer = setInterval(() => void this.#read(), 1000);
    this.#timer.unref();
  }

  /** A tier's counts as of the last read, or nothing before the first. */
  of(tier: string): { hitChunks?: number; lookedUpChunks?: number } {
    return this.#counts.get(tier) ?? {};
  }

  async #read(): Promise<void> {
    const [hits, misses] = await Promise.all([
      this.#metrics.backendHits.get(),
      this.#metrics.backendMisses.get(),
    ]);
    const counts = new Map<string, { hitChunks: number; lookedUpChunks: number }>();
    const at = (tier: string) => {
      const c = counts.get(tier) ?? { hitChunks: 0, lookedUpChunks: 0 };
      counts.set(tier, c);
      return c;
    };
    for (const v of hits.values) {
      const c = at(String(v.labels.tier));
      c.hitChunks += v.value;
      c.lookedUpChunks += v.value;
    }
    for (const v of misses.values) at(String(v.labels.tier)).lookedUpChunks += v.value;
    this.#counts = counts;
  }

  close(): void {
    clearInterval(this.#timer);
  }
}

/** Every tier's name, type, byte bound and absolute path (disk and file tiers). */
export function tierSummaries(config: KvtierConfig): TierSummary[] {
  return config.tiers.map((t) => {
    const cap = t.options.capacityBytes;
    const path = t.options.path;
    return {
      name: t.name,
      type: t.type,
      ...(typeof cap === 'number' ? { capacityBytes: cap } : {}),
      ...(typeof path === 'string' ? { path: resolve(config.baseDir, path) } : {}),
    };
  });
}
