/**
 * Chunk hashes and namespace ids as packed words: a 64-hex-digit {@link ChunkHash} as eight
 * little-endian int32 words of its 32 bytes (the bytes as they travel on the wire), a 32-digit
 * namespace id as its 16 raw bytes. The compact disk index and its journal keep keys in this form
 * so that a million chunks cost no string or object each.
 */
import type { ChunkHash } from '../../hashing/chunk-hash.ts';

/** Value of each lowercase hex digit by char code; 255 elsewhere. */
const HEX_VALUE = new Uint8Array(128).fill(255);
for (let i = 0; i < 10; i++) HEX_VALUE[48 + i] = i;
for (let i = 0; i < 6; i++) HEX_VALUE[97 + i] = 10 + i;

/** The byte of each pair of lowercase hex digits, by (first char code << 7 | second). */
const PAIR_VALUE = new Uint8Array(1 << 14);
for (let hi = 0; hi < 128; hi++) {
  for (let lo = 0; lo < 128; lo++) {
    const [a, b] = [HEX_VALUE[hi]!, HEX_VALUE[lo]!];
    if (a !== 255 && b !== 255) PAIR_VALUE[(hi << 7) | lo] = (a << 4) | b;
  }
}

/** Two hex digits of each byte value. */
const HEX_PAIR: readonly string[] = Array.from({ length: 256 }, (_, b) =>
  b.toString(16).padStart(2, '0'),
);

/**
 * Word `w` (0–7) of `hash`: bytes 4w..4w+3 little-endian, as an int32. `hash` must be a valid
 * ChunkHash (64 lowercase hex digits); nothing is checked here.
 */
export function hashWord(hash: ChunkHash, w: number): number {
  const i = w * 8;
  const p = PAIR_VALUE;
  return (
    p[(hash.charCodeAt(i) << 7) | hash.charCodeAt(i + 1)]! |
    (p[(hash.charCodeAt(i + 2) << 7) | hash.charCodeAt(i + 3)]! << 8) |
    (p[(hash.charCodeAt(i + 4) << 7) | hash.charCodeAt(i + 5)]! << 16) |
    (p[(hash.charCodeAt(i + 6) << 7) | hash.charCodeAt(i + 7)]! << 24)
  );
}

/**
 * Parses the first 64 characters of `name` as a chunk hash into eight words at `out[at]`; false
 * (with `out` partly written) unless they are all lowercase hex digits.
 */
export function parseHashWords(name: string, out: Int32Array, at: number): boolean {
  if (name.length < 64) return false;
  for (let i = 0; i < 64; i++) {
    const c = name.charCodeAt(i);
    if (c >= 128 || HEX_VALUE[c] === 255) return false;
  }
  for (let w = 0; w < 8; w++) out[at + w] = hashWord(name as ChunkHash, w);
  return true;
}

/** Writes the eight words of `hash` into `out` at `at`. */
export function hashWordsInto(hash: ChunkHash, out: Int32Array, at: number): void {
  for (let w = 0; w < 8; w++) out[at + w] = hashWord(hash, w);
}

/** The ChunkHash of the eight words at `at` in `words`. */
export function hashOfWords(words: Int32Array, at: number): ChunkHash {
  let s = '';
  for (let w = 0; w < 8; w++) {
    const v = words[at + w]!;
    s += HEX_PAIR[v & 0xff]! + HEX_PAIR[(v >>> 8) & 0xff]!;
    s += HEX_PAIR[(v >>> 16) & 0xff]! + HEX_PAIR[v >>> 24]!;
  }
  return s as ChunkHash;
}

/** Lowercase hex of `bytes[from, from + n)`. */
export function hexOfBytes(bytes: Uint8Array, from: number, n: number): string {
  let s = '';
  for (let i = from; i < from + n; i++) s += HEX_PAIR[bytes[i]!]!;
  return s;
}

/**
 * Parses `n` bytes of lowercase hex from `hex` into `out` at `at`; false (with `out` partly
 * written) when `hex` is not exactly 2n lowercase hex digits.
 */
export function bytesOfHex(hex: string, out: Uint8Array, at: number, n: number): boolean {
  if (hex.length !== 2 * n) return false;
  for (let i = 0; i < n; i++) {
    const hi = HEX_VALUE[hex.charCodeAt(2 * i)] ?? 255;
    const lo = HEX_VALUE[hex.charCodeAt(2 * i + 1)] ?? 255;
    if (hi === 255 || lo === 255) return false;
    out[at + i] = (hi << 4) | lo;
  }
  return true;
}
