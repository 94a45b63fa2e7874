import { KvtierError } from '../errors.ts';
import { prefixHashes } from './kv-model.ts';
import type { Workload } from './types.ts';

/**
 * Independent bounds for a capacity sweep, computed from the workload's chunk keys alone (no
 * engine, no sidecar): requests in arrival order each look up the contiguous run of their full
 * chunks that a cache holds (the chunks that end before the last prompt token, as kvtier's
 * connector asks), then store every full chunk of their prompt. An infinite cache gives the most
 * any chunk cache can serve on the workload; an LRU cache of a given number of chunks is the
 * reference a real tier of that capacity is measured against.
 */

/** The chunk keys of a workload, in arrival order. */
export interface ChunkKeyTrace {
  chunkSize: number;
  /** Per request: its prompt length and the keys of its full chunks (prefix-chained). */
  requests: { promptTokens: number; keys: string[] }[];
  /** Sum of prompt tokens. */
  promptTokens: number;
  /** Distinct chunk keys (the working set of an infinite cache). */
  uniqueChunks: number;
}

/** Hit tokens of one cache on a {@link ChunkKeyTrace}. */
export interface BoundResult {
  /** Chunk capacity (Infinity for the infinite cache). */
  capacityChunks: number;
  /** Prompt tokens found in the cache (whole chunks). */
  hitTokens: number;
  /** hitTokens / prompt tokens, in [0, 1]. */
  hitRate: number;
}

/**
 * Chunk keys of every request of `workload` in arrival order (ties in workload order): the
 * simulator's prefix hash at each chunk's last token, so equal prefixes give equal keys.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for a chunk size that is not a positive integer.
 */
export function chunkKeyTrace(workload: Workload, chunkSize: number): ChunkKeyTrace {
  if (!Number.isInteger(chunkSize) || chunkSize < 1)
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `chunkSize must be an integer >= 1, got ${chunkSize}`,
    );
  const sorted = workload.requests
    .map((r, i) => ({ r, i }))
    .sort((a, b) => a.r.arrivalMs - b.r.arrivalMs || a.i - b.i);
  const seen = new Set<string>();
  let promptTokens = 0;
  const requests = sorted.map(({ r }) => {
    const n = r.promptTokens.length;
    promptTokens += n;
    const full = Math.floor(n / chunkSize);
    const h = prefixHashes(r.promptTokens.subarray(0, full * chunkSize));
    const keys: string[] = [];
    for (let c = 0; c < full; c++) {
      const p = (c + 1) * chunkSize - 1;
      const k = `${h[2 * p]!.toString(36)}.${h[2 * p + 1]!.toString(36)}`;
      keys.push(k);
      seen.add(k);
    }
    return { promptTokens: n, keys };
  });
  return { chunkSize, requests, promptTokens, uniqueChunks: seen.size };
}

/**
 * Hit tokens of an LRU chunk cache of `capacityChunks` chunks (Infinity: never evicts) on the
 * trace. A hit refreshes the chunk; stores insert or refresh every full chunk of the prompt.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for a negative or fractional capacity.
 */
export function lruBound(trace: ChunkKeyTrace, capacityChunks: number): BoundResult {
  if (
    capacityChunks !== Number.POSITIVE_INFINITY &&
    (!Number.isInteger(capacityChunks) || capacityChunks < 0)
  )
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `capacityChunks must be an integer >= 0 or Infinity, got ${capacityChunks}`,
    );
  const cs = trace.chunkSize;
  // A Map iterates in insertion order: delete + set moves a key to the most recent end.
  const lru = new Map<string, true>();
  let hitTokens = 0;
  for (const r of trace.requests) {
    const lookup = Math.min(r.keys.length, Math.floor(Math.max(0, r.promptTokens - 1) / cs));
    let hits = 0;
    while (hits < lookup && lru.has(r.keys[hits]!)) hits++;
    hitTokens += hits * cs;
    if (capacityChunks === 0) continue;
    for (const k of r.keys) {
      lru.delete(k);
      lru.set(k, true);
      if (lru.size > capacityChunks) lru.delete(lru.keys().next().value as string);
    }
  }
  return {
    capacityChunks,
    hitTokens,
    hitRate: trace.promptTokens > 0 ? hitTokens / trace.promptTokens : 0,
  };
}
