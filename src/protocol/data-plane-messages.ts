/**
 * Protocol v1 data-plane messages (docs/protocol.md section 4.9): an engine worker registers its
 * KV caches with the sidecar, then asks it to save blocks after a forward pass and to load
 * pinned chunks into blocks before one. Their types are derived from the message table
 * (wire-table.ts, which lays them out and documents their fields).
 */
import type { DataPlaneMessagesOf, MessageOf } from './message-types.ts';

export { DATA_PLANE_LIMITS } from './limits.ts';

/** REGISTER (0x08): the worker's `KvRegistration`, carried as JSON and validated by the data plane. */
export type RegisterRequest = MessageOf<'REGISTER'>;
/** SAVE (0x09): gather the blocks of these chunks into the CPU tier. */
export type SaveRequestMessage = MessageOf<'SAVE'>;
/** LOAD (0x0A): scatter a lookup's pinned chunks into these blocks. */
export type LoadRequestMessage = MessageOf<'LOAD'>;
/** HOLD (0x0B): move a lookup's pins to an engine request (kept across preemption). */
export type HoldRequest = MessageOf<'HOLD'>;
/** REQUEST_FINISHED (0x0C): an engine request ended. */
export type RequestFinishedRequest = MessageOf<'REQUEST_FINISHED'>;
/** How an engine request ended: terminal (finished, aborted) or preempted (will ask again). */
export type RequestEndKindName = RequestFinishedRequest['kind'];
/** HEARTBEAT (0x0D): the engine is alive. */
export type HeartbeatRequest = MessageOf<'HEARTBEAT'>;
/** UNREGISTER (0x0E): the worker is shutting down; release everything its engine holds. */
export type UnregisterRequest = MessageOf<'UNREGISTER'>;

/** Every data-plane request (the table's requests of section 4.9). */
export type DataPlaneRequest = DataPlaneMessagesOf<'request'>;

/** REGISTER_RESULT (0x88). */
export type RegisterResult = MessageOf<'REGISTER_RESULT'>;
/** SAVE_RESULT (0x89): chunk counts that add up to the chunks sent. */
export type SaveResultMessage = MessageOf<'SAVE_RESULT'>;
/** LOAD_RESULT (0x8A). */
export type LoadResultMessage = MessageOf<'LOAD_RESULT'>;
/** HOLD_RESULT (0x8B). */
export type HoldResult = MessageOf<'HOLD_RESULT'>;
/** REQUEST_FINISHED_RESULT (0x8C). */
export type RequestFinishedResult = MessageOf<'REQUEST_FINISHED_RESULT'>;
/** HEARTBEAT_RESULT (0x8D). */
export type HeartbeatResult = MessageOf<'HEARTBEAT_RESULT'>;
/** UNREGISTER_RESULT (0x8E). */
export type UnregisterResult = MessageOf<'UNREGISTER_RESULT'>;

/** Every data-plane reply (the table's replies of section 4.9). */
export type DataPlaneReply = DataPlaneMessagesOf<'reply'>;
