/**
 * Hand-written sample messages of the protocol table (src/protocol/wire-table.ts), encoded by the
 * TypeScript codec into the cross-language fixture (gen-python-fixtures.ts): edge cases of
 * every message type (limits, non-ASCII text, absent and present optional fields, every enum
 * value). A sample here is optional for a new message: for a table entry with none, the
 * generator builds one from its field kinds (protocol-fallback-samples.ts).
 */
import { chunkHashFromBytes } from '../src/hashing/chunk-hash.ts';
import type { Reply, Request } from '../src/protocol/messages.ts';

const NS_A = '48f3d9651eaf7e9014cf0c0d7bc30fba';
const NS_B = 'ccd750d5fc54b2450fad560f67df94f4';
const H = (i: number) => chunkHashFromBytes(Buffer.alloc(32, i));
const packed = (...ids: number[]) => Buffer.concat(ids.map((i) => Buffer.alloc(32, i)));

/** Requests of every type, and every optional field. */
export const REQUESTS: { name: string; req: Request }[] = [
  {
    name: 'lookup, defaults',
    req: {
      type: 'lookup',
      requestId: 7,
      lookupId: 'req-1',
      namespaces: [NS_A],
      hashes: packed(1, 2),
      tokenCounts: Uint32Array.from([256, 256]),
      config: {},
    },
  },
  {
    name: 'lookup, two namespaces, no pin, no prefetch, partial last chunk',
    req: {
      type: 'lookup',
      requestId: 0xffffffff,
      lookupId: 'régl-β',
      namespaces: [NS_A, NS_B],
      hashes: packed(3, 4, 5),
      tokenCounts: Uint32Array.from([256, 256, 17]),
      config: { pin: false, prefetch: false },
    },
  },
  {
    name: 'lookup, no pin',
    req: {
      type: 'lookup',
      requestId: 1,
      lookupId: 'x'.repeat(256),
      namespaces: [NS_B],
      hashes: packed(9),
      tokenCounts: Uint32Array.from([65536]),
      config: { pin: false },
    },
  },
  {
    name: "lookup with the engine's prefill rate",
    req: {
      type: 'lookup',
      requestId: 21,
      lookupId: 'req-2',
      namespaces: [NS_A],
      hashes: packed(1, 2),
      tokenCounts: Uint32Array.from([256, 256]),
      config: { computeTokensPerSec: 12_577.5 },
    },
  },
  {
    name: 'lookup, no chunks',
    req: {
      type: 'lookup',
      requestId: 2,
      lookupId: 'empty',
      namespaces: [NS_A],
      hashes: Buffer.alloc(0),
      tokenCounts: new Uint32Array(0),
      config: {},
    },
  },
  { name: 'cancel', req: { type: 'cancel', requestId: 3, lookupId: 'req-1' } },
  { name: 'clear all', req: { type: 'clear', requestId: 4, namespaces: [] } },
  { name: 'clear two', req: { type: 'clear', requestId: 5, namespaces: [NS_A, NS_B] } },
  { name: 'ping', req: { type: 'ping', requestId: 6 } },
  { name: 'stats', req: { type: 'stats', requestId: 8 } },
  {
    name: 'put',
    req: {
      type: 'put',
      requestId: 9,
      namespace: NS_A,
      hash: H(7),
      tokens: 256,
      payload: Buffer.from('kv bytes \u00ff', 'utf8'),
    },
  },
  { name: 'get', req: { type: 'get', requestId: 10, namespace: NS_B, hash: H(8) } },
  {
    name: 'register',
    req: {
      type: 'register',
      requestId: 11,
      registration: {
        engineId: 'engine-0',
        device: 'host',
        modelId: 'm/é',
        dtype: 'bfloat16',
        numKvHeads: 2,
        headDim: 8,
        tpSize: 1,
        tpRank: 0,
        mla: false,
        numBlocks: 64,
        blockSize: 16,
        blockStrideBytes: 512,
        chunkSize: 64,
        layers: [
          {
            k: { path: '/dev/shm/kv', offsetBytes: 0 },
            v: { path: '/dev/shm/kv', offsetBytes: 32768 },
          },
        ],
        ppSize: 2,
        ppRank: 1,
        ppFirstLayer: 1,
      },
    },
  },
  {
    name: 'save',
    req: {
      type: 'save',
      requestId: 12,
      engineId: 'engine-0',
      engineRequestId: 'req-1',
      skipChunks: 1,
      blockIds: Uint32Array.from([0, 1, 2, 3, 4, 5, 6, 4294967295]),
      chunkHashes: packed(1, 2),
    },
  },
  {
    name: 'load, no skip',
    req: {
      type: 'load',
      requestId: 13,
      engineId: 'engine-0',
      engineRequestId: 'req-1',
      lookupId: 'req-1',
      deadlineMs: 0,
      stateSlot: -1,
      blockIds: Uint32Array.from([10, 11, 12, 13]),
      chunkHashes: packed(1),
    },
  },
  {
    name: 'load, skip 2 blocks, state slot and deadline',
    req: {
      type: 'load',
      requestId: 14,
      engineId: 'engine-0',
      engineRequestId: 'req-2',
      lookupId: 'look-2',
      deadlineMs: 1500,
      stateSlot: 3,
      blockIds: Uint32Array.from([20, 21, 22, 23, 24, 25]),
      chunkHashes: packed(1, 2),
      skipBlocks: 2,
    },
  },
  {
    name: 'save with a not-after time',
    req: {
      type: 'save',
      requestId: 30,
      engineId: 'engine-0',
      engineRequestId: 'req-3',
      skipChunks: 0,
      blockIds: Uint32Array.from([8, 9, 10, 11]),
      chunkHashes: packed(3),
      notAfterNs: 18_446_744_073_709_551_557n,
    },
  },
  {
    name: 'save with a not-after time and a CUDA event',
    req: {
      type: 'save',
      requestId: 32,
      engineId: 'engine-0',
      engineRequestId: 'req-4',
      skipChunks: 1,
      blockIds: Uint32Array.from([12, 13, 14, 15, 16, 17, 18, 19]),
      chunkHashes: packed(4, 5),
      notAfterNs: 987_654_321_000n,
      cudaEvent: Buffer.from(Array.from({ length: 64 }, (_, i) => (i * 29 + 7) & 0xff)),
    },
  },
  {
    name: 'save with a fence and no CUDA event',
    req: {
      type: 'save',
      requestId: 33,
      engineId: 'engine-0',
      engineRequestId: 'req-5',
      skipChunks: 0,
      blockIds: Uint32Array.from([20, 21]),
      chunkHashes: packed(6),
      notAfterNs: 55_000_000_000n,
      fenceSlot: 4095,
      fenceTicket: 0xfffffffd,
    },
  },
  {
    name: 'save with a CUDA event and a fence',
    req: {
      type: 'save',
      requestId: 34,
      engineId: 'engine-0',
      engineRequestId: 'req-6',
      skipChunks: 0,
      blockIds: Uint32Array.from([22, 23]),
      chunkHashes: packed(7),
      notAfterNs: 56_000_000_000n,
      cudaEvent: Buffer.from(Array.from({ length: 64 }, (_, i) => (i * 13 + 1) & 0xff)),
      fenceSlot: 0,
      fenceTicket: 5,
    },
  },
  {
    name: 'load with a not-after time, no skip',
    req: {
      type: 'load',
      requestId: 31,
      engineId: 'engine-0',
      engineRequestId: 'req-3',
      lookupId: 'look-3',
      deadlineMs: 0,
      stateSlot: -1,
      blockIds: Uint32Array.from([30, 31, 32, 33]),
      chunkHashes: packed(3),
      skipBlocks: 0,
      notAfterNs: 1_234_567_890_123_456_789n,
    },
  },
  {
    name: 'load, layer-wise (a progress slot), no not-after time',
    req: {
      type: 'load',
      requestId: 32,
      engineId: 'engine-0',
      engineRequestId: 'req-4',
      lookupId: 'look-4',
      deadlineMs: 5000,
      stateSlot: 2,
      blockIds: Uint32Array.from([40, 41]),
      chunkHashes: packed(2),
      skipBlocks: 1,
      progressSlot: 3,
    },
  },
  {
    name: 'hold',
    req: { type: 'hold', requestId: 15, engineId: 'e', engineRequestId: 'r', lookupId: 'l' },
  },
  {
    name: 'request finished',
    req: {
      type: 'request-finished',
      requestId: 16,
      engineId: 'e',
      engineRequestId: 'r',
      kind: 'finished',
    },
  },
  {
    name: 'request aborted',
    req: {
      type: 'request-finished',
      requestId: 17,
      engineId: 'e',
      engineRequestId: 'r',
      kind: 'aborted',
    },
  },
  {
    name: 'request preempted',
    req: {
      type: 'request-finished',
      requestId: 18,
      engineId: 'e',
      engineRequestId: 'r',
      kind: 'preempted',
    },
  },
  { name: 'heartbeat', req: { type: 'heartbeat', requestId: 19, engineId: 'engine-0' } },
  { name: 'unregister', req: { type: 'unregister', requestId: 20, engineId: 'engine-0' } },
];

/** Replies of every type. */
export const REPLIES: { name: string; rep: Reply }[] = [
  {
    name: 'lookup result ok with tiers',
    rep: {
      type: 'lookup-result',
      requestId: 7,
      lookupId: 'req-1',
      status: 'ok',
      epoch: 3,
      hitTokens: 512,
      hitChunks: 2,
      tiers: [
        { tier: 'cpu', tokens: 256 },
        { tier: 'disk', tokens: 256 },
      ],
    },
  },
  {
    name: 'lookup result with tier rates',
    rep: {
      type: 'lookup-result',
      requestId: 21,
      lookupId: 'req-2',
      status: 'ok',
      epoch: 3,
      hitTokens: 512,
      hitChunks: 2,
      tiers: [
        { tier: 'cpu', tokens: 256 },
        { tier: 'disk', tokens: 256 },
      ],
      bytesPerToken: 131_072,
      tierRates: [
        { tier: 'cpu', decision: 'none', readBytesPerSec: 0n, latencyUs: 0, declinedTokens: 0 },
        {
          tier: 'disk',
          decision: 'load',
          readBytesPerSec: 3_621_172_047n,
          latencyUs: 290,
          declinedTokens: 0,
        },
        {
          tier: 's3',
          decision: 'decline',
          readBytesPerSec: 0xffffffffffffffffn,
          latencyUs: 0xffffffff,
          declinedTokens: 256,
        },
      ],
    },
  },
  {
    name: 'lookup result canceled',
    rep: {
      type: 'lookup-result',
      requestId: 8,
      lookupId: 'régl-β',
      status: 'canceled',
      epoch: 91_000_000,
      hitTokens: 0,
      hitChunks: 0,
      tiers: [],
    },
  },
  {
    name: 'lookup result stale',
    rep: {
      type: 'lookup-result',
      requestId: 0xffffffff,
      lookupId: 'z',
      status: 'stale',
      epoch: 0xffffffff,
      hitTokens: 0,
      hitChunks: 0,
      tiers: [],
    },
  },
  { name: 'cancel result found', rep: { type: 'cancel-result', requestId: 3, found: true } },
  { name: 'cancel result not found', rep: { type: 'cancel-result', requestId: 4, found: false } },
  { name: 'clear result', rep: { type: 'clear-result', requestId: 5, epoch: 91_357_315 } },
  {
    name: 'pong',
    rep: {
      type: 'pong',
      requestId: 6,
      info: {
        protocolVersion: 1,
        epoch: 3,
        limits: { maxChunksPerLookup: 8192 },
        tiers: [],
        dataPlane: null,
        note: 'ünï',
      },
    },
  },
  {
    name: 'stats result',
    rep: { type: 'stats-result', requestId: 8, stats: { epoch: 3, lookups: { ongoing: 0 } } },
  },
  { name: 'put result stored', rep: { type: 'put-result', requestId: 9, outcome: 'stored' } },
  { name: 'put result exists', rep: { type: 'put-result', requestId: 9, outcome: 'exists' } },
  { name: 'put result dropped', rep: { type: 'put-result', requestId: 9, outcome: 'dropped' } },
  {
    name: 'get result found',
    rep: {
      type: 'get-result',
      requestId: 10,
      found: true,
      tokens: 256,
      payload: Buffer.from([0, 1, 2, 255]),
    },
  },
  {
    name: 'get result not found',
    rep: { type: 'get-result', requestId: 10, found: false, tokens: 0, payload: Buffer.alloc(0) },
  },
  {
    name: 'register result',
    rep: {
      type: 'register-result',
      requestId: 11,
      engineId: 'engine-0',
      namespace: NS_A,
      chunkSize: 256,
      blockSize: 16,
      blockLayout: 'HND',
    },
  },
  {
    name: 'save result',
    rep: { type: 'save-result', requestId: 12, saved: 2, skipped: 1, dropped: 0 },
  },
  {
    name: 'load result with invalid blocks',
    rep: {
      type: 'load-result',
      requestId: 13,
      loadedTokens: 240,
      invalidBlockIds: Uint32Array.from([24, 25, 4294967295]),
    },
  },
  {
    name: 'load result complete',
    rep: {
      type: 'load-result',
      requestId: 14,
      loadedTokens: 512,
      invalidBlockIds: new Uint32Array(0),
    },
  },
  { name: 'hold result', rep: { type: 'hold-result', requestId: 15, heldChunks: 3 } },
  {
    name: 'request finished result',
    rep: { type: 'request-finished-result', requestId: 16, released: true },
  },
  {
    name: 'heartbeat result unknown',
    rep: { type: 'heartbeat-result', requestId: 19, known: false },
  },
  { name: 'heartbeat result known', rep: { type: 'heartbeat-result', requestId: 19, known: true } },
  { name: 'unregister result', rep: { type: 'unregister-result', requestId: 20, released: true } },
  {
    name: 'error',
    rep: {
      type: 'error',
      requestId: 21,
      code: 'KVT_NOT_FOUND',
      message: 'engine "x" has no registered KV cache',
    },
  },
  {
    name: 'error with request id 0',
    rep: {
      type: 'error',
      requestId: 0,
      code: 'KVT_PROTOCOL',
      message: 'message is 3 bytes, shorter than the 8-byte header',
    },
  },
  {
    name: 'error with an unknown code reads as KVT_INTERNAL',
    rep: {
      type: 'error',
      requestId: 22,
      code: 'KVT_FROM_THE_FUTURE' as 'KVT_INTERNAL',
      message: 'ß',
    },
  },
];
