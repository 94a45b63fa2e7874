/**
 * The prefetch step of a lookup's walk (lookup-walk.ts): the hits the walk found below host
 * memory are read with non-blocking batched gets, admitted by the serializer (design decision 4:
 * weight = chunks), matched by hash and put into host memory pinned. The first chunk a tier did
 * not deliver, that has the wrong token count, was cleared meanwhile or finds no room ends the
 * ready prefix.
 */
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
import type { ChunkShapes, TierRates } from './tier-rates.ts';

/** Chunks [start, end) of a lookup found in tier `tierIndex` by the walk. */
export interface Segment {
  tierIndex: number;
  start: number;
  end: number;
}

/** What the prefetch reads and writes; all owned by the storage manager. */
export interface PrefetchParts {
  /** The tiers in order; the first is `host`. */
  readonly tiers: readonly StorageBackend[];
  readonly host: HostMemoryTier;
  readonly serializer: AsyncSerializer;
  readonly fence: ClearFence;
  readonly metrics: KvtierMetrics | undefined;
  readonly log: Logger;
  /** Each tier's read rate: every prefetch get is a sample of it. */
  readonly rates: TierRates;
  /** Bytes per token by namespace: every chunk brought in is a sample of it. */
  readonly shapes: ChunkShapes;
}

/** One lookup's prefetch, as its walk leaves it. */
export interface PrefetchJob {
  readonly namespaces: readonly NamespaceId[];
  readonly hashes: LookupHashes;
  /** Tokens per chunk, one per hash. */
  readonly tokenCounts: ArrayLike<number>;
  /** Per namespace (in order), where the walk found each run of hits. */
  readonly segmentsByNs: readonly (readonly Segment[])[];
  /** The ready prefix so far: chunks [0, ready) are pinned in some tier. */
  readonly ready: number;
  /** The lookup's pins; gets the host-memory pins of what is brought in. */
  readonly ledger: PinLedger;
  readonly abort: LazyAbort;
  /** The CLEAR fence's stamp taken when the lookup started. */
  readonly stamp: number;
}

/**
 * Brings the lower-tier parts of [0, ready) into host memory, pinned. Returns the new ready
 * count: the first chunk a tier did not deliver (or host memory could not take) ends it.
 * Rejects when the lookup is aborted while it waits or reads.
 */
export async function prefetchIntoHost(parts: PrefetchParts, job: PrefetchJob): Promise<number> {
  const { tiers, host, fence, metrics, log } = parts;
  const { hashes, tokenCounts, ready, ledger } = job;
  const reads: { ns: NamespaceId; seg: Segment }[] = [];
  let weight = 0;
  job.namespaces.forEach((ns, i) => {
    for (const seg of job.segmentsByNs[i]!) {
      const end = Math.min(seg.end, ready);
      if (seg.tierIndex > 0 && end > seg.start) {
        reads.push({ ns, seg: { ...seg, end } });
        weight += end - seg.start;
      }
    }
  });
  if (weight === 0) return ready;
  const started = performance.now();
  const limit = await parts.serializer.run(
    weight,
    async (sig) => {
      const fetched = await Promise.all(
        reads.map(async ({ ns, seg }) => {
          const tier = tiers[seg.tierIndex]!;
          try {
            const t0 = performance.now();
            const got = await tier.batchedGet(ns, hashes.hexSlice(seg.start, seg.end), {
              signal: sig,
            });
            measured(parts, tier.name, ns, got, (performance.now() - t0) / 1000);
            return got;
          } catch (err) {
            if (sig.aborted) throw abortedError(sig, 'prefetch');
            log.warn('tier get failed during prefetch; treated as a miss', {
              tier: tier.name,
              err,
            });
            return new Map<ChunkHash, Chunk | null>();
          }
        }),
      );
      let newReady = ready;
      for (let j = 0; j < reads.length; j++) {
        const { ns, seg } = reads[j]!;
        const map = fetched[j]!;
        const stored: ChunkHash[] = [];
        let pos = seg.start;
        for (; pos < seg.end && pos < newReady; pos++) {
          const hash = hashes.at(pos);
          const chunk = map.get(hash);
          // Results are keyed by hash; a missing or mismatched chunk ends the ready prefix.
          if (chunk == null || chunk.tokens !== tokenCounts[pos]) break;
          // Read before a CLEAR of its namespace: must not come back into host memory.
          if (fence.clearedSince(ns, job.stamp)) break;
          const outcome = await host.put(ns, hash, chunk, { pin: true });
          if (outcome === 'dropped') break;
          stored.push(hash);
        }
        // Host memory copied what it stored: the read buffers can be reused.
        releaseChunks(map.values());
        ledger.add(host, ns, seg.start, stored);
        if (stored.length > 0)
          metrics?.prefetchChunks.inc({ tier: tiers[seg.tierIndex]!.name }, stored.length);
        if (pos < seg.end) newReady = Math.min(newReady, pos);
      }
      return newReady;
    },
    { signal: job.abort.signal },
  );
  metrics?.prefetchDuration.observe((performance.now() - started) / 1000);
  return limit;
}

/** Records a get's payload bytes and time as a sample of the tier's rate and the chunks' shape. */
function measured(
  parts: PrefetchParts,
  tier: string,
  ns: NamespaceId,
  got: ReadonlyMap<ChunkHash, Chunk | null>,
  seconds: number,
): void {
  let bytes = 0;
  let tokens = 0;
  for (const c of got.values())
    if (c != null) {
      bytes += c.data.byteLength;
      tokens += c.tokens;
    }
  parts.rates.recordGet(tier, bytes, seconds);
  parts.shapes.record(ns, bytes, tokens);
}
