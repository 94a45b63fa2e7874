import { DEFAULT_GPU, DEFAULT_MFU, type EngineSpeed, gpuPreset, prefillSeconds } from './gpu.ts';
import { kvBytesPerToken, modelPreset, type PlannedModel } from './models.ts';

/**
 * The calibration of the planner's time model. Two of its constants were chosen so that it
 * reproduces one published figure (LMCache's TTFT for a 10,000-token Llama-8B context: ~0.57 s to
 * prefill, ~0.06 s to load from CPU memory): the MFU ({@link DEFAULT_MFU}) and the host link of
 * PCIe Gen5 GPUs (22 GB/s). Printing the model against that figure is therefore a calibration,
 * not a check: it cannot fail. What it shows is what the same constants give for the run's own
 * model and GPU.
 */

/** The published figure the constants were chosen to reproduce. */
export const TTFT_CALIBRATION = Object.freeze({
  model: 'llama-3.1-8b',
  gpu: DEFAULT_GPU,
  tokens: 10_000,
  recomputeSeconds: 0.57,
  hostLoadSeconds: 0.06,
  source: 'LMCache, Llama-8B, 10K-token context: ~0.57 s prefill vs ~0.06 s from CPU memory',
});

/** A 10,000-token prefill and host-memory load of `m` on `s`, seconds. */
export function tenThousandTokens(
  m: PlannedModel,
  s: EngineSpeed,
): { prefillSeconds: number; hostLoadSeconds: number } {
  const n = TTFT_CALIBRATION.tokens;
  return {
    prefillSeconds: prefillSeconds(m, s, 0, n),
    hostLoadSeconds: (n * kvBytesPerToken(m)) / s.gpu.hostLinkBytesPerSec,
  };
}

/** One line: the calibration, and what its constants give for this run's model and GPU. */
export function calibrationLine(m: PlannedModel, s: EngineSpeed): string {
  const c = TTFT_CALIBRATION;
  const ref = modelPreset(c.model);
  const refSpeed: EngineSpeed = { ...s, gpu: gpuPreset(c.gpu), gpus: 1, mfu: DEFAULT_MFU };
  const at = tenThousandTokens(ref, refSpeed);
  const run = tenThousandTokens(m, s);
  return (
    `MFU ${DEFAULT_MFU} and a 22 GB/s host link give a 10,000-token ${ref.name} prefill on ${refSpeed.gpu.name} ` +
    `${at.prefillSeconds.toFixed(2)} s (published ~${c.recomputeSeconds} s) and its load from host memory ` +
    `${at.hostLoadSeconds.toFixed(3)} s (published ~${c.hostLoadSeconds} s; ${c.source}). ` +
    `This run, ${m.name} on ${s.gpus > 1 ? `${s.gpus} × ` : ''}${s.gpu.name} at MFU ${s.mfu}: ${run.prefillSeconds.toFixed(2)} s and ${run.hostLoadSeconds.toFixed(3)} s.`
  );
}
