/**
 * The subset of MessagePack (https://msgpack.org, the 2013 spec with bin and str8) the event
 * stream speaks: nil, booleans, integers up to 2^53, float64, UTF-8 strings, binary, arrays and
 * maps with string keys. Small on purpose: the stream's messages are arrays of these, and a
 * subscriber in any language decodes them with its own msgpack library.
 */
import { KvtierError } from '../errors.ts';

/** A value {@link encodeMsgpack} can write and {@link decodeMsgpack} returns. */
export type MsgpackValue =
  | null
  | boolean
  | number
  | string
  | Uint8Array
  | readonly MsgpackValue[]
  | { readonly [key: string]: MsgpackValue };

/** A growable output buffer. */
class Writer {
  buf: Buffer;
  len = 0;

  constructor(size: number) {
    this.buf = Buffer.allocUnsafe(size);
  }

  room(n: number): void {
    if (this.len + n <= this.buf.length) return;
    const next = Buffer.allocUnsafe(Math.max(this.buf.length * 2, this.len + n));
    this.buf.copy(next, 0, 0, this.len);
    this.buf = next;
  }

  byte(b: number): void {
    this.room(1);
    this.buf[this.len++] = b;
  }
}

function writeHead(w: Writer, n: number, fix: number, fixMax: number, c8: number): void {
  // c8 is the 8-bit form's type byte (str8, bin8) or 0 when there is none (arrays, maps); the
  // 16- and 32-bit forms follow it.
  if (n <= fixMax && fix !== 0) w.byte(fix | n);
  else if (n < 0x100 && c8 !== 0) {
    w.byte(c8);
    w.byte(n);
  } else if (n < 0x10000) {
    w.room(3);
    w.buf[w.len] = c8 === 0 ? (fix === 0x90 ? 0xdc : 0xde) : c8 + 1;
    w.buf.writeUInt16BE(n, w.len + 1);
    w.len += 3;
  } else {
    w.room(5);
    w.buf[w.len] = c8 === 0 ? (fix === 0x90 ? 0xdd : 0xdf) : c8 + 2;
    w.buf.writeUInt32BE(n, w.len + 1);
    w.len += 5;
  }
}

function writeInt(w: Writer, v: number): void {
  if (v >= 0) {
    if (v < 0x80) {
      w.byte(v);
      return;
    }
    if (v < 0x100) {
      w.byte(0xcc);
      w.byte(v);
      return;
    }
    w.room(9);
    if (v < 0x10000) {
      w.buf[w.len] = 0xcd;
      w.buf.writeUInt16BE(v, w.len + 1);
      w.len += 3;
    } else if (v < 0x100000000) {
      w.buf[w.len] = 0xce;
      w.buf.writeUInt32BE(v, w.len + 1);
      w.len += 5;
    } else {
      w.buf[w.len] = 0xcf;
      w.buf.writeBigUInt64BE(BigInt(v), w.len + 1);
      w.len += 9;
    }
    return;
  }
  if (v >= -32) {
    w.byte(v & 0xff);
    return;
  }
  w.room(9);
  if (v >= -0x80) {
    w.buf[w.len] = 0xd0;
    w.buf.writeInt8(v, w.len + 1);
    w.len += 2;
  } else if (v >= -0x8000) {
    w.buf[w.len] = 0xd1;
    w.buf.writeInt16BE(v, w.len + 1);
    w.len += 3;
  } else if (v >= -0x80000000) {
    w.buf[w.len] = 0xd2;
    w.buf.writeInt32BE(v, w.len + 1);
    w.len += 5;
  } else {
    w.buf[w.len] = 0xd3;
    w.buf.writeBigInt64BE(BigInt(v), w.len + 1);
    w.len += 9;
  }
}

function write(w: Writer, v: MsgpackValue): void {
  if (v === null || typeof v === 'boolean') {
    w.byte(v === null ? 0xc0 : v ? 0xc3 : 0xc2);
    return;
  }
  if (typeof v === 'number') {
    if (Number.isSafeInteger(v)) {
      writeInt(w, v);
      return;
    }
    w.room(9);
    w.buf[w.len] = 0xcb;
    w.buf.writeDoubleBE(v, w.len + 1);
    w.len += 9;
    return;
  }
  if (typeof v === 'string') {
    const n = Buffer.byteLength(v, 'utf8');
    writeHead(w, n, 0xa0, 31, 0xd9);
    w.room(n);
    w.len += w.buf.write(v, w.len, 'utf8');
    return;
  }
  if (v instanceof Uint8Array) {
    writeHead(w, v.byteLength, 0, -1, 0xc4);
    w.room(v.byteLength);
    w.buf.set(v, w.len);
    w.len += v.byteLength;
    return;
  }
  if (Array.isArray(v)) {
    writeHead(w, v.length, 0x90, 15, 0);
    for (const x of v as readonly MsgpackValue[]) write(w, x);
    return;
  }
  if (typeof v === 'object') {
    const entries = Object.entries(v as Record<string, MsgpackValue>);
    writeHead(w, entries.length, 0x80, 15, 0);
    for (const [k, x] of entries) {
      write(w, k);
      write(w, x);
    }
    return;
  }
  throw new KvtierError('KVT_INVALID_ARGUMENT', `msgpack cannot encode a ${typeof v}`);
}

/**
 * Encodes `value`. Integers are written in the smallest form; other numbers as float64.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for a value outside {@link MsgpackValue}.
 */
export function encodeMsgpack(value: MsgpackValue, sizeHint = 256): Buffer {
  const w = new Writer(sizeHint);
  write(w, value);
  return w.buf.subarray(0, w.len);
}

class Reader {
  pos = 0;
  readonly buf: Buffer;

  constructor(buf: Uint8Array) {
    this.buf = Buffer.from(buf.buffer, buf.byteOffset, buf.byteLength);
  }

  need(n: number): number {
    if (this.pos + n > this.buf.length)
      throw new KvtierError('KVT_PROTOCOL', `msgpack: truncated at byte ${this.pos}`);
    const at = this.pos;
    this.pos += n;
    return at;
  }
}

function readBig(r: Reader, at: number, signed: boolean): number {
  const v = signed ? r.buf.readBigInt64BE(at) : r.buf.readBigUInt64BE(at);
  if (v > BigInt(Number.MAX_SAFE_INTEGER) || v < BigInt(Number.MIN_SAFE_INTEGER))
    throw new KvtierError('KVT_PROTOCOL', 'msgpack: integer beyond 2^53');
  return Number(v);
}

function read(r: Reader, depth: number): MsgpackValue {
  if (depth > 64) throw new KvtierError('KVT_PROTOCOL', 'msgpack: nested deeper than 64');
  const b = r.buf[r.need(1)]!;
  if (b < 0x80) return b;
  if (b >= 0xe0) return b - 0x100;
  if (b >= 0xa0 && b <= 0xbf) return str(r, b & 0x1f);
  if (b >= 0x90 && b <= 0x9f) return arr(r, b & 0x0f, depth);
  if (b >= 0x80 && b <= 0x8f) return map(r, b & 0x0f, depth);
  const buf = r.buf;
  switch (b) {
    case 0xc0:
      return null;
    case 0xc2:
      return false;
    case 0xc3:
      return true;
    case 0xc4:
      return bin(r, buf[r.need(1)]!);
    case 0xc5:
      return bin(r, buf.readUInt16BE(r.need(2)));
    case 0xc6:
      return bin(r, buf.readUInt32BE(r.need(4)));
    case 0xca:
      return buf.readFloatBE(r.need(4));
    case 0xcb:
      return buf.readDoubleBE(r.need(8));
    case 0xcc:
      return buf[r.need(1)]!;
    case 0xcd:
      return buf.readUInt16BE(r.need(2));
    case 0xce:
      return buf.readUInt32BE(r.need(4));
    case 0xcf:
      return readBig(r, r.need(8), false);
    case 0xd0:
      return buf.readInt8(r.need(1));
    case 0xd1:
      return buf.readInt16BE(r.need(2));
    case 0xd2:
      return buf.readInt32BE(r.need(4));
    case 0xd3:
      return readBig(r, r.need(8), true);
    case 0xd9:
      return str(r, buf[r.need(1)]!);
    case 0xda:
      return str(r, buf.readUInt16BE(r.need(2)));
    case 0xdb:
      return str(r, buf.readUInt32BE(r.need(4)));
    case 0xdc:
      return arr(r, buf.readUInt16BE(r.need(2)), depth);
    case 0xdd:
      return arr(r, buf.readUInt32BE(r.need(4)), depth);
    case 0xde:
      return map(r, buf.readUInt16BE(r.need(2)), depth);
    case 0xdf:
      return map(r, buf.readUInt32BE(r.need(4)), depth);
    default:
      throw new KvtierError('KVT_PROTOCOL', `msgpack: type byte 0x${b.toString(16)} not supported`);
  }
}

function str(r: Reader, n: number): string {
  const at = r.need(n);
  return r.buf.toString('utf8', at, at + n);
}

function bin(r: Reader, n: number): Uint8Array {
  const at = r.need(n);
  return r.buf.subarray(at, at + n);
}

function arr(r: Reader, n: number, depth: number): MsgpackValue[] {
  if (n > r.buf.length - r.pos) throw new KvtierError('KVT_PROTOCOL', 'msgpack: truncated array');
  const out: MsgpackValue[] = [];
  for (let i = 0; i < n; i++) out.push(read(r, depth + 1));
  return out;
}

function map(r: Reader, n: number, depth: number): Record<string, MsgpackValue> {
  if (n > r.buf.length - r.pos) throw new KvtierError('KVT_PROTOCOL', 'msgpack: truncated map');
  const out: Record<string, MsgpackValue> = {};
  for (let i = 0; i < n; i++) {
    const k = read(r, depth + 1);
    if (typeof k !== 'string')
      throw new KvtierError('KVT_PROTOCOL', 'msgpack: map key not a string');
    out[k] = read(r, depth + 1);
  }
  return out;
}

/**
 * Decodes one value that fills `bytes` exactly. Binary values are views into `bytes`.
 * @throws KvtierError `KVT_PROTOCOL` on truncated or trailing bytes, an unsupported type byte
 *   (ext types), an integer beyond 2^53, or nesting deeper than 64.
 */
export function decodeMsgpack(bytes: Uint8Array): MsgpackValue {
  const r = new Reader(bytes);
  const v = read(r, 0);
  if (r.pos !== r.buf.length)
    throw new KvtierError('KVT_PROTOCOL', `msgpack: ${r.buf.length - r.pos} trailing bytes`);
  return v;
}
