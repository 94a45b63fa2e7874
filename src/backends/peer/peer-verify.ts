/**
 * What a peer tier accepts of a PEER_GET_RESULT (docs/protocol.md 4.10): only records of the
 * namespace it asked for, of hashes it asked for (each once), with a token count, a payload within
 * bounds and a payload whose CRC-32C is the one the peer computed from the bytes it sent. Anything
 * else is refused, with the reason, and is a miss: never bytes in a KV cache.
 */
import type { MessageOf } from '../../protocol/message-types.ts';
import type { Chunk, ChunkHash, NamespaceId } from '../core/types.ts';
import { CHECKSUM_CRC32C, payloadChecksumAsync } from '../format/checksum.ts';

/** Why a peer's answer, or one chunk of it, was not used. */
export type PeerRefusal =
  /** The reply named another namespace than the one asked for. */
  | 'namespace'
  /** A record of a hash not asked for. */
  | 'hash'
  /** A second record of one hash. */
  | 'duplicate'
  /** A token count of 0. */
  | 'tokens'
  /** An empty payload, or one over `maxChunkBytes`. */
  | 'size'
  /** The payload's CRC-32C is not the one the peer sent with it. */
  | 'checksum'
  /** The reply did not decode (truncated, trailing bytes), or is of another type. */
  | 'malformed'
  /** No reply within the deadline. */
  | 'timeout'
  /** An ERROR reply. */
  | 'error';

/** The reasons a whole chunk can be refused for, as {@link verifyPeerChunks} reports them. */
export type ChunkRefusal = Extract<
  PeerRefusal,
  'namespace' | 'hash' | 'duplicate' | 'tokens' | 'size' | 'checksum'
>;

/** What {@link verifyPeerChunks} makes of a reply. */
export interface VerifiedChunks {
  /** Accepted chunks, by hash; their bytes are views into the reply frame. */
  readonly chunks: Map<ChunkHash, Chunk>;
  /** One entry per refused record. */
  readonly refused: ChunkRefusal[];
}

type PeerGetResult = MessageOf<'PEER_GET_RESULT'>;

/**
 * Checks a PEER_GET_RESULT against its request: namespace `ns` and the hashes `asked`.
 * Checksums of large payloads run on the libuv pool.
 */
export async function verifyPeerChunks(
  ns: NamespaceId,
  asked: ReadonlySet<ChunkHash>,
  reply: PeerGetResult,
  maxChunkBytes: number,
): Promise<VerifiedChunks> {
  const refused: ChunkRefusal[] = [];
  const chunks = new Map<ChunkHash, Chunk>();
  if (reply.namespace !== ns) {
    for (let i = 0; i < reply.chunks.length; i++) refused.push('namespace');
    return { chunks, refused };
  }
  const seen = new Set<ChunkHash>();
  const candidates: PeerGetResult['chunks'] = [];
  for (const r of reply.chunks) {
    if (!asked.has(r.hash)) refused.push('hash');
    else if (seen.has(r.hash)) refused.push('duplicate');
    else if (r.tokens < 1) refused.push('tokens');
    else if (r.payload.byteLength === 0 || r.payload.byteLength > maxChunkBytes)
      refused.push('size');
    else {
      seen.add(r.hash);
      candidates.push(r);
    }
  }
  const sums = await Promise.all(
    candidates.map((r) => payloadChecksumAsync(CHECKSUM_CRC32C, r.payload)),
  );
  candidates.forEach((r, i) => {
    if (Number(sums[i]) !== r.crc32c) refused.push('checksum');
    else chunks.set(r.hash, { tokens: r.tokens, data: r.payload });
  });
  return { chunks, refused };
}
