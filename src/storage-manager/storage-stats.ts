/**
 * The storage manager's read-only views: the STATS snapshot (`kvtier stats`) and the sources the
 * metrics module reads at scrape time. Both read the parts the manager owns as of the moment
 * they are asked for.
 */
import type { StorageBackend } from '../backends/core/types.ts';
import type { EventManager } from '../event-manager/event-manager.ts';
import type { MetricSources } from '../metrics/metrics.ts';
import type { AsyncSerializer } from '../serializer/async-serializer.ts';
import type { LookupByteBudget } from './lookup-budget.ts';
import type { PinnedLookup } from './storage-types.ts';
import type { TierRates } from './tier-rates.ts';

/** What the views read; the functions are read when the view is. */
export interface StorageStatsParts {
  readonly tiers: readonly StorageBackend[];
  /** The epoch now (it changes with every clear). */
  readonly epoch: () => number;
  readonly events: Pick<EventManager<PinnedLookup>, 'sizes' | 'expiredTotal'>;
  readonly lookupBytes: Pick<LookupByteBudget, 'used' | 'capacity' | 'refused'>;
  readonly serializer: Pick<AsyncSerializer, 'capacity' | 'inUse' | 'waiters'>;
  readonly writeQueue: { readonly depth: number; readonly bytes: number };
  /** Write-throughs refused because the queue was full, since start. */
  readonly writeThroughDropped: () => number;
  /** Each tier's read rate as lookups measure it. */
  readonly rates: Pick<TierRates, 'rate'>;
}

/** The scrape-time sources the metrics module reads from a storage manager. */
export function storageMetricSources(p: StorageStatsParts): MetricSources {
  const { tiers, events, serializer, writeQueue } = p;
  return {
    backends: () => tiers,
    serializer: () => ({
      capacity: serializer.capacity,
      inUse: serializer.inUse,
      waiters: serializer.waiters,
    }),
    events: () => ({ ...events.sizes(), expiredTotal: events.expiredTotal }),
    pinnedLookups: () => events.sizes().done,
    writeQueueDepth: () => writeQueue.depth,
    epoch: p.epoch,
    tierRates: () =>
      tiers.slice(1).map((t) => {
        const r = p.rates.rate(t.name);
        return {
          tier: t.name,
          readBytesPerSec: r.readBytesPerSec,
          latencySeconds: r.latencySeconds,
        };
      }),
  };
}

/** A JSON-friendly snapshot for the STATS request and `kvtier stats`. */
export function storageStats(p: StorageStatsParts): Record<string, unknown> {
  return {
    epoch: p.epoch(),
    tiers: p.tiers.map((t, i) => ({
      name: t.name,
      kind: t.kind,
      health: t.health(),
      ...t.stats(),
      ...(i > 0 ? { readRate: readRate(p.rates, t.name) } : {}),
    })),
    lookups: {
      ...p.events.sizes(),
      expiredTotal: p.events.expiredTotal,
      bytes: p.lookupBytes.used,
      maxBytes: p.lookupBytes.capacity,
      refusedTotal: p.lookupBytes.refused,
    },
    serializer: {
      capacityChunks: p.serializer.capacity,
      inUseChunks: p.serializer.inUse,
      waiters: p.serializer.waiters,
    },
    writeThrough: {
      depth: p.writeQueue.depth,
      bytes: p.writeQueue.bytes,
      dropped: p.writeThroughDropped(),
    },
  };
}

/**
 * A tier's read rate for STATS: bandwidth (bytes/s) and latency (ms), null while not measured,
 * and where the figures come from (`measured`, `fixed` or `none`).
 */
function readRate(
  rates: Pick<TierRates, 'rate'>,
  tier: string,
): { bytesPerSec: number | null; latencyMs: number | null; source: string } {
  const r = rates.rate(tier);
  return {
    bytesPerSec: r.readBytesPerSec === undefined ? null : Math.round(r.readBytesPerSec),
    latencyMs: r.latencySeconds === undefined ? null : r.latencySeconds * 1000,
    source: r.source,
  };
}
