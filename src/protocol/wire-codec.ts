/**
 * The protocol v1 codec, driven by the message table (`wire-table.ts`): each entry is compiled
 * once, at load, into its fields' steps (`wire-fields.ts`), and a message is encoded in one
 * allocation (sizes first) and decoded front to back, each field checked as it is read.
 * Trailing optional fields and the table's cross-field rules are handled here. `createCodec`
 * compiles any table built with `wire-spec.ts`; protocol v1's codec is compiled from `MESSAGES`.
 */
import { KvtierError } from '../errors.ts';
import { decodeHeader, Reader, Writer } from './frame.ts';
import { HEADER_BYTES, type ProtocolLimits } from './messages.ts';
import { type FieldOps, fieldOps } from './wire-fields.ts';
import type { MessageSpec, Rule } from './wire-spec.ts';
import { MESSAGES } from './wire-table.ts';
import { hashCount, invalid, LateJson, type Msg } from './wire-values.ts';

/** One table entry, compiled. */
interface Compiled {
  readonly spec: MessageSpec;
  /** How the message is named in errors: 'lookup', 'save result', ... */
  readonly what: string;
  readonly ops: readonly FieldOps[];
  /** Index of the first trailing optional field (`ops.length` when none). */
  readonly firstOptional: number;
  /** Byte counts allowed after the required fields: 0, then each prefix of fixed optionals. */
  readonly trailers: readonly number[];
  /** The last optional field has no fixed size (a list): present when more bytes follow. */
  readonly variableLast: boolean;
  readonly late: boolean;
  /** The encoder and field reader unrolled for this message (messages without optional fields). */
  readonly unrolled?: Unrolled;
}

interface Unrolled {
  encode(m: Msg & { requestId: number }): Buffer;
  read(r: Reader, limits: ProtocolLimits, out: Msg): void;
}

/**
 * Straight-line code for one message: each field's steps called at a call site of its own, so
 * the engine inlines them as it would a hand-written codec (the loop in `encodeMessage` calls
 * every field's steps from one site). The source is built from the table alone: field indexes,
 * keys (JSON-quoted) and fixed sizes.
 */
function unroll(spec: MessageSpec, ops: readonly FieldOps[], what: string): Unrolled {
  const idx = ops.map((_, i) => i);
  const key = (i: number) => JSON.stringify(ops[i]!.key);
  const size = idx.map((i) => (ops[i]!.fixed > 0 ? `${ops[i]!.fixed}` : `o${i}.size(p${i})`));
  const source = [
    ...idx.map((i) => `const o${i} = ops[${i}];`),
    'return {',
    '  encode(m) {',
    ...idx.map((i) => `    const p${i} = o${i}.prep(m[${key(i)}], m);`),
    spec.rules === undefined ? '' : '    checkRules(rules, m, what);',
    `    const w = new Writer(${[HEADER_BYTES, ...size].join(' + ')}, code, m.requestId);`,
    ...idx.map((i) => `    o${i}.write(w, p${i});`),
    '    return w.done();',
    '  },',
    '  read(r, limits, out) {',
    ...idx.map((i) => `    out[${key(i)}] = o${i}.read(r, limits, out);`),
    '  },',
    '};',
  ].join('\n');
  const make = new Function('ops', 'Writer', 'checkRules', 'rules', 'what', 'code', source);
  return make(ops, Writer, checkRules, spec.rules, what, spec.code) as Unrolled;
}

function compile(spec: MessageSpec): Compiled {
  const what = spec.name.toLowerCase().replace(/_/g, ' ');
  const ops = spec.fields.map((f) => fieldOps(f, what, spec.dir === 'reply'));
  let firstOptional = spec.fields.findIndex((f) => 'optional' in f && f.optional === true);
  if (firstOptional < 0) firstOptional = ops.length;
  const variableLast = firstOptional < ops.length && ops.at(-1)!.fixed === 0;
  const trailers = [0];
  for (let i = firstOptional; i < ops.length - (variableLast ? 1 : 0); i++) {
    if (ops[i]!.fixed === 0)
      throw new Error(
        `${spec.name}: optional field ${ops[i]!.key} has no fixed size and is not last`,
      );
    trailers.push(trailers.at(-1)! + ops[i]!.fixed);
  }
  const late = spec.fields.some((f) => f.kind === 'json' && f.late === true);
  const unrolled = firstOptional === ops.length ? unroll(spec, ops, what) : undefined;
  return {
    spec,
    what,
    ops,
    firstOptional,
    trailers,
    variableLast,
    late,
    ...(unrolled ? { unrolled } : {}),
  };
}

function checkRules(rules: readonly Rule[] | undefined, m: Msg, what: string): void {
  if (rules === undefined) return;
  for (const rule of rules) {
    const v = m[rule.field] as number | undefined;
    const n = hashCount(m[rule.of]);
    if (rule.rule === 'atMostCount' && v !== undefined && v > n)
      throw invalid(`${rule.field} is ${v}, more than the ${n} chunks`);
    if (rule.rule === 'zeroWithoutCount' && v !== undefined && v > 0 && n === 0)
      throw invalid(`${rule.field} is ${v} but the ${what} has no chunks`);
  }
}

/** An encoder and decoders for the messages of one table. */
export interface MessageCodec {
  /**
   * Encodes message `m` (a request or reply object) by its table entry.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` / `KVT_TOO_LARGE` for a value the wire cannot
   *   carry (`KVT_INTERNAL` for a reply integer out of range); `KVT_INTERNAL` for an unknown type.
   */
  encode(m: Msg & { type: string; requestId: number }): Buffer;
  /**
   * Decodes a request frame (server side) against `limits`.
   * @throws KvtierError `KVT_PROTOCOL` (malformed, unknown type), `KVT_TOO_LARGE` (over a
   *   limit), `KVT_INVALID_ARGUMENT` (well-formed but invalid value).
   */
  decodeRequest(buf: Uint8Array, limits: ProtocolLimits): Msg;
  /** Decodes a reply frame (client side), as `decodeRequest`; replies carry no server limits. */
  decodeReply(buf: Uint8Array, limits: ProtocolLimits): Msg;
}

/**
 * Compiles `table` (protocol v1's is `MESSAGES`) into its codec.
 * @throws Error when two entries share a tag, or a direction's type code.
 */
export function createCodec(table: readonly MessageSpec[]): MessageCodec {
  const byTag = new Map<string, Compiled>();
  const requests = new Map<number, Compiled>();
  const replies = new Map<number, Compiled>();
  for (const spec of table) {
    const byCode = spec.dir === 'request' ? requests : replies;
    const clash = byTag.get(spec.tag)?.spec ?? byCode.get(spec.code)?.spec;
    if (clash !== undefined)
      throw new Error(
        `message ${spec.name} (0x${spec.code.toString(16)}) clashes with ${clash.name} (0x${clash.code.toString(16)})`,
      );
    const c = compile(spec);
    byTag.set(spec.tag, c);
    byCode.set(spec.code, c);
  }
  return {
    encode: (m) => encodeWith(byTag, m),
    decodeRequest: (buf, limits) => decodeMessage(buf, requests, 'request', limits),
    decodeReply: (buf, limits) => decodeMessage(buf, replies, 'reply', limits),
  };
}

function encodeWith(
  byTag: ReadonlyMap<string, Compiled>,
  m: Msg & { type: string; requestId: number },
): Buffer {
  const c = byTag.get(m.type);
  if (c === undefined) throw new KvtierError('KVT_INTERNAL', `no message type ${String(m.type)}`);
  if (c.unrolled !== undefined) return c.unrolled.encode(m);
  const ops = c.ops;
  // Trailing optional fields: written up to the last one set.
  let count = c.firstOptional;
  for (let i = ops.length - 1; i >= c.firstOptional; i--)
    if (m[ops[i]!.key] !== undefined) {
      count = i + 1;
      break;
    }
  const prepared = new Array<unknown>(count);
  let size = HEADER_BYTES;
  for (let i = 0; i < count; i++) {
    const op = ops[i]!;
    const p = op.prep(m[op.key], m);
    prepared[i] = p;
    size += op.size(p);
  }
  checkRules(c.spec.rules, m, c.what);
  const w = new Writer(size, c.spec.code, m.requestId);
  for (let i = 0; i < count; i++) ops[i]!.write(w, prepared[i]);
  return w.done();
}

/** Decodes a frame as one of `table`'s messages (see `MessageCodec.decodeRequest`). */
function decodeMessage(
  buf: Uint8Array,
  table: ReadonlyMap<number, Compiled>,
  dir: string,
  limits: ProtocolLimits,
): Msg {
  const { type, requestId } = decodeHeader(buf);
  const c = table.get(type);
  if (c === undefined)
    throw new KvtierError('KVT_PROTOCOL', `unknown ${dir} type 0x${type.toString(16)}`);
  const r = new Reader(buf);
  const out: Msg = { type: c.spec.tag, requestId };
  const ops = c.ops;
  let count = ops.length;
  if (c.unrolled !== undefined) c.unrolled.read(r, limits, out);
  else for (let i = 0; i < c.firstOptional; i++) out[ops[i]!.key] = ops[i]!.read(r, limits, out);
  if (c.firstOptional < ops.length) {
    const rest = r.buf.length - r.off;
    const fixedAll = c.trailers.at(-1)!;
    // Past every fixed optional field: the variable last one follows (the end check holds it).
    const k = c.variableLast && rest > fixedAll ? c.trailers.length : c.trailers.indexOf(rest);
    if (k < 0) {
      const names = ops
        .slice(c.firstOptional)
        .map((o) => `${o.key} (${o.fixed > 0 ? `${o.fixed} bytes` : 'variable'})`);
      throw new KvtierError(
        'KVT_PROTOCOL',
        `${c.what} has ${rest} bytes after its fixed fields at offset ${r.off}; only ${names.join(', then ')} may follow`,
      );
    }
    count = c.firstOptional + k;
  }
  for (let i = c.firstOptional; i < count; i++) out[ops[i]!.key] = ops[i]!.read(r, limits, out);
  r.end(c.what);
  if (c.late)
    for (const op of ops) {
      const v = out[op.key];
      if (v instanceof LateJson) out[op.key] = v.parse();
    }
  checkRules(c.spec.rules, out, c.what);
  return out;
}

const V1 = createCodec(MESSAGES);

/** Encodes a protocol v1 message by its table entry (see `MessageCodec.encode`). */
export const encodeMessage = V1.encode;
/** Decodes a protocol v1 request frame (server side) against `limits`. */
export const decodeRequestMessage = V1.decodeRequest;
/** Decodes a protocol v1 reply frame (client side); replies carry no server limits. */
export const decodeReplyMessage = V1.decodeReply;
