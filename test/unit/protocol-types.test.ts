/**
 * The TypeScript message types derived from the message table (src/protocol/message-types.ts).
 * Most of this file is checked by the compiler (`npm run typecheck` covers test/): each derived
 * type must equal the interface it replaced, written out here by hand; a wrong field type, a
 * missing field or an unknown tag must not compile. The tests at the end run the same sample
 * objects through the codec.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { KvtierErrorCode } from '../../src/errors.ts';
import { type ChunkHash, chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';
import {
  decodeReply,
  decodeRequest,
  encodeReply,
  encodeRequest,
} from '../../src/protocol/codec.ts';
import type * as DP from '../../src/protocol/data-plane-messages.ts';
import type { FieldValue, MessageOf } from '../../src/protocol/message-types.ts';
import type * as M from '../../src/protocol/messages.ts';

/** True when `A` and `B` are the same type (not merely assignable either way). */
type Equal<A, B> =
  (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
/** Compiles only for `true`. */
type Expect<T extends true> = T;

// The interfaces as they were written by hand before the types were derived from the table.
type Id<T extends string> = { type: T; requestId: number };
type ExpectedLookupConfig = {
  pin?: boolean;
  prefetch?: boolean;
  computeTokensPerSec?: number;
  awaitChunks?: number;
  awaitMs?: number;
};
type ExpectedTierTokens = { tier: string; tokens: number };
type ExpectedTierRate = {
  tier: string;
  decision: 'none' | 'load' | 'decline';
  readBytesPerSec: bigint;
  latencyUs: number;
  declinedTokens: number;
};
type ExpectedLookupRequest = Id<'lookup'> & {
  lookupId: string;
  namespaces: string[];
  hashes: Buffer;
  tokenCounts: Uint32Array;
  config: ExpectedLookupConfig;
};
type ExpectedPutRequest = Id<'put'> & {
  namespace: string;
  hash: ChunkHash;
  tokens: number;
  payload: Buffer;
};
type ExpectedSave = Id<'save'> & {
  engineId: string;
  engineRequestId: string;
  skipChunks: number;
  blockIds: Uint32Array;
  chunkHashes: Buffer;
  notAfterNs?: bigint;
  cudaEvent?: Uint8Array;
  fenceSlot?: number;
  fenceTicket?: number;
};
type ExpectedLoad = Id<'load'> & {
  engineId: string;
  engineRequestId: string;
  lookupId: string;
  deadlineMs: number;
  stateSlot: number;
  blockIds: Uint32Array;
  chunkHashes: Buffer;
  skipBlocks?: number;
  notAfterNs?: bigint;
  progressSlot?: number;
};
type ExpectedLookupResult = Id<'lookup-result'> & {
  lookupId: string;
  status: 'ok' | 'canceled' | 'stale';
  epoch: number;
  hitTokens: number;
  hitChunks: number;
  tiers: ExpectedTierTokens[];
  bytesPerToken?: number;
  tierRates?: ExpectedTierRate[];
};
type Flat<T> = { [K in keyof T]: T[K] } & {};
type LookupPlaneRequests =
  | M.LookupRequest
  | M.CancelRequest
  | M.ClearRequest
  | M.PingRequest
  | M.PutRequest
  | M.GetRequest
  | M.StatsRequest;
type DataPlaneRequests =
  | DP.RegisterRequest
  | DP.SaveRequestMessage
  | DP.LoadRequestMessage
  | DP.HoldRequest
  | DP.RequestFinishedRequest
  | DP.HeartbeatRequest
  | DP.UnregisterRequest;
type LookupPlaneReplies =
  | M.LookupResult
  | M.CancelResult
  | M.ClearResult
  | M.Pong
  | M.StatsResult
  | M.PutResult
  | M.GetResult
  | M.ErrorReply;
type DataPlaneReplies =
  | DP.RegisterResult
  | DP.SaveResultMessage
  | DP.LoadResultMessage
  | DP.HoldResult
  | DP.RequestFinishedResult
  | DP.HeartbeatResult
  | DP.UnregisterResult;
type AllRequests = LookupPlaneRequests | DataPlaneRequests;
type AllReplies = LookupPlaneReplies | DataPlaneReplies;
type RequestTag = AllRequests['type'];
type ReplyTag = AllReplies['type'];

export type Checks = [
  Expect<Equal<M.LookupConfig, ExpectedLookupConfig>>,
  Expect<Equal<M.TierTokens, ExpectedTierTokens>>,
  Expect<Equal<M.TierRate, ExpectedTierRate>>,
  Expect<Equal<M.LookupRequest, Flat<ExpectedLookupRequest>>>,
  Expect<Equal<M.CancelRequest, Flat<Id<'cancel'> & { lookupId: string }>>>,
  Expect<Equal<M.ClearRequest, Flat<Id<'clear'> & { namespaces: string[] }>>>,
  Expect<Equal<M.PingRequest, Id<'ping'>>>,
  Expect<Equal<M.StatsRequest, Id<'stats'>>>,
  Expect<Equal<M.PutRequest, Flat<ExpectedPutRequest>>>,
  Expect<Equal<M.GetRequest, Flat<Id<'get'> & { namespace: string; hash: ChunkHash }>>>,
  Expect<
    Equal<DP.RegisterRequest, Flat<Id<'register'> & { registration: Record<string, unknown> }>>
  >,
  Expect<Equal<DP.SaveRequestMessage, Flat<ExpectedSave>>>,
  Expect<Equal<DP.LoadRequestMessage, Flat<ExpectedLoad>>>,
  Expect<
    Equal<
      DP.HoldRequest,
      Flat<Id<'hold'> & { engineId: string; engineRequestId: string; lookupId: string }>
    >
  >,
  Expect<Equal<DP.RequestEndKindName, 'finished' | 'aborted' | 'preempted'>>,
  Expect<
    Equal<
      DP.RequestFinishedRequest,
      Flat<
        Id<'request-finished'> & {
          engineId: string;
          engineRequestId: string;
          kind: DP.RequestEndKindName;
        }
      >
    >
  >,
  Expect<Equal<DP.HeartbeatRequest, Flat<Id<'heartbeat'> & { engineId: string }>>>,
  Expect<Equal<DP.UnregisterRequest, Flat<Id<'unregister'> & { engineId: string }>>>,
  Expect<Equal<M.LookupStatusName, 'ok' | 'canceled' | 'stale'>>,
  Expect<Equal<M.LookupResult, Flat<ExpectedLookupResult>>>,
  Expect<Equal<M.CancelResult, Flat<Id<'cancel-result'> & { found: boolean }>>>,
  Expect<Equal<M.ClearResult, Flat<Id<'clear-result'> & { epoch: number }>>>,
  Expect<Equal<M.Pong, Flat<Id<'pong'> & { info: Record<string, unknown> }>>>,
  Expect<Equal<M.StatsResult, Flat<Id<'stats-result'> & { stats: Record<string, unknown> }>>>,
  Expect<Equal<M.PutResult, Flat<Id<'put-result'> & { outcome: 'stored' | 'exists' | 'dropped' }>>>,
  Expect<
    Equal<M.GetResult, Flat<Id<'get-result'> & { found: boolean; tokens: number; payload: Buffer }>>
  >,
  Expect<
    Equal<
      DP.RegisterResult,
      Flat<
        Id<'register-result'> & {
          engineId: string;
          namespace: string;
          chunkSize: number;
          blockSize: number;
          blockLayout?: string;
        }
      >
    >
  >,
  Expect<
    Equal<
      DP.SaveResultMessage,
      Flat<Id<'save-result'> & { saved: number; skipped: number; dropped: number }>
    >
  >,
  Expect<
    Equal<
      DP.LoadResultMessage,
      Flat<Id<'load-result'> & { loadedTokens: number; invalidBlockIds: Uint32Array }>
    >
  >,
  Expect<Equal<DP.HoldResult, Flat<Id<'hold-result'> & { heldChunks: number }>>>,
  Expect<
    Equal<DP.RequestFinishedResult, Flat<Id<'request-finished-result'> & { released: boolean }>>
  >,
  Expect<Equal<DP.HeartbeatResult, Flat<Id<'heartbeat-result'> & { known: boolean }>>>,
  Expect<Equal<DP.UnregisterResult, Flat<Id<'unregister-result'> & { released: boolean }>>>,
  Expect<Equal<M.ErrorReply, Flat<Id<'error'> & { code: KvtierErrorCode; message: string }>>>,
  // The unions hold every message above (a message added to the table joins them too), each
  // data-plane message in the data-plane unions and no other there.
  Expect<Equal<Extract<M.Request, { type: RequestTag }>, AllRequests>>,
  Expect<Equal<Extract<M.Reply, { type: ReplyTag }>, AllReplies>>,
  Expect<Equal<Extract<DP.DataPlaneRequest, { type: RequestTag }>, DataPlaneRequests>>,
  Expect<Equal<Extract<DP.DataPlaneReply, { type: ReplyTag }>, DataPlaneReplies>>,
  Expect<Equal<Extract<DP.DataPlaneRequest, LookupPlaneRequests>, never>>,
  Expect<Equal<Extract<DP.DataPlaneReply, LookupPlaneReplies>, never>>,
  // Field kinds one by one.
  Expect<Equal<FieldValue<{ kind: 'u64'; key: 'x' }>, bigint>>,
  Expect<Equal<FieldValue<{ kind: 'bytes'; key: 'x'; size: 4 }>, Uint8Array>>,
  Expect<
    Equal<FieldValue<{ kind: 'str'; key: 'x'; max: 9; known: 'errorCodes' }>, KvtierErrorCode>
  >,
  Expect<Equal<MessageOf<'PING'>, M.PingRequest>>,
];

const H = chunkHashFromBytes(Buffer.alloc(32, 1));

const save: DP.SaveRequestMessage = {
  type: 'save',
  requestId: 1,
  engineId: 'e',
  engineRequestId: 'r',
  skipChunks: 0,
  blockIds: Uint32Array.of(1, 2),
  chunkHashes: Buffer.alloc(32, 3),
  notAfterNs: 5n,
};
const put: M.Request = {
  type: 'put',
  requestId: 2,
  namespace: 'a'.repeat(32),
  hash: H,
  tokens: 1,
  payload: Buffer.from('x'),
};
const finished: M.Reply = { type: 'request-finished-result', requestId: 3, released: true };
const error: M.Reply = { type: 'error', requestId: 4, code: 'KVT_TIMEOUT', message: 'slow' };

// What must not compile.
const wrong = {
  // @ts-expect-error a string field given a number
  cancel: { type: 'cancel', requestId: 1, lookupId: 5 } satisfies M.CancelRequest,
  hold: {
    type: 'hold',
    requestId: 1,
    engineId: 'e',
    engineRequestId: 'r',
    // @ts-expect-error a required field missing (lookupId)
  } satisfies DP.HoldRequest,
  // @ts-expect-error an unknown tag
  unknown: { type: 'lookup-all', requestId: 1 } satisfies M.Request,
  kind: {
    type: 'request-finished',
    requestId: 1,
    engineId: 'e',
    engineRequestId: 'r',
    // @ts-expect-error an enum value the table does not list
    kind: 'done',
  } satisfies M.Request,
  // @ts-expect-error a u64 given a number
  notAfter: { ...save, notAfterNs: 5 } satisfies DP.SaveRequestMessage,
  // @ts-expect-error a LOOKUP option that is not a boolean
  config: { pin: 'yes' } satisfies M.LookupConfig,
  // @ts-expect-error an error code that is not a KvtierErrorCode
  code: { type: 'error', requestId: 1, code: 'KVT_NOPE', message: '' } satisfies M.ErrorReply,
  // @ts-expect-error a hash that is a plain string (not a validated ChunkHash)
  hash: { type: 'get', requestId: 1, namespace: 'a'.repeat(32), hash: 'ab' } satisfies M.GetRequest,
};

describe('derived protocol message types', () => {
  it('type the objects the codec encodes and decodes', () => {
    assert.deepEqual(decodeRequest(encodeRequest(save)), save);
    assert.deepEqual(decodeRequest(encodeRequest(put)), put);
    assert.deepEqual(decodeReply(encodeReply(finished)), finished);
    assert.deepEqual(decodeReply(encodeReply(error)), error);
  });

  it('are what the codec refuses where the compiler refuses them', () => {
    assert.throws(() => encodeRequest(wrong.cancel as unknown as M.Request), /lookupId/);
    assert.throws(() => encodeRequest(wrong.unknown as unknown as M.Request), /no message type/);
    assert.throws(() => encodeRequest(wrong.kind as unknown as M.Request), /kind must be one of/);
    assert.throws(() => encodeRequest(wrong.notAfter as unknown as M.Request), /bigint/);
  });
});
