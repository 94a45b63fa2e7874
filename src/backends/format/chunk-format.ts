/**
 * The stored chunk format (design decision 5, docs/architecture.md): every chunk below the CPU
 * tier is one object, a fixed 128-byte header followed by the payload. The byte layout, checksum
 * parameters and reader rules are specified in docs/storage-format.md; keep the two in step (a
 * test checks the doc's worked example against this encoder).
 */
import { crc32 } from 'node:zlib';
import { KvtierError } from '../../errors.ts';
import { describe } from '../../util/validate.ts';
import type { Chunk, ChunkHash } from '../core/types.ts';
import {
  CHECKSUM_CRC32C,
  CHECKSUM_XXH64,
  type ChecksumAlgorithm,
  copyPayloadCrc32cAsync,
  payloadChecksum,
  payloadChecksumAsync,
} from './checksum.ts';

/** 4-byte magic at offset 0 of every stored chunk object: ASCII `KVTC`. */
export const CHUNK_MAGIC: Buffer = Buffer.from('KVTC', 'latin1');

/**
 * Format version written at offset 4: 2 (payload checksum CRC-32C). Readers also accept
 * version 1 (XXH64); any other version is a miss.
 */
export const CHUNK_FORMAT_VERSION = 2;

/** The checksum algorithm each readable format version requires. */
const ALGORITHM_OF_VERSION: ReadonlyMap<number, ChecksumAlgorithm> = new Map([
  [1, CHECKSUM_XXH64],
  [2, CHECKSUM_CRC32C],
]);

/** Fixed size of the header in bytes; the payload follows immediately. */
export const CHUNK_HEADER_BYTES = 128;

/** Largest payload the format accepts, in bytes (2 GiB; the length field itself is a u64). */
export const CHUNK_MAX_PAYLOAD_BYTES = 2 ** 31;

/** Payload checksum algorithm id 1: XXH64 with seed 0 over the payload bytes (version 1). */
export const CHUNK_CHECKSUM_XXH64 = CHECKSUM_XXH64;

/** Payload checksum algorithm id 2: CRC-32C of the payload bytes (version 2, written). */
export const CHUNK_CHECKSUM_CRC32C = CHECKSUM_CRC32C;

/** Layout of the payload bytes (how KV is arranged); 0 = opaque bytes as given by the client. */
export type ChunkLayout = number;

/** Layout 0: the payload is opaque bytes exactly as the client gave them. */
export const CHUNK_LAYOUT_OPAQUE: ChunkLayout = 0;

/** A parsed, checked header. */
export interface ChunkHeader {
  version: number;
  /** Namespace id, 32 lowercase hex digits. */
  namespace: string;
  /** Chunk hash, 64 lowercase hex digits. */
  hash: ChunkHash;
  tokens: number;
  layout: number;
  payloadBytes: number;
  /** The payload checksum algorithm: XXH64 in version 1, CRC-32C in version 2. */
  checksumAlgorithm: ChecksumAlgorithm;
  /** The payload checksum as stored (u64; a CRC-32C is zero-extended). */
  checksum: bigint;
}

/** Why a stored object was rejected; each one is a miss for the reader (see the doc). */
export type ChunkDecodeFailure =
  | 'truncated'
  | 'magic'
  | 'version'
  | 'header' /* header self-check failed, or a field invalid in this version */
  | 'namespace'
  | 'hash'
  | 'length'
  | 'checksum';

/** Every failure reason, e.g. for pre-registering metric label values. */
export const CHUNK_DECODE_FAILURES: readonly ChunkDecodeFailure[] = [
  'truncated',
  'magic',
  'version',
  'header',
  'namespace',
  'hash',
  'length',
  'checksum',
];

// Byte offsets inside the header (all integers little-endian).
const OFF_MAGIC = 0;
const OFF_VERSION = 4; // u16
const OFF_HEADER_BYTES = 6; // u16
const OFF_FLAGS = 8; // u32, 0 in versions 1 and 2
const OFF_LAYOUT = 12; // u32
const OFF_NAMESPACE = 16; // 16 raw bytes
const OFF_HASH = 32; // 32 raw bytes
const OFF_TOKENS = 64; // u32
const OFF_CHECKSUM_ALG = 68; // u32
const OFF_PAYLOAD_BYTES = 72; // u64
const OFF_CHECKSUM = 80; // u64
const OFF_RESERVED = 88; // zeros up to the header CRC
const OFF_HEADER_CRC = 124; // u32, CRC-32 (IEEE) of bytes [0, 124)

const U32_MAX = 0xffff_ffff;
const NS_RE = /^[0-9a-f]{32}$/;

/**
 * The payload checksum of `data` with `algorithm` (default CRC-32C, the one written) as stored
 * in the header, on the calling thread. The async encoders and decoders below run large
 * CRC-32C payloads on the libuv pool instead (src/backends/format/checksum.ts).
 */
export function chunkPayloadChecksum(
  data: Uint8Array,
  algorithm: ChecksumAlgorithm = CHECKSUM_CRC32C,
): bigint {
  return payloadChecksum(algorithm, data);
}

/** Total stored size in bytes of an object whose payload is `payloadBytes` long. */
export function chunkObjectBytes(payloadBytes: number): number {
  return CHUNK_HEADER_BYTES + payloadBytes;
}

function invalid(message: string): KvtierError {
  return new KvtierError('KVT_INVALID_ARGUMENT', message);
}

function checkChunkArgs(ns: string, chunk: Chunk, layout: number): void {
  const n = chunk.data?.byteLength;
  if (typeof n !== 'number' || n < 1 || n > CHUNK_MAX_PAYLOAD_BYTES) {
    throw invalid(
      `chunk.data must hold 1 to ${CHUNK_MAX_PAYLOAD_BYTES} bytes, got ${describe(n)} bytes`,
    );
  }
  if (typeof ns !== 'string' || !NS_RE.test(ns)) {
    throw invalid(`namespace must be 32 lowercase hex digits, got ${describe(ns)}`);
  }
  const tokens = chunk.tokens;
  if (!Number.isInteger(tokens) || tokens < 1 || tokens > U32_MAX) {
    throw invalid(`chunk.tokens must be an integer in [1, ${U32_MAX}], got ${describe(tokens)}`);
  }
  if (!Number.isInteger(layout) || layout < 0 || layout > U32_MAX) {
    throw invalid(`layout must be an integer in [0, ${U32_MAX}], got ${describe(layout)}`);
  }
}

/** Writes a header for arguments already checked by `checkChunkArgs`. */
function writeHeader(
  out: Buffer,
  ns: string,
  hash: ChunkHash,
  chunk: Chunk,
  layout: number,
  checksum: bigint,
): void {
  out.fill(0, 0, CHUNK_HEADER_BYTES);
  CHUNK_MAGIC.copy(out, OFF_MAGIC);
  out.writeUInt16LE(CHUNK_FORMAT_VERSION, OFF_VERSION);
  out.writeUInt16LE(CHUNK_HEADER_BYTES, OFF_HEADER_BYTES);
  out.writeUInt32LE(0, OFF_FLAGS);
  out.writeUInt32LE(layout, OFF_LAYOUT);
  out.write(ns, OFF_NAMESPACE, 16, 'hex');
  out.write(hash, OFF_HASH, 32, 'hex');
  out.writeUInt32LE(chunk.tokens, OFF_TOKENS);
  out.writeUInt32LE(CHECKSUM_CRC32C, OFF_CHECKSUM_ALG);
  out.writeBigUInt64LE(BigInt(chunk.data.byteLength), OFF_PAYLOAD_BYTES);
  out.writeBigUInt64LE(checksum, OFF_CHECKSUM);
  out.writeUInt32LE(crc32(out.subarray(0, OFF_HEADER_CRC)), OFF_HEADER_CRC);
}

/**
 * The header for `chunk` stored under (ns, hash); computes the payload checksum.
 * Write it followed by `chunk.data` (e.g. a file written in two parts, then renamed).
 * @param layout payload layout id, default 0 (opaque).
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for a malformed ns, tokens outside
 *   [1, 2^32-1], an empty or over-large payload (see CHUNK_MAX_PAYLOAD_BYTES), or a bad layout.
 */
export function encodeChunkHeader(
  ns: string,
  hash: ChunkHash,
  chunk: Chunk,
  layout: ChunkLayout = CHUNK_LAYOUT_OPAQUE,
): Buffer {
  checkChunkArgs(ns, chunk, layout);
  const out = Buffer.allocUnsafe(CHUNK_HEADER_BYTES);
  writeHeader(out, ns, hash, chunk, layout, chunkPayloadChecksum(chunk.data));
  return out;
}

/**
 * {@link encodeChunkHeader} with the checksum of a large payload computed on the libuv pool
 * (when the addon is loaded), so the event loop is not held. `chunk.data` must not change until
 * it settles. Rejects as `encodeChunkHeader` throws.
 */
export async function encodeChunkHeaderAsync(
  ns: string,
  hash: ChunkHash,
  chunk: Chunk,
  layout: ChunkLayout = CHUNK_LAYOUT_OPAQUE,
): Promise<Buffer> {
  checkChunkArgs(ns, chunk, layout);
  const checksum = await payloadChecksumAsync(CHECKSUM_CRC32C, chunk.data);
  const out = Buffer.allocUnsafe(CHUNK_HEADER_BYTES);
  writeHeader(out, ns, hash, chunk, layout, checksum);
  return out;
}

/** Offset in the header of the payload checksum (u64le), for a writer that fills it in. */
export const CHUNK_HEADER_CHECKSUM_AT = OFF_CHECKSUM;
/** Offset of the header's CRC-32 (IEEE, u32le, of the bytes before it), filled in after it. */
export const CHUNK_HEADER_CRC_AT = OFF_HEADER_CRC;

/**
 * {@link encodeChunkHeader} without the payload checksum (and so without a valid header CRC):
 * for a writer that computes the checksum as it writes the payload and fills in both fields at
 * {@link CHUNK_HEADER_CHECKSUM_AT} and {@link CHUNK_HEADER_CRC_AT} (the native atomic write).
 * Throws as `encodeChunkHeader`.
 */
export function encodeChunkHeaderTemplate(
  ns: string,
  hash: ChunkHash,
  chunk: Chunk,
  layout: ChunkLayout = CHUNK_LAYOUT_OPAQUE,
): Buffer {
  checkChunkArgs(ns, chunk, layout);
  const out = Buffer.allocUnsafe(CHUNK_HEADER_BYTES);
  writeHeader(out, ns, hash, chunk, layout, 0n);
  return out;
}

/**
 * Header + payload in ONE new buffer (for single-value stores: Redis SET, S3 PutObject).
 * Copies the payload once. Throws as `encodeChunkHeader`.
 */
export function encodeChunkObject(
  ns: string,
  hash: ChunkHash,
  chunk: Chunk,
  layout: ChunkLayout = CHUNK_LAYOUT_OPAQUE,
): Buffer {
  checkChunkArgs(ns, chunk, layout);
  const out = Buffer.allocUnsafe(CHUNK_HEADER_BYTES + chunk.data.byteLength);
  writeHeader(out, ns, hash, chunk, layout, chunkPayloadChecksum(chunk.data));
  out.set(chunk.data, CHUNK_HEADER_BYTES);
  return out;
}

/**
 * Writes header + payload into `target` at `offset` (e.g. a reused buffer: allocating fresh
 * memory for every large object costs more than the checksum, see bench/checksum.ts). Returns
 * the bytes written, `chunkObjectBytes(chunk.data.byteLength)`. Throws as `encodeChunkHeader`,
 * and `KVT_INVALID_ARGUMENT` when the object does not fit in `target` after `offset`.
 */
export function encodeChunkObjectInto(
  target: Uint8Array,
  ns: string,
  hash: ChunkHash,
  chunk: Chunk,
  layout: ChunkLayout = CHUNK_LAYOUT_OPAQUE,
  offset = 0,
): number {
  const out = objectTarget(target, ns, chunk, layout, offset);
  writeHeader(out, ns, hash, chunk, layout, chunkPayloadChecksum(chunk.data));
  out.set(chunk.data, CHUNK_HEADER_BYTES);
  return out.length;
}

/**
 * {@link encodeChunkObjectInto} with the payload copied and checksummed in one pass on the libuv
 * pool (when the addon is loaded and the payload is large). Neither `chunk.data` nor
 * `target` may change until it settles. Rejects as `encodeChunkObjectInto` throws.
 */
export async function encodeChunkObjectIntoAsync(
  target: Uint8Array,
  ns: string,
  hash: ChunkHash,
  chunk: Chunk,
  layout: ChunkLayout = CHUNK_LAYOUT_OPAQUE,
  offset = 0,
): Promise<number> {
  const out = objectTarget(target, ns, chunk, layout, offset);
  // Copy and checksum in one pass (one pool thread): the payload is read from memory once.
  const checksum = await copyPayloadCrc32cAsync(chunk.data, out, CHUNK_HEADER_BYTES);
  writeHeader(out, ns, hash, chunk, layout, checksum);
  return out.length;
}

/** {@link encodeChunkObject} as {@link encodeChunkObjectIntoAsync} does it. */
export async function encodeChunkObjectAsync(
  ns: string,
  hash: ChunkHash,
  chunk: Chunk,
  layout: ChunkLayout = CHUNK_LAYOUT_OPAQUE,
): Promise<Buffer> {
  checkChunkArgs(ns, chunk, layout);
  const out = Buffer.allocUnsafe(CHUNK_HEADER_BYTES + chunk.data.byteLength);
  await encodeChunkObjectIntoAsync(out, ns, hash, chunk, layout);
  return out;
}

/** Checks the arguments and returns the view of `target` the object goes to. */
function objectTarget(
  target: Uint8Array,
  ns: string,
  chunk: Chunk,
  layout: number,
  offset: number,
): Buffer {
  checkChunkArgs(ns, chunk, layout);
  const total = chunkObjectBytes(chunk.data.byteLength);
  if (!Number.isInteger(offset) || offset < 0 || offset + total > target.byteLength) {
    throw invalid(
      `target must hold ${total} bytes from offset ${describe(offset)}, has ${target.byteLength}`,
    );
  }
  return Buffer.from(target.buffer, target.byteOffset + offset, total);
}

type HeaderResult = { ok: true; header: ChunkHeader } | { ok: false; reason: ChunkDecodeFailure };

function asBuffer(bytes: Uint8Array): Buffer {
  return Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length);
}

function parseHeader(expectedNs: string, expectedHash: ChunkHash, buf: Buffer): HeaderResult {
  if (buf.length < CHUNK_HEADER_BYTES) return { ok: false, reason: 'truncated' };
  if (CHUNK_MAGIC.compare(buf, OFF_MAGIC, OFF_MAGIC + 4) !== 0) {
    return { ok: false, reason: 'magic' };
  }
  const version = buf.readUInt16LE(OFF_VERSION);
  const algorithm = ALGORITHM_OF_VERSION.get(version);
  if (algorithm === undefined) return { ok: false, reason: 'version' };
  if (buf.readUInt32LE(OFF_HEADER_CRC) !== crc32(buf.subarray(0, OFF_HEADER_CRC))) {
    return { ok: false, reason: 'header' };
  }
  // The CRC matched, so these can only fail for a header written by a broken or newer writer.
  const tokens = buf.readUInt32LE(OFF_TOKENS);
  const lenLo = buf.readUInt32LE(OFF_PAYLOAD_BYTES);
  const lenHi = buf.readUInt32LE(OFF_PAYLOAD_BYTES + 4);
  const payloadBytes = lenHi * 2 ** 32 + lenLo;
  if (
    buf.readUInt16LE(OFF_HEADER_BYTES) !== CHUNK_HEADER_BYTES ||
    buf.readUInt32LE(OFF_FLAGS) !== 0 ||
    buf.readUInt32LE(OFF_CHECKSUM_ALG) !== algorithm ||
    (algorithm === CHECKSUM_CRC32C && buf.readUInt32LE(OFF_CHECKSUM + 4) !== 0) ||
    tokens === 0 ||
    payloadBytes === 0 ||
    payloadBytes > CHUNK_MAX_PAYLOAD_BYTES ||
    !reservedIsZero(buf)
  ) {
    return { ok: false, reason: 'header' };
  }
  const namespace = buf.toString('hex', OFF_NAMESPACE, OFF_NAMESPACE + 16);
  if (namespace !== expectedNs) return { ok: false, reason: 'namespace' };
  if (buf.toString('hex', OFF_HASH, OFF_HASH + 32) !== expectedHash)
    return { ok: false, reason: 'hash' };
  return {
    ok: true,
    header: {
      version,
      namespace,
      hash: expectedHash,
      tokens,
      layout: buf.readUInt32LE(OFF_LAYOUT),
      payloadBytes,
      checksumAlgorithm: algorithm,
      checksum: buf.readBigUInt64LE(OFF_CHECKSUM),
    },
  };
}

function reservedIsZero(buf: Buffer): boolean {
  for (let i = OFF_RESERVED; i < OFF_HEADER_CRC; i += 4) {
    if (buf.readUInt32LE(i) !== 0) return false;
  }
  return true;
}

/**
 * Parses and checks a header read from storage against the expected (ns, hash): magic, version,
 * header CRC and field validity, namespace and hash. Only the first CHUNK_HEADER_BYTES of `buf`
 * are read, so a whole object may be passed. The payload is not checked: use
 * `verifyChunkPayload`. Never throws for bad bytes. The expected ids must be lowercase hex, as `NamespaceId` and
 * `ChunkHash` are; any other spelling is reported as a mismatch.
 */
export function decodeChunkHeader(
  expectedNs: string,
  expectedHash: ChunkHash,
  buf: Uint8Array,
): HeaderResult {
  return parseHeader(expectedNs, expectedHash, asBuffer(buf));
}

type DecodeResult =
  | { ok: true; chunk: Chunk; header: ChunkHeader }
  | { ok: false; reason: ChunkDecodeFailure };

/** Checks 1-8 of a whole object; the payload view to checksum, or the failure. */
function decodeUnverified(
  expectedNs: string,
  expectedHash: ChunkHash,
  obj: Uint8Array,
): { ok: true; header: ChunkHeader; data: Uint8Array } | { ok: false; reason: ChunkDecodeFailure } {
  const parsed = parseHeader(expectedNs, expectedHash, asBuffer(obj));
  if (!parsed.ok) return parsed;
  const { header } = parsed;
  const stored = obj.byteLength - CHUNK_HEADER_BYTES;
  if (stored < header.payloadBytes) return { ok: false, reason: 'truncated' };
  if (stored > header.payloadBytes) return { ok: false, reason: 'length' };
  return { ok: true, header, data: obj.subarray(CHUNK_HEADER_BYTES) };
}

/**
 * Parses a whole stored object and verifies everything (magic, version, header check, namespace,
 * hash, payload length == stored length, payload checksum with the version's algorithm). On
 * success `chunk.data` is a view into `obj` (no copy), valid as long as the caller keeps `obj`.
 * Never throws for bad bytes: corrupt data is a reported failure. A short object is
 * 'truncated'; trailing bytes are 'length'. Checksums on the calling thread: a server prefers
 * {@link decodeChunkObjectAsync}.
 */
export function decodeChunkObject(
  expectedNs: string,
  expectedHash: ChunkHash,
  obj: Uint8Array,
): DecodeResult {
  const d = decodeUnverified(expectedNs, expectedHash, obj);
  if (!d.ok) return d;
  if (payloadChecksum(d.header.checksumAlgorithm, d.data) !== d.header.checksum) {
    return { ok: false, reason: 'checksum' };
  }
  return { ok: true, chunk: { tokens: d.header.tokens, data: d.data }, header: d.header };
}

/**
 * {@link decodeChunkObject} with the checksum of a large version-2 payload computed on the
 * libuv pool (when the addon is loaded). `obj` must not change until it settles. Never rejects
 * for bad bytes. `objCrc32c`, when given, is the CRC-32C of `obj` from byte
 * {@link CHUNK_HEADER_BYTES} to its end, computed while reading it: a version-2 object whose
 * payload is exactly that range is checked against it instead of being read again.
 */
export async function decodeChunkObjectAsync(
  expectedNs: string,
  expectedHash: ChunkHash,
  obj: Uint8Array,
  objCrc32c?: number,
): Promise<DecodeResult> {
  const d = decodeUnverified(expectedNs, expectedHash, obj);
  if (!d.ok) return d;
  const known =
    objCrc32c !== undefined &&
    d.header.checksumAlgorithm === CHECKSUM_CRC32C &&
    d.data.byteOffset === obj.byteOffset + CHUNK_HEADER_BYTES &&
    d.data.byteLength === obj.byteLength - CHUNK_HEADER_BYTES
      ? BigInt(objCrc32c)
      : await payloadChecksumAsync(d.header.checksumAlgorithm, d.data);
  if (known !== d.header.checksum) {
    return { ok: false, reason: 'checksum' };
  }
  return { ok: true, chunk: { tokens: d.header.tokens, data: d.data }, header: d.header };
}

/**
 * Verifies a payload read separately (e.g. a file read in two parts) against its header: the
 * length must equal `header.payloadBytes` and the checksum (the header's algorithm) must match.
 * Never throws.
 */
export function verifyChunkPayload(header: ChunkHeader, payload: Uint8Array): boolean {
  return (
    payload.byteLength === header.payloadBytes &&
    payloadChecksum(header.checksumAlgorithm, payload) === header.checksum
  );
}

/** {@link verifyChunkPayload} off the event loop where it can (see decodeChunkObjectAsync). */
export async function verifyChunkPayloadAsync(
  header: ChunkHeader,
  payload: Uint8Array,
): Promise<boolean> {
  return (
    payload.byteLength === header.payloadBytes &&
    (await payloadChecksumAsync(header.checksumAlgorithm, payload)) === header.checksum
  );
}
