/**
 * The TypeScript type of every protocol message, derived from its entry in the message table
 * (`wire-table.ts`): a message is `{ type, requestId, ...fields }`, its `type` the entry's name in
 * lower case with `_` as `-`, each field typed by its kind. `messages.ts` and
 * `data-plane-messages.ts` name the derived types; a new table entry gets its type, and joins
 * `Request` or `Reply`, with no other edit.
 */
import type { KvtierErrorCode } from '../errors.ts';
import type { ChunkHash } from '../hashing/chunk-hash.ts';
import type { Direction, Field, MessageSpec, TagOf } from './wire-spec.ts';
import type { DATA_PLANE_SECTION, MESSAGES } from './wire-table.ts';

/** Protocol v1's table, as a type. */
export type ProtocolTable = typeof MESSAGES;

/** `T` with its intersections flattened into one object type (optional marks kept). */
type Flat<T> = { [K in keyof T]: T[K] } & {};

/**
 * The value of field `F`: u32/i32 a number, u64 a bigint, bool a boolean, enum the union of its
 * names, str a string (`known: 'errorCodes'`: a `KvtierErrorCode`), ns a string (32 hex digits),
 * hash a `ChunkHash`, nsList a string array, hashes a Buffer (packed, 32 bytes each), u32s a
 * Uint32Array, json an object (with `booleans`: an object of those optional booleans, and of the
 * optional numbers `numbers` names), blob a
 * Buffer, bytes a Uint8Array, list an array of records of its `of` fields.
 */
export type FieldValue<F extends Field> = F extends { kind: 'u32' | 'i32' }
  ? number
  : F extends { kind: 'u64' }
    ? bigint
    : F extends { kind: 'bool' }
      ? boolean
      : F extends { kind: 'enum'; names: readonly (infer E)[] }
        ? E
        : F extends { kind: 'str'; known: 'errorCodes' }
          ? KvtierErrorCode
          : F extends { kind: 'str' | 'ns' }
            ? string
            : F extends { kind: 'hash' }
              ? ChunkHash
              : F extends { kind: 'nsList' }
                ? string[]
                : F extends { kind: 'hashes' | 'blob' }
                  ? Buffer
                  : F extends { kind: 'u32s' }
                    ? Uint32Array
                    : F extends {
                          kind: 'json';
                          booleans: readonly (infer B extends string)[];
                          numbers: readonly (infer N extends string)[];
                        }
                      ? Flat<{ [K in B]?: boolean } & { [K in N]?: number }>
                      : F extends { kind: 'json'; booleans: readonly (infer B extends string)[] }
                        ? { [K in B]?: boolean }
                        : F extends { kind: 'json' }
                          ? Record<string, unknown>
                          : F extends { kind: 'bytes' }
                            ? Uint8Array
                            : F extends { kind: 'list'; of: infer O extends readonly Field[] }
                              ? FieldsOf<O>[]
                              : never;

/** The properties of fields `Fs`: one per field, optional where the field is `optional`. */
export type FieldsOf<Fs extends readonly Field[]> = Flat<
  { [F in Fs[number] as F extends { optional: true } ? never : F['key']]: FieldValue<F> } & {
    [F in Fs[number] as F extends { optional: true } ? F['key'] : never]?: FieldValue<F>;
  }
>;

/** The message object of entry `S` (of each, for a union of entries). */
export type MessageOfSpec<S extends MessageSpec> = S extends MessageSpec
  ? Flat<{ type: TagOf<S['name']>; requestId: number } & FieldsOf<S['fields']>>
  : never;

/** The wire names of table `T`'s messages in direction `D` (default: both). */
export type MessageName<
  T extends readonly MessageSpec[] = ProtocolTable,
  D extends Direction = Direction,
> = Extract<T[number], { dir: D }>['name'];

/** The message object of the entry named `N` in table `T` (protocol v1's by default). */
export type MessageOf<
  N extends MessageName<T>,
  T extends readonly MessageSpec[] = ProtocolTable,
> = MessageOfSpec<Extract<T[number], { name: N }>>;

/** Every message of table `T` in direction `D`, as a union tagged by `type`. */
export type MessagesOf<
  D extends Direction,
  T extends readonly MessageSpec[] = ProtocolTable,
> = MessageOfSpec<Extract<T[number], { dir: D }>>;

/** Every data-plane message of protocol v1 (docs/protocol.md section 4.9) in direction `D`. */
export type DataPlaneMessagesOf<D extends Direction> = MessageOfSpec<
  Extract<ProtocolTable[number], { dir: D; section: typeof DATA_PLANE_SECTION }>
>;
