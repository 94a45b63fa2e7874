import { CHUNK_HEADER_BYTES } from '../backends/chunk-format.ts';
import { DEFAULT_PAGE_BYTES } from '../backends/host-arena.ts';
import { type ChunkKeyTrace, lruBound } from './bounds.ts';
import { kvBytesPerToken, type PlannedModel } from './models.ts';
import type { SimReport } from './types.ts';

/**
 * Capacity planning on top of the simulator. Capacities are given in the planned model's bytes
 * (what an operator buys); the simulator stores chunks of a small verification model, so each
 * capacity becomes the same number of chunks of the verification model before the sidecar sees
 * it. Tokens, chunks and hit rates are the same in both; bytes and times are reported for the
 * planned model.
 */

/** The shapes a conversion needs. */
export interface PlanShapes {
  planned: PlannedModel;
  /** KV bytes per token of the verification model. */
  verificationBytesPerToken: number;
  /** Tokens per chunk and per engine block. */
  chunkTokens: number;
  blockTokens: number;
}

/** Whole chunks of the planned model that `bytes` hold. */
export function chunksIn(bytes: number, s: PlanShapes): number {
  return Math.floor(bytes / (kvBytesPerToken(s.planned) * s.chunkTokens));
}

/**
 * Host-memory capacity to give the sidecar's CPU tier so it holds as many verification chunks as
 * `plannedBytes` hold planned chunks (chunks rounded up to whole arena pages, as the arena does).
 */
export function cpuTierBytes(plannedBytes: number, s: PlanShapes): number {
  const pages = Math.ceil((s.verificationBytesPerToken * s.chunkTokens) / DEFAULT_PAGE_BYTES);
  return Math.max(DEFAULT_PAGE_BYTES, chunksIn(plannedBytes, s) * pages * DEFAULT_PAGE_BYTES);
}

/** Disk capacity for the same number of chunks (one object each: header and payload). */
export function diskTierBytes(plannedBytes: number, s: PlanShapes): number {
  const object = CHUNK_HEADER_BYTES + s.verificationBytesPerToken * s.chunkTokens;
  return Math.max(object, chunksIn(plannedBytes, s) * object);
}

/** GPU KV blocks that `plannedBytes` of GPU memory hold for the planned model. */
export function gpuBlocksIn(plannedBytes: number, s: PlanShapes): number {
  return Math.max(1, Math.floor(plannedBytes / (kvBytesPerToken(s.planned) * s.blockTokens)));
}

/** kvtier's share of prompt tokens (every tier). */
export function kvtierShare(r: SimReport): number {
  const n = Object.values(r.tokens.byTier).reduce((a, b) => a + b, 0);
  return r.promptTokens > 0 ? n / r.promptTokens : 0;
}

/** One row of a sweep with its bounds. */
export interface BoundedRow {
  capacityBytes: number;
  chunks: number;
  report: SimReport;
  /** LRU chunk cache of the same capacity on the workload's chunk keys. */
  lru: number;
  /** LRU chunk cache of this capacity plus the GPU KV cache's (the pair kvtier + GPU compares with). */
  lruWithGpu: number;
  /** Infinite chunk cache on the same keys. */
  infinite: number;
}

/** Attaches the LRU bound of each capacity and the infinite bound to the sweep's reports. */
export function boundRows(
  trace: ChunkKeyTrace,
  capacitiesBytes: readonly number[],
  reports: readonly SimReport[],
  s: PlanShapes,
): BoundedRow[] {
  const infinite = lruBound(trace, Number.POSITIVE_INFINITY).hitRate;
  return reports.map((report, i) => {
    const capacityBytes = capacitiesBytes[i] as number;
    const chunks = chunksIn(capacityBytes, s);
    const gpuChunks = Math.floor((report.model?.gpuCacheTokens ?? 0) / s.chunkTokens);
    return {
      capacityBytes,
      chunks,
      report,
      lru: lruBound(trace, chunks).hitRate,
      lruWithGpu: lruBound(trace, chunks + gpuChunks).hitRate,
      infinite,
    };
  });
}

/**
 * One line of advice from a run: what the CPU tier served at its capacity, and the smallest
 * host memory (doubling from one chunk) at which an LRU cache reaches 95% of the infinite
 * cache's hit rate on this workload, with that rate.
 */
export function adviceLine(
  trace: ChunkKeyTrace,
  report: SimReport,
  cpuPlannedBytes: number,
  s: PlanShapes,
  fmtBytes: (n: number) => string,
): string {
  const infinite = lruBound(trace, Number.POSITIVE_INFINITY);
  const chunkBytes = kvBytesPerToken(s.planned) * s.chunkTokens;
  const pct = (f: number) => `${(f * 100).toFixed(1)}%`;
  const served = `${fmtBytes(cpuPlannedBytes)} of host memory served ${pct(kvtierShare(report))} of prompt tokens from kvtier`;
  if (infinite.hitTokens === 0)
    return `Advice (${s.planned.name}): ${served}; this workload reuses no chunk, so more host memory would not help.`;
  let chunks = 1;
  let lru = lruBound(trace, chunks);
  while (lru.hitRate < 0.95 * infinite.hitRate && chunks < trace.uniqueChunks) {
    chunks = Math.min(trace.uniqueChunks, chunks * 2);
    lru = lruBound(trace, chunks);
  }
  return (
    `Advice (${s.planned.name}): ${served}; ${fmtBytes(chunks * chunkBytes)} would let an LRU cache serve ` +
    `${pct(lru.hitRate)} (95% of the ${pct(infinite.hitRate)} any cache could, with the GPU prefix cache's share included).`
  );
}
