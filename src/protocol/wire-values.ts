/**
 * Value helpers of the table-driven codec (`wire-fields.ts`): error constructors, limits, u32
 * arrays, UTF-8 truncation and the JSON fields' parsing.
 */
import { KvtierError } from '../errors.ts';
import type { Reader, Writer } from './frame.ts';
import { HASH_BYTES, type ProtocolLimits } from './messages.ts';
import type { Field, Max } from './wire-spec.ts';

/** A message object as the codec sees it. */
export type Msg = Record<string, unknown>;

const LE = new Uint8Array(Uint32Array.of(1).buffer)[0] === 1;

/** A `KVT_INVALID_ARGUMENT` error. */
export const invalid = (text: string): KvtierError => new KvtierError('KVT_INVALID_ARGUMENT', text);
export const tooLarge = (text: string): KvtierError => new KvtierError('KVT_TOO_LARGE', text);

/** The wire maximum of `max` (what an encoder allows). */
export const wireMax = (max: Max): number => (typeof max === 'number' ? max : max.wire);
/** The maximum a decoder applies under `limits`. */
export const readMax = (max: Max, limits: ProtocolLimits): number =>
  typeof max === 'number' ? max : limits[max.limit];

/** The hashes in a packed field's value, for count rules. */
export const hashCount = (v: unknown): number => (v as Uint8Array).length / HASH_BYTES;

export function checkU32(name: string, v: unknown): number {
  if (typeof v === 'number' && Number.isInteger(v) && v >= 0 && v <= 0xffffffff) return v;
  throw invalid(`${name} must be an integer in [0, 4294967295], got ${String(v)}`);
}

export function truncateUtf8(s: string, maxBytes: number): string {
  if (Buffer.byteLength(s, 'utf8') <= maxBytes) return s;
  return Buffer.from(s, 'utf8')
    .subarray(0, maxBytes)
    .toString('utf8')
    .replace(/\uFFFD$/, '');
}

export function readU32s(
  r: Reader,
  n: number,
  label: string,
  range?: [number, number],
): Uint32Array {
  r.need(n * 4, label);
  const out = new Uint32Array(n);
  const buf = r.buf;
  let off = r.off;
  if (LE && n >= 64) {
    // One copy of the little-endian words, then the range check over the typed array (for
    // short lists the views cost more than reading word by word).
    new Uint8Array(out.buffer, out.byteOffset, n * 4).set(buf.subarray(off, off + n * 4));
    r.off = off + n * 4;
    if (range !== undefined) {
      const [lo, hi] = range;
      for (let i = 0; i < n; i++) {
        const v = out[i]!;
        if (v < lo || v > hi)
          throw invalid(`${label} of element ${i} is ${v}, allowed ${lo}..${hi}`);
      }
    }
    return out;
  }
  for (let i = 0; i < n; i++, off += 4) {
    const v = buf.readUInt32LE(off);
    if (range !== undefined && (v < range[0] || v > range[1]))
      throw invalid(`${label} of element ${i} is ${v}, allowed ${range[0]}..${range[1]}`);
    out[i] = v;
  }
  r.off = off;
  return out;
}

export function writeU32s(w: Writer, ids: Uint32Array): void {
  if (LE) {
    w.bytes(new Uint8Array(ids.buffer, ids.byteOffset, ids.byteLength));
    return;
  }
  for (let i = 0; i < ids.length; i++) w.u32(ids[i]!);
}

export function parseJson(f: Extract<Field, { kind: 'json' }>, label: string, text: string): Msg {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    throw new KvtierError('KVT_PROTOCOL', `${label} is not valid JSON`);
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) {
    if (f.object === 'coerce') return {};
    throw invalid(`${label} must be a JSON object`);
  }
  const o = v as Msg;
  if (f.booleans === undefined) return o;
  const out: Msg = {};
  for (const k of f.booleans) {
    if (o[k] === undefined) continue;
    if (typeof o[k] !== 'boolean') throw invalid(`${label} "${k}" must be a boolean`);
    out[k] = o[k];
  }
  for (const k of f.numbers ?? []) {
    const x = o[k];
    if (x === undefined) continue;
    if (typeof x !== 'number' || !Number.isFinite(x) || x <= 0)
      throw invalid(`${label} "${k}" must be a positive finite number, got ${JSON.stringify(x)}`);
    out[k] = x;
  }
  return out;
}

/** The bytes of a JSON field sent as nothing. */
export const EMPTY = new Uint8Array(0);

/** JSON text read before the end of the body was checked; parsed after it (`late`). */
export class LateJson {
  constructor(
    readonly field: Extract<Field, { kind: 'json' }>,
    readonly label: string,
    readonly text: string,
  ) {}
  parse(): Msg {
    return parseJson(this.field, this.label, this.text);
  }
}
