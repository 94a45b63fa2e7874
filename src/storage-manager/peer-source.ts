/**
 * What a sidecar serves to the peer tiers of other sidecars (PEER_CONTAINS, PEER_GET; docs/fleet.md
 * "Peers"): its own tiers, walked in order as a lookup walks them, skipping every tier that reaches
 * other sidecars itself (`capabilities.peers`), so that a peer's request never fans out again.
 */
import type { Chunk, ChunkHash, NamespaceId, StorageBackend } from '../backends/core/types.ts';
import type { Logger } from '../util/log.ts';

/** Chunks read for a peer, held until the reply that carries them has been built. */
export interface PeerReadLease {
  /** The chunks found, by hash (a hash asked for and not found is absent). */
  readonly chunks: ReadonlyMap<ChunkHash, Chunk>;
  /**
   * Releases the pins (host memory) and pooled buffers (lower tiers) behind `chunks`; their bytes
   * may change afterwards. Idempotent.
   */
  release(): void;
}

/** The tiers a peer's request may read: not down, and not reaching other sidecars themselves. */
function localTiers(tiers: readonly StorageBackend[]): StorageBackend[] {
  return tiers.filter((t) => t.capabilities.peers !== true && t.health() !== 'down');
}

/**
 * Leading chunks of `hashes` held in the local tiers: each tier continues where the one before it
 * stopped, as a lookup's walk does (nothing is pinned). A tier that fails counts as a miss.
 */
export async function localContains(
  tiers: readonly StorageBackend[],
  ns: NamespaceId,
  hashes: readonly ChunkHash[],
  log: Logger,
): Promise<number> {
  let k = 0;
  for (const t of localTiers(tiers)) {
    if (k >= hashes.length) break;
    try {
      k += await t.batchedContains(ns, k === 0 ? hashes : hashes.slice(k));
    } catch (err) {
      log.debug('tier contains failed for a peer; treated as a miss', { tier: t.name, err });
    }
  }
  return k;
}

/**
 * Reads `hashes` from the local tiers, first tier first. Chunks of a tier that pins (host memory)
 * are pinned before they are read and stay pinned until `release`, so a reply can be built from
 * them in place. A tier that fails counts as a miss.
 */
export async function localRead(
  tiers: readonly StorageBackend[],
  ns: NamespaceId,
  hashes: readonly ChunkHash[],
  log: Logger,
): Promise<PeerReadLease> {
  const chunks = new Map<ChunkHash, Chunk>();
  const pins: { tier: StorageBackend; hashes: ChunkHash[] }[] = [];
  let rest = [...new Set(hashes)];
  let released = false;
  const release = () => {
    if (released) return;
    released = true;
    for (const c of chunks.values()) c.release?.();
    for (const p of pins) {
      try {
        p.tier.unpin(ns, p.hashes);
      } catch {
        // Closed meanwhile: nothing left to release.
      }
    }
  };
  try {
    for (const t of localTiers(tiers)) {
      if (rest.length === 0) break;
      let asked = rest;
      if (t.capabilities.pinning) {
        asked = rest.filter((h) => t.pin(ns, [h]) === 1);
        if (asked.length > 0) pins.push({ tier: t, hashes: asked });
        if (asked.length === 0) continue;
      }
      let got: Map<ChunkHash, Chunk | null>;
      try {
        got = await t.batchedGet(ns, asked);
      } catch (err) {
        log.debug('tier get failed for a peer; treated as a miss', { tier: t.name, err });
        continue;
      }
      for (const [h, c] of got) if (c != null && !chunks.has(h)) chunks.set(h, c);
      rest = rest.filter((h) => !chunks.has(h));
    }
  } catch (err) {
    release();
    throw err;
  }
  return { chunks, release };
}
