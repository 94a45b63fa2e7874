import type { Workload } from './types.ts';
import {
  type LongDocQaOptions,
  longDocQa,
  type MultiRoundQaOptions,
  multiRoundQa,
  type TraceReplayOptions,
  traceReplay,
} from './workloads.ts';

/**
 * A workload named by how to make it rather than by its requests, so a worker thread can make
 * the same requests again (every token is seeded: equal specs give equal workloads) instead of
 * receiving hundreds of megabytes of prompts.
 */
export type WorkloadSpec =
  | { kind: 'multi-round'; options: MultiRoundQaOptions }
  | { kind: 'long-doc'; options: LongDocQaOptions }
  | { kind: 'trace'; options: TraceReplayOptions };

/**
 * Makes the workload `spec` names.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for bad options or a malformed trace; `KVT_ABORTED`
 *   when `signal` aborts; the file system's error when a trace cannot be read.
 */
export async function loadWorkload(spec: WorkloadSpec, signal?: AbortSignal): Promise<Workload> {
  if (spec.kind === 'multi-round') return multiRoundQa(spec.options);
  if (spec.kind === 'long-doc') return longDocQa(spec.options);
  return await traceReplay(spec.options, signal === undefined ? {} : { signal });
}

/**
 * The same requests with every arrival time multiplied by `factor` (2: half the rate). The
 * prompts are shared with `w`, not copied.
 */
export function scaleArrivals(w: Workload, factor: number): Workload {
  if (factor === 1) return w;
  return {
    name: w.name,
    requests: w.requests.map((r) => ({ ...r, arrivalMs: r.arrivalMs * factor })),
  };
}
