import { createHash } from 'node:crypto';
import { KvtierError } from '../errors.ts';
import { describe, requireBoolean, requireInt, requireString } from '../util/validate.ts';
import {
  type ChunkHash,
  chunkHash,
  chunkHashBytes,
  chunkHashesFromPacked,
  chunkHashFromBytes,
} from './chunk-hash.ts';
import {
  encodeChunkSpans,
  type MultiModalSpan,
  type ResolvedMultiModalSpan,
  resolveMultiModalSpans,
} from './mm-spans.ts';

/**
 * The default kvtier chunk hasher (design decision 1 in docs/architecture.md). A chunk's key is a
 * 32-byte SHA-256 chained over the whole prefix before it, so equal keys mean equal prefixes. The
 * exact byte-level spec, with test vectors and a reference script, is in docs/protocol.md section
 * 9 (explained with a worked example in docs/hashing.md); any change here is a protocol change and
 * must bump the domain tag.
 */

/** Domain tag hashed into the seed; versioned so a future scheme can never collide with this one. */
export const HASH_DOMAIN = 'kvtier/v1';

/** Domain tag of the seed when a LoRA adapter is named (the salt is then length-prefixed). */
export const HASH_DOMAIN_EXTRA = 'kvtier/v1x';

/** Domain tag of a chunk's link when extra-input spans overlap the chunk. */
export const HASH_DOMAIN_MM = 'kvtier/v1/mm';

/** Length of one chunk hash in bytes (SHA-256). */
export const HASH_BYTES = 32;

/** Largest accepted `chunkSize` in tokens; bounds the per-call scratch buffer to 4 MiB. */
export const MAX_CHUNK_SIZE = 1 << 20;

/** Largest token id a chunk can carry (tokens are hashed as unsigned 32-bit little-endian). */
export const MAX_TOKEN_ID = 0xffff_ffff;

/** Options of {@link hashChunks}. */
export interface ChunkHasherOptions {
  /** Tokens per chunk, an integer in [1, {@link MAX_CHUNK_SIZE}]. Default 256. */
  chunkSize?: number;
  /** Cache salt (tenant isolation), hashed as UTF-8 into the seed. Default `''`. */
  salt?: string;
  /** Hash a trailing chunk shorter than `chunkSize`. Default `false`. */
  partial?: boolean;
  /**
   * Name of the LoRA adapter the KV was computed with (vLLM `lora_request.lora_name`), hashed as
   * UTF-8 into the seed. Default `''`: no adapter, and the seed is the same as without this option.
   */
  lora?: string;
  /**
   * Extra-input spans (multimodal inputs behind placeholder tokens). A chunk that overlaps a span
   * gets a different hash; chunks that overlap none hash as without this option. Default `[]`.
   */
  mm?: readonly MultiModalSpan[];
}

/** {@link ChunkHasherOptions} with defaults filled in and `mm` validated and sorted. */
export interface ResolvedChunkHasherOptions {
  chunkSize: number;
  salt: string;
  partial: boolean;
  lora: string;
  mm: ResolvedMultiModalSpan[];
}

/** One hashed chunk: tokens `[start, end)` of the input and the chained hash of that prefix. */
export interface HashedChunk {
  /** Index of the chunk's first token. */
  start: number;
  /** Index one past the chunk's last token. */
  end: number;
  /** 32-byte SHA-256 chained hash; a fresh buffer owned by the caller. */
  hash: Buffer;
}

/** The defaults of {@link ChunkHasherOptions}, in one place. */
export const CHUNK_HASHER_DEFAULTS: Readonly<Required<ChunkHasherOptions>> = Object.freeze({
  chunkSize: 256,
  salt: '',
  partial: false,
  lora: '',
  mm: Object.freeze([]) as readonly MultiModalSpan[],
});

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

const LITTLE_ENDIAN_HOST = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

/**
 * Fills in defaults and validates.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` when `chunkSize` is not an integer in
 *   [1, {@link MAX_CHUNK_SIZE}], `salt` or `lora` is not a well-formed string (lone UTF-16
 *   surrogates have no UTF-8 encoding, so other languages could not reproduce the seed),
 *   `partial` is not a boolean, or a span of `mm` is malformed (id not 1..1024 bytes, offset not an
 *   integer >= 0, length not an integer >= 1, offset + length not < 2^32).
 */
export function resolveChunkHasherOptions(o: ChunkHasherOptions = {}): ResolvedChunkHasherOptions {
  const chunkSize = requireInt(
    'chunkSize',
    o.chunkSize ?? CHUNK_HASHER_DEFAULTS.chunkSize,
    1,
    MAX_CHUNK_SIZE,
  );
  const salt = requireWellFormedString('salt', o.salt ?? CHUNK_HASHER_DEFAULTS.salt);
  const partial = requireBoolean('partial', o.partial ?? CHUNK_HASHER_DEFAULTS.partial);
  const lora = requireWellFormedString('lora', o.lora ?? CHUNK_HASHER_DEFAULTS.lora);
  const mm = resolveMultiModalSpans('mm', o.mm ?? CHUNK_HASHER_DEFAULTS.mm);
  return { chunkSize, salt, partial, lora, mm };
}

function requireWellFormedString(name: string, value: unknown): string {
  const s = requireString(name, value);
  if (LONE_SURROGATE.test(s)) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `${name} must be a well-formed Unicode string (it contains a lone UTF-16 surrogate)`,
    );
  }
  return s;
}

/**
 * The chain seed `h[-1]`: without a LoRA `SHA-256("kvtier/v1" || 0x00 || UTF-8(salt))`; with one,
 * `SHA-256("kvtier/v1x" || 0x00 || u32le(len(S)) || S || u32le(len(L)) || L)` where `S` and `L`
 * are the UTF-8 bytes of the salt and the LoRA name.
 * @param salt cache salt; default `''`.
 * @param lora LoRA adapter name; default `''` (none).
 * @returns a fresh 32-byte buffer.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for a non-string or ill-formed salt or LoRA name.
 */
export function hashSeed(salt = '', lora = ''): Buffer {
  return seedOf(requireWellFormedString('salt', salt), requireWellFormedString('lora', lora));
}

function seedOf(salt: string, lora: string): Buffer {
  if (lora === '') {
    return createHash('sha256')
      .update(HASH_DOMAIN, 'utf8')
      .update(ZERO_BYTE)
      .update(salt, 'utf8')
      .digest();
  }
  const s = Buffer.from(salt, 'utf8');
  const l = Buffer.from(lora, 'utf8');
  return createHash('sha256')
    .update(HASH_DOMAIN_EXTRA, 'utf8')
    .update(ZERO_BYTE)
    .update(u32le(s.length))
    .update(s)
    .update(u32le(l.length))
    .update(l)
    .digest();
}

/** The link of chunk `i`: `h[i-1]`, or with overlapping spans `SHA-256("kvtier/v1/mm" || 0x00 || h[i-1] || e_i)`. */
function linkOf(prev: Buffer, spans: Buffer | undefined): Buffer {
  if (spans === undefined) return prev;
  return createHash('sha256')
    .update(HASH_DOMAIN_MM, 'utf8')
    .update(ZERO_BYTE)
    .update(prev)
    .update(spans)
    .digest();
}

function u32le(v: number): Buffer {
  const b = Buffer.allocUnsafe(4);
  b.writeUInt32LE(v, 0);
  return b;
}

const ZERO_BYTE = new Uint8Array([0]);

/**
 * Splits `tokens` into chunks of `chunkSize` and returns each chunk's prefix-chained hash:
 * `h[i] = SHA-256(link[i] || u32le(t) for each token t of chunk i)`, `h[-1] = hashSeed(salt, lora)`,
 * where `link[i]` is `h[i-1]`, or, when spans of `mm` overlap chunk `i`,
 * `SHA-256("kvtier/v1/mm" || 0x00 || h[i-1] || e_i)` with `e_i` the overlapping spans encoded in
 * (offset, length, id) order. A trailing chunk shorter than `chunkSize` is returned only when
 * `partial` is set.
 *
 * A `Uint32Array` is hashed straight from its bytes on little-endian hosts (no per-token work);
 * a `number[]` is validated and packed token by token into one reused scratch buffer.
 *
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for bad options, or for a token that is not an
 *   integer in [0, 2^32) (the message names its index and value). Every token is validated,
 *   including a trailing partial chunk that is not hashed.
 */
export function hashChunks(
  tokens: readonly number[] | Uint32Array,
  opts?: ChunkHasherOptions,
): HashedChunk[] {
  const { chunkSize, salt, partial, lora, mm } = resolveChunkHasherOptions(opts);
  const n = tokens.length;
  const full = Math.floor(n / chunkSize);
  const count = partial && n % chunkSize !== 0 ? full + 1 : full;
  if (!(tokens instanceof Uint32Array)) requireTokenIds(tokens);
  if (count === 0) return [];
  const out: HashedChunk[] = new Array(count);
  const spans = mm.length === 0 ? undefined : encodeChunkSpans(mm, chunkSize, n, count);

  let prev = seedOf(salt, lora);
  if (tokens instanceof Uint32Array && LITTLE_ENDIAN_HOST) {
    for (let i = 0; i < count; i++) {
      const start = i * chunkSize;
      const end = Math.min(start + chunkSize, n);
      const bytes = new Uint8Array(tokens.buffer, tokens.byteOffset + start * 4, (end - start) * 4);
      prev = createHash('sha256').update(linkOf(prev, spans?.[i])).update(bytes).digest();
      out[i] = { start, end, hash: prev };
    }
    return out;
  }

  const scratch = new Uint32Array(Math.min(chunkSize, n));
  const scratchBytes = new Uint8Array(scratch.buffer);
  const view = new DataView(scratch.buffer);
  for (let i = 0; i < count; i++) {
    const start = i * chunkSize;
    const end = Math.min(start + chunkSize, n);
    const len = end - start;
    if (LITTLE_ENDIAN_HOST) {
      for (let j = 0; j < len; j++) scratch[j] = tokenAt(tokens, start + j);
    } else {
      for (let j = 0; j < len; j++) view.setUint32(j * 4, tokenAt(tokens, start + j), true);
    }
    prev = createHash('sha256')
      .update(linkOf(prev, spans?.[i]))
      .update(scratchBytes.subarray(0, len * 4))
      .digest();
    out[i] = { start, end, hash: prev };
  }
  return out;
}

function tokenAt(tokens: readonly number[] | Uint32Array, i: number): number {
  // Validated up front (number[]) or guaranteed by the type (Uint32Array).
  return tokens[i] as number;
}

/** Validates every token before any hashing, so a bad tail is refused even when not hashed. */
function requireTokenIds(tokens: readonly number[]): void {
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i];
    // `t >>> 0 === t` holds exactly for integers in [0, 2^32); it is false for NaN, ±Infinity,
    // fractions, negatives, non-numbers and holes (undefined).
    if (typeof t !== 'number' || t >>> 0 !== t) {
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `token ${i} must be an integer in [0, ${MAX_TOKEN_ID}], got ${describe(t)}`,
      );
    }
  }
}

/**
 * Concatenates chunk hashes into one buffer of `chunks.length * 32` bytes (the packed form the
 * protocol carries in one binary field).
 * @throws KvtierError `KVT_INVALID_ARGUMENT` when a hash is not exactly 32 bytes.
 */
export function packHashes(chunks: readonly { hash: Uint8Array }[]): Buffer {
  const out = Buffer.allocUnsafe(chunks.length * HASH_BYTES);
  for (let i = 0; i < chunks.length; i++) {
    const h = (chunks[i] as { hash: Uint8Array }).hash;
    if (!(h instanceof Uint8Array) || h.length !== HASH_BYTES) {
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `chunks[${i}].hash must be ${HASH_BYTES} bytes, got ${h instanceof Uint8Array ? `${h.length} bytes` : describe(h)}`,
      );
    }
    out.set(h, i * HASH_BYTES);
  }
  return out;
}

/** Token count of each chunk (`end - start`), in order: the per-chunk counts a lookup carries. */
export function tokenCounts(chunks: readonly HashedChunk[]): number[] {
  return chunks.map((c) => c.end - c.start);
}

/**
 * The chunk hash of a 32-byte digest (its lowercase hex).
 * @throws KvtierError `KVT_INVALID_ARGUMENT` when `hash` is not 32 bytes.
 */
export function hashToHex(hash: Uint8Array): ChunkHash {
  if (hash instanceof Uint8Array && hash.length !== HASH_BYTES)
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `hash must be ${HASH_BYTES} bytes, got ${hash.length} bytes`,
    );
  return chunkHashFromBytes(hash);
}

/**
 * Parses 64 lowercase hex digits into a fresh 32-byte buffer. Uppercase is refused so that one
 * hash has exactly one text form (log lines and keys compare as strings).
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for anything else.
 */
export function hexToHash(hex: string): Buffer {
  return chunkHashBytes(chunkHash(hex, 'hash'));
}

/** Splits packed hashes into chunk hashes (64 hex digits each); see {@link chunkHashesFromPacked}. */
export const hashesToHex: (packed: Uint8Array) => ChunkHash[] = chunkHashesFromPacked;
