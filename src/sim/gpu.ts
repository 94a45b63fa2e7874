import { KvtierError } from '../errors.ts';
import { H100_HOST_LINK, H200_HOST_LINK, PCIE_GEN4_HOST_LINK } from './host-link.ts';
import { kvBytesPerToken, type PlannedModel } from './models.ts';

/**
 * How fast the modeled engine is: a GPU preset (peak dense bf16 FLOP/s, HBM bandwidth, memory,
 * host link), the number of GPUs one engine spans (tensor parallel, scaled ideally), and the
 * stated utilisations. A step of the engine takes the longer of its compute time (FLOPs over
 * peak x MFU) and its memory time (weights and KV read over HBM bandwidth x utilisation): long
 * prefills are compute-bound, decode steps memory-bound. Every number lives here with its source,
 * except the host links, which `host-link.ts` takes from kvtier's GPU check.
 */

/** One GPU model's datasheet figures. */
export interface GpuPreset {
  /** Display name. */
  name: string;
  /** Dense bf16 tensor throughput, FLOP/s (without sparsity). */
  peakFlops: number;
  /** HBM (or GDDR) bandwidth, bytes/s. */
  memoryBytesPerSec: number;
  /** Device memory, bytes. */
  memoryBytes: number;
  /**
   * Bandwidth of kvtier's KV loads from pinned host memory into this GPU, bytes/s: from kvtier's
   * GPU check, measured or derived as `hostLinkSource` says (`host-link.ts`).
   */
  hostLinkBytesPerSec: number;
  /** Where the host link comes from. */
  hostLinkSource: string;
  /** Where the figures come from. */
  source: string;
}

/** GPU presets, keyed by `--gpu` name. */
export const GPU_PRESETS: Readonly<Record<string, Readonly<GpuPreset>>> = Object.freeze({
  h100: {
    name: 'NVIDIA H100 SXM',
    peakFlops: 989e12,
    memoryBytesPerSec: 3.35e12,
    memoryBytes: 80e9,
    hostLinkBytesPerSec: H100_HOST_LINK.bytesPerSec,
    hostLinkSource: H100_HOST_LINK.source,
    source: 'NVIDIA H100 datasheet: 989 TFLOPS dense BF16, 3.35 TB/s HBM3, 80 GB, PCIe Gen5',
  },
  h200: {
    name: 'NVIDIA H200 SXM',
    peakFlops: 989e12,
    memoryBytesPerSec: 4.8e12,
    memoryBytes: 141e9,
    hostLinkBytesPerSec: H200_HOST_LINK.bytesPerSec,
    hostLinkSource: H200_HOST_LINK.source,
    source: 'NVIDIA H200 datasheet: 989 TFLOPS dense BF16, 4.8 TB/s HBM3e, 141 GB, PCIe Gen5',
  },
  a100: {
    name: 'NVIDIA A100 SXM 80GB',
    peakFlops: 312e12,
    memoryBytesPerSec: 2.039e12,
    memoryBytes: 80e9,
    hostLinkBytesPerSec: PCIE_GEN4_HOST_LINK.bytesPerSec,
    hostLinkSource: PCIE_GEN4_HOST_LINK.source,
    source: 'NVIDIA A100 datasheet: 312 TFLOPS dense BF16, 2,039 GB/s HBM2e, 80 GB, PCIe Gen4',
  },
  l40s: {
    name: 'NVIDIA L40S',
    peakFlops: 362e12,
    memoryBytesPerSec: 864e9,
    memoryBytes: 48e9,
    hostLinkBytesPerSec: PCIE_GEN4_HOST_LINK.bytesPerSec,
    hostLinkSource: PCIE_GEN4_HOST_LINK.source,
    source: 'NVIDIA L40S datasheet: 362 TFLOPS dense BF16, 864 GB/s GDDR6, 48 GB, PCIe Gen4',
  },
});

/** The preset used without `--gpu`. */
export const DEFAULT_GPU = 'h100';

/**
 * Model FLOPs utilisation of the modeled engine. It is a calibration, not a measurement: 0.33
 * makes a 10,000-token Llama-3.1-8B prefill on an H100 take the ~0.57 s LMCache published.
 */
export const DEFAULT_MFU = 0.33;

/** Share of HBM bandwidth a decode step reaches (decode kernels reach roughly 70-80%); an assumption. */
export const DEFAULT_MEMORY_UTILIZATION = 0.75;

/** Share of the GPUs' memory the engine takes (vLLM's `gpu_memory_utilization` default). */
export const GPU_MEMORY_UTILIZATION = 0.9;

/** The engine the planner models: which GPU, how many per engine, and the utilisations. */
export interface EngineSpeed {
  gpu: GpuPreset;
  /** GPUs one engine spans (tensor parallel); FLOPs and bandwidth scale with it (no communication cost). */
  gpus: number;
  mfu: number;
  memoryUtilization: number;
}

/**
 * The preset called `name` (case-insensitive).
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the presets.
 */
export function gpuPreset(name: string): GpuPreset {
  const g = GPU_PRESETS[name.toLowerCase()];
  if (g === undefined)
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `--gpu must be one of ${Object.keys(GPU_PRESETS).join(', ')}, got ${JSON.stringify(name)}`,
    );
  return { ...g };
}

/** Bytes of the model's weights (every parameter, MoE experts included). */
export function weightBytes(m: PlannedModel): number {
  return (m.totalParams ?? m.activeParams) * (m.weightBytesPerParam ?? 2);
}

/**
 * GPUs per engine when none is given: the smallest power of two whose memory holds the weights
 * in at most 60% of it (the rest is KV cache and activations).
 */
export function defaultGpusPerEngine(m: PlannedModel, g: GpuPreset): number {
  let n = 1;
  while (weightBytes(m) > 0.6 * n * g.memoryBytes && n < 64) n *= 2;
  return n;
}

/**
 * Resolves the engine: the preset, GPUs per engine (default {@link defaultGpusPerEngine}), MFU
 * and memory utilisation (defaults {@link DEFAULT_MFU}, {@link DEFAULT_MEMORY_UTILIZATION}).
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for an unknown GPU or a value out of range.
 */
export function resolveEngineSpeed(
  m: PlannedModel,
  o: { gpu?: string; gpus?: number; mfu?: number; memoryUtilization?: number } = {},
): EngineSpeed {
  const gpu = gpuPreset(o.gpu ?? DEFAULT_GPU);
  const frac = (name: string, v: number) => {
    if (!(v > 0 && v <= 1))
      throw new KvtierError('KVT_INVALID_ARGUMENT', `${name} must be in (0, 1], got ${v}`);
    return v;
  };
  const gpus = o.gpus ?? defaultGpusPerEngine(m, gpu);
  if (!Number.isInteger(gpus) || gpus < 1 || gpus > 1024)
    throw new KvtierError('KVT_INVALID_ARGUMENT', `GPUs per engine must be 1..1024, got ${gpus}`);
  return {
    gpu,
    gpus,
    mfu: frac('--mfu', o.mfu ?? DEFAULT_MFU),
    memoryUtilization: frac(
      'memory utilisation',
      o.memoryUtilization ?? DEFAULT_MEMORY_UTILIZATION,
    ),
  };
}

/**
 * KV cache bytes of the engine when `--gpu-memory` is not given: {@link GPU_MEMORY_UTILIZATION}
 * of the engine's GPU memory less the weights (at least one 16-token block's worth).
 */
export function defaultKvCacheBytes(m: PlannedModel, s: EngineSpeed): number {
  const free = GPU_MEMORY_UTILIZATION * s.gpus * s.gpu.memoryBytes - weightBytes(m);
  return Math.max(16 * kvBytesPerToken(m), Math.floor(free));
}

/** FLOPs to compute prompt positions `[start, end)` with the positions before `start` cached. */
export function segmentFlops(m: PlannedModel, start: number, end: number): number {
  if (end <= start) return 0;
  return (
    2 * m.activeParams * (end - start) +
    2 * m.numLayers * m.attentionWidth * (end * end - start * start)
  );
}

/**
 * Seconds of one engine step that computes `segments` (one per scheduled request: positions
 * `[start, end)`, decode steps included as one-token segments): the longer of compute (FLOPs at
 * peak x MFU) and memory (weights, read once per step, plus each request's KV up to `end`, at
 * HBM bandwidth x utilisation).
 */
export function stepSeconds(
  m: PlannedModel,
  s: EngineSpeed,
  segments: readonly { start: number; end: number }[],
): number {
  let flops = 0;
  let tokens = 0;
  let kvTokens = 0;
  for (const g of segments) {
    flops += segmentFlops(m, g.start, g.end);
    tokens += g.end - g.start;
    kvTokens += g.end;
  }
  return stepTime(m, s, flops, tokens, kvTokens);
}

/**
 * Seconds of a decode-only step of `batch` requests whose contexts sum to `contextTokens`
 * (each computes one token at its position): {@link stepSeconds} without building segments.
 */
export function decodeStepSeconds(
  m: PlannedModel,
  s: EngineSpeed,
  batch: number,
  contextTokens: number,
): number {
  // Each request computes position c: FLOPs 2P + 2LW((c+1)^2 - c^2) = 2P + 2LW(2c + 1).
  const flops =
    2 * m.activeParams * batch + 2 * m.numLayers * m.attentionWidth * (2 * contextTokens + batch);
  return stepTime(m, s, flops, batch, contextTokens + batch);
}

function stepTime(
  m: PlannedModel,
  s: EngineSpeed,
  flops: number,
  tokens: number,
  kvTokens: number,
): number {
  if (tokens <= 0) return 0;
  const compute = flops / (s.gpus * s.gpu.peakFlops * s.mfu);
  const active = m.activeParams * tokens * (m.weightBytesPerParam ?? 2);
  const weights = Math.min(weightBytes(m), active);
  const memory =
    (weights + kvTokens * kvBytesPerToken(m)) /
    (s.gpus * s.gpu.memoryBytesPerSec * s.memoryUtilization);
  return Math.max(compute, memory);
}

/** Seconds to prefill positions `[cached, total)` of one prompt alone (compute-bound). */
export function prefillSeconds(
  m: PlannedModel,
  s: EngineSpeed,
  cached: number,
  total: number,
): number {
  return segmentFlops(m, cached, total) / (s.gpus * s.gpu.peakFlops * s.mfu);
}

/**
 * The engine's prefill rate on a workload, prompt tokens/s: its prompt tokens over the seconds
 * it takes to prefill each prompt from scratch, one at a time (no cache, no decode).
 */
export function prefillRate(
  m: PlannedModel,
  s: EngineSpeed,
  promptLengths: readonly number[],
): number {
  let tokens = 0;
  let seconds = 0;
  for (const n of promptLengths) {
    tokens += n;
    seconds += prefillSeconds(m, s, 0, n);
  }
  return seconds > 0 ? tokens / seconds : 0;
}

/** One line naming the engine, for reports. */
export function describeEngine(m: PlannedModel, s: EngineSpeed): string {
  const tf = (s.gpus * s.gpu.peakFlops) / 1e12;
  const tb = (s.gpus * s.gpu.memoryBytesPerSec) / 1e12;
  return (
    `${m.name} on ${s.gpus > 1 ? `${s.gpus} × ` : ''}${s.gpu.name} ` +
    `(${tf.toFixed(0)} TFLOP/s dense BF16 at MFU ${s.mfu}, ${tb.toFixed(2)} TB/s memory at ${Math.round(100 * s.memoryUtilization)}%)`
  );
}
