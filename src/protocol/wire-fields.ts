/**
 * How each field kind of the protocol table (`wire-table.ts`) is checked, sized, written and
 * read. `fieldOps` turns one table field into these four steps once, at load; `wire-codec.ts`
 * runs them in wire order. Encoding checks throw `KVT_INVALID_ARGUMENT` / `KVT_TOO_LARGE`
 * (`KVT_INTERNAL`, from the writer, for a reply integer that does not fit); decoding throws
 * `KVT_PROTOCOL` / `KVT_TOO_LARGE` / `KVT_INVALID_ARGUMENT` naming the field and, for framing,
 * the byte offset.
 */
import { KVTIER_ERROR_CODES, KvtierError } from '../errors.ts';
import { chunkHashFromBytes } from '../hashing/chunk-hash.ts';
import { internNamespaceId } from '../namespace/namespace-intern.ts';
import { type Reader, strSize, type Writer } from './frame.ts';
import { HASH_BYTES, NAMESPACE_BYTES, type ProtocolLimits } from './messages.ts';
import type { Field } from './wire-spec.ts';
import {
  checkU32,
  EMPTY,
  hashCount,
  invalid,
  LateJson,
  type Msg,
  parseJson,
  readMax,
  readU32s,
  tooLarge,
  truncateUtf8,
  wireMax,
  writeU32s,
} from './wire-values.ts';

/** The steps of one field: `prep` checks a value and returns what `size` and `write` take. */
export interface FieldOps {
  readonly key: string;
  prep(v: unknown, m: Msg): unknown;
  size(p: unknown): number;
  write(w: Writer, p: unknown): void;
  /** Reads the field; `out` holds the fields read before it. */
  read(r: Reader, limits: ProtocolLimits, out: Msg): unknown;
  /** Bytes of a fixed-size field (trailing optional fields); 0 for variable ones. */
  readonly fixed: number;
}

const NS_RE = /^[0-9a-f]{32}$/;
const ENCODE = new TextEncoder();
const UTF8_LENIENT = new TextDecoder('utf-8');
const ERROR_CODES: ReadonlySet<string> = new Set(KVTIER_ERROR_CODES);

/** The four steps of field `f` of a message labelled `what` ('lookup', 'save result', ...). */
export function fieldOps(f: Field, what: string, reply: boolean): FieldOps {
  const key = f.key;
  const label = f.label ?? key;
  const base = { key, fixed: 0 };
  switch (f.kind) {
    case 'bool':
      return {
        ...base,
        fixed: 1,
        prep: (v) => (v ? 1 : 0),
        size: () => 1,
        write: (w, p) => w.u8(p as number),
        read: (r) => {
          return r.u8(label) === 1;
        },
      };
    case 'u32':
      return {
        ...base,
        fixed: 4,
        // An absent optional field before a present one is written as 0.
        prep: (v) => (reply ? v : checkU32(key, f.optional ? (v ?? 0) : v)),
        size: () => 4,
        write: (w, p) => w.u32(p as number),
        read: (r, limits) => {
          const v = r.u32(label);
          if (f.range !== undefined) {
            const hi = readMax(f.range[1], limits);
            if (v < f.range[0] || v > hi)
              throw invalid(`${label} is ${v}, allowed ${f.range[0]}..${hi}`);
          }
          return v;
        },
      };
    case 'i32':
      return {
        ...base,
        fixed: 4,
        prep: (v) => {
          if (typeof v === 'number' && Number.isInteger(v) && v >= f.min && v <= 0x7fffffff)
            return v;
          throw invalid(`${key} must be an integer in [${f.min}, 2^31), got ${String(v)}`);
        },
        size: () => 4,
        write: (w, p) => {
          w.buf.writeInt32LE(p as number, w.off);
          w.off += 4;
        },
        read: (r) => {
          r.need(4, label);
          const v = r.buf.readInt32LE(r.off);
          r.off += 4;
          if (v < f.min) throw invalid(`${label} must be at least ${f.min}, got ${v}`);
          return v;
        },
      };
    case 'u64':
      return {
        ...base,
        fixed: 8,
        prep: (v) => {
          const x = v ?? 0n; // absent before a present optional field: 0
          if (typeof x === 'bigint' && x >= 0n && x <= 0xffffffffffffffffn) return x;
          throw invalid(`${key} must be a bigint in [0, 2^64), got ${String(v)}`);
        },
        size: () => 8,
        write: (w, p) => w.u64(p as bigint),
        read: (r) => {
          return r.u64(label);
        },
      };
    case 'enum':
      return {
        ...base,
        fixed: 1,
        prep: (v) => {
          const i = f.names.indexOf(v as string);
          if (i < 0) throw invalid(`${key} must be one of ${f.names.join(', ')}, got ${String(v)}`);
          return i;
        },
        size: () => 1,
        write: (w, p) => w.u8(p as number),
        read: (r) => {
          const code = r.u8(label);
          const name = f.names[code];
          if (name === undefined) {
            const allowed = f.names.map((n, i) => `${i} (${n})`).join(', ');
            throw new KvtierError(f.unknown, `unknown ${label} ${code}; allowed ${allowed}`);
          }
          return name;
        },
      };
    case 'str':
      return {
        ...base,
        prep: (v) => {
          if (typeof v !== 'string' || (f.nonEmpty && v.length === 0))
            throw invalid(`${label} must be a${f.nonEmpty ? ' non-empty' : ''} string`);
          if (f.truncateTo !== undefined) return truncateUtf8(v, f.truncateTo);
          if (v.length > f.max / 3 && Buffer.byteLength(v, 'utf8') > f.max)
            throw tooLarge(`${label} is longer than ${f.max} bytes`);
          return v;
        },
        size: (p) => strSize(p as string),
        write: (w, p) => w.str(p as string),
        read: (r) => {
          const s = r.str(label, f.max);
          if (f.nonEmpty && s.length === 0) throw invalid(`${label} must not be empty`);
          return f.known === 'errorCodes' && !ERROR_CODES.has(s) ? 'KVT_INTERNAL' : s;
        },
      };
    case 'ns':
    case 'hash': {
      const n = f.kind === 'ns' ? NAMESPACE_BYTES : HASH_BYTES;
      return {
        ...base,
        fixed: n,
        prep: (v) => {
          if (f.kind === 'ns' && !(typeof v === 'string' && NS_RE.test(v)))
            throw invalid(`namespace id must be 32 lowercase hex digits, got ${JSON.stringify(v)}`);
          return v;
        },
        size: () => n,
        write: (w, p) => w.hex(p as string, n),
        read: (r) => {
          return f.kind === 'ns'
            ? internNamespaceId(r.hex(n, 'namespace id'))
            : chunkHashFromBytes(r.bytes(n, 'chunk hash'));
        },
      };
    }
    case 'nsList':
      return {
        ...base,
        prep: (v) => {
          const list = v as string[];
          if (list.length > 255)
            throw tooLarge(`${what} names ${list.length} namespaces, at most 255 fit`);
          if (list.length < f.min || list.length > f.max)
            throw invalid(`${what} needs ${f.min}..${f.max} namespaces, got ${list.length}`);
          for (const ns of list)
            if (!NS_RE.test(ns))
              throw invalid(
                `namespace id must be 32 lowercase hex digits, got ${JSON.stringify(ns)}`,
              );
          return list;
        },
        size: (p) => 1 + NAMESPACE_BYTES * (p as string[]).length,
        write: (w, p) => {
          const list = p as string[];
          w.u8(list.length);
          for (const ns of list) w.hex(ns, NAMESPACE_BYTES);
        },
        read: (r) => {
          const n = r.u8('namespace count');
          if (n < f.min || n > f.max)
            throw invalid(`${what} needs ${f.min}..${f.max} namespaces, got ${n}`);
          const list: string[] = [];
          for (let i = 0; i < n; i++)
            list.push(internNamespaceId(r.hex(NAMESPACE_BYTES, 'namespace id')));
          return list;
        },
      };
    case 'hashes':
      return {
        ...base,
        prep: (v) => {
          const b = v as Uint8Array;
          if (!(b instanceof Uint8Array) || b.length % HASH_BYTES !== 0)
            throw invalid(
              `${what}.${key} must be a multiple of ${HASH_BYTES} bytes, got ${b?.length}`,
            );
          const n = b.length / HASH_BYTES;
          if (n > wireMax(f.max))
            throw tooLarge(`${what} has ${n} chunks, the wire allows ${wireMax(f.max)}`);
          return b;
        },
        size: (p) => 4 + (p as Uint8Array).length,
        write: (w, p) => {
          const b = p as Uint8Array;
          w.u32(b.length / HASH_BYTES);
          w.bytes(b);
        },
        read: (r, limits) => {
          const n = r.u32('chunk count');
          const max = readMax(f.max, limits);
          if (n > max) throw tooLarge(`${what} has ${n} chunks, the limit is ${max}`);
          return r.bytes(n * HASH_BYTES, label === key ? 'chunk hashes' : label);
        },
      };
    case 'u32s': {
      const own = f.countOf === undefined;
      return {
        ...base,
        prep: (v, m) => {
          const a = v as Uint32Array;
          if (!(a instanceof Uint32Array)) throw invalid(`${what}.${key} must be a Uint32Array`);
          if (!own) {
            const n = hashCount(m[f.countOf!]);
            if (a.length !== n)
              throw invalid(`${what} has ${a.length} ${label}s for ${n} chunks (need ${n})`);
          } else if (f.max !== undefined && a.length > wireMax(f.max))
            throw tooLarge(`${what} has ${a.length} ${label}, the limit is ${wireMax(f.max)}`);
          return a;
        },
        size: (p) => (own ? 4 : 0) + 4 * (p as Uint32Array).length,
        write: (w, p) => {
          const a = p as Uint32Array;
          if (own) w.u32(a.length);
          writeU32s(w, a);
        },
        read: (r, limits, out) => {
          let n: number;
          if (own) {
            n = r.u32(`${label} count`);
            const max = f.max === undefined ? undefined : readMax(f.max, limits);
            if (max !== undefined && n > max)
              throw tooLarge(`${what} has ${n} ${label}, the limit is ${max}`);
          } else n = hashCount(out[f.countOf!]);
          const range = f.range && ([f.range[0], readMax(f.range[1], limits)] as [number, number]);
          return readU32s(r, n, label, range);
        },
      };
    }
    case 'json':
      return {
        ...base,
        prep: (v) => {
          if (typeof v !== 'object' || v === null) throw invalid(`${label} must be an object`);
          if (f.omitEmpty && Object.keys(v).length === 0) return EMPTY;
          const json = ENCODE.encode(JSON.stringify(v));
          if (f.max !== undefined && json.length > f.max)
            throw tooLarge(`${label} JSON is ${json.length} bytes, the limit is ${f.max}`);
          return json;
        },
        size: (p) => 4 + (p as Uint8Array).length,
        write: (w, p) => {
          w.u32((p as Uint8Array).length);
          w.bytes(p as Uint8Array);
        },
        read: (r) => {
          const n = r.u32(`${label} length`);
          if (f.max !== undefined && n > f.max)
            throw tooLarge(`${label} is ${n} bytes, the limit is ${f.max}`);
          if (n === 0 && f.omitEmpty) {
            return {};
          }
          const text = f.lenient ? UTF8_LENIENT.decode(r.bytes(n, label)) : r.utf8(n, label);
          return f.late ? new LateJson(f, label, text) : parseJson(f, label, text);
        },
      };
    case 'blob':
      return {
        ...base,
        prep: (v) => v as Uint8Array,
        size: (p) => 4 + (p as Uint8Array).length,
        write: (w, p) => {
          w.u32((p as Uint8Array).length);
          w.bytes(p as Uint8Array);
        },
        read: (r, limits) => {
          const n = r.u32(`${label} length`);
          const max = f.max === undefined ? undefined : readMax(f.max, limits);
          if (max !== undefined && n > max)
            throw tooLarge(`${label} is ${n} bytes, the limit is ${max}`);
          if (f.nonEmpty && n === 0) throw invalid(`${label} must not be empty`);
          return r.bytes(n, label);
        },
      };
    case 'bytes':
      return {
        ...base,
        fixed: f.size,
        prep: (v) => {
          // An absent optional field before a present one is written as zeros, read as absent.
          if (v === undefined && f.optional) return new Uint8Array(f.size);
          if (!(v instanceof Uint8Array) || v.length !== f.size)
            throw invalid(`${key} must be ${f.size} bytes`);
          return v;
        },
        size: () => f.size,
        write: (w, p) => w.bytes(p as Uint8Array),
        read: (r) => {
          const b = r.bytes(f.size, label);
          return f.optional && b.every((x) => x === 0) ? undefined : Buffer.from(b);
        },
      };
    case 'list': {
      // Prepared as one flat array: record i's field s at i * k + s.
      const sub = f.of.map((g) => fieldOps(g, what, reply));
      const k = sub.length;
      return {
        ...base,
        prep: (v) => {
          const items = v as Msg[];
          const n = Math.min(items.length, f.max);
          const flat = new Array<unknown>(n * k);
          for (let i = 0, j = 0; i < n; i++) {
            const item = items[i]!;
            for (let s = 0; s < k; s++, j++) flat[j] = sub[s]!.prep(item[sub[s]!.key], item);
          }
          return flat;
        },
        size: (p) => {
          const flat = p as unknown[];
          let n = 1;
          for (let j = 0; j < flat.length; j++) n += sub[j % k]!.size(flat[j]);
          return n;
        },
        write: (w, p) => {
          const flat = p as unknown[];
          w.u8(flat.length / k);
          for (let j = 0; j < flat.length; j++) sub[j % k]!.write(w, flat[j]);
        },
        read: (r, limits) => {
          const n = r.u8(`${label} count`);
          const items: Msg[] = [];
          for (let i = 0; i < n; i++) {
            const item: Msg = {};
            for (const s of sub) item[s.key] = s.read(r, limits, item);
            items.push(item);
          }
          return items;
        },
      };
    }
  }
}
