/**
 * What the sidecar's event stream reports (docs/events.md): chunks stored in a tier, chunks a
 * tier no longer holds, and CLEARs. The storage manager and the tier decorators report into a
 * {@link ChunkEventSink}; the stream turns the reports into numbered batches.
 */
import type { BackendCapabilities, ChunkHash, NamespaceId } from '../backends/core/types.ts';

/**
 * Where a tier keeps its chunks, as the stream names it (vLLM's `medium` vocabulary): `CPU` for
 * host memory, `SHARED` for a store several sidecars read and write, `DISK` for other
 * persistent ones, `EXTERNAL` otherwise.
 */
export type EventMedium = 'CPU' | 'DISK' | 'SHARED' | 'EXTERNAL';

/** Why a tier no longer holds a chunk. */
export type RemovalReason = 'evicted' | 'removed' | 'corrupt' | 'expired';

/** A tier as events name it. */
export interface EventTier {
  readonly name: string;
  readonly medium: EventMedium;
}

/** The medium of a tier with these capabilities. */
export function mediumOf(caps: BackendCapabilities): EventMedium {
  if (caps.hostMemory) return 'CPU';
  if (caps.shared) return 'SHARED';
  if (caps.persistent) return 'DISK';
  return 'EXTERNAL';
}

/**
 * Receives what happened to chunks. Implementations never throw and never wait: they are called
 * on the storage hot paths.
 */
export interface ChunkEventSink {
  /** `tier` holds the chunk now (written, or found already there by a write). */
  stored(tier: EventTier, ns: NamespaceId, hash: ChunkHash): void;
  /** `tier` no longer holds these chunks (a remove may name chunks the tier did not hold). */
  removed(
    tier: EventTier,
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    reason: RemovalReason,
  ): void;
  /** Every tier dropped these namespaces (every namespace when empty); `epoch` is the new one. */
  cleared(namespaces: readonly NamespaceId[], epoch: number): void;
}

/** One namespace's chunks in one tier, for a snapshot: `hashes` packed, 32 bytes each. */
export interface SnapshotGroup {
  readonly tier: EventTier;
  readonly ns: NamespaceId;
  readonly hashes: readonly ChunkHash[];
}

/**
 * A tier a snapshot lists from its store (a shared tier): `scan` starts the listing (null when
 * the tier cannot be listed now).
 */
export interface SnapshotScan {
  readonly tier: EventTier;
  readonly scan: (signal: AbortSignal) => AsyncIterable<{
    readonly ns: NamespaceId;
    readonly hashes: readonly ChunkHash[];
  }> | null;
}
