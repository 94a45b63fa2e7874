import {
  type Chunk,
  type ChunkHash,
  type HostMemoryTier,
  type NamespaceId,
  releaseChunks,
  type StorageBackend,
} from '../backends/core/types.ts';
import { abortedError } from '../errors.ts';
import type { KvtierMetrics } from '../metrics/metrics.ts';
import type { AsyncSerializer } from '../serializer/async-serializer.ts';
import type { Logger } from '../util/log.ts';
import type { ClearFence } from './clear-fence.ts';
import type { LazyAbort } from './lazy-abort.ts';
import type { LookupHashes } from './lookup-hashes.ts';
import type { PinLedger } from './pin-ledger.ts';

/** A copy of a chunk a tier's get returned, owned by the caller; the tier's is released. */
export function ownedCopy(chunk: Chunk): Chunk {
  const copy = { tokens: chunk.tokens, data: Buffer.from(chunk.data) };
  chunk.release?.();
  return copy;
}

/** Tokens a lookup found ready in one tier. */
export interface TierTokens {
  tier: string;
  tokens: number;
}

/** The parts of a lookup the walk reads (a `LookupInput` of the storage manager). */
export interface WalkInput {
  readonly namespaces: readonly NamespaceId[];
  readonly hashes: LookupHashes;
  /** Tokens per chunk, one per hash. */
  readonly tokenCounts: ArrayLike<number>;
}

/** Chunks [start, end) of a lookup found in tier `tierIndex`. */
export interface Segment {
  tierIndex: number;
  start: number;
  end: number;
}

/** What a {@link TierWalk} reads and writes; all owned by the storage manager. */
export interface TierWalkDeps {
  readonly tiers: readonly StorageBackend[];
  readonly host: HostMemoryTier;
  readonly serializer: AsyncSerializer;
  readonly fence: ClearFence;
  readonly metrics: KvtierMetrics | undefined;
  readonly log: Logger;
}

/**
 * The lookup's walk over the tiers for the storage manager: the contiguous hits per tier
 * (pinned into the lookup's ledger), the prefetch budget, and the prefetch of lower-tier hits
 * into host memory under the serializer. Holds no state of its own between lookups.
 */
export class TierWalk {
  readonly tiers: readonly StorageBackend[];
  readonly #host: HostMemoryTier;
  readonly #serializer: AsyncSerializer;
  readonly #fence: ClearFence;
  readonly #metrics: KvtierMetrics | undefined;
  readonly #log: Logger;

  constructor(deps: TierWalkDeps) {
    this.tiers = deps.tiers;
    this.#host = deps.host;
    this.#serializer = deps.serializer;
    this.#fence = deps.fence;
    this.#metrics = deps.metrics;
    this.#log = deps.log;
  }

  /** Walks the tiers for one namespace: contiguous hits per tier, each tier continuing where the last stopped. */
  async probe(
    ns: NamespaceId,
    hashes: LookupHashes,
    tierCount: number,
    ledger: PinLedger,
    signal: LazyAbort,
  ): Promise<Segment[]> {
    const segments: Segment[] = [];
    let pos = 0;
    const n = hashes.length;
    for (let ti = 0; ti < tierCount && pos < n; ti++) {
      const tier = this.tiers[ti]!;
      if (tier.health() === 'down') continue;
      // The host tier's packed index, when it has one, needs no hex strings.
      const packed = ti === 0 ? this.#host.packedIndex : undefined;
      let rest: ChunkHash[] | undefined;
      let k = 0;
      try {
        if (packed !== undefined) k = packed.contains(ns, hashes.packed, pos, n - pos, true);
        else {
          rest = hashes.hexSlice(pos);
          // Host memory answers at once; only slower tiers get a signal to abort on.
          k = await tier.batchedContains(
            ns,
            rest,
            ti === 0 ? { pin: true } : { pin: true, signal: signal.signal },
          );
        }
      } catch (err) {
        if (signal.aborted) throw abortedError(signal.signal, 'lookup');
        this.#log.warn('tier contains failed; treated as a miss', { tier: tier.name, err });
        continue;
      }
      k = Math.max(0, Math.min(k, n - pos));
      if (k === 0) continue;
      if (rest === undefined) ledger.addPacked(tier, packed!, ns, pos, hashes, pos, k);
      else ledger.add(tier, ns, pos, rest, 0, k);
      segments.push({ tierIndex: ti, start: pos, end: pos + k });
      pos += k;
    }
    return segments;
  }

  /** Shortens `ready` so that the chunks to prefetch fit in the serializer's whole budget. */
  fitBudget(segmentsByNs: Segment[][], ready: number): number {
    const budget = this.#serializer.capacity;
    let lower = 0;
    for (const segs of segmentsByNs)
      for (const s of segs)
        if (s.tierIndex > 0) lower += Math.max(0, Math.min(s.end, ready) - s.start);
    if (lower <= budget) return ready;
    let used = 0;
    for (let pos = 0; pos < ready; pos++) {
      for (const segs of segmentsByNs) {
        const s = segs.find((x) => x.start <= pos && pos < x.end);
        if (s !== undefined && s.tierIndex > 0) used++;
      }
      if (used > budget) return pos;
    }
    return ready;
  }

  /**
   * Brings the lower-tier parts of [0, ready) into the CPU tier, pinned. Returns the new ready
   * count: the first chunk a tier did not deliver (or the CPU tier could not take) ends it.
   */
  async prefetch(
    input: WalkInput,
    segmentsByNs: Segment[][],
    ready: number,
    ledger: PinLedger,
    abort: LazyAbort,
    stamp: number,
  ): Promise<number> {
    const jobs: { ns: NamespaceId; seg: Segment }[] = [];
    let weight = 0;
    input.namespaces.forEach((ns, i) => {
      for (const seg of segmentsByNs[i]!) {
        const end = Math.min(seg.end, ready);
        if (seg.tierIndex > 0 && end > seg.start) {
          jobs.push({ ns, seg: { ...seg, end } });
          weight += end - seg.start;
        }
      }
    });
    if (weight === 0) return ready;
    const started = performance.now();
    const limit = await this.#serializer.run(
      weight,
      async (sig) => {
        const fetched = await Promise.all(
          jobs.map(async ({ ns, seg }) => {
            const tier = this.tiers[seg.tierIndex]!;
            try {
              return await tier.batchedGet(ns, input.hashes.hexSlice(seg.start, seg.end), {
                signal: sig,
              });
            } catch (err) {
              if (sig.aborted) throw abortedError(sig, 'prefetch');
              this.#log.warn('tier get failed during prefetch; treated as a miss', {
                tier: tier.name,
                err,
              });
              return new Map<ChunkHash, Chunk | null>();
            }
          }),
        );
        let newReady = ready;
        for (let j = 0; j < jobs.length; j++) {
          const { ns, seg } = jobs[j]!;
          const map = fetched[j]!;
          const stored: ChunkHash[] = [];
          let pos = seg.start;
          for (; pos < seg.end && pos < newReady; pos++) {
            const hash = input.hashes.at(pos);
            const chunk = map.get(hash);
            // Results are keyed by hash; a missing or mismatched chunk ends the ready prefix.
            if (chunk == null || chunk.tokens !== input.tokenCounts[pos]) break;
            // Read before a CLEAR of its namespace: must not come back into host memory.
            if (this.#fence.clearedSince(ns, stamp)) break;
            const outcome = await this.#host.put(ns, hash, chunk, { pin: true });
            if (outcome === 'dropped') break;
            stored.push(hash);
          }
          // The host tier copied what it stored: the read buffers can be reused.
          releaseChunks(map.values());
          ledger.add(this.#host, ns, seg.start, stored);
          if (stored.length > 0)
            this.#metrics?.prefetchChunks.inc(
              { tier: this.tiers[seg.tierIndex]!.name },
              stored.length,
            );
          if (pos < seg.end) newReady = Math.min(newReady, pos);
        }
        return newReady;
      },
      { signal: abort.signal },
    );
    this.#metrics?.prefetchDuration.observe((performance.now() - started) / 1000);
    return limit;
  }

  /** Tokens of [0, ready) per tier that holds them, in tier order; tiers with none are left out. */
  breakdown(
    segments: readonly Segment[],
    ready: number,
    tokenCounts: ArrayLike<number>,
  ): TierTokens[] {
    const out: TierTokens[] = [];
    for (const s of segments) {
      let tokens = 0;
      for (let i = s.start; i < Math.min(s.end, ready); i++) tokens += tokenCounts[i]!;
      if (tokens > 0) out.push({ tier: this.tiers[s.tierIndex]!.name, tokens });
    }
    return out;
  }
}
