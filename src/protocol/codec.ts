/**
 * Encoder and decoder for protocol v1 (docs/protocol.md). Every message is one ZMQ frame
 * (`frame.ts`: header, reader, writer) whose body is laid out by its entry in the message table
 * (`wire-table.ts`), which `wire-codec.ts` interprets. Decoders throw
 * `KvtierError('KVT_PROTOCOL' | 'KVT_TOO_LARGE')` with the byte offset of the problem.
 */

import { DEFAULT_LIMITS, type ProtocolLimits, type Reply, type Request } from './messages.ts';
import { decodeReplyMessage, decodeRequestMessage, encodeMessage } from './wire-codec.ts';

export { hashesToHex } from '../hashing/chunk-hasher.ts';
export { decodeHeader, type Header, peekRequestId } from './frame.ts';

type Tagged = Record<string, unknown> & { type: string; requestId: number };

/** Encodes a request. Throws KVT_INVALID_ARGUMENT / KVT_TOO_LARGE for values the wire cannot carry. */
export function encodeRequest(req: Request): Buffer {
  return encodeMessage(req as unknown as Tagged);
}

/** Encodes a reply. Throws KVT_INTERNAL for an integer that does not fit its field. */
export function encodeReply(rep: Reply): Buffer {
  return encodeMessage(rep as unknown as Tagged);
}

/**
 * Decodes and validates a request against `limits`. Throws KVT_PROTOCOL for malformed frames,
 * KVT_TOO_LARGE for frames over a limit, KVT_INVALID_ARGUMENT for well-formed but invalid values.
 */
export function decodeRequest(buf: Uint8Array, limits: ProtocolLimits = DEFAULT_LIMITS): Request {
  return decodeRequestMessage(buf, limits) as unknown as Request;
}

/** Decodes a reply (client side). Throws KVT_PROTOCOL (malformed) or KVT_TOO_LARGE (over a wire limit). */
export function decodeReply(buf: Uint8Array): Reply {
  return decodeReplyMessage(buf, DEFAULT_LIMITS) as unknown as Reply;
}
