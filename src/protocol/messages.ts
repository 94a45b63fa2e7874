/**
 * Protocol v1 message types. Each is derived from the message's entry in the message table
 * (wire-table.ts, which also gives its wire layout and documents its fields; docs/protocol.md
 * shows it); the codec in codec.ts is its only implementation here.
 */
import type { MessageOf, MessagesOf } from './message-types.ts';

export { DEFAULT_LIMITS, type ProtocolLimits, WIRE_LIMITS } from './limits.ts';

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

/** LOOKUP (0x01): how much of these chunks' KV the server holds, in every namespace named. */
export type LookupRequest = MessageOf<'LOOKUP'>;
/**
 * Per-lookup options carried as a small JSON object (all optional): `pin`, `prefetch`,
 * `computeTokensPerSec` (docs/protocol.md 4.1).
 */
export type LookupConfig = LookupRequest['config'];
/** CANCEL (0x02): stop a lookup and release its pins. */
export type CancelRequest = MessageOf<'CANCEL'>;
/** CLEAR (0x03): drop every chunk of these namespaces (none named: every namespace). */
export type ClearRequest = MessageOf<'CLEAR'>;
/** PING (0x04). */
export type PingRequest = MessageOf<'PING'>;
/** STATS (0x07). */
export type StatsRequest = MessageOf<'STATS'>;
/** PUT (0x05): store one chunk. */
export type PutRequest = MessageOf<'PUT'>;
/** GET (0x06): read one chunk. */
export type GetRequest = MessageOf<'GET'>;

/** Every request of the message table, data-plane ones included, tagged by `type`. */
export type Request = MessagesOf<'request'>;

/** LOOKUP_RESULT (0x81). */
export type LookupResult = MessageOf<'LOOKUP_RESULT'>;
/** Lookup result status (a byte on the wire: 0 ok, 1 canceled, 2 stale). */
export type LookupStatusName = LookupResult['status'];
/** One tier's share of a lookup's ready tokens. */
export type TierTokens = LookupResult['tiers'][number];
/** One tier's rates and the lookup's decision about it (sent with `computeTokensPerSec`). */
export type TierRate = NonNullable<LookupResult['tierRates']>[number];
/** CANCEL_RESULT (0x82). */
export type CancelResult = MessageOf<'CANCEL_RESULT'>;
/** CLEAR_RESULT (0x83). */
export type ClearResult = MessageOf<'CLEAR_RESULT'>;
/** PONG (0x84): the server's version, limits and tiers. */
export type Pong = MessageOf<'PONG'>;
/** STATS_RESULT (0x87). */
export type StatsResult = MessageOf<'STATS_RESULT'>;
/** PUT_RESULT (0x85). */
export type PutResult = MessageOf<'PUT_RESULT'>;
/** GET_RESULT (0x86). */
export type GetResult = MessageOf<'GET_RESULT'>;
/** ERROR (0xFF): a request failed; `code` is one of `KvtierErrorCode`. */
export type ErrorReply = MessageOf<'ERROR'>;

/** Every reply of the message table, ERROR and data-plane ones included, tagged by `type`. */
export type Reply = MessagesOf<'reply'>;
