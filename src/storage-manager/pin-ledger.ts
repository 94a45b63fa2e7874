import type { ChunkHash, NamespaceId, StorageBackend } from '../backends/types.ts';

interface PinRun {
  tier: StorageBackend;
  ns: NamespaceId;
  /** Chunk position of hashes[0] within the lookup. */
  start: number;
  hashes: ChunkHash[];
}

/**
 * Records every pin a lookup takes, by tier, namespace and chunk position, so that each is
 * released exactly once whatever path the lookup ends on (answered, trimmed, cancelled,
 * aborted, expired).
 */
export class PinLedger {
  #runs: PinRun[] = [];

  /** Records pins already taken on `tier` for chunks `start .. start + hashes.length`. */
  add(tier: StorageBackend, ns: NamespaceId, start: number, hashes: ChunkHash[]): void {
    if (hashes.length > 0) this.#runs.push({ tier, ns, start, hashes });
  }

  /** Number of pinned chunks recorded. */
  get size(): number {
    let n = 0;
    for (const r of this.#runs) n += r.hashes.length;
    return n;
  }

  /** Releases the pins of every chunk at position >= `end` (in every tier and namespace). */
  releaseFrom(end: number): void {
    const kept: PinRun[] = [];
    for (const r of this.#runs) {
      const keep = Math.max(0, Math.min(r.hashes.length, end - r.start));
      if (keep < r.hashes.length) safeUnpin(r.tier, r.ns, r.hashes.slice(keep));
      if (keep > 0) {
        r.hashes.length = keep;
        kept.push(r);
      }
    }
    this.#runs = kept;
  }

  /** Releases every pin on tiers other than `keep`. */
  releaseAllBut(keep: StorageBackend): void {
    const kept: PinRun[] = [];
    for (const r of this.#runs) {
      if (r.tier === keep) kept.push(r);
      else safeUnpin(r.tier, r.ns, r.hashes);
    }
    this.#runs = kept;
  }

  /** Releases every pin. Idempotent. */
  releaseAll(): void {
    const runs = this.#runs;
    this.#runs = [];
    for (const r of runs) safeUnpin(r.tier, r.ns, r.hashes);
  }

  /** Hashes pinned on `tier` for `ns`, in position order. */
  pinnedOn(tier: StorageBackend, ns: NamespaceId): ChunkHash[] {
    const runs = this.#runs
      .filter((r) => r.tier === tier && r.ns === ns)
      .sort((a, b) => a.start - b.start);
    return runs.flatMap((r) => r.hashes);
  }
}

function safeUnpin(tier: StorageBackend, ns: NamespaceId, hashes: ChunkHash[]): void {
  try {
    tier.unpin(ns, hashes);
  } catch {
    // A closed tier holds nothing that still needs unpinning.
  }
}
