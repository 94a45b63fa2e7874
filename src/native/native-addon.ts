import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { availableParallelism } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { abortedError } from '../errors.ts';
import { requireInt, requireOneOf } from '../util/validate.ts';
import { type NativeFileIo, RAW_FILE_FUNCTIONS, type RawFileIo, wrapFileIo } from './file-io.ts';
import { guard, toNativeError } from './native-error.ts';

export { NativeError, type NativeErrorCode } from './native-error.ts';

/**
 * The one declaration of the `native-cuda` addon's surface (`kvtier_native.node`) and its
 * loader; a leaf module (it imports only errors, its own error mapping and validation). The
 * data plane's copy engine on the addon is `copy-engine.ts`; without the addon the sidecar
 * copies with `data-plane/fs-copy-engine.ts` (positional file I/O), and host slabs come from
 * Node buffers.
 */

/** Numbers per copy op in an ops array: `[srcIndex, srcOffset, dstIndex, dstOffset, length]`. */
export const COPY_OP_WIDTH = 5;

/**
 * Numbers per strided copy op:
 * `[srcIndex, srcOffset, dstIndex, dstOffset, length, count, srcStride, dstStride]`, `count`
 * pieces of `length` bytes, piece `k` from `srcOffset + k * srcStride` to
 * `dstOffset + k * dstStride`.
 */
export const COPY_STRIDED_OP_WIDTH = 8;

/** Largest slab {@link NativeAddon.allocSlab} hands out: 1 GiB. */
export const MAX_NATIVE_SLAB_BYTES = 1024 * 1024 * 1024;

/** Default `maxThreads` of a host copy batch: the core count, at most 4. */
export const DEFAULT_COPY_THREADS = Math.max(1, Math.min(4, availableParallelism()));

/** What the CUDA side can do in this process. */
export interface CudaProbe {
  /** The addon was built with the CUDA part (nvcc found, `KVTIER_NO_CUDA` unset). */
  readonly compiled: boolean;
  /** A driver and at least one device answered; CUDA functions work only when true. */
  readonly available: boolean;
  /** Number of visible devices (0 when unavailable). */
  readonly devices: number;
  /** `'ok'`, or why CUDA is unavailable (no driver, no device, not compiled, disabled). */
  readonly reason: string;
}

/** Result of {@link NativeAddon.probe}. */
export interface NativeProbe {
  /** The host part (slabs, file mappings, host copies) always works once the addon loads. */
  readonly host: true;
  /** System page size in bytes; `mapFile` offsets must be multiples of it. */
  readonly pageBytes: number;
  readonly cuda: CudaProbe;
  /** CRC-32C runs on the CPU's crc32 instruction (SSE4.2); false: a table, about 8x slower. */
  readonly crc32cHardware: boolean;
}

/** Memory a copy op may name: a whole ArrayBuffer, or the bytes a view covers. */
export type CopyBuffer = ArrayBuffer | ArrayBufferView;

/** Options of a host copy batch. */
export interface CopyBatchOptions {
  /** Threads one large batch may use, the worker included: 1..64. Default {@link DEFAULT_COPY_THREADS}. */
  maxThreads?: number;
  /** Checked before the batch starts; a started batch runs to completion. */
  signal?: AbortSignal;
}

/** Options of {@link NativeAddon.mapFile}. */
export interface MapFileOptions {
  /** Where the mapping starts in the file; a multiple of the page size. Default 0. */
  offsetBytes?: number;
  /** Bytes to map; default (or 0): to the end of the file. Must lie inside the file. */
  lengthBytes?: number;
  /**
   * Default false. True maps the file shared: writes reach the file and every other mapping.
   * False maps it copy-on-write: other processes' writes are seen, this process's stay private.
   */
  writable?: boolean;
}

/** A device memory range, e.g. from {@link NativeAddon.cudaIpcOpenMemHandle}. */
export interface DeviceRegion {
  readonly ptr: bigint;
  readonly bytes: number;
}

/** Options naming a CUDA device: index 0.. (default 0). */
export interface DeviceOptions {
  device?: number;
}

/** Direction of a device batch: host to device, or device to host. */
export type CopyDirection = 'h2d' | 'd2h';

/**
 * How a device batch is issued (native-cuda/src/cuda_copy.h): `memcpy` one cudaMemcpyAsync per
 * coalesced run; `batch` one cudaMemcpyBatchAsync; `kernel` one gather/scatter kernel reading
 * and writing the pinned host pages through their device mapping (small blocks at the link's
 * rate; falls back to memcpy when a host buffer is not mapped pinned memory); `staged` the host
 * side as long contiguous spans by DMA through a 16 MiB device staging buffer, the blocks
 * scattered or gathered there by the kernel; `auto` (default; `KVTIER_CUDA_COPY` overrides it)
 * staged when the host side forms spans of 512 KiB or more on average (a chunk's payload) and
 * runs average 16 KiB or more, else the kernel for runs under 1 MiB on average whose host memory
 * is mapped, else memcpy.
 */
export type DeviceCopyMethod = 'auto' | 'memcpy' | 'batch' | 'kernel' | 'staged';

/** Options of {@link NativeAddon.copyBatchDevice}. */
export interface DeviceCopyOptions extends DeviceOptions {
  /** Default 'auto'. */
  method?: DeviceCopyMethod;
  /**
   * A 64-byte `cudaIpcEventHandle_t` another process recorded after writing the device bytes
   * (an interprocess event): the copies start only after it has completed.
   */
  waitEvent?: Uint8Array;
  /** Checked before the batch starts; a started batch runs to completion. */
  signal?: AbortSignal;
}

/**
 * Device copy batches so far in this process, by the method that ran them: their coalesced runs
 * and bytes, and the time spent planning them (validation, coalescing, host mappings), issuing
 * them and waiting for them, summed over batches (ms).
 */
export type DeviceCopyCounts = Record<
  'memcpy' | 'batch' | 'kernel' | 'staged',
  { batches: number; runs: number; bytes: number; planMs: number; issueMs: number; waitMs: number }
>;

/** The addon's exports as the C++ side registers them (native-cuda/src/addon.cc). */
interface RawAddon extends RawFileIo {
  probe(): NativeProbe;
  allocSlab(bytes: number): ArrayBuffer;
  prefaultAsync(buffer: CopyBuffer): Promise<number>;
  mapFile(path: string, offset: number, length: number, writable: boolean): ArrayBuffer;
  addressOf(buffer: CopyBuffer): bigint;
  copyBatch(buffers: readonly CopyBuffer[], ops: Float64Array, maxThreads: number): Promise<number>;
  copyBatchStrided(
    buffers: readonly CopyBuffer[],
    ops: Float64Array,
    maxThreads: number,
  ): Promise<number>;
  crc32c(buffer: CopyBuffer, crc: number): number;
  crc32cAsync(buffer: CopyBuffer, crc: number): Promise<number>;
  copyCrc32cAsync(src: CopyBuffer, dst: CopyBuffer, dstOffset: number): Promise<number>;
  preadCrc32cAsync(fd: number, dst: CopyBuffer, position: number, crcFrom: number): Promise<number>;
  cudaDeviceUuids(): string[];
  cudaIpcOpen(handle: Uint8Array, device: number): bigint;
  cudaIpcClose(ptr: bigint, device: number): void;
  cudaIpcGetHandle(ptr: bigint, device: number): ArrayBuffer;
  cudaMalloc(bytes: number, device: number): bigint;
  cudaFree(ptr: bigint, device: number): void;
  copyBatchDevice(
    direction: CopyDirection,
    hostBuffers: readonly CopyBuffer[],
    deviceRegions: BigUint64Array,
    ops: Float64Array,
    device: number,
    options: { method?: string; waitEvent?: Uint8Array },
  ): Promise<number>;
  deviceCopyCounts(): DeviceCopyCounts;
}

/**
 * The loaded addon. Every method throws (or rejects with) {@link NativeError}. Memory returned
 * as an ArrayBuffer is owned by that ArrayBuffer and released when it is garbage collected.
 */
export interface NativeAddon {
  /** Absolute path of the loaded `.node` file. */
  readonly path: string;
  /** Capabilities; the CUDA part is probed once per process. Never throws. */
  probe(): NativeProbe;
  /** Whole-object file operations for the file tiers (file-io.ts). */
  readonly files: NativeFileIo;
  /**
   * Page-aligned, zero-filled host memory of `bytes` (1..1 GiB), pinned with CUDA when CUDA is
   * available. Throws `KVT_TOO_LARGE` above 1 GiB, `KVT_CAPACITY` when the host is out of memory.
   */
  allocSlab(bytes: number): ArrayBuffer;
  /**
   * Commits the memory `buffer` covers (each whole system page inside it) writable, on the libuv
   * pool, with `madvise(MADV_POPULATE_WRITE)`: the contents are not changed (present pages are
   * left alone; missing ones come in zero filled, as a first write would bring them), so copies
   * may run into the same bytes meanwhile. Resolves with the bytes covered, or `'unsupported'`
   * when the kernel lacks it (Linux < 5.14). The buffer is kept alive until it settles.
   * @throws NativeError `KVT_CAPACITY` (`ENOMEM`) when the host is out of memory, `KVT_BACKEND`
   *   with the errno name otherwise.
   */
  prefault(buffer: CopyBuffer): Promise<number | 'unsupported'>;
  /**
   * Maps a file (e.g. an engine's KV cache in /dev/shm). Throws `KVT_INVALID_ARGUMENT`
   * (`ERR_MISALIGNED` offset, `ERR_OUT_OF_RANGE` beyond the end of the file), `KVT_NOT_FOUND`
   * (`ENOENT`), or `KVT_BACKEND` with the errno name as `nativeCode`. Touching a mapping after
   * the file was truncated below it kills the process (SIGBUS): files must not shrink.
   */
  mapFile(path: string, options?: MapFileOptions): ArrayBuffer;
  /** Address of the first byte of `buffer` (tests and diagnostics). */
  addressOf(buffer: CopyBuffer): bigint;
  /**
   * Runs a batch of copies on the libuv pool. `ops` holds 5-tuples
   * `[srcIndex, srcOffset, dstIndex, dstOffset, length]` indexing `buffers`. Every op is checked
   * before anything is copied: fields are non-negative integers (`ERR_BAD_OP`), indexes exist
   * (`ERR_BAD_OP`), ranges lie inside their buffers (`ERR_OUT_OF_RANGE`), and no byte is written
   * twice or both read and written by the batch (`ERR_OVERLAP`, judged per underlying
   * ArrayBuffer), so the copies may run in any order; a bad batch rejects with `KVT_INVALID_ARGUMENT`
   * and copies nothing. Zero-length ops are checked and skipped; an op whose source and
   * destination both continue the previous op's is merged into it. Resolves with the number of
   * contiguous copies left after coalescing.
   */
  copyBatch(
    buffers: readonly CopyBuffer[],
    ops: Float64Array,
    options?: CopyBatchOptions,
  ): Promise<number>;
  /**
   * {@link NativeAddon.copyBatch} with strided ops ({@link COPY_STRIDED_OP_WIDTH} numbers each):
   * `[srcIndex, srcOffset, dstIndex, dstOffset, length, count, srcStride, dstStride]` copies
   * `count` pieces of `length` bytes, piece `k` from `srcOffset + k * srcStride` to
   * `dstOffset + k * dstStride` (one op per head of an HND block instead of one per token and
   * head). With `count` > 1 each stride must be >= `length` (`ERR_BAD_OP`), and the last piece
   * must end inside its buffer (`ERR_OUT_OF_RANGE`); `count` 0 or `length` 0 is checked and
   * skipped. The overlap rule is the same, judged piece by piece (`ERR_OVERLAP`); a batch whose
   * strided destinations interleave so irregularly that the check would need more than 2^26
   * pieces is refused (`ERR_TOO_LARGE`). Ops contiguous on both sides are coalesced as plain
   * ops are. Resolves with the number of copies left (a strided op counts once).
   */
  copyBatchStrided(
    buffers: readonly CopyBuffer[],
    ops: Float64Array,
    options?: CopyBatchOptions,
  ): Promise<number>;
  /**
   * CRC-32C (Castagnoli) of the bytes `buffer` covers, on the calling thread, continuing from
   * `crc` (default 0 = start): the same value as `crc32c` in src/util/crc32c.ts. Blocks the
   * event loop about 1 ms per 30 MB with the CPU instruction: use it for small buffers.
   */
  crc32c(buffer: CopyBuffer, crc?: number): number;
  /**
   * {@link NativeAddon.crc32c} on the libuv pool: the event loop is not blocked. The buffer must
   * not change until the promise settles (the addon keeps it alive, not unchanged).
   */
  crc32cAsync(buffer: CopyBuffer, crc?: number): Promise<number>;
  /**
   * Copies `src` into `dst` at byte `dstOffset` and returns the CRC-32C of the copied bytes, in
   * one pass on the libuv pool (each cache-sized block is checksummed right after it is copied,
   * from the destination). Neither buffer may change until the promise settles.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` when `src` does not fit at `dstOffset` or the
   *   two overlap.
   */
  copyCrc32cAsync(src: CopyBuffer, dst: CopyBuffer, dstOffset: number): Promise<number>;
  /**
   * Fills `dst` from the open file `fd` at byte `position` (continued over short reads) and
   * returns the CRC-32C of `dst` from byte `crcFrom` on, in one pass on the libuv pool (each
   * 256 KiB block is checksummed right after it is read). `fd` must stay open and `dst`
   * unchanged until the promise settles.
   * @throws NativeError `KVT_BACKEND`: `nativeCode` `ERR_SHORT_READ` when the file ends before
   *   `dst` is full, `EIO` when a read fails.
   */
  preadCrc32cAsync(fd: number, dst: CopyBuffer, position: number, crcFrom: number): Promise<number>;
  /**
   * The UUID of every CUDA device this process sees, by device index (so index `i` is the
   * `device` option that names it), as `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` in lowercase
   * hex, the form `nvidia-smi -L` prints. `CUDA_VISIBLE_DEVICES` decides which devices and in
   * what order, so the same GPU may have another index in another process; its UUID is the same.
   * Needs CUDA (throws `KVT_BACKEND` / `ERR_NO_CUDA` without it).
   */
  cudaDeviceUuids(): string[];
  /** Opens an engine's 64-byte CUDA IPC handle; returns the device pointer. Needs CUDA. */
  cudaIpcOpenMemHandle(handle: Uint8Array, options?: DeviceOptions): bigint;
  /** Closes a pointer from {@link NativeAddon.cudaIpcOpenMemHandle}. Needs CUDA. */
  cudaIpcCloseMemHandle(ptr: bigint, options?: DeviceOptions): void;
  /** Exports a 64-byte IPC handle of device memory (tests, benchmarks). Needs CUDA. */
  cudaIpcGetMemHandle(ptr: bigint, options?: DeviceOptions): Uint8Array;
  /** Allocates device memory (tests, benchmarks); free with `cudaFree`. Needs CUDA. */
  cudaMalloc(bytes: number, options?: DeviceOptions): bigint;
  /** Frees memory from {@link NativeAddon.cudaMalloc}. Needs CUDA. */
  cudaFree(ptr: bigint, options?: DeviceOptions): void;
  /**
   * Copies between host buffers and device regions on a fresh stream, by the method of
   * `options.method` ({@link DeviceCopyMethod}); ops are
   * `[hostIndex, hostOffset, deviceIndex, deviceOffset, length]` whatever the direction, all
   * bounds-checked first, adjacent ones coalesced. With `waitEvent` the stream first waits for
   * that interprocess event. Resolves (with the number of coalesced copies) once a completion
   * event fired. Rejects `KVT_BACKEND` / `ERR_NO_CUDA` without CUDA.
   */
  copyBatchDevice(
    direction: CopyDirection,
    hostBuffers: readonly CopyBuffer[],
    deviceRegions: readonly DeviceRegion[],
    ops: Float64Array,
    options?: DeviceCopyOptions,
  ): Promise<number>;
  /** Device copy batches this process ran, by method (all zero without CUDA). Never throws. */
  deviceCopyCounts(): DeviceCopyCounts;
}

/** Result of {@link loadNative}: the addon, or why it could not be loaded. */
export type LoadNativeResult = { addon: NativeAddon } | { addon: null; reason: string };

const ADDON_FILE = join('native-cuda', 'build', 'Release', 'kvtier_native.node');
let loaded: LoadNativeResult | undefined;

/**
 * Loads the addon once per process and caches the outcome; never throws. The file is
 * `$KVTIER_NATIVE_PATH` when set, otherwise `native-cuda/build/Release/kvtier_native.node` in
 * the nearest enclosing directory that has one (so this works from `src/` and from `dist/`).
 */
export function loadNative(): LoadNativeResult {
  loaded ??= tryLoad();
  return loaded;
}

function tryLoad(): LoadNativeResult {
  const fromEnv = process.env.KVTIER_NATIVE_PATH;
  const path = fromEnv ? resolve(fromEnv) : findAddon();
  if (path === null) {
    return {
      addon: null,
      reason: `native addon not built: no ${ADDON_FILE} above ${here()} (run the build:native script)`,
    };
  }
  if (!existsSync(path)) {
    return {
      addon: null,
      reason: `native addon not found: KVTIER_NATIVE_PATH=${fromEnv} does not exist`,
    };
  }
  try {
    const raw = createRequire(import.meta.url)(path) as RawAddon;
    const missing = [...RAW_FUNCTIONS, ...RAW_FILE_FUNCTIONS].filter(
      (f) => typeof raw[f] !== 'function',
    );
    if (missing.length > 0) {
      return {
        addon: null,
        reason: `native addon at ${path} is older than this kvtier (no ${missing.join(', ')}): run the build:native script`,
      };
    }
    return { addon: wrap(raw, path) };
  } catch (err) {
    return { addon: null, reason: `native addon at ${path} failed to load: ${String(err)}` };
  }
}

/** Every function this version calls: an addon built from older sources lacks some. */
const RAW_FUNCTIONS: readonly (keyof RawAddon)[] = [
  'probe',
  'allocSlab',
  'mapFile',
  'addressOf',
  'copyBatch',
  'copyBatchStrided',
  'crc32c',
  'crc32cAsync',
  'copyCrc32cAsync',
  'preadCrc32cAsync',
  'cudaDeviceUuids',
  'cudaIpcOpen',
  'cudaIpcClose',
  'cudaIpcGetHandle',
  'cudaMalloc',
  'cudaFree',
  'copyBatchDevice',
  'deviceCopyCounts',
  'prefaultAsync',
];

function here(): string {
  return dirname(fileURLToPath(import.meta.url));
}

function findAddon(): string | null {
  let dir = here();
  for (let i = 0; i < 6; i++) {
    const candidate = join(dir, ADDON_FILE);
    if (existsSync(candidate)) return candidate;
    dir = dirname(dir);
  }
  return null;
}

function deviceOf(options: DeviceOptions | undefined): number {
  return requireInt('device', options?.device ?? 0, 0, 1023);
}

function wrap(raw: RawAddon, path: string): NativeAddon {
  return {
    path,
    probe: () => raw.probe(),
    files: wrapFileIo(raw, toNativeError),
    allocSlab: (bytes) =>
      guard(() => raw.allocSlab(requireInt('bytes', bytes, 1, MAX_NATIVE_SLAB_BYTES))),
    prefault: async (buffer) =>
      guard(() => raw.prefaultAsync(buffer)).then(
        (bytes) => (bytes < 0 ? 'unsupported' : bytes),
        (err: unknown) => {
          throw toNativeError(err);
        },
      ),
    mapFile: (file, options = {}) =>
      guard(() =>
        raw.mapFile(
          file,
          requireInt('offsetBytes', options.offsetBytes ?? 0, 0),
          requireInt('lengthBytes', options.lengthBytes ?? 0, 0),
          options.writable ?? false,
        ),
      ),
    addressOf: (buffer) => guard(() => raw.addressOf(buffer)),
    copyBatch: async (buffers, ops, options = {}) => {
      if (options.signal?.aborted) throw abortedError(options.signal, 'copyBatch');
      const threads = requireInt('maxThreads', options.maxThreads ?? DEFAULT_COPY_THREADS, 1, 64);
      return guard(() => raw.copyBatch(buffers, ops, threads)).catch((err: unknown) => {
        throw toNativeError(err);
      });
    },
    copyBatchStrided: async (buffers, ops, options = {}) => {
      if (options.signal?.aborted) throw abortedError(options.signal, 'copyBatchStrided');
      const threads = requireInt('maxThreads', options.maxThreads ?? DEFAULT_COPY_THREADS, 1, 64);
      return guard(() => raw.copyBatchStrided(buffers, ops, threads)).catch((err: unknown) => {
        throw toNativeError(err);
      });
    },
    crc32c: (buffer, crc = 0) =>
      guard(() => raw.crc32c(buffer, requireInt('crc', crc, 0, 0xffff_ffff))),
    crc32cAsync: async (buffer, crc = 0) =>
      guard(() => raw.crc32cAsync(buffer, requireInt('crc', crc, 0, 0xffff_ffff))).catch(
        (err: unknown) => {
          throw toNativeError(err);
        },
      ),
    copyCrc32cAsync: async (src, dst, dstOffset) =>
      guard(() =>
        raw.copyCrc32cAsync(
          src,
          dst,
          requireInt('dstOffset', dstOffset, 0, Number.MAX_SAFE_INTEGER),
        ),
      ).catch((err: unknown) => {
        throw toNativeError(err);
      }),
    preadCrc32cAsync: async (fd, dst, position, crcFrom) =>
      guard(() =>
        raw.preadCrc32cAsync(
          requireInt('fd', fd, 0, 0x7fff_ffff),
          dst,
          requireInt('position', position, 0, Number.MAX_SAFE_INTEGER),
          requireInt('crcFrom', crcFrom, 0, Number.MAX_SAFE_INTEGER),
        ),
      ).catch((err: unknown) => {
        throw toNativeError(err);
      }),
    cudaDeviceUuids: () => guard(() => raw.cudaDeviceUuids()),
    deviceCopyCounts: () => raw.deviceCopyCounts(),
    cudaIpcOpenMemHandle: (handle, options) =>
      guard(() => raw.cudaIpcOpen(handle, deviceOf(options))),
    cudaIpcCloseMemHandle: (ptr, options) => guard(() => raw.cudaIpcClose(ptr, deviceOf(options))),
    cudaIpcGetMemHandle: (ptr, options) =>
      new Uint8Array(guard(() => raw.cudaIpcGetHandle(ptr, deviceOf(options)))),
    cudaMalloc: (bytes, options) =>
      guard(() => raw.cudaMalloc(requireInt('bytes', bytes, 1), deviceOf(options))),
    cudaFree: (ptr, options) => guard(() => raw.cudaFree(ptr, deviceOf(options))),
    copyBatchDevice: async (direction, hostBuffers, deviceRegions, ops, options = {}) => {
      if (options.signal?.aborted) throw abortedError(options.signal, 'copyBatchDevice');
      const regions = new BigUint64Array(deviceRegions.length * 2);
      deviceRegions.forEach((r, i) => {
        regions[2 * i] = r.ptr;
        regions[2 * i + 1] = BigInt(requireInt(`deviceRegions[${i}].bytes`, r.bytes, 0));
      });
      const device = deviceOf(options);
      const extra = {
        ...(options.method !== undefined
          ? {
              method: requireOneOf('method', options.method, [
                'auto',
                'memcpy',
                'batch',
                'kernel',
                'staged',
              ] as const),
            }
          : {}),
        ...(options.waitEvent !== undefined ? { waitEvent: options.waitEvent } : {}),
      };
      return guard(() =>
        raw.copyBatchDevice(direction, hostBuffers, regions, ops, device, extra),
      ).catch((err: unknown) => {
        throw toNativeError(err);
      });
    },
  };
}
