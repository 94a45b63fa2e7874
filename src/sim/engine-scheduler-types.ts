import type { KvtierSchedulerConnector } from '../connector/scheduler-connector.ts';
import type { ConnectorRequest } from '../connector/types.ts';
import type { BlockAllocator } from './block-allocator.ts';
import type { KvFile } from './engine-io.ts';
import type { SimRequest } from './types.ts';

/** Types of the simulator's scheduler (`engine-scheduler.ts`): its events, dependencies, requests and counters. */

/** Where a request is in its life (vLLM `RequestStatus`). */
export type SimRequestStatus =
  | 'waiting'
  | 'waiting_for_remote_kvs'
  | 'running'
  | 'preempted'
  | 'finished'
  | 'failed'
  | 'aborted';

/** Something the scheduler did, for tests and traces. */
export type SimEvent =
  | {
      type: 'status';
      step: number;
      requestId: string;
      from: SimRequestStatus | 'new';
      to: SimRequestStatus;
    }
  | {
      type: 'load-done';
      step: number;
      requestId: string;
      /** Tokens the load was to provide, and those that arrived valid. */
      tokens: number;
      validTokens: number;
    }
  | { type: 'freed'; step: number; requestId: string; delayed: boolean }
  | { type: 'alloc-intent'; step: number; requestId: string; externalTokens: number };

/** A load intent the test hook may re-issue (`updateStateAfterAlloc` a second time). */
export interface LoadAllocInfo {
  requestId: string;
  blockIds: readonly number[];
  externalTokens: number;
}

/** The part of kvtier's scheduler connector the simulator's scheduler calls (a run without kvtier stands in its own). */
export type SchedulerConnectorLike = Pick<
  KvtierSchedulerConnector,
  | 'getNumNewMatchedTokens'
  | 'updateStateAfterAlloc'
  | 'requestPreempted'
  | 'requestFinished'
  | 'resetPrefixCache'
  | 'buildConnectorMeta'
  | 'updateConnectorOutput'
  | 'close'
  | 'trackedRequests'
>;

/** What the scheduler needs from the engine. */
export interface SimSchedulerDeps {
  connector: SchedulerConnectorLike;
  allocator: BlockAllocator;
  /** The engine's KV file; absent in a run without kvtier (nothing is loaded, so nothing is written or checked). */
  kv?: KvFile;
  blockSize: number;
  chunkSize: number;
  maxTokensPerStep: number;
  maxRunning: number;
  kvLoadFailurePolicy: 'recompute' | 'fail';
  /** Tier breakdown of an answered lookup (contiguous chunks, fastest tier first). */
  tiersOf: (lookupId: string) => readonly { tier: string; tokens: number }[] | undefined;
  onEvent?: (e: SimEvent) => void;
  onLoadAlloc?: (a: LoadAllocInfo) => number | undefined;
  /**
   * Chunk keys this engine computed (a fleet's cross-node accounting): the scheduler adds the key
   * of every prompt chunk it computes, and counts loaded chunks whose key is not in it as
   * cross-node tokens.
   */
  ownChunks?: Set<number>;
}

/** A request as the scheduler tracks it. */
export interface Req {
  readonly sim: SimRequest;
  readonly id: string;
  conn: ConnectorRequest;
  readonly hashes: Uint32Array;
  readonly promptLen: number;
  readonly outputTarget: number;
  status: SimRequestStatus;
  blocks: number[];
  numComputed: number;
  numOutput: number;
  numPreemptions: number;
  cachedBlocks: number;
  pendingLookup: boolean;
  /** A lookup of this admission was answered (the connector keeps the answer: no new lookup until a preemption). */
  answered: boolean;
  /** The load in flight: tokens from `firstToken`, into `blocks`, under `lookupId`. */
  load: { firstToken: number; tokens: number; blocks: number[]; lookupId: string } | null;
  delayedFree: boolean;
  /** Where the current admission's prompt tokens came from so far. */
  adm: AdmissionSources;
  /** Whether an admission completed the prompt's prefill (its sources are counted). */
  prefillDone: boolean;
  /** Prompt tokens the first admission found cached (GPU prefix cache and kvtier), once decided. */
  firstHitTokens: number | undefined;
  /** The furthest prompt position this request computed itself, and that position when last preempted. */
  ownComputedEnd: number;
  ownProgress: number;
  /** Modeled times (ms): first scheduled (compute or load), first token sampled. */
  firstScheduledMs: number | undefined;
  firstTokenMs: number | undefined;
}

/** Prompt tokens of one admission by source. */
export interface AdmissionSources {
  gpu: number;
  tiers: Record<string, number>;
  recomputed: number;
  /** Of the kvtier tokens, those in chunks another engine of a fleet computed. */
  crossNode: number;
}

/** The sources of the admission that completed a request's prefill. */
export interface CompletedPrefill extends AdmissionSources {
  requestId: string;
  promptTokens: number;
  /** Of `gpu` and of the tiers' tokens: the request's own prefix, computed before a preemption. */
  selfGpu: number;
  selfKvtier: number;
}

/** Modeled times of a finished request (ms). */
export interface RequestTiming {
  /** Arrival to first scheduled (compute or kvtier load). */
  queueMs: number;
  /** Arrival to first token: queueing, loads and compute. */
  ttftMs: number;
}

/** Counters the engine turns into a report. */
export interface SchedulerCounters {
  /**
   * Sources of the admissions that completed their prefill: each prompt token once. The GPU
   * prefix cache and the tiers count hits on other requests' prefixes; a request's own prefix
   * found again after a preemption is `selfReuse`.
   */
  gpuPrefixCache: number;
  byTier: Record<string, number>;
  recomputed: number;
  selfReuseGpu: number;
  selfReuseKvtier: number;
  /** kvtier tokens in chunks another engine computed (fleets). */
  crossNode: number;
  /** Finished requests' modeled times. */
  timings: RequestTiming[];
  /** Prompt tokens of requests that ended (failed, aborted) before any prefill completed. */
  unserved: number;
  /** Preemptions, and the prompt tokens computed and loaded in admissions they threw away. */
  preemptions: number;
  preemptionRecomputed: number;
  preemptionReloaded: number;
  /** One entry per request whose prefill completed. */
  prefills: CompletedPrefill[];
  pendingLookups: number;
  stepsWaited: number;
  verifiedBlocks: number;
  mismatchedBlocks: number;
  mismatches: { requestId: string; block: number; layer: number }[];
  invalidBlocks: number;
  recomputedAfterFailure: number;
  /** Requests failed because a load failed under the `fail` policy. */
  failedRequests: number;
  /** Requests failed at admission: prompt and output can never fit in the GPU blocks. */
  failedTooLarge: number;
  finished: number;
  aborted: number;
}
