import type {
  ChunkHash,
  NamespaceId,
  PackedHostIndex,
  StorageBackend,
} from '../backends/core/types.ts';
import type { LookupHashes } from './lookup-hashes.ts';

interface PinRun {
  tier: StorageBackend;
  ns: NamespaceId;
  /** Chunk position of the run's first pinned hash within the lookup. */
  start: number;
  /**
   * Pinned hashes are `hashes[from, from + count)`, or with `packed`, hashes `from .. from +
   * count` of `packed`, unpinned through `index`; never written.
   */
  hashes: readonly ChunkHash[] | undefined;
  packed: LookupHashes | undefined;
  index: PackedHostIndex | undefined;
  /**
   * With `packed`: the index's handles of the pinned chunks when it gave them, handle `i` for
   * hash `handlesFrom + i`; released by handle where the index can, else by hash.
   */
  handles: unknown[] | undefined;
  handlesFrom: number;
  from: number;
  count: number;
}

/**
 * Records every pin a lookup takes, by tier, namespace and chunk position, so that each is
 * released exactly once whatever path the lookup ends on (answered, trimmed, cancelled,
 * aborted, expired). Runs refer to the caller's hashes (which must not change while recorded)
 * instead of copying them: a lookup that hits everything records one list it already has.
 */
export class PinLedger {
  #runs: PinRun[] = [];

  /**
   * Records pins already taken on `tier` for chunks `start .. start + count`, whose hashes are
   * `hashes[from, from + count)` (default: all of `hashes`).
   */
  add(
    tier: StorageBackend,
    ns: NamespaceId,
    start: number,
    hashes: readonly ChunkHash[],
    from = 0,
    count = hashes.length - from,
  ): void {
    if (count > 0)
      this.#runs.push({
        tier,
        ns,
        start,
        hashes,
        packed: undefined,
        index: undefined,
        handles: undefined,
        handlesFrom: 0,
        from,
        count,
      });
  }

  /**
   * Records pins taken through `index` (the packed index of `tier`) for chunks
   * `start .. start + count`, whose hashes are hashes `from .. from + count` of `packed`; with
   * `handles` (from `index.containsPinned`), handle `i` is hash `from + i`'s.
   */
  addPacked(
    tier: StorageBackend,
    index: PackedHostIndex,
    ns: NamespaceId,
    start: number,
    packed: LookupHashes,
    from: number,
    count: number,
    handles?: unknown[],
  ): void {
    if (count > 0)
      this.#runs.push({
        tier,
        ns,
        start,
        hashes: undefined,
        packed,
        index,
        handles,
        handlesFrom: from,
        from,
        count,
      });
  }

  /** Number of pinned chunks recorded. */
  get size(): number {
    let n = 0;
    for (const r of this.#runs) n += r.count;
    return n;
  }

  /** Releases the pins of every chunk at position >= `end` (in every tier and namespace). */
  releaseFrom(end: number): void {
    const runs = this.#runs;
    let kept = 0;
    for (let i = 0; i < runs.length; i++) {
      const r = runs[i]!;
      const keep = Math.max(0, Math.min(r.count, end - r.start));
      if (keep < r.count) {
        safeUnpin(r, r.from + keep, r.count - keep);
        // The released chunks' handles are not kept alive by the lookup.
        if (r.handles !== undefined) r.handles.length = r.from - r.handlesFrom + keep;
      }
      r.count = keep;
      if (keep > 0) runs[kept++] = r;
    }
    runs.length = kept;
  }

  /** Releases every pin on tiers other than `keep`. */
  releaseAllBut(keep: StorageBackend): void {
    const runs = this.#runs;
    let kept = 0;
    for (let i = 0; i < runs.length; i++) {
      const r = runs[i]!;
      if (r.tier === keep) runs[kept++] = r;
      else safeUnpin(r, r.from, r.count);
    }
    runs.length = kept;
  }

  /** Releases every pin. Idempotent. */
  releaseAll(): void {
    const runs = this.#runs;
    if (runs.length === 0) return;
    this.#runs = [];
    for (const r of runs) safeUnpin(r, r.from, r.count);
  }

  /** Hashes pinned on `tier` for `ns`, in position order. */
  pinnedOn(tier: StorageBackend, ns: NamespaceId): ChunkHash[] {
    const runs = this.#runs
      .filter((r) => r.tier === tier && r.ns === ns)
      .sort((a, b) => a.start - b.start);
    return runs.flatMap((r) => hexOf(r, r.from, r.count));
  }
}

function hexOf(r: PinRun, from: number, count: number): readonly ChunkHash[] {
  if (r.packed !== undefined) return r.packed.hexSlice(from, from + count);
  const hashes = r.hashes!;
  return from === 0 && count === hashes.length ? hashes : hashes.slice(from, from + count);
}

function safeUnpin(r: PinRun, from: number, count: number): void {
  try {
    const index = r.index;
    if (index === undefined) r.tier.unpin(r.ns, hexOf(r, from, count));
    else if (
      r.handles === undefined ||
      index.unpinHandles?.(r.handles, from - r.handlesFrom, count) !== true
    )
      index.unpin(r.ns, r.packed!.view(from, count), 0, count);
  } catch {
    // A closed tier holds nothing that still needs unpinning.
  }
}
