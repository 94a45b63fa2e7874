/**
 * The stream's payloads in MessagePack (docs/events.md), written by `@msgpack/msgpack`: integers
 * in their smallest form, other numbers as float64, strings as str, `Uint8Array`s (Buffers
 * included) as bin, arrays as arrays. A subscriber in any language reads them with its own
 * msgpack library.
 */
import { Encoder } from '@msgpack/msgpack';

/** What a payload is made of: the stream writes arrays of these, never maps or extension types. */
export type PayloadValue = null | boolean | number | string | Uint8Array | readonly PayloadValue[];

// Explicit where another choice would change the bytes on the wire: float32 would lose a
// timestamp's sub-second digits; without BigInt every integer is a number, in its smallest form.
const encoder = new Encoder({
  forceFloat32: false,
  forceIntegerToFloat: false,
  useBigInt64: false,
});

/**
 * Encodes `value` into a Buffer of its own (the caller may keep it; nothing else writes to it).
 * A number that is a safe integer is written as an integer, any other as float64.
 * @throws Error for a value outside {@link PayloadValue} (a bug: callers build the values).
 */
export function encodePayload(value: PayloadValue): Buffer {
  const bytes = encoder.encode(value);
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}
