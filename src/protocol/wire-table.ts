/**
 * Protocol v1 in one table: every message, its type code, its direction and its fields in wire
 * order with their kinds, limits and checks. The TypeScript codec (`wire-codec.ts`) interprets
 * it; `scripts/gen-protocol.ts` writes the Python package's copy (python/kvtier_vllm/
 * protocol_table.py) and the layout blocks of docs/protocol.md from it. Adding a message is one
 * entry here plus its handler in the server.
 */
import { DATA_PLANE_LIMITS as DP } from './data-plane-messages.ts';
import { type ProtocolLimits, WIRE_LIMITS as WIRE } from './messages.ts';

/** A maximum: a fixed number, or the wire maximum plus the server limit a decoder applies. */
export type Max = number | { readonly wire: number; readonly limit: keyof ProtocolLimits };

/**
 * One field. `key` is the property of the TypeScript message (Python uses its snake_case form);
 * `label` (default: `key`) names it in error messages. Kinds:
 * - `u32`, `i32` (signed), `u64` (a bigint): little-endian integers; `range` is checked
 *   by the decoder (`KVT_INVALID_ARGUMENT`), `min` is an `i32`'s least value.
 * - `bool`: a u8, 1 is true (any other byte reads false). `enum`: a u8 indexing `names`.
 * - `str`: u16le length + strict UTF-8, at most `max` bytes (`KVT_TOO_LARGE`); `nonEmpty`
 *   refuses "" (`KVT_INVALID_ARGUMENT`); `truncateTo` cuts an encoded value at a character
 *   boundary; `known: 'errorCodes'` reads a code the decoder does not know as `KVT_INTERNAL`.
 * - `ns`: a namespace id, 16 bytes (32 hex digits in a message). `nsList`: u8 count + ids.
 * - `hash`: one 32-byte chunk hash. `hashes`: u32 count + packed 32-byte hashes.
 * - `u32s`: u32 count + u32 array; with `countOf`, no count of its own: as many as `countOf`.
 * - `json`: u32le length + UTF-8 JSON object. `blob`: u32le length + bytes.
 * - `bytes`: exactly `size` bytes. `list`: u8 count + records of `of` (the encoder sends the
 *   first `max`).
 * `optional` fields are trailing: each is present only when every one before it is; an encoder
 * writes up to the last one that is set (earlier ones as 0).
 */
export type Field =
  | { kind: 'bool' | 'u64'; key: string; label?: string; optional?: true }
  | {
      kind: 'u32';
      key: string;
      label?: string;
      range?: readonly [number, Max];
      optional?: true;
    }
  | { kind: 'i32'; key: string; label?: string; min: number }
  | {
      kind: 'enum';
      key: string;
      label?: string;
      names: readonly string[];
      /** What an unknown byte is: a malformed reply, or an invalid request value. */
      unknown: 'KVT_PROTOCOL' | 'KVT_INVALID_ARGUMENT';
    }
  | {
      kind: 'str';
      key: string;
      label?: string;
      max: number;
      nonEmpty?: true;
      truncateTo?: number;
      known?: 'errorCodes';
    }
  | { kind: 'ns' | 'hash'; key: string; label?: string }
  | { kind: 'nsList'; key: string; label?: string; min: number; max: number }
  | { kind: 'hashes'; key: string; label?: string; max: Max }
  | {
      kind: 'u32s';
      key: string;
      label?: string;
      max?: Max;
      countOf?: string;
      range?: readonly [number, Max];
    }
  | {
      kind: 'json';
      key: string;
      label?: string;
      max?: number;
      /** Keys kept, each a boolean when present; absent: the whole object is kept. */
      booleans?: readonly string[];
      /** `require`: anything but an object is `KVT_INVALID_ARGUMENT`; `coerce`: it reads `{}`. */
      object: 'require' | 'coerce';
      /** An empty object is sent as 0 bytes. */
      omitEmpty?: true;
      /** Parsed after the end of the body is checked (a reply, or a REGISTER). */
      late?: true;
      /** Invalid UTF-8 is replaced instead of refused. */
      lenient?: true;
    }
  | { kind: 'blob'; key: string; label?: string; max?: Max; nonEmpty?: true }
  | { kind: 'bytes'; key: string; label?: string; size: number; optional?: true }
  | {
      kind: 'list';
      key: string;
      label?: string;
      max: number;
      of: readonly Field[];
      /** Name of one record's type (the Python reply record). */
      record: string;
    };

/** A check across fields, run by the decoder after the body and by the encoder before it. */
export type Rule =
  /** `field` is at most the number of hashes in `of`. */
  | { rule: 'atMostCount'; field: string; of: string }
  /** `field` is 0 when `of` holds no hash. */
  | { rule: 'zeroWithoutCount'; field: string; of: string };

/** One message of protocol v1. */
export interface MessageSpec {
  /** Wire name, as docs/protocol.md spells it. */
  readonly name: string;
  /** The `type` of the TypeScript message object. */
  readonly tag: string;
  readonly code: number;
  readonly dir: 'request' | 'reply';
  /** Section of docs/protocol.md. */
  readonly section: string;
  readonly fields: readonly Field[];
  readonly rules?: readonly Rule[];
}

const ID = WIRE.maxLookupIdBytes;
const LOOKUP_ID: Field = { kind: 'str', key: 'lookupId', max: ID, nonEmpty: true };
const ENGINE_ID: Field = { kind: 'str', key: 'engineId', max: DP.maxIdBytes, nonEmpty: true };
const ENGINE_REQUEST_ID: Field = {
  kind: 'str',
  key: 'engineRequestId',
  label: 'requestId',
  max: DP.maxIdBytes,
  nonEmpty: true,
};
const BLOCK_IDS: Field = {
  kind: 'u32s',
  key: 'blockIds',
  label: 'block ids',
  max: DP.maxBlocksPerMessage,
};
const CHUNK_HASHES: Field = {
  kind: 'hashes',
  key: 'chunkHashes',
  max: DP.maxChunksPerMessage,
};
const NOT_AFTER: Field = { kind: 'u64', key: 'notAfterNs', optional: true };
const TOKENS: readonly [number, Max] = [1, { wire: 0xffffffff, limit: 'maxTokensPerChunk' }];
const JSON_REPLY = { kind: 'json', object: 'coerce', late: true, lenient: true } as const;

/** Every message of protocol v1, requests first, in type-code order. */
export const MESSAGES: readonly MessageSpec[] = [
  {
    name: 'LOOKUP',
    tag: 'lookup',
    code: 0x01,
    dir: 'request',
    section: '4.1',
    fields: [
      LOOKUP_ID,
      { kind: 'nsList', key: 'namespaces', min: 1, max: WIRE.maxNamespacesPerLookup },
      {
        kind: 'hashes',
        key: 'hashes',
        max: { wire: WIRE.maxChunksPerLookup, limit: 'maxChunksPerLookup' },
      },
      { kind: 'u32s', key: 'tokenCounts', label: 'token count', countOf: 'hashes', range: TOKENS },
      {
        kind: 'json',
        key: 'config',
        max: WIRE.maxConfigBytes,
        booleans: ['pin', 'prefetch'],
        object: 'require',
        omitEmpty: true,
      },
    ],
  },
  {
    name: 'CANCEL',
    tag: 'cancel',
    code: 0x02,
    dir: 'request',
    section: '4.2',
    fields: [LOOKUP_ID],
  },
  {
    name: 'CLEAR',
    tag: 'clear',
    code: 0x03,
    dir: 'request',
    section: '4.3',
    fields: [{ kind: 'nsList', key: 'namespaces', min: 0, max: 255 }],
  },
  { name: 'PING', tag: 'ping', code: 0x04, dir: 'request', section: '4.4', fields: [] },
  {
    name: 'PUT',
    tag: 'put',
    code: 0x05,
    dir: 'request',
    section: '4.6',
    fields: [
      { kind: 'ns', key: 'namespace' },
      { kind: 'hash', key: 'hash' },
      { kind: 'u32', key: 'tokens', label: 'token count', range: TOKENS },
      {
        kind: 'blob',
        key: 'payload',
        max: { wire: 0xffffffff, limit: 'maxPayloadBytes' },
        nonEmpty: true,
      },
    ],
  },
  {
    name: 'GET',
    tag: 'get',
    code: 0x06,
    dir: 'request',
    section: '4.7',
    fields: [
      { kind: 'ns', key: 'namespace' },
      { kind: 'hash', key: 'hash' },
    ],
  },
  { name: 'STATS', tag: 'stats', code: 0x07, dir: 'request', section: '4.5', fields: [] },
  {
    name: 'REGISTER',
    tag: 'register',
    code: 0x08,
    dir: 'request',
    section: '4.9',
    fields: [
      {
        kind: 'json',
        key: 'registration',
        max: DP.maxRegistrationBytes,
        object: 'require',
        late: true,
        lenient: true,
      },
    ],
  },
  {
    name: 'SAVE',
    tag: 'save',
    code: 0x09,
    dir: 'request',
    section: '4.9',
    fields: [
      ENGINE_ID,
      ENGINE_REQUEST_ID,
      { kind: 'u32', key: 'skipChunks' },
      BLOCK_IDS,
      CHUNK_HASHES,
      NOT_AFTER,
      { kind: 'bytes', key: 'cudaEvent', size: 64, optional: true },
    ],
    rules: [{ rule: 'atMostCount', field: 'skipChunks', of: 'chunkHashes' }],
  },
  {
    name: 'LOAD',
    tag: 'load',
    code: 0x0a,
    dir: 'request',
    section: '4.9',
    fields: [
      ENGINE_ID,
      ENGINE_REQUEST_ID,
      LOOKUP_ID,
      { kind: 'u32', key: 'deadlineMs' },
      { kind: 'i32', key: 'stateSlot', min: -1 },
      BLOCK_IDS,
      CHUNK_HASHES,
      { kind: 'u32', key: 'skipBlocks', optional: true },
      NOT_AFTER,
    ],
    rules: [{ rule: 'zeroWithoutCount', field: 'skipBlocks', of: 'chunkHashes' }],
  },
  {
    name: 'HOLD',
    tag: 'hold',
    code: 0x0b,
    dir: 'request',
    section: '4.9',
    fields: [ENGINE_ID, ENGINE_REQUEST_ID, LOOKUP_ID],
  },
  {
    name: 'REQUEST_FINISHED',
    tag: 'request-finished',
    code: 0x0c,
    dir: 'request',
    section: '4.9',
    fields: [
      ENGINE_ID,
      ENGINE_REQUEST_ID,
      {
        kind: 'enum',
        key: 'kind',
        names: ['finished', 'aborted', 'preempted'],
        unknown: 'KVT_INVALID_ARGUMENT',
      },
    ],
  },
  {
    name: 'HEARTBEAT',
    tag: 'heartbeat',
    code: 0x0d,
    dir: 'request',
    section: '4.9',
    fields: [ENGINE_ID],
  },
  {
    name: 'UNREGISTER',
    tag: 'unregister',
    code: 0x0e,
    dir: 'request',
    section: '4.9',
    fields: [ENGINE_ID],
  },
  {
    name: 'LOOKUP_RESULT',
    tag: 'lookup-result',
    code: 0x81,
    dir: 'reply',
    section: '4.1',
    fields: [
      { kind: 'str', key: 'lookupId', max: ID },
      { kind: 'enum', key: 'status', names: ['ok', 'canceled', 'stale'], unknown: 'KVT_PROTOCOL' },
      { kind: 'u32', key: 'epoch' },
      { kind: 'u32', key: 'hitTokens' },
      { kind: 'u32', key: 'hitChunks' },
      {
        kind: 'list',
        key: 'tiers',
        max: 255,
        record: 'TierTokens',
        of: [
          { kind: 'str', key: 'tier', label: 'tier name', max: 0xffff },
          { kind: 'u32', key: 'tokens', label: 'tier tokens' },
        ],
      },
    ],
  },
  {
    name: 'CANCEL_RESULT',
    tag: 'cancel-result',
    code: 0x82,
    dir: 'reply',
    section: '4.2',
    fields: [{ kind: 'bool', key: 'found' }],
  },
  {
    name: 'CLEAR_RESULT',
    tag: 'clear-result',
    code: 0x83,
    dir: 'reply',
    section: '4.3',
    fields: [{ kind: 'u32', key: 'epoch' }],
  },
  {
    name: 'PONG',
    tag: 'pong',
    code: 0x84,
    dir: 'reply',
    section: '4.4',
    fields: [{ ...JSON_REPLY, key: 'info' }],
  },
  {
    name: 'PUT_RESULT',
    tag: 'put-result',
    code: 0x85,
    dir: 'reply',
    section: '4.6',
    fields: [
      {
        kind: 'enum',
        key: 'outcome',
        names: ['stored', 'exists', 'dropped'],
        unknown: 'KVT_PROTOCOL',
      },
    ],
  },
  {
    name: 'GET_RESULT',
    tag: 'get-result',
    code: 0x86,
    dir: 'reply',
    section: '4.7',
    fields: [
      { kind: 'bool', key: 'found' },
      { kind: 'u32', key: 'tokens' },
      { kind: 'blob', key: 'payload' },
    ],
  },
  {
    name: 'STATS_RESULT',
    tag: 'stats-result',
    code: 0x87,
    dir: 'reply',
    section: '4.5',
    fields: [{ ...JSON_REPLY, key: 'stats' }],
  },
  {
    name: 'REGISTER_RESULT',
    tag: 'register-result',
    code: 0x88,
    dir: 'reply',
    section: '4.9',
    fields: [
      { kind: 'str', key: 'engineId', max: DP.maxIdBytes },
      { kind: 'ns', key: 'namespace' },
      { kind: 'u32', key: 'chunkSize' },
      { kind: 'u32', key: 'blockSize' },
    ],
  },
  {
    name: 'SAVE_RESULT',
    tag: 'save-result',
    code: 0x89,
    dir: 'reply',
    section: '4.9',
    fields: [
      { kind: 'u32', key: 'saved' },
      { kind: 'u32', key: 'skipped' },
      { kind: 'u32', key: 'dropped' },
    ],
  },
  {
    name: 'LOAD_RESULT',
    tag: 'load-result',
    code: 0x8a,
    dir: 'reply',
    section: '4.9',
    fields: [
      { kind: 'u32', key: 'loadedTokens' },
      { kind: 'u32s', key: 'invalidBlockIds', label: 'invalid block ids' },
    ],
  },
  {
    name: 'HOLD_RESULT',
    tag: 'hold-result',
    code: 0x8b,
    dir: 'reply',
    section: '4.9',
    fields: [{ kind: 'u32', key: 'heldChunks' }],
  },
  {
    name: 'REQUEST_FINISHED_RESULT',
    tag: 'request-finished-result',
    code: 0x8c,
    dir: 'reply',
    section: '4.9',
    fields: [{ kind: 'bool', key: 'released' }],
  },
  {
    name: 'HEARTBEAT_RESULT',
    tag: 'heartbeat-result',
    code: 0x8d,
    dir: 'reply',
    section: '4.9',
    fields: [{ kind: 'bool', key: 'known' }],
  },
  {
    name: 'UNREGISTER_RESULT',
    tag: 'unregister-result',
    code: 0x8e,
    dir: 'reply',
    section: '4.9',
    fields: [{ kind: 'bool', key: 'released' }],
  },
  {
    name: 'ERROR',
    tag: 'error',
    code: 0xff,
    dir: 'reply',
    section: '4.8',
    fields: [
      { kind: 'str', key: 'code', label: 'error code', max: 64, known: 'errorCodes' },
      {
        kind: 'str',
        key: 'message',
        label: 'error message',
        max: 0xffff,
        truncateTo: WIRE.maxErrorMessageBytes,
      },
    ],
  },
];
