/**
 * Payload checksums of the stored chunk format (docs/storage-format.md §2): algorithm 1, XXH64
 * (seed 0, format version 1, read only), and algorithm 2, CRC-32C (format version 2, written).
 * CRC-32C runs in the native addon when it is loaded (the CPU's crc32 instruction, on the libuv
 * pool for large payloads so the event loop is not held) and in plain JavaScript otherwise;
 * both give the same value.
 */
import xxhash from 'xxhash-wasm';
import { loadNative, type NativeAddon } from '../../native/native-addon.ts';
import { crc32c } from '../../util/crc32c.ts';

/** Algorithm id 1: XXH64 with seed 0 (stored format version 1). */
export const CHECKSUM_XXH64 = 1;

/** Algorithm id 2: CRC-32C (Castagnoli), the u32 stored zero-extended (stored format version 2). */
export const CHECKSUM_CRC32C = 2;

/** A payload checksum algorithm id as stored in the header. */
export type ChecksumAlgorithm = typeof CHECKSUM_XXH64 | typeof CHECKSUM_CRC32C;

/**
 * Payloads up to this size are checksummed on the calling thread even when the addon could run
 * them on the pool: with the CPU instruction (~30 GB/s) 256 KiB takes under 10 µs, less than a
 * round trip through the libuv pool.
 */
export const CHECKSUM_SYNC_MAX_BYTES = 256 * 1024;

// Hashing in slices keeps the WebAssembly memory (which never shrinks) at one slice instead of
// the largest payload ever seen, and beats one-shot hashing on large payloads (bench/checksum.ts).
const XXH64_SLICE_BYTES = 128 * 1024;
const xx = await xxhash();

let native: NativeAddon | null | undefined;

function addon(): NativeAddon | null {
  if (native === undefined) {
    native = process.env.KVTIER_NATIVE_CHECKSUM === '0' ? null : loadNative().addon;
  }
  return native;
}

/**
 * Where CRC-32C runs in this process: `'native'` (the addon; `hardware` says whether with the
 * CPU instruction) or `'js'` (the addon is not loaded, or `KVTIER_NATIVE_CHECKSUM=0`).
 */
export function crc32cEngine(): { engine: 'native' | 'js'; hardware: boolean } {
  const a = addon();
  return a === null
    ? { engine: 'js', hardware: false }
    : { engine: 'native', hardware: a.probe().crc32cHardware };
}

/** XXH64 (seed 0) of `data` on the calling thread (WebAssembly, about 5-10 GB/s). */
export function xxh64(data: Uint8Array): bigint {
  if (data.byteLength <= XXH64_SLICE_BYTES) return xx.h64Raw(data);
  const h = xx.create64();
  for (let off = 0; off < data.byteLength; off += XXH64_SLICE_BYTES) {
    h.update(data.subarray(off, Math.min(data.byteLength, off + XXH64_SLICE_BYTES)));
  }
  return h.digest();
}

/**
 * The checksum of `data` with `algorithm`, as stored in the header's u64 field, on the calling
 * thread. Prefer {@link payloadChecksumAsync} for large payloads on a server.
 */
export function payloadChecksum(algorithm: ChecksumAlgorithm, data: Uint8Array): bigint {
  if (algorithm === CHECKSUM_XXH64) return xxh64(data);
  const a = addon();
  return BigInt(a === null ? crc32c(data) : a.crc32c(data));
}

/**
 * {@link payloadChecksum} without holding the event loop where it can: CRC-32C of a payload
 * over {@link CHECKSUM_SYNC_MAX_BYTES} runs on the libuv pool when the addon is loaded. XXH64
 * and the JavaScript CRC-32C run on this thread. `data` must not change until it settles.
 */
export async function payloadChecksumAsync(
  algorithm: ChecksumAlgorithm,
  data: Uint8Array,
): Promise<bigint> {
  const a = algorithm === CHECKSUM_CRC32C ? addon() : null;
  if (a === null || data.byteLength <= CHECKSUM_SYNC_MAX_BYTES) {
    return payloadChecksum(algorithm, data);
  }
  return BigInt(await a.crc32cAsync(data));
}

/**
 * CRC-32C of `data` continued from `crc` (0 to start), on this thread with the native addon;
 * `null` when the addon is not loaded (or `KVTIER_NATIVE_CHECKSUM=0`), where checksumming as the
 * bytes arrive would cost more than checksumming once they are all there. For small pieces only
 * (a network read): it holds the event loop for the piece.
 */
export function crc32cUpdateNative(crc: number, data: Uint8Array): number | null {
  const a = addon();
  return a === null ? null : a.crc32c(data, crc);
}

/**
 * Copies `src` into `dst` at `dstOffset` and returns the CRC-32C of the payload (as
 * {@link payloadChecksum} gives it), in one pass on the libuv pool when the addon is loaded and
 * `src` is over {@link CHECKSUM_SYNC_MAX_BYTES}; otherwise the copy, then the checksum. Neither
 * buffer may change until it settles.
 * @throws RangeError when `src` does not fit in `dst` after `dstOffset`.
 */
export async function copyPayloadCrc32cAsync(
  src: Uint8Array,
  dst: Uint8Array,
  dstOffset: number,
): Promise<bigint> {
  if (dstOffset + src.byteLength > dst.byteLength) {
    throw new RangeError(`a ${src.byteLength}-byte payload does not fit at ${dstOffset}`);
  }
  const a = src.byteLength > CHECKSUM_SYNC_MAX_BYTES ? addon() : null;
  if (a !== null) {
    // Rejected only for buffers the addon will not copy between (e.g. overlapping views).
    const crc = await a.copyCrc32cAsync(src, dst, dstOffset).catch(() => null);
    if (crc !== null) return BigInt(crc);
  }
  // The checksum first: when the views overlap, the copy changes `src`.
  const crc = payloadChecksum(CHECKSUM_CRC32C, src);
  dst.set(src, dstOffset);
  return crc;
}

/**
 * Fills `dst` from the open file `fd` at `position` and returns the CRC-32C of `dst` from byte
 * `crcFrom` on, in one pass on the libuv pool. `null` when the addon is not loaded (or
 * `KVTIER_NATIVE_CHECKSUM=0`) or the read did not fill `dst` (a file cut short, a read error):
 * the caller then reads the plain way, which reports what is there.
 */
export async function readFileCrc32cAsync(
  fd: number,
  dst: Uint8Array,
  position: number,
  crcFrom: number,
): Promise<number | null> {
  const a = addon();
  if (a === null) return null;
  return a.preadCrc32cAsync(fd, dst, position, crcFrom).catch(() => null);
}
