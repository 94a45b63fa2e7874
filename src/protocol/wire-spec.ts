/**
 * The vocabulary of the protocol message table (`wire-table.ts`): field kinds, cross-field rules,
 * message entries, and the helpers that build them. The helpers keep every name, key and kind
 * as a literal type, so that `message-types.ts` derives each message's TypeScript type from
 * its entry; `wire-fields.ts` and `wire-codec.ts` read the same entries at run time.
 */
import type { ProtocolLimits } from './limits.ts';

/** A maximum: a fixed number, or the wire maximum plus the server limit a decoder applies. */
export type Max = number | { readonly wire: number; readonly limit: keyof ProtocolLimits };

/**
 * One field. `key` is the property of the TypeScript message (Python uses its snake_case form);
 * `label` (default: `key`) names it in error messages. Kinds:
 * - `u32`, `i32` (signed), `u64` (a bigint): little-endian integers; `range` is checked
 *   by the decoder (`KVT_INVALID_ARGUMENT`), `min` is an `i32`'s least value.
 * - `bool`: a u8, 1 is true (any other byte reads false). `enum`: a u8 indexing `names`.
 * - `str`: u16le length + strict UTF-8, at most `max` bytes (`KVT_TOO_LARGE`); `nonEmpty`
 *   refuses "" (`KVT_INVALID_ARGUMENT`); `truncateTo` cuts an encoded value at a character
 *   boundary; `known: 'errorCodes'` reads a code the decoder does not know as `KVT_INTERNAL`.
 * - `ns`: a namespace id, 16 bytes (32 hex digits in a message). `nsList`: u8 count + ids.
 * - `hash`: one 32-byte chunk hash. `hashes`: u32 count + packed 32-byte hashes.
 * - `u32s`: u32 count + u32 array; with `countOf`, no count of its own: as many as `countOf`.
 * - `json`: u32le length + UTF-8 JSON object. `blob`: u32le length + bytes.
 * - `bytes`: exactly `size` bytes. `list`: u8 count + records of `of` (the encoder sends the
 *   first `max`).
 * `optional` fields are trailing: each is present only when every one before it is; an encoder
 * writes up to the last one that is set (earlier ones as 0). Every optional field has a fixed
 * size but the last, which may be a `list`: a decoder tells which are present from the bytes
 * left after the required fields.
 */
export type Field =
  | { kind: 'bool' | 'u64'; key: string; label?: string; optional?: true }
  | {
      kind: 'u32';
      key: string;
      label?: string;
      range?: readonly [number, Max];
      optional?: true;
    }
  | { kind: 'i32'; key: string; label?: string; min: number }
  | {
      kind: 'enum';
      key: string;
      label?: string;
      names: readonly string[];
      /** What an unknown byte is: a malformed reply, or an invalid request value. */
      unknown: 'KVT_PROTOCOL' | 'KVT_INVALID_ARGUMENT';
    }
  | {
      kind: 'str';
      key: string;
      label?: string;
      max: number;
      nonEmpty?: true;
      truncateTo?: number;
      known?: 'errorCodes';
    }
  | { kind: 'ns' | 'hash'; key: string; label?: string }
  | { kind: 'nsList'; key: string; label?: string; min: number; max: number }
  | { kind: 'hashes'; key: string; label?: string; max: Max }
  | {
      kind: 'u32s';
      key: string;
      label?: string;
      max?: Max;
      countOf?: string;
      range?: readonly [number, Max];
    }
  | {
      kind: 'json';
      key: string;
      label?: string;
      max?: number;
      /** Keys kept, each a boolean when present; absent: the whole object is kept. */
      booleans?: readonly string[];
      /** Keys kept too (with `booleans`), each a positive finite number when present. */
      numbers?: readonly string[];
      /** `require`: anything but an object is `KVT_INVALID_ARGUMENT`; `coerce`: it reads `{}`. */
      object: 'require' | 'coerce';
      /** An empty object is sent as 0 bytes. */
      omitEmpty?: true;
      /** Parsed after the end of the body is checked (a reply, or a REGISTER). */
      late?: true;
      /** Invalid UTF-8 is replaced instead of refused. */
      lenient?: true;
    }
  | { kind: 'blob'; key: string; label?: string; max?: Max; nonEmpty?: true }
  | { kind: 'bytes'; key: string; label?: string; size: number; optional?: true }
  | {
      kind: 'list';
      key: string;
      label?: string;
      max: number;
      of: readonly Field[];
      /** Name of one record's type (the Python reply record). */
      record: string;
      optional?: true;
    };

/** A check across fields, run by the decoder after the body and by the encoder before it. */
export type Rule =
  /** `field` is at most the number of hashes in `of`. */
  | { rule: 'atMostCount'; field: string; of: string }
  /** `field` is 0 when `of` holds no hash. */
  | { rule: 'zeroWithoutCount'; field: string; of: string };

/** Whether a message is a request (type codes 0x00..0x7F) or a reply (0x80..0xFF). */
export type Direction = 'request' | 'reply';

/** `S` with every `_` replaced by `-`. */
type Dashed<S extends string> = S extends `${infer H}_${infer T}` ? `${H}-${Dashed<T>}` : S;

/** The `type` tag of message `N`: its name in lower case, `_` as `-` (`REQUEST_FINISHED` → `request-finished`). */
export type TagOf<N extends string> = Lowercase<Dashed<N>>;

/**
 * One message of protocol v1. The type parameters are the entry's literal name, direction,
 * section and fields (built by {@link request} and {@link reply}); left out, any entry.
 */
export interface MessageSpec<
  N extends string = string,
  D extends Direction = Direction,
  S extends string = string,
  F extends readonly Field[] = readonly Field[],
> {
  /** Wire name, as docs/protocol.md spells it. */
  readonly name: N;
  /** The `type` of the TypeScript message object: the name in lower case, `_` as `-` ({@link TagOf}). */
  readonly tag: string;
  readonly code: number;
  /** A request (codes below 0x80) or a reply. */
  readonly dir: D;
  /** Section of docs/protocol.md. */
  readonly section: S;
  readonly fields: F;
  readonly rules?: readonly Rule[];
}

/** The entry builder of one direction: checks the code's range, derives the tag. */
const entriesOf =
  <D extends Direction>(dir: D) =>
  <const N extends string, const S extends string, const F extends readonly Field[]>(
    name: N,
    code: number,
    section: S,
    fields: F,
    rules?: readonly Rule[],
  ): MessageSpec<N, D, S, F> => {
    const [lo, hi] = dir === 'request' ? [0x00, 0x7f] : [0x80, 0xff];
    if (!Number.isInteger(code) || code < lo || code > hi)
      throw new Error(
        `${dir} ${name}: type code ${code} is outside 0x${lo.toString(16)}..0x${hi.toString(16)}`,
      );
    const tag = name.toLowerCase().replace(/_/g, '-');
    return { name, tag, code, dir, section, fields, ...(rules === undefined ? {} : { rules }) };
  };

/**
 * A request entry: wire name, type code (below 0x80), docs/protocol.md section, fields in wire
 * order, cross-field rules. Its reply is the entry whose code is this one's with the high bit set.
 * @throws Error for a code outside 0x00..0x7F.
 */
export const request = entriesOf('request');

/** A reply entry, as {@link request}. @throws Error for a code outside 0x80..0xFF. */
export const reply = entriesOf('reply');

/** A `u32` field. */
export const u32 = <const K extends string>(key: K) =>
  ({ kind: 'u32', key }) as const satisfies Field;
/** A `bool` field. */
export const bool = <const K extends string>(key: K) =>
  ({ kind: 'bool', key }) as const satisfies Field;
/** A namespace id field. */
export const ns = <const K extends string>(key: K) =>
  ({ kind: 'ns', key }) as const satisfies Field;
/** A chunk hash field. */
export const hash = <const K extends string>(key: K) =>
  ({ kind: 'hash', key }) as const satisfies Field;
/** A non-empty id string of at most `max` bytes, named `label` in errors (default: `key`). */
export const id = <const K extends string>(
  key: K,
  max: number,
  label?: string,
): {
  readonly kind: 'str';
  readonly key: K;
  readonly max: number;
  readonly nonEmpty: true;
  readonly label?: string;
} =>
  ({
    kind: 'str',
    key,
    max,
    nonEmpty: true,
    ...(label === undefined ? {} : { label }),
  }) as const satisfies Field;
/** An enum field: a u8 indexing `names`; an unknown byte is the error `unknown`. */
export const enumOf = <const K extends string, const N extends readonly string[]>(
  key: K,
  names: N,
  unknown: 'KVT_PROTOCOL' | 'KVT_INVALID_ARGUMENT',
) => ({ kind: 'enum', key, names, unknown }) as const satisfies Field;
