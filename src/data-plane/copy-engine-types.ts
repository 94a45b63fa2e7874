/**
 * The copy-engine port of the data plane: what a copy engine opens and copies between. A leaf
 * module, so the data plane and every engine (`fs-copy-engine.ts`, `native-copy-engine.ts`)
 * import it without importing each other.
 */

/** A KV container the copy engine opened: a host file (mapped or by positional I/O) or a GPU allocation. */
export interface DeviceSurface {
  readonly sizeBytes: number;
  /**
   * The little-endian u32 at `offset`, read now from a host mapping (state files); absent where
   * the surface is not mapped into this process (then read it with a copy).
   */
  readWord?(offset: number): number;
  /** Writes the little-endian u32 at `offset` now, into a host mapping (state files); absent likewise. */
  writeWord?(offset: number, value: number): void;
  /** Releases the mapping or handle; idempotent. */
  close(): Promise<void>;
}

/** What copy ops address: host memory (arena pages) or an opened device surface. */
export type CopySurface = Uint8Array | DeviceSurface;

/** Per-batch options of {@link CopyEngine.copy}. */
export interface CopyOptions {
  /**
   * A CUDA interprocess event (64-byte `cudaIpcEventHandle_t`) the engine recorded after writing
   * the blocks: device-to-host copies wait for it on the GPU. Ignored by engines without CUDA.
   */
  waitEvent?: Uint8Array;
}

/**
 * Copies between surfaces off the event loop. `ops` is a flat list of 5-tuples
 * `[srcSurface, srcOffset, dstSurface, dstOffset, length]` indexing `surfaces` (the shape the
 * native addon's `jsCopyBatch` takes). Rejects when any op fails; the destination may then be
 * partly written.
 */
export interface CopyEngine {
  /** Opens a host shared-memory KV (or state) file for reading and writing, shared with its creator. */
  openFile(path: string): Promise<DeviceSurface>;
  /**
   * Opens a CUDA IPC allocation on device `device` (an index among the devices this process
   * sees, from {@link CopyEngine.cudaDevices}); copies touching the surface run on that device.
   * Absent on engines without CUDA.
   */
  openCuda?(ipcHandle: string, allocationBytes: number, device: number): Promise<DeviceSurface>;
  /**
   * UUIDs of the CUDA devices this process sees, by index (`GPU-xxxxxxxx-...`); present with
   * `openCuda`. Registrations name their GPU by UUID and are opened on its index here.
   */
  cudaDevices?(): readonly string[];
  copy(surfaces: readonly CopySurface[], ops: Float64Array, options?: CopyOptions): Promise<void>;
  /**
   * {@link CopyEngine.copy} with strided ops, 8-tuples
   * `[srcSurface, srcOffset, dstSurface, dstOffset, length, count, srcStride, dstStride]`:
   * `count` pieces of `length` bytes, piece `k` from `srcOffset + k * srcStride` to
   * `dstOffset + k * dstStride` (strides >= `length` when `count` > 1). Optional: the data plane
   * sends strided ops (HND blocks, one op per head) only to engines that have it, plain ops to
   * the others.
   */
  copyStrided?(
    surfaces: readonly CopySurface[],
    ops: Float64Array,
    options?: CopyOptions,
  ): Promise<void>;
  /** What the engine is and can do, for PING and logs (`kind`, and `cuda` where it applies). */
  describe?(): Record<string, unknown>;
}
