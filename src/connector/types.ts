/**
 * Shapes shared by the scheduler-side and worker-side connectors (docs/connector.md). They mirror
 * vLLM's KV connector V1: the scheduler produces one {@link ConnectorMeta} per step, the engine
 * hands it to every worker, and the workers report completions back as a
 * {@link ConnectorOutput}.
 */
import type { LookupAnswer, LookupCallOptions } from '../lookup-client/lookup-client.ts';

/** What the connector reads from an engine request. */
export interface ConnectorRequest {
  /** The engine's request id; unique among live requests. */
  readonly requestId: string;
  /** Prompt token ids, each an integer in [0, 2^32). Hashed once per request and cached. */
  readonly promptTokenIds: readonly number[] | Uint32Array;
  /** Cache salt (tenant isolation); default: the connector's `salt`. */
  readonly cacheSalt?: string;
  /** Set when the request ended by abort rather than by finishing (vLLM: FINISHED_ABORTED). */
  readonly aborted?: boolean;
}

/**
 * Load a lookup's pinned chunks into blocks (worker: `DataPlaneClient.load`). Chunk `i` of the
 * intent goes to `blockIds[i * blocksPerChunk - skipBlocks ...]` (chunk 0 to `blockIds[0 ...]`).
 */
export interface LoadIntent {
  readonly requestId: string;
  /** The lookup whose pins cover the chunks. */
  readonly lookupId: string;
  /** Index of the first chunk in the prompt. */
  readonly firstChunk: number;
  /** Tokens the load provides: chunks * chunkSize - skipBlocks * blockSize. */
  readonly numTokens: number;
  /**
   * Destination blocks, `chunks * blocksPerChunk - skipBlocks` of them, in chunk order: the
   * skipped leading blocks of the first chunk are not listed.
   */
  readonly blockIds: readonly number[];
  /** Packed 32-byte chunk hashes, one per chunk. */
  readonly chunkHashes: Buffer;
  /**
   * Leading blocks of the first chunk the engine already holds in its own prefix cache (it ended
   * inside that chunk); the sidecar does not write them. 0..blocksPerChunk-1; absent means 0.
   */
  readonly skipBlocks?: number;
}

/** Save the blocks of full prompt chunks after this step's forward pass (`DataPlaneClient.save`). */
export interface SaveIntent {
  readonly requestId: string;
  /** Index of the first chunk in the prompt (the earlier ones are stored already). */
  readonly firstChunk: number;
  /** Source blocks, `chunks * blocksPerChunk` of them, in chunk order. */
  readonly blockIds: readonly number[];
  /** Packed 32-byte chunk hashes, one per chunk. */
  readonly chunkHashes: Buffer;
}

/** How a request left the scheduler: terminal (finished, aborted) or preempted (asks again later). */
export type RequestEndKind = 'finished' | 'aborted' | 'preempted';

/** A request that ended since the last metadata. */
export interface RequestEnd {
  readonly requestId: string;
  readonly kind: RequestEndKind;
  /**
   * True when the scheduler kept the request's blocks (vLLM `delay_free_blocks`): the worker must
   * report the id in `finishedSending` once its transfers are over, and only then are they freed.
   */
  readonly delayFree: boolean;
}

/** The per-step metadata (vLLM `KVConnectorMetadata`), built once and consumed once. */
export interface ConnectorMeta {
  readonly loads: readonly LoadIntent[];
  readonly saves: readonly SaveIntent[];
  readonly finished: readonly RequestEnd[];
}

/** One request the scheduler runs this step (vLLM: `NewRequestData` / `CachedRequestData`). */
export interface ScheduledRequest {
  readonly request: ConnectorRequest;
  /** The request's whole block table, from its first block. */
  readonly blockIds: readonly number[];
  /** Tokens whose KV existed before this step (local prefix cache and loads included). */
  readonly numComputedTokens: number;
  /** Tokens this step computes. */
  readonly numScheduledTokens: number;
}

/** What `buildConnectorMeta` needs from the scheduler's output (vLLM `SchedulerOutput`). */
export interface SchedulerStep {
  readonly scheduled: readonly ScheduledRequest[];
}

/** Completions the workers reported (vLLM `KVConnectorOutput`), fed back to the scheduler. */
export interface ConnectorOutput {
  readonly finishedSending?: Iterable<string>;
  readonly finishedRecving?: Iterable<string>;
  /** Blocks of failed loads; the engine recomputes from the first of them. */
  readonly invalidBlockIds?: Iterable<number>;
}

/** The worker's `getFinished` answer. */
export interface FinishedTransfers {
  /** Requests whose free was delayed and whose saves and loads are over: free their blocks now. */
  readonly finishedSending: Set<string>;
  /** Requests whose async load settled (loaded, or failed with invalid blocks). */
  readonly finishedRecving: Set<string>;
}

/**
 * The part of `LookupClient` / `MultiLookupClient` the scheduler connector uses. `lookup` must
 * never block: null while pending, then the hit tokens once; so must `lookupAnswer` (the whole
 * answer), which the connector uses instead when it has the engine's prefill rate.
 */
export interface ConnectorLookup {
  lookup(
    lookupId: string,
    hashes: Uint8Array,
    tokenCounts: ArrayLike<number>,
    opts?: { namespaces?: readonly string[] },
  ): number | null;
  lookupAnswer?(
    lookupId: string,
    hashes: Uint8Array,
    tokenCounts: ArrayLike<number>,
    opts?: LookupCallOptions,
  ): LookupAnswer | null;
  /** Forgets a pending lookup and cancels it on the server. */
  forget(lookupId: string): void;
  /** Releases an answered lookup's pins on the server. */
  cancel(lookupId: string): Promise<unknown>;
  /** Present on `LookupClient`; called by the connector's `close()`. */
  close?(): Promise<void>;
}
