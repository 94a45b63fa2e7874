/**
 * Protocol v1 data-plane messages (docs/protocol.md section 4.9): an engine worker registers its
 * KV caches with the sidecar, then asks it to save blocks after a forward pass and to load
 * pinned chunks into blocks before one. Laid out by the message table (wire-table.ts).
 */

/** Wire limits of the data-plane messages; a decoder refuses anything over them. */
export const DATA_PLANE_LIMITS = {
  /** Bytes of an engine, request or lookup id (each 1..256). */
  maxIdBytes: 256,
  /** Bytes of a REGISTER's JSON body (1 MiB). */
  maxRegistrationBytes: 1024 * 1024,
  /** Block ids in one SAVE or LOAD (1 MiB of ids). */
  maxBlocksPerMessage: 262_144,
  /** Chunk hashes in one SAVE or LOAD (2 MiB of hashes). */
  maxChunksPerMessage: 65_536,
} as const;

/** How an engine request ended: terminal (finished, aborted) or preempted (will ask again). */
export type RequestEndKindName = 'finished' | 'aborted' | 'preempted';

/** REGISTER (0x08): the worker's `KvRegistration`, carried as JSON and validated by the data plane. */
export interface RegisterRequest {
  type: 'register';
  requestId: number;
  /** The parsed JSON object; its fields are checked by `resolveKvRegistration`. */
  registration: Record<string, unknown>;
}

/** SAVE (0x09): gather the blocks of these chunks into the CPU tier. */
export interface SaveRequestMessage {
  type: 'save';
  requestId: number;
  engineId: string;
  engineRequestId: string;
  /** Leading chunks the engine knows are stored. */
  skipChunks: number;
  blockIds: Uint32Array;
  /** Packed chunk hashes, 32 bytes each. */
  chunkHashes: Buffer;
  /**
   * Not-after time on the host's monotonic clock (`CLOCK_MONOTONIC`, ns: Node's
   * `process.hrtime.bigint()`, Python's `time.monotonic_ns()`): a copy out of the engine's
   * blocks that finishes later is discarded (its chunks count as dropped) and none starts past
   * it, so blocks the engine reused after giving up on the SAVE are never stored. The optional
   * trailing u64 of the body; absent on the wire means none. The encoder writes it whenever it
   * is defined; the decoder sets it only when present.
   */
  notAfterNs?: bigint;
  /**
   * A CUDA interprocess event (the 64-byte `cudaIpcEventHandle_t`) the engine recorded on its
   * stream after the step that wrote the blocks: the sidecar's device-to-host copies wait for it
   * on the GPU, so the engine need not synchronize its stream before sending the SAVE. Follows
   * `notAfterNs` on the wire (written as 0 when that is undefined); absent means no event.
   */
  cudaEvent?: Uint8Array;
}

/** LOAD (0x0A): scatter a lookup's pinned chunks into these blocks. */
export interface LoadRequestMessage {
  type: 'load';
  requestId: number;
  engineId: string;
  engineRequestId: string;
  lookupId: string;
  /** Relative to the server's receipt, ms; 0 means the server's default. */
  deadlineMs: number;
  /** Slot of the registered state file to set on completion; -1 for none. */
  stateSlot: number;
  blockIds: Uint32Array;
  /** Packed chunk hashes, 32 bytes each. */
  chunkHashes: Buffer;
  /**
   * Leading blocks of the first chunk the engine already holds: not written and not in
   * `blockIds`. The optional trailing u32 of the body; absent on the wire means 0. The encoder
   * writes it whenever it is defined (0 included); the decoder sets it only when present.
   */
  skipBlocks?: number;
  /**
   * Not-after time on the host's monotonic clock (ns, as for SAVE): chunks not started by then
   * are invalid, so nothing is written into blocks after the engine gave up on the LOAD. The
   * optional u64 after `skipBlocks`: a LOAD that carries it carries `skipBlocks` too (0 when
   * none); the encoder writes both when it is defined; the decoder sets it only when present.
   */
  notAfterNs?: bigint;
}

/** HOLD (0x0B): move a lookup's pins to an engine request (kept across preemption). */
export interface HoldRequest {
  type: 'hold';
  requestId: number;
  engineId: string;
  engineRequestId: string;
  lookupId: string;
}

/** REQUEST_FINISHED (0x0C): an engine request ended. */
export interface RequestFinishedRequest {
  type: 'request-finished';
  requestId: number;
  engineId: string;
  engineRequestId: string;
  kind: RequestEndKindName;
}

/** HEARTBEAT (0x0D): the engine is alive. */
export interface HeartbeatRequest {
  type: 'heartbeat';
  requestId: number;
  engineId: string;
}

/** UNREGISTER (0x0E): the worker is shutting down; release everything its engine holds. */
export interface UnregisterRequest {
  type: 'unregister';
  requestId: number;
  engineId: string;
}

/** Every data-plane request. */
export type DataPlaneRequest =
  | RegisterRequest
  | SaveRequestMessage
  | LoadRequestMessage
  | HoldRequest
  | RequestFinishedRequest
  | HeartbeatRequest
  | UnregisterRequest;

/** REGISTER_RESULT (0x88). */
export interface RegisterResult {
  type: 'register-result';
  requestId: number;
  engineId: string;
  /** Namespace id derived from the registration, 32 hex digits. */
  namespace: string;
  /** Tokens per stored chunk. */
  chunkSize: number;
  /** Tokens per engine block. */
  blockSize: number;
}

/** SAVE_RESULT (0x89): chunk counts that add up to the chunks sent. */
export interface SaveResultMessage {
  type: 'save-result';
  requestId: number;
  saved: number;
  skipped: number;
  dropped: number;
}

/** LOAD_RESULT (0x8A). */
export interface LoadResultMessage {
  type: 'load-result';
  requestId: number;
  loadedTokens: number;
  /** Blocks not written with valid KV (vLLM's load-failure recovery). */
  invalidBlockIds: Uint32Array;
}

/** HOLD_RESULT (0x8B). */
export interface HoldResult {
  type: 'hold-result';
  requestId: number;
  /** Chunks now held for the request; 0 when the lookup was unknown, running or expired. */
  heldChunks: number;
}

/** REQUEST_FINISHED_RESULT (0x8C). */
export interface RequestFinishedResult {
  type: 'request-finished-result';
  requestId: number;
  /** True when the request's pins and state were released (terminal end, known engine). */
  released: boolean;
}

/** HEARTBEAT_RESULT (0x8D). */
export interface HeartbeatResult {
  type: 'heartbeat-result';
  requestId: number;
  /** False when the server has no registration for the engine (restarted, or swept as silent). */
  known: boolean;
}

/** UNREGISTER_RESULT (0x8E). */
export interface UnregisterResult {
  type: 'unregister-result';
  requestId: number;
  /** True when the engine was registered (and is now released); false for an unknown engine. */
  released: boolean;
}

/** Every data-plane reply. */
export type DataPlaneReply =
  | RegisterResult
  | SaveResultMessage
  | LoadResultMessage
  | HoldResult
  | RequestFinishedResult
  | HeartbeatResult
  | UnregisterResult;
