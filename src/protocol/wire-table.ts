/**
 * Protocol v1 in one table: every message, its type code, its direction and its fields in wire
 * order with their kinds, limits and checks (the kinds are described in `wire-spec.ts`). The
 * TypeScript codec (`wire-codec.ts`) interprets it; the TypeScript message types
 * (`messages.ts`, `data-plane-messages.ts`) are derived from it (`message-types.ts`);
 * `scripts/gen-protocol.ts` writes the Python package's copy (python/kvtier_vllm/
 * protocol_table.py), its per-message encoders and client methods (protocol_encode.py,
 * client_requests.py), the layout blocks of docs/protocol.md and the cross-language fixture from
 * it. Adding a message is one entry here plus its handler in the server
 * (src/lookup-server/sidecar-server.ts), which does not compile until the handler exists.
 */
import { DATA_PLANE_LIMITS as DP, WIRE_LIMITS as WIRE } from './limits.ts';
import {
  bool,
  enumOf,
  type Field,
  hash,
  id,
  type Max,
  type MessageSpec,
  ns,
  reply,
  request,
  u32,
} from './wire-spec.ts';

/** docs/protocol.md's section of the data-plane messages (`DataPlaneRequest`, `DataPlaneReply`). */
export const DATA_PLANE_SECTION = '4.9';

/** docs/protocol.md's section of the sidecar-to-sidecar messages of the peer tier. */
export const PEER_SECTION = '4.10';

const LOOKUP_ID = id('lookupId', WIRE.maxLookupIdBytes);
const ENGINE_ID = id('engineId', DP.maxIdBytes);
const ENGINE_REQUEST_ID = id('engineRequestId', DP.maxIdBytes, 'requestId');
const BLOCK_IDS = {
  kind: 'u32s',
  key: 'blockIds',
  label: 'block ids',
  max: DP.maxBlocksPerMessage,
} as const satisfies Field;
/** Packed chunk hashes, 32 bytes each. */
const CHUNK_HASHES = {
  kind: 'hashes',
  key: 'chunkHashes',
  max: DP.maxChunksPerMessage,
} as const satisfies Field;
/**
 * Not-after time on the host's monotonic clock (`CLOCK_MONOTONIC`, ns: Node's
 * `process.hrtime.bigint()`, Python's `time.monotonic_ns()`). SAVE: a copy out of the engine's
 * blocks that finishes later is discarded (its chunks count as dropped) and none starts past it,
 * so blocks the engine reused after giving up on the SAVE are never stored. LOAD: chunks not
 * started by then are invalid, so nothing is written into blocks after the engine gave up on
 * the LOAD. An optional trailing u64; absent on the wire means none. The encoder writes it
 * whenever it is defined; the decoder sets it only when present.
 */
const NOT_AFTER = { kind: 'u64', key: 'notAfterNs', optional: true } as const satisfies Field;
const TOKENS: readonly [number, Max] = [1, { wire: 0xffffffff, limit: 'maxTokensPerChunk' }];
const JSON_REPLY = { kind: 'json', object: 'coerce', late: true, lenient: true } as const;
/** PEER_CONTAINS's hashes: as many as a lookup may name. */
const PEER_CONTAINS_HASHES = {
  kind: 'hashes',
  key: 'hashes',
  max: { wire: WIRE.maxChunksPerLookup, limit: 'maxChunksPerLookup' },
} as const satisfies Field;
/** PEER_GET's hashes: as many as its reply's list can carry. */
const PEER_GET_HASHES = {
  kind: 'hashes',
  key: 'hashes',
  max: WIRE.maxChunksPerPeerGet,
} as const satisfies Field;

/** Every message of protocol v1, requests first, in type-code order. */
export const MESSAGES = [
  request('LOOKUP', 0x01, '4.1', [
    LOOKUP_ID,
    // Namespace ids (32 hex digits each); a chunk counts only when present in every one.
    { kind: 'nsList', key: 'namespaces', min: 1, max: WIRE.maxNamespacesPerLookup },
    // Packed chunk hashes, 32 bytes each.
    {
      kind: 'hashes',
      key: 'hashes',
      max: { wire: WIRE.maxChunksPerLookup, limit: 'maxChunksPerLookup' },
    },
    // Tokens per chunk, one per hash.
    { kind: 'u32s', key: 'tokenCounts', label: 'token count', countOf: 'hashes', range: TOKENS },
    // Per-lookup options (`LookupConfig`), all optional. `pin`: pin the hits until
    // cancel/cleanup or the pin TTL (default true). `prefetch`: prefetch lower-tier hits into
    // host memory (default true); without it, only CPU hits count. `computeTokensPerSec`: the
    // engine's prefill rate, tokens/s; with it a tier below host memory is claimed from only
    // where fetching its hits beats computing them, and the reply carries the tier rates.
    // `awaitChunks` and `awaitMs` (disaggregated prefill, docs/fleet.md): the answer waits up to
    // `awaitMs` for the first `awaitChunks` chunks, whose save is still in flight elsewhere, to
    // appear in a tier; past that it answers what it holds (the wait counted as timed out).
    {
      kind: 'json',
      key: 'config',
      max: WIRE.maxConfigBytes,
      booleans: ['pin', 'prefetch'],
      numbers: ['computeTokensPerSec', 'awaitChunks', 'awaitMs'],
      object: 'require',
      omitEmpty: true,
    },
  ]),
  request('CANCEL', 0x02, '4.2', [LOOKUP_ID]),
  request('CLEAR', 0x03, '4.3', [
    // Empty: every namespace.
    { kind: 'nsList', key: 'namespaces', min: 0, max: 255 },
  ]),
  request('PING', 0x04, '4.4', []),
  request('PUT', 0x05, '4.6', [
    ns('namespace'),
    hash('hash'), // validated where it enters (wire decode, or the client's `put`)
    { kind: 'u32', key: 'tokens', label: 'token count', range: TOKENS },
    {
      kind: 'blob',
      key: 'payload',
      max: { wire: 0xffffffff, limit: 'maxPayloadBytes' },
      nonEmpty: true,
    },
  ]),
  request('GET', 0x06, '4.7', [ns('namespace'), hash('hash')]),
  request('STATS', 0x07, '4.5', []),
  // The worker's `KvRegistration`, carried as JSON; the data plane checks its fields
  // (`resolveKvRegistration`).
  request('REGISTER', 0x08, '4.9', [
    {
      kind: 'json',
      key: 'registration',
      max: DP.maxRegistrationBytes,
      object: 'require',
      late: true,
      lenient: true,
    },
  ]),
  // Gather the blocks of these chunks into the CPU tier.
  request(
    'SAVE',
    0x09,
    '4.9',
    [
      ENGINE_ID,
      ENGINE_REQUEST_ID,
      u32('skipChunks'), // leading chunks the engine knows are stored
      BLOCK_IDS,
      CHUNK_HASHES,
      NOT_AFTER,
      // A CUDA interprocess event (the 64-byte `cudaIpcEventHandle_t`) the engine recorded on
      // its stream after the step that wrote the blocks: the sidecar's device-to-host copies
      // wait for it on the GPU, so the engine need not synchronize its stream before sending
      // the SAVE. Follows `notAfterNs` (written as 0 when that is undefined); absent: no event.
      { kind: 'bytes', key: 'cudaEvent', size: 64, optional: true },
      // A save fence: slot `fenceSlot` of the registered state file holds `fenceTicket` while the
      // engine still wants this SAVE, and anything else once it cancelled it (then it may reuse
      // the blocks at once). The server copies nothing when the word differs before the copy and
      // stores nothing when it differs after. Follows `cudaEvent` (written as 64 zero bytes, read
      // as no event, when there is none); only to a server whose PONG lists `saveFence`.
      { kind: 'u32', key: 'fenceSlot', optional: true },
      { kind: 'u32', key: 'fenceTicket', optional: true },
    ],
    [{ rule: 'atMostCount', field: 'skipChunks', of: 'chunkHashes' }],
  ),
  // Scatter a lookup's pinned chunks into these blocks.
  request(
    'LOAD',
    0x0a,
    '4.9',
    [
      ENGINE_ID,
      ENGINE_REQUEST_ID,
      LOOKUP_ID,
      u32('deadlineMs'), // relative to the server's receipt, ms; 0: the server's default
      // Slot of the registered state file to set on completion; -1 for none.
      { kind: 'i32', key: 'stateSlot', min: -1 },
      BLOCK_IDS,
      CHUNK_HASHES,
      // Leading blocks of the first chunk the engine already holds: not written and not in
      // `blockIds`. Absent on the wire means 0. The encoder writes it whenever it is defined
      // (0 included), and as 0 when only `notAfterNs` is; the decoder sets it only when present.
      { kind: 'u32', key: 'skipBlocks', optional: true },
      NOT_AFTER,
      // A layer-wise load: the server copies layer by layer (every chunk's layer 0, then layer
      // 1, ...) and writes to slot `progressSlot` of the registered state file, as a 4-byte
      // little-endian int32, how many leading layers are in place, so the engine can compute
      // layer N while later layers load. Follows `notAfterNs` (written as 0, read as none, when
      // that is undefined); only to a server whose PONG lists `layerwiseLoad`.
      { kind: 'u32', key: 'progressSlot', optional: true },
    ],
    [{ rule: 'zeroWithoutCount', field: 'skipBlocks', of: 'chunkHashes' }],
  ),
  // Move a lookup's pins to an engine request (kept across preemption).
  request('HOLD', 0x0b, '4.9', [ENGINE_ID, ENGINE_REQUEST_ID, LOOKUP_ID]),
  // An engine request ended.
  request('REQUEST_FINISHED', 0x0c, '4.9', [
    ENGINE_ID,
    ENGINE_REQUEST_ID,
    // Terminal (finished, aborted) or preempted (will ask again).
    enumOf('kind', ['finished', 'aborted', 'preempted'], 'KVT_INVALID_ARGUMENT'),
  ]),
  // The engine is alive.
  request('HEARTBEAT', 0x0d, '4.9', [ENGINE_ID]),
  // The worker is shutting down; release everything its engine holds.
  request('UNREGISTER', 0x0e, '4.9', [ENGINE_ID]),
  // Sidecar to sidecar (the peer tier, docs/fleet.md): how many of these chunks, counted from the
  // first, the server holds in its own tiers (never asking its own peer tier).
  request('PEER_CONTAINS', 0x10, PEER_SECTION, [ns('namespace'), PEER_CONTAINS_HASHES]),
  // The chunks the server holds of these, each with the CRC-32C of the bytes it sends.
  request('PEER_GET', 0x11, PEER_SECTION, [ns('namespace'), PEER_GET_HASHES]),
  // Store one chunk sent by the sidecar whose peer tier names this server its home; the server
  // writes it to its own tiers but never on to its own peer tier.
  request('PEER_PUT', 0x12, PEER_SECTION, [
    ns('namespace'),
    hash('hash'),
    { kind: 'u32', key: 'tokens', label: 'token count', range: TOKENS },
    u32('crc32c'), // CRC-32C (Castagnoli) of `payload`
    {
      kind: 'blob',
      key: 'payload',
      max: { wire: 0xffffffff, limit: 'maxPayloadBytes' },
      nonEmpty: true,
    },
  ]),
  reply('LOOKUP_RESULT', 0x81, '4.1', [
    { kind: 'str', key: 'lookupId', max: WIRE.maxLookupIdBytes },
    enumOf('status', ['ok', 'canceled', 'stale'], 'KVT_PROTOCOL'),
    u32('epoch'),
    u32('hitTokens'), // tokens ready in host memory, counted from the first chunk
    u32('hitChunks'),
    // Where the ready tokens were found, in tier order (`TierTokens`).
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
    // Sent only to a LOOKUP whose config named `computeTokensPerSec` (a reader that predates
    // them refuses trailing bytes). KV bytes per token of the first namespace as the server
    // knows them from its chunks (0: none seen yet).
    { kind: 'u32', key: 'bytesPerToken', optional: true },
    // Every tier in config order (`TierRate`): what this lookup decided about it (`none`: no
    // decision was needed), its read bandwidth (bytes/s; 0: not measured) and per-request
    // latency (µs) as the server measures them, and the tokens it held that were declined.
    {
      kind: 'list',
      key: 'tierRates',
      max: 255,
      record: 'TierRate',
      optional: true,
      of: [
        { kind: 'str', key: 'tier', label: 'tier name', max: 0xffff },
        enumOf('decision', ['none', 'load', 'decline'], 'KVT_PROTOCOL'),
        { kind: 'u64', key: 'readBytesPerSec', label: 'tier read bandwidth' },
        { kind: 'u32', key: 'latencyUs', label: 'tier latency' },
        { kind: 'u32', key: 'declinedTokens', label: 'declined tokens' },
      ],
    },
  ]),
  // `found`: whether the server held state for the lookup id.
  reply('CANCEL_RESULT', 0x82, '4.2', [bool('found')]),
  reply('CLEAR_RESULT', 0x83, '4.3', [u32('epoch')]),
  reply('PONG', 0x84, '4.4', [{ ...JSON_REPLY, key: 'info' }]),
  reply('PUT_RESULT', 0x85, '4.6', [
    enumOf('outcome', ['stored', 'exists', 'dropped'], 'KVT_PROTOCOL'),
  ]),
  reply('GET_RESULT', 0x86, '4.7', [
    bool('found'),
    u32('tokens'),
    { kind: 'blob', key: 'payload' },
  ]),
  reply('STATS_RESULT', 0x87, '4.5', [{ ...JSON_REPLY, key: 'stats' }]),
  reply('REGISTER_RESULT', 0x88, '4.9', [
    { kind: 'str', key: 'engineId', max: DP.maxIdBytes },
    ns('namespace'), // derived from the registration
    u32('chunkSize'), // tokens per stored chunk
    u32('blockSize'), // tokens per engine block
    // The in-block order the copies assume (`NHD` or `HND`). A worker whose registration named
    // `HND` and gets no `HND` back talks to a sidecar that would store its blocks unreordered.
    { kind: 'str', key: 'blockLayout', max: 8, optional: true },
  ]),
  // Chunk counts that add up to the chunks sent.
  reply('SAVE_RESULT', 0x89, '4.9', [u32('saved'), u32('skipped'), u32('dropped')]),
  reply('LOAD_RESULT', 0x8a, '4.9', [
    u32('loadedTokens'),
    // Blocks not written with valid KV (vLLM's load-failure recovery).
    { kind: 'u32s', key: 'invalidBlockIds', label: 'invalid block ids' },
  ]),
  // Chunks now held for the request; 0 when the lookup was unknown, running or expired.
  reply('HOLD_RESULT', 0x8b, '4.9', [u32('heldChunks')]),
  // True when the request's pins and state were released (terminal end, known engine).
  reply('REQUEST_FINISHED_RESULT', 0x8c, '4.9', [bool('released')]),
  // False when the server has no registration for the engine (restarted, or swept as silent).
  reply('HEARTBEAT_RESULT', 0x8d, '4.9', [bool('known')]),
  // True when the engine was registered (and is now released); false for an unknown engine.
  reply('UNREGISTER_RESULT', 0x8e, '4.9', [bool('released')]),
  // Leading chunks held, as a tier's `batchedContains` counts them.
  reply('PEER_CONTAINS_RESULT', 0x90, PEER_SECTION, [u32('count')]),
  // The namespace asked for, and each chunk held (`PeerChunk`), in any order; a chunk not held is
  // left out. `crc32c` is the CRC-32C of `payload` computed from the bytes sent.
  reply('PEER_GET_RESULT', 0x91, PEER_SECTION, [
    ns('namespace'),
    {
      kind: 'list',
      key: 'chunks',
      max: WIRE.maxChunksPerPeerGet,
      record: 'PeerChunk',
      of: [
        hash('hash'),
        { kind: 'u32', key: 'tokens', label: 'token count' },
        u32('crc32c'),
        { kind: 'blob', key: 'payload' },
      ],
    },
  ]),
  reply('PEER_PUT_RESULT', 0x92, PEER_SECTION, [
    enumOf('outcome', ['stored', 'exists', 'dropped'], 'KVT_PROTOCOL'),
  ]),
  reply('ERROR', 0xff, '4.8', [
    { kind: 'str', key: 'code', label: 'error code', max: 64, known: 'errorCodes' },
    {
      kind: 'str',
      key: 'message',
      label: 'error message',
      max: 0xffff,
      truncateTo: WIRE.maxErrorMessageBytes,
    },
  ]),
] as const satisfies readonly MessageSpec[];
