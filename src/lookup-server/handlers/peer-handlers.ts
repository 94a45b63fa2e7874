/**
 * The messages of the peer tier, from another sidecar (docs/protocol.md 4.10, docs/fleet.md
 * "Peers"): PEER_CONTAINS and PEER_GET answer from this sidecar's own tiers and never ask its own
 * peer tier; PEER_PUT stores a chunk whose home this sidecar is and never sends it on.
 */
import { CHECKSUM_CRC32C, payloadChecksumAsync } from '../../backends/format/checksum.ts';
import { KvtierError } from '../../errors.ts';
import { hashesToHex } from '../../protocol/codec.ts';
import type { MessageOf } from '../../protocol/message-types.ts';
import { type Handlers, withRelease } from './handler-types.ts';

/** One chunk of a PEER_GET_RESULT. */
type PeerChunk = MessageOf<'PEER_GET_RESULT'>['chunks'][number];

/** Payload bytes one PEER_GET_RESULT carries at most; chunks past it are left out (misses). */
export const PEER_GET_MAX_REPLY_BYTES = 1024 ** 3;

/** The CRC-32C of `data` as the u32 on the wire (on the libuv pool when large). */
async function crc32cOf(data: Uint8Array): Promise<number> {
  return Number(await payloadChecksumAsync(CHECKSUM_CRC32C, data));
}

export const PEER_HANDLERS: Handlers<'peer-contains' | 'peer-get' | 'peer-put'> = {
  async 'peer-contains'(ctx, req) {
    const count = await ctx.storage.peerContains(req.namespace, hashesToHex(req.hashes));
    return { type: 'peer-contains-result', requestId: req.requestId, count };
  },
  async 'peer-get'(ctx, req) {
    const hashes = hashesToHex(req.hashes);
    const lease = await ctx.storage.peerRead(req.namespace, hashes);
    try {
      const picked: { hash: (typeof hashes)[number]; tokens: number; data: Uint8Array }[] = [];
      let bytes = 0;
      for (const hash of new Set(hashes)) {
        const c = lease.chunks.get(hash);
        if (c === undefined || bytes + c.data.byteLength > PEER_GET_MAX_REPLY_BYTES) continue;
        bytes += c.data.byteLength;
        picked.push({ hash, tokens: c.tokens, data: c.data });
      }
      // The bytes stay pinned until the server has copied them into the reply frame.
      const crcs = await Promise.all(picked.map((c) => crc32cOf(c.data)));
      const chunks: PeerChunk[] = picked.map((c, i) => ({
        hash: c.hash,
        tokens: c.tokens,
        crc32c: crcs[i]!,
        payload: Buffer.from(c.data.buffer, c.data.byteOffset, c.data.byteLength),
      }));
      return withRelease(
        {
          type: 'peer-get-result',
          requestId: req.requestId,
          namespace: req.namespace,
          chunks,
        },
        lease.release,
      );
    } catch (err) {
      lease.release();
      throw err;
    }
  },
  async 'peer-put'(ctx, req) {
    if ((await crc32cOf(req.payload)) !== req.crc32c)
      throw new KvtierError(
        'KVT_CORRUPT',
        `payload of ${req.payload.byteLength} bytes does not match its CRC-32C ${req.crc32c}`,
      );
    const outcome = await ctx.storage.putFromPeer(req.namespace, req.hash, {
      tokens: req.tokens,
      data: req.payload,
    });
    return { type: 'peer-put-result', requestId: req.requestId, outcome };
  },
};
