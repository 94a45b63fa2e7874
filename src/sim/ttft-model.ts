import { DEFAULT_GPU, DEFAULT_MFU, type EngineSpeed, gpuPreset, prefillSeconds } from './gpu.ts';
import { kvBytesPerToken, modelPreset, type PlannedModel } from './models.ts';

/**
 * The planner's time model against one published figure: LMCache's TTFT for a 10,000-token
 * Llama-8B context, ~0.57 s to prefill and ~0.06 s to load from CPU memory. The MFU
 * ({@link DEFAULT_MFU}) was chosen to reproduce the prefill, so printing the model's prefill
 * against it is a calibration, not a check: it cannot fail. The host link is not calibrated: it
 * is kvtier's own load as its GPU check measured it (`host-link.ts`), and the report prints the
 * load it gives beside LMCache's published one.
 */

/** The published figure: the prefill the MFU reproduces, and LMCache's load shown for comparison. */
export const TTFT_REFERENCE = Object.freeze({
  model: 'llama-3.1-8b',
  gpu: DEFAULT_GPU,
  tokens: 10_000,
  recomputeSeconds: 0.57,
  hostLoadSeconds: 0.06,
  source: 'LMCache, Llama-8B, 10K-token context: ~0.57 s prefill vs ~0.06 s from CPU memory',
  /** Who published it, for the report. */
  publisher: 'LMCache',
});

/** A 10,000-token prefill and host-memory load of `m` on `s`, seconds. */
export function tenThousandTokens(
  m: PlannedModel,
  s: EngineSpeed,
): { prefillSeconds: number; hostLoadSeconds: number } {
  const n = TTFT_REFERENCE.tokens;
  return {
    prefillSeconds: prefillSeconds(m, s, 0, n),
    hostLoadSeconds: (n * kvBytesPerToken(m)) / s.gpu.hostLinkBytesPerSec,
  };
}

function referenceRun(s: EngineSpeed) {
  const ref = modelPreset(TTFT_REFERENCE.model);
  const speed: EngineSpeed = {
    ...s,
    gpu: gpuPreset(TTFT_REFERENCE.gpu),
    gpus: 1,
    mfu: DEFAULT_MFU,
  };
  return { ref, speed, at: tenThousandTokens(ref, speed) };
}

const onGpus = (s: EngineSpeed) => `${s.gpus > 1 ? `${s.gpus} × ` : ''}${s.gpu.name}`;
const gbps = (bytesPerSec: number) => `${(bytesPerSec / 1e9).toFixed(1)} GB/s`;

/** One line: the MFU's calibration, and what the MFU gives for this run's model and GPU. */
export function calibrationLine(m: PlannedModel, s: EngineSpeed): string {
  const c = TTFT_REFERENCE;
  const { ref, speed, at } = referenceRun(s);
  const run = tenThousandTokens(m, s);
  return (
    `MFU ${DEFAULT_MFU} gives a 10,000-token ${ref.name} prefill on ${speed.gpu.name} ` +
    `${at.prefillSeconds.toFixed(2)} s (published ~${c.recomputeSeconds} s; ${c.source}). ` +
    `This run, ${m.name} on ${onGpus(s)} at MFU ${s.mfu}: ${run.prefillSeconds.toFixed(2)} s.`
  );
}

/**
 * One line: the measured host link's load of the reference's 10,000 tokens beside LMCache's
 * published load, and this run's.
 */
export function hostLinkLine(m: PlannedModel, s: EngineSpeed): string {
  const c = TTFT_REFERENCE;
  const { ref, speed, at } = referenceRun(s);
  const bytes = c.tokens * kvBytesPerToken(ref);
  const run = tenThousandTokens(m, s);
  const runLink = s.gpu.name === speed.gpu.name ? '' : ` (${s.gpu.hostLinkSource})`;
  return (
    `${speed.gpu.name}'s ${gbps(speed.gpu.hostLinkBytesPerSec)} loads the same 10,000 tokens' KV ` +
    `(${(bytes / 1e9).toFixed(2)} GB) from host memory in ${at.hostLoadSeconds.toFixed(3)} s; ` +
    `${c.publisher} published ~${c.hostLoadSeconds} s. The link: ${speed.gpu.hostLinkSource}. ` +
    `This run, ${m.name} on ${s.gpu.name}: ${run.hostLoadSeconds.toFixed(3)} s at ${gbps(s.gpu.hostLinkBytesPerSec)}${runLink}.`
  );
}
