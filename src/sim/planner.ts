import { CHUNK_HEADER_BYTES } from '../backends/format/chunk-format.ts';
import { type ChunkKeyTrace, lruBound, tierBehindGpuBound } from './bounds.ts';
import { decodeStepSeconds, type EngineSpeed, prefillRate, prefillSeconds } from './gpu.ts';
import { kvBytesPerToken, type PlannedModel } from './models.ts';
import { kvtierTokens } from './report.ts';
import type { PlannerTier } from './tier-models.ts';
import type { SimReport, Workload } from './types.ts';

/**
 * Capacity planning on top of the simulator. Capacities are given in the planned model's bytes
 * (what an operator buys); the simulator stores chunks of a small verification model, so each
 * capacity becomes the same number of chunks of the verification model before the sidecar sees
 * it. Tokens, chunks and hit rates are the same in both; bytes and times are the planned model's.
 *
 * Here: the conversions, the load a workload offers, the gain of a run over the same engine
 * without kvtier, the bounds each figure is compared with (and the flags when one is above its
 * bound), targets and the cheapest configuration that reaches one.
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
 * The sidecar's CPU tier for `plannedBytes` of the planned model: as many arena pages as chunks,
 * a page the verification chunk's size (a power of two, at least 4 KiB).
 */
export function cpuTier(
  plannedBytes: number,
  s: PlanShapes,
): { capacityBytes: number; pageBytes: number } {
  const chunk = s.verificationBytesPerToken * s.chunkTokens;
  let pageBytes = 4096;
  while (pageBytes < chunk) pageBytes *= 2;
  return { capacityBytes: Math.max(1, chunksIn(plannedBytes, s)) * pageBytes, pageBytes };
}

/** Bytes of one stored chunk object below the CPU tier (header and payload). */
export function chunkObjectBytes(s: PlanShapes): number {
  return CHUNK_HEADER_BYTES + s.verificationBytesPerToken * s.chunkTokens;
}

/** Capacity of a file-backed tier (disk, fs) holding as many chunks as `plannedBytes` hold. */
export function lowerTierBytes(plannedBytes: number, s: PlanShapes): number {
  return Math.max(1, chunksIn(plannedBytes, s)) * chunkObjectBytes(s);
}

/**
 * `maxmemory` of a private Redis holding about as many chunks: 1 MiB for the server itself, and
 * per chunk its object plus ~128 bytes of key and dictionary overhead (Redis evicts by its own
 * approximate LRU, so the count is approximate too).
 */
export function redisMaxMemory(plannedBytes: number, s: PlanShapes): number {
  return 2 ** 20 + Math.max(1, chunksIn(plannedBytes, s)) * (chunkObjectBytes(s) + 128);
}

/** GPU KV blocks that `plannedBytes` of GPU memory hold for the planned model. */
export function gpuBlocksIn(plannedBytes: number, s: PlanShapes): number {
  return Math.max(1, Math.floor(plannedBytes / (kvBytesPerToken(s.planned) * s.blockTokens)));
}

/** What one engine can serve of a workload, by the GPU model (no cache). */
export interface EngineCapacity {
  /** Seconds to prefill the mean prompt from scratch. */
  prefillSeconds: number;
  /** Requests decoding at once: as many as the KV cache holds at the mean context, at most `maxRunning`. */
  batch: number;
  /** Seconds of decode per request: its output tokens, one step each, the step shared by the batch. */
  decodeSeconds: number;
  /** 1 / (prefill + decode) per request. */
  requestsPerSec: number;
}

/**
 * The capacity of one engine on `w`'s requests: a request costs the prefill of its prompt (no
 * prefix cache) plus its decode steps, each shared by the largest batch the KV cache holds.
 */
export function engineCapacity(
  w: Workload,
  planned: PlannedModel,
  speed: EngineSpeed,
  kvCacheTokens: number,
  maxRunning: number,
): EngineCapacity {
  const n = Math.max(1, w.requests.length);
  let prefill = 0;
  let prompt = 0;
  let output = 0;
  for (const r of w.requests) {
    prefill += prefillSeconds(planned, speed, 0, r.promptTokens.length);
    prompt += r.promptTokens.length;
    output += Math.max(1, r.outputTokens);
  }
  const context = (prompt + output / 2) / n;
  const batch = Math.max(1, Math.min(maxRunning, Math.floor(kvCacheTokens / Math.max(1, context))));
  const step = decodeStepSeconds(planned, speed, batch, batch * context);
  const decode = ((output / n) * step) / batch;
  return {
    prefillSeconds: prefill / n,
    batch,
    decodeSeconds: decode,
    requestsPerSec: 1 / (prefill / n + decode),
  };
}

/** The load a workload offers its engines. */
export interface OfferedLoad {
  promptTokens: number;
  /** First to last arrival, ms. */
  spanMs: number;
  /** Prompt tokens per second of the span. */
  offeredTokensPerSec: number;
  /** One engine's prefill rate on these prompts (no cache, nothing else running), tokens/s. */
  prefillTokensPerSec: number;
  /** Requests per second of the span. */
  requestsPerSec: number;
  capacity: EngineCapacity;
  /** Offered requests over the engines' capacity (ρ). */
  rho: number;
}

/** The load `w` (at its own arrival times) offers `engines` engines. */
export function offeredLoad(
  w: Workload,
  planned: PlannedModel,
  speed: EngineSpeed,
  capacity: EngineCapacity,
  engines = 1,
): OfferedLoad {
  let promptTokens = 0;
  let first = Number.POSITIVE_INFINITY;
  let last = 0;
  for (const r of w.requests) {
    promptTokens += r.promptTokens.length;
    first = Math.min(first, r.arrivalMs);
    last = Math.max(last, r.arrivalMs);
  }
  const spanMs = Math.max(1, last - (Number.isFinite(first) ? first : 0));
  const rate = prefillRate(
    planned,
    speed,
    w.requests.map((r) => r.promptTokens.length),
  );
  const rps = (Math.max(1, w.requests.length - 1) * 1000) / spanMs;
  return {
    promptTokens,
    spanMs,
    offeredTokensPerSec: (promptTokens * 1000) / spanMs,
    prefillTokensPerSec: rate,
    requestsPerSec: rps,
    capacity,
    rho: rps / (engines * capacity.requestsPerSec),
  };
}

/** The factor on arrival times that brings `load` to `rho` of its engines' capacity. */
export function sustainableScale(load: OfferedLoad, rho: number): number {
  return load.rho / rho;
}

/** Whether a run is overloaded, and why, from its offered load and the run without kvtier. */
export function overload(load: OfferedLoad, off: SimReport): string | undefined {
  if (load.rho >= 1)
    return `requests arrive at ${Math.round(100 * load.rho)}% of the engine's capacity`;
  const thrown = (off.preemption?.recomputedTokens ?? 0) / Math.max(1, off.promptTokens);
  if (thrown > 0.1)
    return `preemption threw away ${Math.round(100 * thrown)}% of the prompt work of the engine without kvtier`;
  return undefined;
}

/** Prefill work of a run: prompt tokens it computed, preemption's recompute included. */
export function computedPromptTokens(r: SimReport): number {
  return r.tokens.recomputed + (r.preemption?.recomputedTokens ?? 0);
}

/** What a run gained over the same engine without kvtier. */
export interface Gain {
  /** Prompt tokens per second of the replay the engine no longer computed. */
  savedTokensPerSec: number;
  /** The same as a share of prompt tokens. */
  savedShare: number;
  /** TTFT (queueing included) without and with kvtier, ms. */
  ttftP50: [off: number, on: number];
  ttftP90: [off: number, on: number];
  /** GPU busy time without and with kvtier, ms. */
  busyMs: [off: number, on: number];
}

/** The gain of `on` over `off` (same engine, same requests), per second of the arrival span. */
export function gainOver(off: SimReport, on: SimReport, spanMs: number): Gain {
  const saved = computedPromptTokens(off) - computedPromptTokens(on);
  return {
    savedTokensPerSec: (saved * 1000) / Math.max(1, spanMs),
    savedShare: on.promptTokens > 0 ? saved / on.promptTokens : 0,
    ttftP50: [off.modeledTtftMs.p50, on.modeledTtftMs.p50],
    ttftP90: [off.modeledTtftMs.p90, on.modeledTtftMs.p90],
    busyMs: [off.timeline?.busyMs ?? 0, on.timeline?.busyMs ?? 0],
  };
}

/** Shares of prompt tokens from other requests' prefixes (self-reuse left out). */
export function servedShares(r: SimReport): { kvtier: number; gpu: number; withGpu: number } {
  const p = Math.max(1, r.promptTokens);
  const kv = kvtierTokens(r) / p;
  const gpu = r.tokens.gpuPrefixCache / p;
  return { kvtier: kv, gpu, withGpu: kv + gpu };
}

/** The bounds of one configuration, shares of prompt tokens. */
export interface RowBounds {
  /** An LRU cache of the tier capacity alone (a reference, not flagged). */
  lru: number;
  /** A tier of that capacity behind an LRU GPU cache: compared with kvtier alone. */
  tierBehindGpu: number;
  /** One LRU cache of tier and GPU capacity: compared with kvtier + GPU cache. */
  lruWithGpu: number;
  /** No eviction: no cache can serve more (kvtier + GPU cache). */
  infinite: number;
}

/**
 * The bounds of a run whose kvtier tiers hold `tierChunks` (write-through makes the largest tier
 * the one that bounds reuse) on an engine whose GPU KV cache holds `gpuChunks`; the tier behind
 * the GPU cache starts where the run's own GPU cache stopped for each request.
 */
export function rowBounds(
  trace: ChunkKeyTrace,
  run: SimReport,
  tierChunks: number,
  gpuChunks: number,
  infinite: number,
): RowBounds {
  return {
    lru: lruBound(trace, tierChunks).hitRate,
    tierBehindGpu: tierBehindGpuBound(trace, run.gpuHitTokens ?? {}, tierChunks),
    lruWithGpu: lruBound(trace, tierChunks + gpuChunks).hitRate,
    infinite,
  };
}

/**
 * Figures above their bound, one line each: kvtier alone above a tier behind the GPU cache,
 * kvtier + GPU above the LRU of both capacities or above the infinite cache. Self-reuse after
 * preemption is left out of the figures; what remains above a bound comes from the engine's
 * order (a request served before one that arrived earlier), GPU blocks finer than chunks, or
 * partial-chunk loads.
 */
export function boundFlags(r: SimReport, b: RowBounds): string[] {
  const s = servedShares(r);
  const pct = (f: number) => `${(100 * f).toFixed(1)}%`;
  const out: string[] = [];
  const eps = 5e-4;
  if (s.kvtier > b.tierBehindGpu + eps)
    out.push(`kvtier alone ${pct(s.kvtier)} > tier-behind-GPU bound ${pct(b.tierBehindGpu)}`);
  if (s.withGpu > b.lruWithGpu + eps)
    out.push(`kvtier + GPU ${pct(s.withGpu)} > LRU +GPU bound ${pct(b.lruWithGpu)}`);
  if (s.withGpu > b.infinite + eps)
    out.push(`kvtier + GPU ${pct(s.withGpu)} > infinite-cache bound ${pct(b.infinite)}`);
  return out;
}

/** What a configuration must reach (`--target`). */
export type Target =
  | { kind: 'saved'; tokensPerSec: number }
  | { kind: 'share'; fraction: number }
  | { kind: 'ttft-p50' | 'ttft-p90'; ms: number };

/** Whether a run with `gain` reaches `t`. */
export function meetsTarget(g: Gain, t: Target): boolean {
  if (t.kind === 'saved') return g.savedTokensPerSec >= t.tokensPerSec;
  if (t.kind === 'share') return g.savedShare >= t.fraction;
  return (t.kind === 'ttft-p50' ? g.ttftP50[1] : g.ttftP90[1]) <= t.ms;
}

/** One configuration of a plan with what it gained and cost. */
export interface PlanRow {
  label: string;
  /** Capacity per tier in the planned model's bytes. */
  capacities: Partial<Record<PlannerTier, number>>;
  report: SimReport;
  gain: Gain;
  bounds?: RowBounds;
  flags: string[];
  /** Rough 3-year cost of its tiers, US dollars. */
  cost: number;
}

/** The cheapest row that reaches `t` (ties: the larger saving), or undefined. */
export function cheapestReaching(rows: readonly PlanRow[], t: Target): PlanRow | undefined {
  let best: PlanRow | undefined;
  for (const r of rows) {
    if (!meetsTarget(r.gain, t)) continue;
    if (
      best === undefined ||
      r.cost < best.cost ||
      (r.cost === best.cost && r.gain.savedTokensPerSec > best.gain.savedTokensPerSec)
    )
      best = r;
  }
  return best;
}

/**
 * The smallest capacity (doubling from one chunk) at which an LRU chunk cache serves 95% of what
 * an infinite one does on the trace, with its share; undefined when nothing is reused.
 */
export function lruKnee(
  trace: ChunkKeyTrace,
): { chunks: number; share: number; infinite: number } | undefined {
  const infinite = lruBound(trace, Number.POSITIVE_INFINITY).hitRate;
  if (infinite === 0) return undefined;
  let chunks = 1;
  let lru = lruBound(trace, chunks).hitRate;
  while (lru < 0.95 * infinite && chunks < trace.uniqueChunks) {
    chunks = Math.min(trace.uniqueChunks, chunks * 2);
    lru = lruBound(trace, chunks).hitRate;
  }
  return { chunks, share: lru, infinite };
}
