import { KvtierError } from '../errors.ts';
import { mapKey } from './block-allocator.ts';
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
  /** Per request: its id, prompt length and the keys of its full chunks (prefix-chained, 53-bit numbers). */
  requests: { id: string; promptTokens: number; keys: Float64Array }[];
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
  const seen = new Set<number>();
  let promptTokens = 0;
  const requests = sorted.map(({ r }) => {
    const n = r.promptTokens.length;
    promptTokens += n;
    const full = Math.floor(n / chunkSize);
    const h = prefixHashes(r.promptTokens.subarray(0, full * chunkSize));
    const keys = new Float64Array(full);
    for (let c = 0; c < full; c++) {
      keys[c] = mapKey(h, (c + 1) * chunkSize - 1);
      seen.add(keys[c]!);
    }
    return { id: r.id, promptTokens: n, keys };
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
  const lru = new Lru(capacityChunks);
  let hitTokens = 0;
  for (const r of trace.requests) {
    const lookup = lookupChunks(r, cs);
    let hits = 0;
    while (hits < lookup && lru.has(r.keys[hits]!)) hits++;
    hitTokens += hits * cs;
    for (const k of r.keys) lru.touch(k);
  }
  return {
    capacityChunks,
    hitTokens,
    hitRate: trace.promptTokens > 0 ? hitTokens / trace.promptTokens : 0,
  };
}

/**
 * What a tier of `tierChunks` (LRU) serves behind the engine's own GPU prefix cache: each request,
 * in arrival order, starts where the engine's GPU cache stopped for it (`gpuTokens` by request id,
 * whole chunks), takes the tier's contiguous run of chunks from there, then every full chunk of
 * its prompt goes to the tier (kvtier saves what the engine computes). The GPU level is the run's
 * own, not a model of it: a GPU prefix cache shares blocks that running requests hold, which no
 * LRU of its size describes. Returns the tier's share of prompt tokens.
 */
export function tierBehindGpuBound(
  trace: ChunkKeyTrace,
  gpuTokens: Readonly<Record<string, number>>,
  tierChunks: number,
): number {
  const cs = trace.chunkSize;
  const tier = new Lru(tierChunks);
  let tierTokens = 0;
  for (const r of trace.requests) {
    const lookup = lookupChunks(r, cs);
    const g = Math.min(lookup, Math.floor((gpuTokens[r.id] ?? 0) / cs));
    let t = g;
    while (t < lookup && tier.has(r.keys[t]!)) t++;
    tierTokens += (t - g) * cs;
    for (const k of r.keys) tier.touch(k);
  }
  return trace.promptTokens > 0 ? tierTokens / trace.promptTokens : 0;
}

/** Full chunks a request looks up: those that end before its last prompt token. */
function lookupChunks(r: { promptTokens: number; keys: Float64Array }, cs: number): number {
  return Math.min(r.keys.length, Math.floor(Math.max(0, r.promptTokens - 1) / cs));
}

/** An LRU set of chunk keys (Infinity: never evicts). */
class Lru {
  // A Map iterates in insertion order: delete + set moves a key to the most recent end.
  readonly #m = new Map<number, true>();
  readonly #cap: number;

  constructor(capacity: number) {
    if (capacity !== Number.POSITIVE_INFINITY && (!Number.isInteger(capacity) || capacity < 0))
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `capacityChunks must be an integer >= 0 or Infinity, got ${capacity}`,
      );
    this.#cap = capacity;
  }

  has(k: number): boolean {
    return this.#m.has(k);
  }

  touch(k: number): void {
    if (this.#cap === 0) return;
    this.#m.delete(k);
    this.#m.set(k, true);
    if (this.#m.size > this.#cap) this.#m.delete(this.#m.keys().next().value as number);
  }
}
