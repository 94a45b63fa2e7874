/**
 * A `SET key <value> [PX ttl] NX` sent as one prebuilt RESP frame. ioredis writes a command with
 * a Buffer argument by concatenating every part into a freshly allocated buffer: a second copy of
 * a multi-MiB object, into new memory, on every put. Here the frame is allocated (from a pool)
 * with room for the value in its place, the tier encodes the chunk object straight into that room
 * (`KvStore.valueBuffer`), and the frame is what the command writes (ioredis's own script
 * commands extend `Command` and override `toWritable` the same way): each payload is copied once,
 * by the encoder that also checksums it.
 */
import { Command } from 'ioredis';
import type { BufferPool } from '../arena/buffer-pool.ts';

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

/** A framed `SET` with room for its value, and its frame (from the pool the caller gave). */
export interface FramedSet {
  /** The command to pass to `sendCommand` once `value` is filled; its `promise` settles with the reply. */
  readonly command: Command;
  /** The whole frame; the caller releases it to the pool once Redis has replied. */
  readonly frame: Buffer;
  /** The value's place inside `frame`: fill it before sending. */
  readonly value: Buffer;
}

/**
 * A frame from `pool` holding `SET key <valueBytes bytes> [PX ttlMs] NX`, the value's bytes left
 * to the caller. Send `command` once `value` is filled, and release `frame` to the pool only once
 * Redis has replied (it has then read every byte); after a failure the socket may still hold the
 * frame, so it is left to the garbage collector.
 */
export function framedSet(
  pool: BufferPool,
  key: string,
  valueBytes: number,
  ttlMs: number | null,
): FramedSet {
  const tail = ttlMs === null ? ['NX'] : ['PX', String(ttlMs), 'NX'];
  const head = `*${3 + tail.length}\r\n$3\r\nset\r\n$${Buffer.byteLength(key)}\r\n${key}\r\n$${valueBytes}\r\n`;
  const after = `\r\n${tail.map((a) => `$${Buffer.byteLength(a)}\r\n${a}\r\n`).join('')}`;
  const headBytes = Buffer.byteLength(head);
  const frame = pool.acquire(headBytes + valueBytes + Buffer.byteLength(after));
  frame.write(head, 0);
  frame.write(after, headBytes + valueBytes);
  const value = frame.subarray(headBytes, headBytes + valueBytes);
  return { command: new FramedCommand([key, value, ...tail], frame), frame, value };
}
