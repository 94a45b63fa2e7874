/**
 * The chunk-hash type: a 32-byte hash held as its 64 lowercase hex digits, branded so that the
 * compiler lets only a validated value through. The functions here are its only constructors: the
 * wire decoder builds it straight from frame bytes (no check needed, bytes always have a hex
 * form), text entry points (CLI, client API, plug-in tests) validate once with {@link chunkHash}.
 * Everything after the edge (storage manager, tiers, data plane) trusts the type and never
 * re-checks it. A hex string rather than bytes because JavaScript maps key by value only for
 * primitives, and every tier below host memory needs the hex name anyway (file paths, Redis and
 * S3 keys, logs, JSON).
 *
 * It is one of three forms of a hash, and parts convert between them where each needs its own: a
 * LOOKUP stays packed bytes as far as host memory's packed index and is made hex only for the
 * tiers below it (storage-manager/lookup-walk.ts, prefetch.ts), for pins recorded by hex and when a LOAD reads
 * the answered lookup (storage-manager/pin-ledger.ts, lookup-hashes.ts); SAVE and LOAD are made
 * hex whole in the server (lookup-server/sidecar-server.ts); stored headers, events and the journal
 * take the bytes back, and the host and disk indexes take eight int32 words
 * (backends/index/packed-key-index.ts, backends/index/hash-words.ts). docs/architecture.md, "Hash forms",
 * lists every conversion.
 */
import { KvtierError } from '../errors.ts';
import { describe } from '../util/validate.ts';

declare const chunkHashBrand: unique symbol;

/**
 * A chunk hash as 64 lowercase hex digits (32 bytes, see docs/protocol.md "Chunk hashing").
 * A plain string at run time; build one with {@link chunkHash}, {@link chunkHashFromBytes} or
 * {@link chunkHashesFromPacked}.
 */
export type ChunkHash = string & { readonly [chunkHashBrand]: true };

/** Bytes in a chunk hash. */
export const CHUNK_HASH_BYTES = 32;

const HEX_64 = /^[0-9a-f]{64}$/;

/** True when `value` is 64 lowercase hex digits (one hash has exactly one text form). */
export function isChunkHash(value: unknown): value is ChunkHash {
  return typeof value === 'string' && HEX_64.test(value);
}

/**
 * Validates text as a chunk hash.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` unless `hex` is 64 lowercase hex digits (uppercase
 *   is refused: keys and log lines compare as strings). `what` names the value in the message.
 */
export function chunkHash(hex: unknown, what = 'chunk hash'): ChunkHash {
  if (!isChunkHash(hex))
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `${what} must be ${CHUNK_HASH_BYTES * 2} lowercase hex digits, got ${describe(hex)}`,
    );
  return hex;
}

/**
 * The hash held in `bytes[offset, offset + 32)`: one native hex conversion, no check needed.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` when fewer than 32 bytes follow `offset`.
 */
export function chunkHashFromBytes(bytes: Uint8Array, offset = 0): ChunkHash {
  if (!(bytes instanceof Uint8Array) || offset < 0 || bytes.length - offset < CHUNK_HASH_BYTES)
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `hash must be ${CHUNK_HASH_BYTES} bytes, got ${bytes instanceof Uint8Array ? `${bytes.length - offset} bytes` : describe(bytes)}`,
    );
  return asBuffer(bytes).toString('hex', offset, offset + CHUNK_HASH_BYTES) as ChunkHash;
}

/**
 * Splits packed hashes (32 bytes each, as on the wire) into chunk hashes: one native hex
 * conversion of the whole field, then substrings (much cheaper than a conversion per hash).
 * @throws KvtierError `KVT_INVALID_ARGUMENT` when the length is not a multiple of 32.
 */
export function chunkHashesFromPacked(packed: Uint8Array): ChunkHash[] {
  if (packed.length % CHUNK_HASH_BYTES !== 0)
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `packed hashes must be a multiple of ${CHUNK_HASH_BYTES} bytes, got ${packed.length}`,
    );
  const n = packed.length / CHUNK_HASH_BYTES;
  const all = asBuffer(packed).toString('hex');
  const out = new Array<ChunkHash>(n);
  const w = CHUNK_HASH_BYTES * 2;
  for (let i = 0; i < n; i++) out[i] = all.slice(i * w, (i + 1) * w) as ChunkHash;
  return out;
}

/** The 32 bytes of a chunk hash (a fresh buffer), for encoders and stored headers. */
export function chunkHashBytes(hash: ChunkHash): Buffer {
  return Buffer.from(hash, 'hex');
}

function asBuffer(b: Uint8Array): Buffer {
  return Buffer.isBuffer(b) ? b : Buffer.from(b.buffer, b.byteOffset, b.byteLength);
}
