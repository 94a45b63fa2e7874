import { KvtierError } from '../errors.ts';
import { requireInt } from '../util/validate.ts';

/**
 * The simulator's deterministic "model": the K or V bytes of token position `p` are a pure
 * function of the prompt prefix `tokens[0..p]`, the layer and K/V. A running two-lane 32-bit
 * hash of the prefix (kept per request, one pair of words per position) seeds a xorshift
 * generator that expands into `bytesPerTokenPerLayer` bytes. Equal prefixes therefore give equal
 * bytes in any block of any request, and any loaded block can be checked against what
 * recomputation would have written.
 */

/** Murmur3's 32-bit finalizer: full avalanche, so nearby inputs give unrelated outputs. */
function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

const SEED_A = 0x6b767469; // 'kvti'
const SEED_B = 0x65722f31; // 'er/1'

/**
 * Running prefix hashes of `tokens`: two u32 words per position, `out[2p]` and `out[2p + 1]`,
 * each committing to every token up to and including `p`. `prefixHashes(t.subarray(0, n))` is
 * the first `2n` words of `prefixHashes(t)`.
 */
export function prefixHashes(tokens: Uint32Array | readonly number[]): Uint32Array {
  const out = new Uint32Array(tokens.length * 2);
  let a = SEED_A;
  let b = SEED_B;
  for (let p = 0; p < tokens.length; p++) {
    const t = tokens[p]! >>> 0;
    a = fmix32(a ^ Math.imul(t + 1, 0x9e3779b1));
    b = fmix32((b + Math.imul(t ^ a, 0x27d4eb2f) + 0x165667b1) | 0);
    out[2 * p] = a;
    out[2 * p + 1] = b;
  }
  return out;
}

/**
 * Key of the engine block that ends at position `lastPos` (its last token), for the engine's own
 * prefix cache: it commits to the whole prefix, like vLLM's chained block hashes.
 */
export function blockKey(hashes: Uint32Array, lastPos: number): string {
  return `${hashes[2 * lastPos]!.toString(36)}.${hashes[2 * lastPos + 1]!.toString(36)}`;
}

/** Shape of the KV bytes the model produces. */
export interface KvModelShape {
  /** Layers; each has a K and a V region. */
  numLayers: number;
  /** Bytes of K (and of V) per token per layer; a multiple of 4. */
  bytesPerTokenPerLayer: number;
}

/**
 * Validates a shape.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` when a field is not a positive integer or the
 *   bytes per token are not a multiple of 4 (the generator writes whole words).
 */
export function resolveKvModelShape(shape: KvModelShape): KvModelShape {
  const numLayers = requireInt('numLayers', shape.numLayers, 1, 4096);
  const bytesPerTokenPerLayer = requireInt(
    'bytesPerTokenPerLayer',
    shape.bytesPerTokenPerLayer,
    4,
    1 << 24,
  );
  if (bytesPerTokenPerLayer % 4 !== 0)
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `bytesPerTokenPerLayer must be a multiple of 4, got ${bytesPerTokenPerLayer}`,
    );
  return { numLayers, bytesPerTokenPerLayer };
}

/**
 * Writes the bytes of positions `[start, end)` of region (`layer`, `kind`: 0 = K, 1 = V) into
 * `out`, token after token (`(end - start) * bytesPerTokenPerLayer` bytes from `out[0]`).
 * Words are written in the platform's byte order: producer and checker run on one machine.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` when `out` is too small, or the range lies outside
 *   `hashes`.
 */
export function fillKv(
  hashes: Uint32Array,
  start: number,
  end: number,
  layer: number,
  kind: 0 | 1,
  bytesPerTokenPerLayer: number,
  out: Uint8Array,
): void {
  const n = end - start;
  if (start < 0 || n < 0 || 2 * end > hashes.length)
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `fillKv: positions [${start}, ${end}) outside the ${hashes.length / 2} hashed positions`,
    );
  if (out.length < n * bytesPerTokenPerLayer)
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `fillKv: ${n} tokens need ${n * bytesPerTokenPerLayer} bytes, got ${out.length}`,
    );
  const words = bytesPerTokenPerLayer >>> 2;
  const aligned = out.byteOffset % 4 === 0;
  const view = aligned
    ? new Uint32Array(out.buffer, out.byteOffset, n * words)
    : new Uint32Array(n * words);
  const salt = Math.imul(2 * layer + kind + 1, 0x9e3779b9);
  let w = 0;
  for (let p = start; p < end; p++) {
    let x = fmix32(hashes[2 * p]! ^ salt);
    // The second lane is a mixed hash already: a Weyl start, no second finalizer needed.
    let y = (hashes[2 * p + 1]! ^ x) | 1;
    for (let i = 0; i < words; i++) {
      // xorshift32 on one lane, Weyl sequence on the other: cheap, and never stuck at zero.
      x ^= x << 13;
      x ^= x >>> 17;
      x ^= x << 5;
      y = (y + 0x6d2b79f5) | 0;
      view[w++] = (x ^ y) >>> 0;
    }
  }
  if (!aligned) out.set(new Uint8Array(view.buffer, 0, n * bytesPerTokenPerLayer));
}

/**
 * {@link fillKv} into 32-bit words: writes the words of positions `[start, end)` of region
 * (`layer`, `kind`) at `out[at]` on, `words` per token (`bytesPerTokenPerLayer / 4`). The words are
 * those `fillKv` writes, so a byte view of `out` holds the same bytes on this machine. No range
 * checks: the engine's hot path calls it with ranges it computed.
 */
export function fillKvWords(
  hashes: Uint32Array,
  start: number,
  end: number,
  layer: number,
  kind: 0 | 1,
  words: number,
  out: Uint32Array,
  at: number,
): void {
  const salt = Math.imul(2 * layer + kind + 1, 0x9e3779b9);
  let w = at;
  for (let p = start; p < end; p++) {
    let x = fmix32(hashes[2 * p]! ^ salt);
    let y = (hashes[2 * p + 1]! ^ x) | 1;
    for (let i = 0; i < words; i++) {
      x ^= x << 13;
      x ^= x >>> 17;
      x ^= x << 5;
      y = (y + 0x6d2b79f5) | 0;
      out[w++] = (x ^ y) >>> 0;
    }
  }
}

/**
 * Whether `out[at...]` holds the words {@link fillKvWords} would write for positions
 * `[start, end)` of region (`layer`, `kind`).
 */
export function kvWordsEqual(
  hashes: Uint32Array,
  start: number,
  end: number,
  layer: number,
  kind: 0 | 1,
  words: number,
  out: Uint32Array,
  at: number,
): boolean {
  const salt = Math.imul(2 * layer + kind + 1, 0x9e3779b9);
  let w = at;
  for (let p = start; p < end; p++) {
    let x = fmix32(hashes[2 * p]! ^ salt);
    let y = (hashes[2 * p + 1]! ^ x) | 1;
    for (let i = 0; i < words; i++) {
      x ^= x << 13;
      x ^= x >>> 17;
      x ^= x << 5;
      y = (y + 0x6d2b79f5) | 0;
      if (out[w++] !== (x ^ y) >>> 0) return false;
    }
  }
  return true;
}
