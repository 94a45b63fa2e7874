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
  /** The `type` of the TypeScript message object: the name in lower case, `_` as `-`. */
  readonly tag: string;
  readonly code: number;
  /** A request (codes below 0x80) or a reply. */
  readonly dir: 'request' | 'reply';
  /** Section of docs/protocol.md. */
  readonly section: string;
  readonly fields: readonly Field[];
  readonly rules?: readonly Rule[];
}

/** One table entry; its tag and direction follow from its name and code. */
function msg(
  name: string,
  code: number,
  section: string,
  fields: readonly Field[],
  rules?: readonly Rule[],
): MessageSpec {
  const tag = name.toLowerCase().replace(/_/g, '-');
  const dir = code < 0x80 ? 'request' : 'reply';
  return { name, tag, code, dir, section, fields, ...(rules === undefined ? {} : { rules }) };
}

const u32 = (key: string): Field => ({ kind: 'u32', key });
const bool = (key: string): Field => ({ kind: 'bool', key });
const ns = (key: string): Field => ({ kind: 'ns', key });
const hash = (key: string): Field => ({ kind: 'hash', key });
const id = (key: string, max: number, label?: string): Field => ({
  kind: 'str',
  key,
  max,
  nonEmpty: true,
  ...(label === undefined ? {} : { label }),
});

const LOOKUP_ID = id('lookupId', WIRE.maxLookupIdBytes);
const ENGINE_ID = id('engineId', DP.maxIdBytes);
const ENGINE_REQUEST_ID = id('engineRequestId', DP.maxIdBytes, 'requestId');
const BLOCK_IDS: Field = {
  kind: 'u32s',
  key: 'blockIds',
  label: 'block ids',
  max: DP.maxBlocksPerMessage,
};
const CHUNK_HASHES: Field = { kind: 'hashes', key: 'chunkHashes', max: DP.maxChunksPerMessage };
const NOT_AFTER: Field = { kind: 'u64', key: 'notAfterNs', optional: true };
const TOKENS: readonly [number, Max] = [1, { wire: 0xffffffff, limit: 'maxTokensPerChunk' }];
const JSON_REPLY = { kind: 'json', object: 'coerce', late: true, lenient: true } as const;
const enumOf = (key: string, names: string[], unknown: 'KVT_PROTOCOL' | 'KVT_INVALID_ARGUMENT') =>
  ({ kind: 'enum', key, names, unknown }) as const;

/** Every message of protocol v1, requests first, in type-code order. */
export const MESSAGES: readonly MessageSpec[] = [
  msg('LOOKUP', 0x01, '4.1', [
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
  ]),
  msg('CANCEL', 0x02, '4.2', [LOOKUP_ID]),
  msg('CLEAR', 0x03, '4.3', [{ kind: 'nsList', key: 'namespaces', min: 0, max: 255 }]),
  msg('PING', 0x04, '4.4', []),
  msg('PUT', 0x05, '4.6', [
    ns('namespace'),
    hash('hash'),
    { kind: 'u32', key: 'tokens', label: 'token count', range: TOKENS },
    {
      kind: 'blob',
      key: 'payload',
      max: { wire: 0xffffffff, limit: 'maxPayloadBytes' },
      nonEmpty: true,
    },
  ]),
  msg('GET', 0x06, '4.7', [ns('namespace'), hash('hash')]),
  msg('STATS', 0x07, '4.5', []),
  msg('REGISTER', 0x08, '4.9', [
    {
      kind: 'json',
      key: 'registration',
      max: DP.maxRegistrationBytes,
      object: 'require',
      late: true,
      lenient: true,
    },
  ]),
  msg(
    'SAVE',
    0x09,
    '4.9',
    [
      ENGINE_ID,
      ENGINE_REQUEST_ID,
      u32('skipChunks'),
      BLOCK_IDS,
      CHUNK_HASHES,
      NOT_AFTER,
      { kind: 'bytes', key: 'cudaEvent', size: 64, optional: true },
    ],
    [{ rule: 'atMostCount', field: 'skipChunks', of: 'chunkHashes' }],
  ),
  msg(
    'LOAD',
    0x0a,
    '4.9',
    [
      ENGINE_ID,
      ENGINE_REQUEST_ID,
      LOOKUP_ID,
      u32('deadlineMs'),
      { kind: 'i32', key: 'stateSlot', min: -1 },
      BLOCK_IDS,
      CHUNK_HASHES,
      { kind: 'u32', key: 'skipBlocks', optional: true },
      NOT_AFTER,
    ],
    [{ rule: 'zeroWithoutCount', field: 'skipBlocks', of: 'chunkHashes' }],
  ),
  msg('HOLD', 0x0b, '4.9', [ENGINE_ID, ENGINE_REQUEST_ID, LOOKUP_ID]),
  msg('REQUEST_FINISHED', 0x0c, '4.9', [
    ENGINE_ID,
    ENGINE_REQUEST_ID,
    enumOf('kind', ['finished', 'aborted', 'preempted'], 'KVT_INVALID_ARGUMENT'),
  ]),
  msg('HEARTBEAT', 0x0d, '4.9', [ENGINE_ID]),
  msg('UNREGISTER', 0x0e, '4.9', [ENGINE_ID]),
  msg('LOOKUP_RESULT', 0x81, '4.1', [
    { kind: 'str', key: 'lookupId', max: WIRE.maxLookupIdBytes },
    enumOf('status', ['ok', 'canceled', 'stale'], 'KVT_PROTOCOL'),
    u32('epoch'),
    u32('hitTokens'),
    u32('hitChunks'),
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
  ]),
  msg('CANCEL_RESULT', 0x82, '4.2', [bool('found')]),
  msg('CLEAR_RESULT', 0x83, '4.3', [u32('epoch')]),
  msg('PONG', 0x84, '4.4', [{ ...JSON_REPLY, key: 'info' }]),
  msg('PUT_RESULT', 0x85, '4.6', [
    enumOf('outcome', ['stored', 'exists', 'dropped'], 'KVT_PROTOCOL'),
  ]),
  msg('GET_RESULT', 0x86, '4.7', [bool('found'), u32('tokens'), { kind: 'blob', key: 'payload' }]),
  msg('STATS_RESULT', 0x87, '4.5', [{ ...JSON_REPLY, key: 'stats' }]),
  msg('REGISTER_RESULT', 0x88, '4.9', [
    { kind: 'str', key: 'engineId', max: DP.maxIdBytes },
    ns('namespace'),
    u32('chunkSize'),
    u32('blockSize'),
  ]),
  msg('SAVE_RESULT', 0x89, '4.9', [u32('saved'), u32('skipped'), u32('dropped')]),
  msg('LOAD_RESULT', 0x8a, '4.9', [
    u32('loadedTokens'),
    { kind: 'u32s', key: 'invalidBlockIds', label: 'invalid block ids' },
  ]),
  msg('HOLD_RESULT', 0x8b, '4.9', [u32('heldChunks')]),
  msg('REQUEST_FINISHED_RESULT', 0x8c, '4.9', [bool('released')]),
  msg('HEARTBEAT_RESULT', 0x8d, '4.9', [bool('known')]),
  msg('UNREGISTER_RESULT', 0x8e, '4.9', [bool('released')]),
  msg('ERROR', 0xff, '4.8', [
    { kind: 'str', key: 'code', label: 'error code', max: 64, known: 'errorCodes' },
    {
      kind: 'str',
      key: 'message',
      label: 'error message',
      max: 0xffff,
      truncateTo: WIRE.maxErrorMessageBytes,
    },
  ]),
];
