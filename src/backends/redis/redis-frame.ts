/**
 * A `SET key <chunk object> [PX ttl] NX` sent as one prebuilt RESP frame. ioredis writes a
 * command with a Buffer argument by concatenating every part into a freshly allocated buffer: a
 * second copy of a multi-MiB object, into new memory, on every put. Here the chunk object is
 * encoded straight into its place inside a reusable frame, and the frame is what the command
 * writes (ioredis's own script commands extend `Command` and override `toWritable` the same
 * way), so each payload is copied once, by the encoder that also checksums it.
 */
import { Command } from 'ioredis';
import type { BufferPool } from '../arena/buffer-pool.ts';
import type { Chunk, ChunkHash, NamespaceId } from '../core/types.ts';
import { chunkObjectBytes, encodeChunkObjectIntoAsync } from '../format/chunk-format.ts';

/** A `SET` whose wire bytes are given whole. Replies as `set` does: 'OK', or null under NX. */
class FramedCommand extends Command {
  readonly #frame: Buffer;

  constructor(args: (string | Buffer)[], frame: Buffer) {
    super('set', args, { replyEncoding: 'utf8' });
    this.#frame = frame;
  }

  override toWritable(_socket: object): Buffer {
    return this.#frame;
  }
}

/** A framed `SET` ready to send, and its frame (from the pool the caller gave). */
export interface FramedSet {
  /** The command to pass to `sendCommand`; its `promise` settles with the reply. */
  readonly command: Command;
  /** The whole frame; the caller releases it to the pool (see {@link encodeFramedSet}). */
  readonly frame: Buffer;
  /** Bytes of the chunk object (header + payload), the value stored. */
  readonly objectBytes: number;
}

/**
 * Encodes `chunk` as the object of (ns, hash) into a frame from `pool` holding
 * `SET key <object> [PX ttlMs] NX`. The caller sends `command` and releases `frame` to the pool
 * only once Redis has replied (it has then read every byte); after a failure the socket may still
 * hold the frame, so it is left to the garbage collector. On a throw the frame is already back.
 * @throws what encoding throws (KVT_INVALID_ARGUMENT for a malformed chunk or namespace).
 */
export async function encodeFramedSet(
  pool: BufferPool,
  key: string,
  ns: NamespaceId,
  hash: ChunkHash,
  chunk: Chunk,
  ttlMs: number | null,
): Promise<FramedSet> {
  const objectBytes = chunkObjectBytes(chunk.data.byteLength);
  const tail = ttlMs === null ? ['NX'] : ['PX', String(ttlMs), 'NX'];
  const head = `*${3 + tail.length}\r\n$3\r\nset\r\n$${Buffer.byteLength(key)}\r\n${key}\r\n$${objectBytes}\r\n`;
  const after = `\r\n${tail.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join('')}`;
  const headBytes = Buffer.byteLength(head);
  const frame = pool.acquire(headBytes + objectBytes + Buffer.byteLength(after));
  try {
    frame.write(head, 0);
    frame.write(after, headBytes + objectBytes);
    await encodeChunkObjectIntoAsync(frame, ns, hash, chunk, undefined, headBytes);
  } catch (err) {
    pool.release(frame);
    throw err;
  }
  const object = frame.subarray(headBytes, headBytes + objectBytes);
  return { command: new FramedCommand([key, object, ...tail], frame), frame, objectBytes };
}
