/**
 * The CPU tier's index: its entries by namespace and hex hash, and the same entries by hash
 * bytes ({@link PackedKeyIndex}) for lookups that come with packed hashes.
 */

import { internNamespaceId } from '../../namespace/namespace-intern.ts';
import type { ArenaBlock } from '../arena/host-arena.ts';
import type { ChunkHash, NamespaceId } from '../core/types.ts';
import { keyOfHash, type PackedKeyed, PackedKeyIndex } from '../index/packed-key-index.ts';
import type { RecencyNode } from '../index/recency-list.ts';

/** One stored chunk of the CPU tier. */
export interface CpuEntry extends RecencyNode<CpuEntry>, PackedKeyed<CpuEntry> {
  readonly ns: NamespaceId;
  readonly hash: ChunkHash;
  readonly block: ArenaBlock;
  readonly tokens: number;
  /** Pins recorded on this copy; pinned entries are kept out of the LRU. */
  pins: number;
}

/** A new unpinned, unlisted entry. */
export function newCpuEntry(
  ns: NamespaceId,
  hash: ChunkHash,
  block: ArenaBlock,
  tokens: number,
): CpuEntry {
  return {
    // One string per id: a lookup's namespace (interned where it was decoded) then compares
    // with each entry's by identity.
    ns: internNamespaceId(ns),
    hash,
    block,
    tokens,
    pins: 0,
    prev: null,
    next: null,
    listed: false,
    key: keyOfHash(hash),
    keyNext: null,
  };
}

/** Live entries by namespace and hash, by hex string and by packed bytes. */
export class CpuIndex {
  readonly #spaces = new Map<NamespaceId, Map<ChunkHash, CpuEntry>>();
  readonly #keys = new PackedKeyIndex<CpuEntry>();

  /** The entries of `ns` by hex hash (read only), or undefined when it has none. */
  space(ns: NamespaceId): ReadonlyMap<ChunkHash, CpuEntry> | undefined {
    return this.#spaces.get(ns);
  }

  /** The entry maps of `ns`, or of every namespace when omitted. */
  spaces(ns?: NamespaceId): (ReadonlyMap<ChunkHash, CpuEntry> | undefined)[] {
    return ns === undefined ? [...this.#spaces.values()] : [this.#spaces.get(ns)];
  }

  get(ns: NamespaceId, hash: ChunkHash): CpuEntry | undefined {
    return this.#spaces.get(ns)?.get(hash);
  }

  /** The entry of `ns` whose hash is the 32 bytes at `off` in `dv`. */
  find(ns: NamespaceId, dv: DataView, off: number): CpuEntry | undefined {
    return this.#keys.find(ns, dv, off);
  }

  /** Indexes `e` (its key must not be indexed yet). */
  add(e: CpuEntry): void {
    let space = this.#spaces.get(e.ns);
    if (space === undefined) {
      space = new Map();
      this.#spaces.set(e.ns, space);
    }
    space.set(e.hash, e);
    this.#keys.add(e);
  }

  delete(e: CpuEntry): void {
    deleteIn(this.#spaces, e.ns, e.hash);
    this.#keys.delete(e);
  }

  clear(): void {
    this.#spaces.clear();
    this.#keys.clear();
  }
}

/** A view of packed hashes `[from, from + count)` (32 bytes each). */
export function packedView(packed: Uint8Array, from: number, count: number): DataView {
  return new DataView(packed.buffer, packed.byteOffset + from * 32, count * 32);
}

/** Deletes `outer[ns][hash]`, and `outer[ns]` once empty. */
export function deleteIn<V>(
  outer: Map<NamespaceId, Map<ChunkHash, V>>,
  ns: NamespaceId,
  hash: ChunkHash,
): void {
  const inner = outer.get(ns);
  if (inner === undefined) return;
  inner.delete(hash);
  if (inner.size === 0) outer.delete(ns);
}
