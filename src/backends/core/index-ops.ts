/**
 * The loops every backend with an in-memory index shares: counting the contiguous prefix of
 * hits (optionally pinning exactly those) and pinning the present chunks of a list. Each
 * backend supplies how to find, touch and pin one of its entries.
 */
import type { ChunkHash } from '../../hashing/chunk-hash.ts';

/**
 * Counts hits from the first hash until the first miss; `find` also refreshes recency. With
 * `pin`, exactly the counted entries are pinned, after the walk (a miss pins nothing extra).
 */
export function countPrefixHits<E>(
  hashes: readonly ChunkHash[],
  find: (hash: ChunkHash) => E | undefined,
  pin: ((e: E) => void) | undefined,
): number {
  const hits: E[] = [];
  for (const hash of hashes) {
    const e = find(hash);
    if (e === undefined) break;
    hits.push(e);
  }
  if (pin !== undefined) for (const e of hits) pin(e);
  return hits.length;
}

/** Pins every present entry once; returns how many were pinned. */
export function pinPresent<E>(
  hashes: readonly ChunkHash[],
  find: (hash: ChunkHash) => E | undefined,
  pin: (e: E) => void,
): number {
  let pinned = 0;
  for (const hash of hashes) {
    const e = find(hash);
    if (e === undefined) continue;
    pin(e);
    pinned++;
  }
  return pinned;
}
