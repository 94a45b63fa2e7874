/**
 * Protocol v1 message types. The wire layout of each is the message table (wire-table.ts),
 * which docs/protocol.md shows; the codec in codec.ts is its only implementation here.
 */
import type { KvtierErrorCode } from '../errors.ts';
import type { ChunkHash } from '../hashing/chunk-hash.ts';
import type { DataPlaneReply, DataPlaneRequest } from './data-plane-messages.ts';

/** First two bytes of every message: ASCII "kv". */
export const MAGIC = 0x766b; // 'k' (0x6b) then 'v' (0x76), read as u16le
/** Protocol version carried in byte 2. */
export const PROTOCOL_VERSION = 1;
/** Size of the common header: magic u16, version u8, type u8, request id u32. */
export const HEADER_BYTES = 8;
/** Bytes in one chunk hash. */
export const HASH_BYTES = 32;
/** Bytes in one namespace id on the wire (32 hex digits in text form). */
export const NAMESPACE_BYTES = 16;

/** Lookup result status (a byte on the wire: 0 ok, 1 canceled, 2 stale). */
export type LookupStatusName = 'ok' | 'canceled' | 'stale';

/** Limits a server enforces; the values it uses are reported by PING. */
export interface ProtocolLimits {
  /** Most chunks in one lookup. Default 8192, at most 65536. */
  maxChunksPerLookup: number;
  /** Most payload bytes in one PUT. Default 128 MiB. */
  maxPayloadBytes: number;
  /** Most tokens one chunk may cover. Default 65536. */
  maxTokensPerChunk: number;
}

export const DEFAULT_LIMITS: Readonly<ProtocolLimits> = {
  maxChunksPerLookup: 8192,
  maxPayloadBytes: 128 * 1024 * 1024,
  maxTokensPerChunk: 65536,
};

/** Fixed limits of the v1 encoding itself. */
export const WIRE_LIMITS = {
  maxLookupIdBytes: 256,
  maxNamespacesPerLookup: 16,
  maxConfigBytes: 4096,
  maxChunksPerLookup: 65536,
  maxErrorMessageBytes: 1024,
} as const;

/** Per-lookup options carried as a small JSON object (all optional). */
export interface LookupConfig {
  /** Pin the hits until cancel/cleanup or the pin TTL (default true). */
  pin?: boolean;
  /** Prefetch lower-tier hits into host memory (default true). Without it, only CPU hits count. */
  prefetch?: boolean;
}

export interface LookupRequest {
  type: 'lookup';
  requestId: number;
  lookupId: string;
  /** Namespace ids (32 hex digits each); a chunk counts only when present in every one. */
  namespaces: string[];
  /** Packed chunk hashes, 32 bytes each. */
  hashes: Buffer;
  /** Tokens per chunk, one per hash. */
  tokenCounts: Uint32Array;
  config: LookupConfig;
}

export interface CancelRequest {
  type: 'cancel';
  requestId: number;
  lookupId: string;
}

export interface ClearRequest {
  type: 'clear';
  requestId: number;
  /** Empty: every namespace. */
  namespaces: string[];
}

export interface PingRequest {
  type: 'ping';
  requestId: number;
}

export interface StatsRequest {
  type: 'stats';
  requestId: number;
}

export interface PutRequest {
  type: 'put';
  requestId: number;
  namespace: string;
  /** Validated where it enters (wire decode, or the client's `put`). */
  hash: ChunkHash;
  tokens: number;
  payload: Buffer;
}

export interface GetRequest {
  type: 'get';
  requestId: number;
  namespace: string;
  hash: ChunkHash;
}

export type Request =
  | LookupRequest
  | CancelRequest
  | ClearRequest
  | PingRequest
  | StatsRequest
  | PutRequest
  | GetRequest
  | DataPlaneRequest;

export interface TierTokens {
  tier: string;
  tokens: number;
}

export interface LookupResult {
  type: 'lookup-result';
  requestId: number;
  lookupId: string;
  status: LookupStatusName;
  epoch: number;
  /** Tokens ready in host memory, counted from the first chunk. */
  hitTokens: number;
  hitChunks: number;
  /** Where the ready tokens were found, in tier order. */
  tiers: TierTokens[];
}

export interface CancelResult {
  type: 'cancel-result';
  requestId: number;
  /** Whether the server held state for the lookup id. */
  found: boolean;
}

export interface ClearResult {
  type: 'clear-result';
  requestId: number;
  epoch: number;
}

export interface Pong {
  type: 'pong';
  requestId: number;
  info: Record<string, unknown>;
}

export interface StatsResult {
  type: 'stats-result';
  requestId: number;
  stats: Record<string, unknown>;
}

export interface PutResult {
  type: 'put-result';
  requestId: number;
  outcome: 'stored' | 'exists' | 'dropped';
}

export interface GetResult {
  type: 'get-result';
  requestId: number;
  found: boolean;
  tokens: number;
  payload: Buffer;
}

export interface ErrorReply {
  type: 'error';
  requestId: number;
  code: KvtierErrorCode;
  message: string;
}

export type Reply =
  | LookupResult
  | CancelResult
  | ClearResult
  | Pong
  | StatsResult
  | PutResult
  | GetResult
  | DataPlaneReply
  | ErrorReply;
