/** Chunks as the pages a tier's `scanChunks` yields. */
import type { ChunkHash, ChunkPage, NamespaceId } from './types.ts';

/** Most chunks in one page of a scan. */
export const SCAN_PAGE_CHUNKS = 4096;

/**
 * `chunks` as pages of one namespace's hashes, in the order given: a page ends where the
 * namespace changes or at {@link SCAN_PAGE_CHUNKS}. Null entries (names that are not chunks) are
 * skipped.
 */
export async function* chunkPages(
  chunks:
    | AsyncIterable<{ readonly ns: NamespaceId; readonly hash: ChunkHash } | null>
    | Iterable<{ readonly ns: NamespaceId; readonly hash: ChunkHash } | null>,
): AsyncGenerator<ChunkPage> {
  let ns: NamespaceId | undefined;
  let hashes: ChunkHash[] = [];
  for await (const c of chunks) {
    if (c === null) continue;
    if (c.ns !== ns || hashes.length >= SCAN_PAGE_CHUNKS) {
      if (ns !== undefined && hashes.length > 0) yield { ns, hashes };
      ns = c.ns;
      hashes = [];
    }
    hashes.push(c.hash);
  }
  if (ns !== undefined && hashes.length > 0) yield { ns, hashes };
}
