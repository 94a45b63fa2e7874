/**
 * Shared types of the engine simulator: the workloads produce `SimRequest`s, the engine
 * (`runSimulation`) schedules them as vLLM's v1 scheduler would against a real kvtier sidecar and
 * produces a `SimReport`, which the CLI prints, sweeps and charts.
 */

/** One request of a workload. */
export interface SimRequest {
  /** Unique id within the run. */
  id: string;
  /** Arrival time in ms from the start of the run (already time-scaled). */
  arrivalMs: number;
  /** Prompt token ids (u32). Equal prefixes give equal chunk hashes. */
  promptTokens: Uint32Array;
  /** Tokens to generate after the prompt (decode steps). */
  outputTokens: number;
  /** Free-form tag for reports, e.g. the user or document id. */
  group?: string;
}

/** A workload: a name and its requests in arrival order. */
export interface Workload {
  name: string;
  requests: SimRequest[];
}

/** Model and engine shape of a run (defaults follow a small Llama-like model). */
export interface SimModel {
  /** Layers; default 4 (small so a run moves little memory). */
  numLayers: number;
  /** KV heads; default 2. */
  numKvHeads: number;
  /** Head dim; default 16. */
  headDim: number;
  /** Tokens per engine block; default 16. */
  blockSize: number;
  /** Tokens per stored chunk; default 256. */
  chunkSize: number;
}

/** What the engine can do per step, and how fast compute is modeled. */
export interface SimEngineOptions {
  /** GPU KV blocks (the engine's own prefix cache lives in them); default 4096. */
  numGpuBlocks: number;
  /** Token budget per step (prefill + decode); default 8192. */
  maxTokensPerStep: number;
  /** Most running requests; default 64. */
  maxRunning: number;
  /** Modeled prefill throughput for the TTFT model, tokens/s; default 20 000. */
  prefillTokensPerSec: number;
  /** What to do with blocks that failed to load. */
  kvLoadFailurePolicy: 'recompute' | 'fail';
  /** Lookup deadline in ms passed to the lookup client; default 2000. */
  lookupTimeoutMs: number;
  /**
   * Let the connector claim the rest of a chunk when the engine's prefix cache ends inside it
   * (the load skips the blocks the engine holds); default true. False claims from chunk
   * boundaries only, for comparison.
   */
  partialChunkLoads: boolean;
  /**
   * kvtier's rule "never slower than recomputing" in the scheduler connector (docs/connector.md):
   * lookups carry `prefillTokensPerSec`, and a lookup is waited for only when computing the
   * tokens it could claim takes longer than the step the request would wait (the last step's
   * length while requests run, 0 while the engine is idle). Applies on a timing model only (its
   * runs settle every lookup before the step that asks), where the sidecar's lower tiers are
   * fixed to the modeled rates. Default false; the planner turns it on.
   */
  neverSlower: boolean;
}

/** Tiers of the sidecar under test (the simulator starts it), as kvtier config tiers. */
export interface SimTierConfig {
  name: string;
  type: string;
  options: Record<string, unknown>;
}

/** Faults injected during a run. */
export interface SimFaults {
  /** Kill the Redis tier at this step and restart it this many steps later. */
  redisOutage?: { atStep: number; forSteps: number };
  /** Restart the sidecar at this step (the disk tier must be recovered). */
  sidecarRestartAtStep?: number;
  /** Corrupt this many stored chunks on the lowest tier at this step. */
  corruptChunks?: { atStep: number; count: number };
  /** Force lookups to time out at this step (the deadline passes). */
  lookupDeadlineAtStep?: number;
  /** Evict the CPU tier between lookup and load at this step. */
  evictBetweenLookupAndLoadAtStep?: number;
}

/**
 * Prompt tokens by where they came from, each counted once: by the admission that completed the
 * request's prefill. `gpuPrefixCache + sum(byTier) + selfReuse.gpu + selfReuse.kvtier +
 * recomputed + unserved` is the prompt tokens.
 */
export interface TokenSources {
  /** Served by the engine's own GPU prefix cache from other requests' prefixes. */
  gpuPrefixCache: number;
  /** Served by kvtier from other requests' prefixes, by tier name (host memory, disk, remote...). */
  byTier: Record<string, number>;
  /**
   * A preempted request's own prefix found again (positions it had computed itself before the
   * preemption, beyond what its first admission found cached): in the GPU prefix cache, or in
   * kvtier, which saved them. Absent from older producers (read as 0).
   */
  selfReuse?: { gpu: number; kvtier: number };
  /** Recomputed by the engine. */
  recomputed: number;
  /** Prompt tokens of requests that ended (failed, aborted) before their prefill completed. */
  unserved: number;
}

/** Work that preemption threw away (the engine then did it again; not in {@link TokenSources}). */
export interface PreemptionWork {
  /** Preemptions (a request can be preempted more than once). */
  preemptions: number;
  /** Prompt tokens recomputed in admissions a preemption threw away, or again after one. */
  recomputedTokens: number;
  /** Prompt tokens loaded from kvtier in such admissions. */
  reloadedTokens: number;
}

/** The model a run is planned for, and the verification model whose bytes actually moved. */
export interface SimPlannedModel {
  /** Display name, e.g. "Llama-3.1-8B". */
  name: string;
  /** KV bytes per token of the planned model: every capacity and modeled byte count uses it. */
  kvBytesPerToken: number;
  /** KV bytes per token of the small verification model that moved and was checked. */
  verificationBytesPerToken: number;
  /** Tokens the engine's GPU KV cache holds (its prefix cache lives in it). */
  gpuCacheTokens: number;
  /** Tokens a chunk holds. */
  chunkTokens: number;
}

/** The modeled timeline of a run (ms on the modeled clock). */
export interface SimTimeline {
  /** Arrival to first scheduled (compute or a kvtier load), over finished requests. */
  queueMs: { p50: number; p90: number; mean: number };
  /** Time the GPU spent in steps that computed tokens. */
  busyMs: number;
  /**
   * GPU blocks held by requests, on average over that time: the rest of the GPU KV cache is
   * what its prefix cache really has.
   */
  meanBlocksInUse?: number;
  /** First arrival to the last request's end. */
  makespanMs: number;
  /** busyMs / makespanMs. */
  utilization: number;
}

/** Everything a run measured. Times marked "modeled" are computed, not measured. */
export interface SimReport {
  workload: string;
  requests: number;
  finished: number;
  failed: number;
  /** Requests aborted by the caller (the engine simulator sets it; optional for older producers). */
  aborted?: number;
  promptTokens: number;
  tokens: TokenSources;
  /** Work preemption threw away; absent from older producers. */
  preemption?: PreemptionWork;
  /** The planned model; absent from older producers. */
  model?: SimPlannedModel;
  /** Bytes kvtier moved per direction (measured from the data plane's replies: verification model). */
  bytes: { saved: number; loaded: number };
  /** The same transfers in the planned model's bytes (tokens x its KV bytes per token). */
  modelBytes?: { saved: number; loaded: number };
  /** Lookups that answered `null` at least once, and the steps requests waited on them. */
  pendingLookups: { lookups: number; stepsWaited: number };
  /** Blocks verified byte-exact against recomputation, and mismatches (must be 0). */
  verifiedBlocks: number;
  mismatchedBlocks: number;
  /** Each mismatch: request, block and layer (first 20). */
  mismatches: { requestId: string; block: number; layer: number }[];
  /** Load failures by cause and how they were handled. */
  failures: {
    invalidBlocks: number;
    recomputedAfterFailure: number;
    failedRequests: number;
    faultsInjected: string[];
  };
  /**
   * MODELED time to first token (ms) of finished requests on the run's modeled clock: arrival to
   * the end of the step that sampled the first token, so queueing, kvtier loads and the prefill
   * are all in it. With the planner's timing model the clock is the GPU model's (src/sim/gpu.ts);
   * without it, tokens over `prefillTokensPerSec`.
   */
  modeledTtftMs: { p50: number; p90: number; mean: number };
  /** The modeled timeline: queueing, GPU busy time, utilisation. Absent from older producers. */
  timeline?: SimTimeline;
  /** kvtier tokens in chunks another engine of a fleet computed (0 for one engine). */
  crossNodeTokens?: number;
  /**
   * What lookups decided about each tier below host memory when the engine's prefill rate went
   * with them (planner runs): lookups that loaded from the tier, lookups that declined it because
   * fetching could not beat computing, and the tokens declined. Absent when none decided.
   */
  tierDecisions?: Record<string, { load: number; decline: number; declinedTokens: number }>;
  /** Whether kvtier was on (false: the baseline run of the same engine without kvtier). */
  kvtier?: boolean;
  /** Wall time of the run (ms), measured. */
  wallMs: number;
  steps: number;
  /** Of `steps`, decode-only steps run in a tight loop (same outcome, fewer engine-loop turns). */
  fastForwardedSteps?: number;
  /**
   * Tokens each request's completing admission found in the GPU prefix cache from other requests'
   * prefixes, by request id (the GPU level of the tier-behind-GPU bound).
   */
  gpuHitTokens?: Record<string, number>;
  /** A fleet's report adds up its engines; here is each engine's own. */
  engines?: SimReport[];
}
