import { KvtierError } from '../errors.ts';
import { describe } from '../util/validate.ts';

/**
 * Extra-input spans of the chunk hasher (docs/protocol.md section 9.1): multimodal inputs (an
 * image, an audio clip) whose placeholder tokens are the same for every input, so the tokens alone
 * do not tell two prompts apart. Each span names the input by an id (vLLM's mm hash) and the
 * prompt tokens its placeholder occupies; every chunk that overlaps a span folds the span into its
 * chain link.
 */

/** One extra input: an id and the prompt tokens `[offset, offset + length)` it stands behind. */
export interface MultiModalSpan {
  /**
   * Identity of the input, 1..{@link MAX_MM_ID_BYTES} bytes; a string is taken as its UTF-8
   * bytes (for vLLM, the mm hash string).
   */
  id: Uint8Array | string;
  /** Index of the first prompt token of the placeholder, an integer >= 0. */
  offset: number;
  /** Placeholder length in tokens, an integer >= 1; `offset + length` must be < 2^32. */
  length: number;
}

/** A validated span with its id as bytes. */
export interface ResolvedMultiModalSpan {
  /** The id's bytes (a copy, owned by the resolved options). */
  id: Buffer;
  offset: number;
  length: number;
}

/** Longest accepted span id in bytes. */
export const MAX_MM_ID_BYTES = 1024;

/** Exclusive bound of `offset + length` (both are hashed as u32le). */
const U32_LIMIT = 2 ** 32;

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/**
 * Validates `mm` and returns its spans with ids as bytes, sorted by (offset, length, id bytes),
 * the order in which they are hashed.
 * @param name the option's name for messages (`mm`).
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the first bad span and field.
 */
export function resolveMultiModalSpans(name: string, mm: unknown): ResolvedMultiModalSpan[] {
  if (!Array.isArray(mm)) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `${name} must be an array of { id, offset, length } spans, got ${describe(mm)}`,
    );
  }
  const out: ResolvedMultiModalSpan[] = mm.map((span: unknown, i) =>
    resolveSpan(`${name}[${i}]`, span),
  );
  out.sort(compareSpans);
  return out;
}

function resolveSpan(name: string, span: unknown): ResolvedMultiModalSpan {
  if (typeof span !== 'object' || span === null) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `${name} must be an object { id, offset, length }, got ${describe(span)}`,
    );
  }
  const s = span as Partial<MultiModalSpan>;
  let id: Buffer;
  if (typeof s.id === 'string') {
    if (LONE_SURROGATE.test(s.id)) {
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `${name}.id must be a well-formed Unicode string (it contains a lone UTF-16 surrogate)`,
      );
    }
    id = Buffer.from(s.id, 'utf8');
  } else if (s.id instanceof Uint8Array) {
    id = Buffer.from(s.id);
  } else {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `${name}.id must be a string or a Uint8Array, got ${describe(s.id)}`,
    );
  }
  if (id.length < 1 || id.length > MAX_MM_ID_BYTES) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `${name}.id must be 1..${MAX_MM_ID_BYTES} bytes, got ${id.length} bytes`,
    );
  }
  const { offset, length } = s;
  if (typeof offset !== 'number' || !Number.isInteger(offset) || offset < 0) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `${name}.offset must be an integer >= 0, got ${describe(offset)}`,
    );
  }
  if (typeof length !== 'number' || !Number.isInteger(length) || length < 1) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `${name}.length must be an integer >= 1, got ${describe(length)}`,
    );
  }
  if (offset + length >= U32_LIMIT) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `${name}.length must keep offset + length < 2^32, got offset ${offset} and length ${length}`,
    );
  }
  return { id, offset, length };
}

function compareSpans(a: ResolvedMultiModalSpan, b: ResolvedMultiModalSpan): number {
  return a.offset - b.offset || a.length - b.length || Buffer.compare(a.id, b.id);
}

/**
 * For chunks `[i * chunkSize, min((i + 1) * chunkSize, n))`, `i < count`, the encoded spans each
 * chunk overlaps: `u32le(offset) || u32le(length) || u32le(len(id)) || id` per span, in the sorted
 * order; `undefined` for a chunk that overlaps none. `spans` must come from
 * {@link resolveMultiModalSpans} (sorted).
 */
export function encodeChunkSpans(
  spans: readonly ResolvedMultiModalSpan[],
  chunkSize: number,
  n: number,
  count: number,
): (Buffer | undefined)[] {
  const perChunk: Buffer[][] = Array.from({ length: count }, () => []);
  for (const span of spans) {
    if (span.offset >= n) continue;
    const first = Math.floor(span.offset / chunkSize);
    const last = Math.min(Math.floor((span.offset + span.length - 1) / chunkSize), count - 1);
    if (first > last) continue;
    const encoded = Buffer.allocUnsafe(12 + span.id.length);
    encoded.writeUInt32LE(span.offset, 0);
    encoded.writeUInt32LE(span.length, 4);
    encoded.writeUInt32LE(span.id.length, 8);
    span.id.copy(encoded, 12);
    for (let i = first; i <= last; i++) perChunk[i]?.push(encoded);
  }
  return perChunk.map((parts) => (parts.length === 0 ? undefined : Buffer.concat(parts)));
}
