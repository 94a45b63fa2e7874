import { kvBytesPerToken, type PlannedModel } from './models.ts';

/**
 * The TTFT model of the planner. MODELED, not measured: the simulator runs no real model, so a
 * request's time to first token is computed from what its prefill did — the prompt tokens it
 * recomputed (prefill FLOPs at an effective GPU rate) and the KV bytes it loaded from each kvtier
 * tier (bytes of the planned model over the tier's bandwidth). Queueing is left out: the figures
 * say what caching saves a request, not how long it waited behind others.
 *
 * Every parameter lives in {@link TTFT_PARAMS}, with its source.
 */

/** Parameters of the TTFT model; see each field's source. */
export interface TtftParams {
  /** The GPU the figures are for. */
  gpu: string;
  /** Dense bf16 peak of that GPU, FLOP/s. Source: NVIDIA H100 datasheet (SXM, 989 TFLOPS dense). */
  peakFlops: number;
  /**
   * Model FLOPs utilization of a long prefill. Source: prefill MFU of 30-40% is what vLLM and
   * SGLang reach on H100 for 8B-70B models at 4K-32K tokens; 0.33 reproduces the published
   * figure of {@link TTFT_CHECK}.
   */
  prefillMfu: number;
  /**
   * Effective bandwidth of a load into the GPU, bytes/s, by tier type. Host memory: pinned
   * host-to-GPU copies over PCIe Gen5 x16 (~50 GB/s one way, NVIDIA) reach ~22 GB/s once
   * gathered per layer (LMCache's published load time of {@link TTFT_CHECK}); disk: one NVMe SSD
   * at ~3 GB/s sequential reads; Redis: 0.45 GB/s on loopback with ioredis (measured on this
   * kind of machine, design brief); anything else is charged the slowest.
   */
  loadBytesPerSec: Record<string, number>;
}

/** The TTFT model's parameters, in one place. */
export const TTFT_PARAMS: Readonly<TtftParams> = Object.freeze({
  gpu: 'NVIDIA H100 SXM',
  peakFlops: 989e12,
  prefillMfu: 0.33,
  loadBytesPerSec: Object.freeze({
    'local-cpu': 22e9,
    'local-disk': 3e9,
    fs: 3e9,
    redis: 0.45e9,
    s3: 0.45e9,
  }) as Record<string, number>,
});

/**
 * The published figure the model is checked against: a 10,000-token prompt on Llama-8B takes
 * ~0.57 s to prefill and ~0.06 s to load from host memory (LMCache's reported TTFT for a
 * 10K-token context, cited in issue 11).
 */
export const TTFT_CHECK = Object.freeze({
  model: 'llama-3.1-8b',
  tokens: 10_000,
  recomputeSeconds: 0.57,
  hostLoadSeconds: 0.06,
  source: 'LMCache, Llama-8B, 10K-token context: ~0.57 s prefill vs ~0.06 s from CPU memory',
});

/**
 * Seconds to prefill tokens `[cached, total)` of a prompt whose first `cached` tokens are already
 * in the KV cache: 2 x active params per token for the weights, plus attention over the prefix
 * (2 x layers x width x (total² - cached²), causal), at `peakFlops x prefillMfu`.
 */
export function prefillSeconds(
  m: PlannedModel,
  cached: number,
  total: number,
  p: TtftParams = TTFT_PARAMS,
): number {
  if (total <= cached) return 0;
  const n = total - cached;
  const flops =
    2 * m.activeParams * n + 2 * m.numLayers * m.attentionWidth * (total * total - cached * cached);
  return flops / (p.peakFlops * p.prefillMfu);
}

/** Seconds to load `tokens` of the model's KV from a tier of type `tierType`. */
export function loadSeconds(
  m: PlannedModel,
  tokens: number,
  tierType: string,
  p: TtftParams = TTFT_PARAMS,
): number {
  const bw = p.loadBytesPerSec[tierType] ?? Math.min(...Object.values(p.loadBytesPerSec));
  return (tokens * kvBytesPerToken(m)) / bw;
}

/** The model against {@link TTFT_CHECK}: modeled and published seconds, and one printable line. */
export function ttftCheck(
  m: PlannedModel,
  p: TtftParams = TTFT_PARAMS,
): {
  recomputeSeconds: number;
  hostLoadSeconds: number;
  line: string;
} {
  const c = TTFT_CHECK;
  const recomputeSeconds = prefillSeconds(m, 0, c.tokens, p);
  const hostLoadSeconds = loadSeconds(m, c.tokens, 'local-cpu', p);
  const line =
    `TTFT model check (${m.name}, ${c.tokens.toLocaleString('en-US')} tokens, ${p.gpu}): ` +
    `recompute ${recomputeSeconds.toFixed(2)} s (published ~${c.recomputeSeconds} s), ` +
    `load from host memory ${hostLoadSeconds.toFixed(3)} s (published ~${c.hostLoadSeconds} s) — ${c.source}`;
  return { recomputeSeconds, hostLoadSeconds, line };
}
