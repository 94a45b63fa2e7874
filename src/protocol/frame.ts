/**
 * The protocol v1 frame (docs/protocol.md): an 8-byte header (magic "kv", version, type,
 * request id u32le) and a body read and written through {@link Reader} and {@link Writer}.
 * Integers are little-endian; strings are u16le length + UTF-8. A leaf module: the
 * table-driven codec (`wire-fields.ts`, `wire-codec.ts`) builds on it.
 */
import { KvtierError } from '../errors.ts';
import { HEADER_BYTES, MAGIC, PROTOCOL_VERSION } from './messages.ts';

const UTF8 = new TextDecoder('utf-8', { fatal: true });

/** Header fields readable from any message of at least 8 bytes. */
export interface Header {
  version: number;
  type: number;
  requestId: number;
}

/** Reads the header; throws KVT_PROTOCOL on a short frame, bad magic or unknown version. */
export function decodeHeader(buf: Uint8Array): Header {
  if (buf.length < HEADER_BYTES) {
    throw new KvtierError(
      'KVT_PROTOCOL',
      `message is ${buf.length} bytes, shorter than the ${HEADER_BYTES}-byte header`,
    );
  }
  const b = asBuffer(buf);
  if (b.readUInt16LE(0) !== MAGIC) {
    throw new KvtierError(
      'KVT_PROTOCOL',
      `bad magic 0x${b.readUInt16LE(0).toString(16)}: not a kvtier message`,
    );
  }
  const version = b[2]!;
  const header = { version, type: b[3]!, requestId: b.readUInt32LE(4) };
  if (version !== PROTOCOL_VERSION) {
    throw new KvtierError(
      'KVT_PROTOCOL',
      `unsupported protocol version ${version} (this server speaks ${PROTOCOL_VERSION})`,
    );
  }
  return header;
}

/** Request id of a frame when its first 8 bytes are readable, else 0 (for error replies). */
export function peekRequestId(buf: Uint8Array): number {
  return buf.length >= HEADER_BYTES ? asBuffer(buf).readUInt32LE(4) : 0;
}

/** Wire size in bytes of a string field: u16le length + its UTF-8 bytes. */
export const strSize = (s: string): number => 2 + Buffer.byteLength(s, 'utf8');

/** The bytes of `b` as a Buffer, without copying. */
export function asBuffer(b: Uint8Array): Buffer {
  return Buffer.isBuffer(b) ? b : Buffer.from(b.buffer, b.byteOffset, b.byteLength);
}

// ---------------------------------------------------------------------------------------------
// Writer: sizes are computed first so each message is one allocation and no copies.

/**
 * Builds one message in a single allocation of `size` bytes (header included) and writes the
 * header. Throws `KVT_INTERNAL` for an integer that does not fit its field and
 * `KVT_INVALID_ARGUMENT` for a hex field of the wrong length.
 */
export class Writer {
  readonly buf: Buffer;
  off = 0;
  constructor(size: number, type: number, requestId: number) {
    this.buf = Buffer.allocUnsafe(size);
    this.buf.writeUInt16LE(MAGIC, 0);
    this.buf[2] = PROTOCOL_VERSION;
    this.buf[3] = type;
    this.buf.writeUInt32LE(requestId >>> 0, 4);
    this.off = HEADER_BYTES;
  }
  u8(v: number): void {
    this.buf[this.off++] = v;
  }
  u32(v: number): void {
    if (!(v >= 0 && v <= 0xffffffff && Number.isInteger(v))) {
      throw new KvtierError(
        'KVT_INTERNAL',
        `value ${v} does not fit the u32 field at offset ${this.off}`,
      );
    }
    this.buf.writeUInt32LE(v, this.off);
    this.off += 4;
  }
  u64(v: bigint): void {
    if (!(typeof v === 'bigint' && v >= 0n && v <= 0xffffffffffffffffn)) {
      throw new KvtierError(
        'KVT_INTERNAL',
        `value ${String(v)} does not fit the u64 field at offset ${this.off}`,
      );
    }
    this.buf.writeBigUInt64LE(v, this.off);
    this.off += 8;
  }
  str(s: string): void {
    const n = this.buf.write(s, this.off + 2, 'utf8');
    this.buf.writeUInt16LE(n, this.off);
    this.off += 2 + n;
  }
  bytes(b: Uint8Array): void {
    this.buf.set(b, this.off);
    this.off += b.length;
  }
  hex(h: string, bytes: number): void {
    const n = this.buf.write(h, this.off, bytes, 'hex');
    if (n !== bytes)
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `expected ${bytes * 2} hex digits, got ${JSON.stringify(h)}`,
      );
    this.off += bytes;
  }
  done(): Buffer {
    return this.off === this.buf.length ? this.buf : this.buf.subarray(0, this.off);
  }
}

// ---------------------------------------------------------------------------------------------
// Reader: every read is bounds-checked and names the offset of a problem.

/**
 * Bounds-checked reader of one message body, starting after the header. Throws `KVT_PROTOCOL`
 * for a truncated field, invalid UTF-8 or trailing bytes, and `KVT_TOO_LARGE` for a string over
 * its limit; messages name the byte offset.
 */
export class Reader {
  readonly buf: Buffer;
  off = HEADER_BYTES;
  constructor(buf: Uint8Array) {
    this.buf = asBuffer(buf);
  }
  need(n: number, what: string): void {
    if (this.off + n > this.buf.length) {
      throw new KvtierError(
        'KVT_PROTOCOL',
        `truncated message: ${what} needs ${n} bytes at offset ${this.off}, ${this.buf.length - this.off} left`,
      );
    }
  }
  u8(what: string): number {
    this.need(1, what);
    return this.buf[this.off++]!;
  }
  u32(what: string): number {
    this.need(4, what);
    const v = this.buf.readUInt32LE(this.off);
    this.off += 4;
    return v;
  }
  u64(what: string): bigint {
    this.need(8, what);
    const v = this.buf.readBigUInt64LE(this.off);
    this.off += 8;
    return v;
  }
  str(what: string, max: number): string {
    this.need(2, what);
    const n = this.buf.readUInt16LE(this.off);
    if (n > max)
      throw new KvtierError('KVT_TOO_LARGE', `${what} is ${n} bytes, the limit is ${max}`);
    this.off += 2;
    return this.utf8(n, what);
  }
  /** `n` bytes of UTF-8 text, decoded strictly: invalid UTF-8 is `KVT_PROTOCOL`. */
  utf8(n: number, what: string): string {
    this.need(n, what);
    let s: string;
    try {
      s = UTF8.decode(this.buf.subarray(this.off, this.off + n));
    } catch {
      // Replacing bad bytes would make distinct ids collide and hide a broken client.
      throw new KvtierError('KVT_PROTOCOL', `${what} at offset ${this.off} is not valid UTF-8`);
    }
    this.off += n;
    return s;
  }
  bytes(n: number, what: string): Buffer {
    this.need(n, what);
    const b = this.buf.subarray(this.off, this.off + n);
    this.off += n;
    return b;
  }
  hex(n: number, what: string): string {
    this.need(n, what);
    const s = this.buf.toString('hex', this.off, this.off + n);
    this.off += n;
    return s;
  }
  end(what: string): void {
    if (this.off !== this.buf.length) {
      throw new KvtierError(
        'KVT_PROTOCOL',
        `${this.buf.length - this.off} unexpected trailing bytes after ${what}`,
      );
    }
  }
}
