import { KvtierError } from '../errors.ts';
import {
  COPY_OP_WIDTH,
  COPY_STRIDED_OP_WIDTH,
  type CopyBuffer,
  type DeviceRegion,
  loadNative,
  type NativeAddon,
} from '../native/native-addon.ts';
import type { CopyEngine, CopyOptions, CopySurface, DeviceSurface } from './copy-engine-types.ts';

/** A host KV file mapped shared into this process. */
class MappedFile implements DeviceSurface {
  readonly sizeBytes: number;
  #memory: Uint8Array | null;
  constructor(memory: ArrayBuffer) {
    this.#memory = new Uint8Array(memory);
    this.sizeBytes = memory.byteLength;
  }
  get memory(): Uint8Array {
    if (this.#memory === null) throw new KvtierError('KVT_CLOSED', 'KV file mapping is closed');
    return this.#memory;
  }
  readWord(offset: number): number {
    const m = this.memory;
    return new DataView(m.buffer, m.byteOffset, m.byteLength).getUint32(offset, true);
  }
  writeWord(offset: number, value: number): void {
    const m = this.memory;
    new DataView(m.buffer, m.byteOffset, m.byteLength).setUint32(offset, value >>> 0, true);
  }
  close(): Promise<void> {
    // The mapping is unmapped when its ArrayBuffer is collected; dropping our reference is all.
    this.#memory = null;
    return Promise.resolve();
  }
}

/** An engine's GPU allocation opened from its CUDA IPC handle on device index `device`. */
export class CudaAllocation implements DeviceSurface {
  #open = true;
  constructor(
    readonly ptr: bigint,
    readonly sizeBytes: number,
    private readonly closeHandle: () => void,
    /** Index of the device (in this process) the allocation was opened on; default 0. */
    readonly device = 0,
  ) {}
  close(): Promise<void> {
    if (this.#open) {
      this.#open = false;
      this.closeHandle();
    }
    return Promise.resolve();
  }
}

/** One copy batch split by where its bytes live, in the addon's op formats. */
export interface DeviceOpPlan {
  host: { buffers: CopySurface[]; ops: Float64Array };
  /** Host → device ops `[hostIndex, hostOffset, deviceIndex, deviceOffset, length]`. */
  h2d: { buffers: CopySurface[]; devices: DeviceSurface[]; ops: Float64Array };
  /** Device → host ops in the same order of fields. */
  d2h: { buffers: CopySurface[]; devices: DeviceSurface[]; ops: Float64Array };
}

/** Maps surface indexes of a batch to the indexes of one part's own list, appending on first use. */
function reindexer(surfaces: readonly CopySurface[], list: CopySurface[]): (i: number) => number {
  const map = new Int32Array(surfaces.length).fill(-1);
  return (i) => {
    let j = map[i]!;
    if (j < 0) {
      j = list.push(surfaces[i]!) - 1;
      map[i] = j;
    }
    return j;
  };
}

/**
 * Splits a batch of `[src, srcOffset, dst, dstOffset, length]` ops over mixed surfaces into host
 * copies, host→device copies (loads into GPU blocks) and device→host copies (saves from them),
 * re-indexing each part's buffers. Two passes over typed arrays: a save or load of gigabytes has
 * over a hundred thousand ops. Device→device copies are refused (KVT_INVALID_ARGUMENT).
 */
export function planDeviceOps(
  surfaces: readonly CopySurface[],
  ops: Float64Array,
  isDevice: (s: CopySurface) => boolean,
): DeviceOpPlan {
  const device = new Uint8Array(surfaces.length);
  for (let i = 0; i < surfaces.length; i++) device[i] = isDevice(surfaces[i]!) ? 1 : 0;
  const n = Math.floor(ops.length / COPY_OP_WIDTH);
  const kind = new Uint8Array(n); // 0 host, 1 h2d, 2 d2h
  const counts = [0, 0, 0];
  for (let k = 0; k < n; k++) {
    const src = ops[k * COPY_OP_WIDTH]!;
    const dst = ops[k * COPY_OP_WIDTH + 2]!;
    const sd = device[src];
    const dd = device[dst];
    if (sd === undefined || dd === undefined || !Number.isInteger(src) || !Number.isInteger(dst)) {
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `copy op ${k} names surface ${sd === undefined ? src : dst}, which does not exist`,
      );
    }
    if (sd === 1 && dd === 1)
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `copy op ${k} is device to device, which the data plane never asks for`,
      );
    const c = dd === 1 ? 1 : sd === 1 ? 2 : 0;
    kind[k] = c;
    counts[c]!++;
  }
  const plan: DeviceOpPlan = {
    host: { buffers: [], ops: new Float64Array(counts[0]! * COPY_OP_WIDTH) },
    h2d: { buffers: [], devices: [], ops: new Float64Array(counts[1]! * COPY_OP_WIDTH) },
    d2h: { buffers: [], devices: [], ops: new Float64Array(counts[2]! * COPY_OP_WIDTH) },
  };
  const hostIdx = reindexer(surfaces, plan.host.buffers);
  const h2dHost = reindexer(surfaces, plan.h2d.buffers);
  const h2dDev = reindexer(surfaces, plan.h2d.devices as CopySurface[]);
  const d2hHost = reindexer(surfaces, plan.d2h.buffers);
  const d2hDev = reindexer(surfaces, plan.d2h.devices as CopySurface[]);
  const at = [0, 0, 0];
  for (let k = 0; k < n; k++) {
    const o = k * COPY_OP_WIDTH;
    const src = ops[o]!;
    const srcOff = ops[o + 1]!;
    const dst = ops[o + 2]!;
    const dstOff = ops[o + 3]!;
    const len = ops[o + 4]!;
    const c = kind[k]!;
    const out = c === 0 ? plan.host.ops : c === 1 ? plan.h2d.ops : plan.d2h.ops;
    const w = at[c]!;
    // d2h ops name the host side first, as every device op does.
    out[w] = c === 0 ? hostIdx(src) : c === 1 ? h2dHost(src) : d2hHost(dst);
    out[w + 1] = c === 2 ? dstOff : srcOff;
    out[w + 2] = c === 0 ? hostIdx(dst) : c === 1 ? h2dDev(dst) : d2hDev(src);
    out[w + 3] = c === 2 ? srcOff : dstOff;
    out[w + 4] = len;
    at[c] = w + COPY_OP_WIDTH;
  }
  return plan;
}

/**
 * Splits a batch's ops by the CUDA device they touch (the device surface's `device`), so each
 * part runs on its own device; ops between host buffers only form the part keyed -1. One
 * engine's regions all live on one device, so a data-plane batch is normally a single part,
 * returned without copying the ops.
 */
export function splitOpsByDevice(
  surfaces: readonly CopySurface[],
  ops: Float64Array,
): Map<number, Float64Array> {
  const deviceOf = new Int32Array(surfaces.length);
  for (let i = 0; i < surfaces.length; i++) {
    const s = surfaces[i];
    deviceOf[i] = s instanceof CudaAllocation ? s.device : -1;
  }
  const n = Math.floor(ops.length / COPY_OP_WIDTH);
  const part = new Int32Array(n);
  const counts = new Map<number, number>();
  for (let k = 0; k < n; k++) {
    const a = deviceOf[ops[k * COPY_OP_WIDTH]!] ?? -1;
    const b = deviceOf[ops[k * COPY_OP_WIDTH + 2]!] ?? -1;
    const d = Math.max(a, b);
    part[k] = d;
    counts.set(d, (counts.get(d) ?? 0) + 1);
  }
  if (counts.size === 1) return new Map([[part[0] ?? -1, ops]]);
  const out = new Map<number, Float64Array>();
  const at = new Map<number, number>();
  for (const [d, c] of counts) {
    out.set(d, new Float64Array(c * COPY_OP_WIDTH));
    at.set(d, 0);
  }
  for (let k = 0; k < n; k++) {
    const d = part[k]!;
    const w = at.get(d)!;
    out.get(d)!.set(ops.subarray(k * COPY_OP_WIDTH, (k + 1) * COPY_OP_WIDTH), w);
    at.set(d, w + COPY_OP_WIDTH);
  }
  return out;
}

/**
 * Rewrites strided ops (`[src, srcOffset, dst, dstOffset, length, count, srcStride, dstStride]`)
 * as plain ones, one per piece, for the device copy paths, which take plain ops (and check them).
 * @throws KvtierError `KVT_INVALID_ARGUMENT` when a count or stride is not a non-negative safe
 *   integer, or a stride is below the length of an op of several pieces.
 */
export function expandStridedOps(ops: Float64Array): Float64Array {
  const W = COPY_STRIDED_OP_WIDTH;
  if (ops.length % W !== 0)
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `strided ops length ${ops.length} is not a multiple of ${W}`,
    );
  const n = ops.length / W;
  let pieces = 0;
  for (let k = 0; k < n; k++) {
    const i = k * W;
    const [len, count, srcStride, dstStride] = [ops[i + 4]!, ops[i + 5]!, ops[i + 6]!, ops[i + 7]!];
    for (const v of [count, srcStride, dstStride])
      if (!Number.isSafeInteger(v) || v < 0)
        throw new KvtierError(
          'KVT_INVALID_ARGUMENT',
          `strided copy op ${k}: count and strides must be non-negative integers, got ${v}`,
        );
    if (count > 1 && len > 0 && (srcStride < len || dstStride < len))
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `strided copy op ${k}: strides ${srcStride} and ${dstStride} must be >= the length ${len}`,
      );
    if (len !== 0) pieces += count;
  }
  const out = new Float64Array(pieces * COPY_OP_WIDTH);
  let o = 0;
  for (let k = 0; k < n; k++) {
    const i = k * W;
    const len = ops[i + 4]!;
    if (len === 0) continue;
    const count = ops[i + 5]!;
    for (let p = 0; p < count; p++) {
      out[o] = ops[i]!;
      out[o + 1] = ops[i + 1]! + p * ops[i + 6]!;
      out[o + 2] = ops[i + 2]!;
      out[o + 3] = ops[i + 3]! + p * ops[i + 7]!;
      out[o + 4] = len;
      o += COPY_OP_WIDTH;
    }
  }
  return out;
}

/**
 * The data plane's copy engine on the native addon: the engine's KV file is mapped shared
 * (mmap) and each batch of block copies runs as memcpy on worker threads, off the event loop;
 * when CUDA is available, GPU KV caches are opened from their IPC handles and copied with
 * batched cudaMemcpyAsync. Returns `engine: null` with the reason when the addon is not built.
 */
export function createNativeCopyEngine():
  | { engine: CopyEngine; reason: '' }
  | { engine: null; reason: string } {
  const loaded = loadNative();
  if (loaded.addon === null) return { engine: null, reason: loaded.reason };
  const addon: NativeAddon = loaded.addon;
  const hostBuffer = (s: CopySurface): CopyBuffer =>
    s instanceof Uint8Array ? s : (s as MappedFile).memory;
  const isDevice = (s: CopySurface) => s instanceof CudaAllocation;
  const region = (s: DeviceSurface): DeviceRegion => ({
    ptr: (s as CudaAllocation).ptr,
    bytes: s.sizeBytes,
  });
  // One batch on one device: host copies, host-to-device and device-to-host, concurrently.
  const copyOnDevice = async (
    surfaces: readonly CopySurface[],
    ops: Float64Array,
    device: number,
    options: CopyOptions,
  ): Promise<void> => {
    const plan = planDeviceOps(surfaces, ops, isDevice);
    await Promise.all([
      plan.host.ops.length > 0
        ? addon.copyBatch(plan.host.buffers.map(hostBuffer), plan.host.ops)
        : null,
      plan.h2d.ops.length > 0
        ? addon.copyBatchDevice(
            'h2d',
            plan.h2d.buffers.map(hostBuffer),
            plan.h2d.devices.map(region),
            plan.h2d.ops,
            { device },
          )
        : null,
      plan.d2h.ops.length > 0
        ? addon.copyBatchDevice(
            'd2h',
            plan.d2h.buffers.map(hostBuffer),
            plan.d2h.devices.map(region),
            plan.d2h.ops,
            options.waitEvent !== undefined ? { device, waitEvent: options.waitEvent } : { device },
          )
        : null,
    ]);
  };
  const engine: CopyEngine = {
    async openFile(path: string): Promise<DeviceSurface> {
      return new MappedFile(addon.mapFile(path, { writable: true }));
    },
    async copy(
      surfaces: readonly CopySurface[],
      ops: Float64Array,
      options: CopyOptions = {},
    ): Promise<void> {
      if (!surfaces.some(isDevice)) {
        await addon.copyBatch(surfaces.map(hostBuffer), ops);
        return;
      }
      const parts = splitOpsByDevice(surfaces, ops);
      await Promise.all(
        [...parts].map(([device, part]) =>
          copyOnDevice(surfaces, part, Math.max(device, 0), options),
        ),
      );
    },
    // Host batches run strided in the addon; the device paths take the pieces as plain ops.
    async copyStrided(
      surfaces: readonly CopySurface[],
      ops: Float64Array,
      options: CopyOptions = {},
    ): Promise<void> {
      if (!surfaces.some(isDevice)) {
        await addon.copyBatchStrided(surfaces.map(hostBuffer), ops);
        return;
      }
      await engine.copy(surfaces, expandStridedOps(ops), options);
    },
  };
  engine.describe = () => {
    const cuda = addon.probe().cuda;
    return {
      kind: 'native',
      addon: addon.path,
      cuda: {
        ...cuda,
        ...(cuda.available
          ? { deviceUuids: engine.cudaDevices?.() ?? [], copies: addon.deviceCopyCounts() }
          : {}),
      },
    };
  };
  // GPU KV caches are offered only where the run-time probe found a usable CUDA device.
  if (addon.probe().cuda.available) {
    let uuids: readonly string[] | undefined;
    engine.cudaDevices = () => {
      uuids ??= Object.freeze(addon.cudaDeviceUuids());
      return uuids;
    };
    engine.openCuda = async (
      ipcHandle: string,
      allocationBytes: number,
      device: number,
    ): Promise<DeviceSurface> => {
      const handle = Buffer.from(ipcHandle, 'hex');
      const ptr = addon.cudaIpcOpenMemHandle(handle, { device });
      return new CudaAllocation(
        ptr,
        allocationBytes,
        () => addon.cudaIpcCloseMemHandle(ptr, { device }),
        device,
      );
    };
  }
  return { reason: '', engine };
}
