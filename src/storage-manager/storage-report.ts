/**
 * The storage manager's read-only views (STATS, the metrics' scrape-time sources) and its
 * GET across the tiers, kept apart from the lookup and save paths.
 */
import type { Chunk, ChunkHash, NamespaceId, StorageBackend } from '../backends/core/types.ts';
import type { EventManager } from '../event-manager/event-manager.ts';
import type { MetricSources } from '../metrics/metrics.ts';
import type { AsyncSerializer } from '../serializer/async-serializer.ts';
import type { Logger } from '../util/log.ts';
import type { LookupByteBudget } from './lookup-budget.ts';
import type { PinnedLookup } from './storage-types.ts';
import { ownedCopy } from './tier-walk.ts';

/** What the views read, as of the moment they are asked for. */
export interface StorageParts {
  readonly tiers: readonly StorageBackend[];
  readonly epoch: number;
  readonly events: Pick<EventManager<PinnedLookup>, 'sizes' | 'expiredTotal'>;
  readonly lookupBytes: Pick<LookupByteBudget, 'used' | 'capacity' | 'refused'>;
  readonly serializer: Pick<AsyncSerializer, 'capacity' | 'inUse' | 'waiters'>;
  readonly writeQueue: { readonly depth: number; readonly bytes: number };
  readonly writeThroughDropped: number;
  /** Where scrape-time sources read the epoch from (it changes with every clear). */
  readonly manager: { readonly epoch: number };
}

/** The scrape-time sources the metrics module reads from a storage manager. */
export function storageMetricSources(p: StorageParts): MetricSources {
  const { tiers, events, serializer, writeQueue, manager } = p;
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
    epoch: () => manager.epoch,
  };
}

/** A JSON-friendly snapshot for the STATS request and `kvtier stats`. */
export function storageStats(p: StorageParts): Record<string, unknown> {
  return {
    epoch: p.epoch,
    tiers: p.tiers.map((t) => ({
      name: t.name,
      kind: t.kind,
      health: t.health(),
      ...t.stats(),
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
      dropped: p.writeThroughDropped,
    },
  };
}

/** Reads one chunk from the first tier that has it; returns a copy of its bytes, or null. */
export async function readFirstTier(
  tiers: readonly StorageBackend[],
  ns: NamespaceId,
  hash: ChunkHash,
  log: Logger,
): Promise<Chunk | null> {
  for (const tier of tiers) {
    if (tier.health() === 'down') continue;
    const pinned = tier.capabilities.pinning && tier.pin(ns, [hash]) === 1;
    try {
      const chunk = (await tier.batchedGet(ns, [hash])).get(hash);
      if (chunk != null) return ownedCopy(chunk);
    } catch (err) {
      log.warn('tier get failed; trying the next tier', { tier: tier.name, err });
    } finally {
      if (pinned) tier.unpin(ns, [hash]);
    }
  }
  return null;
}
