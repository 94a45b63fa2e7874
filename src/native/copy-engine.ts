import {
  COPY_OP_WIDTH,
  type CopyBuffer,
  type DeviceRegion,
  loadNative,
  type NativeAddon,
} from '../addon/native-addon.ts';
import type {
  CopyEngine,
  CopyOptions,
  CopySurface,
  DeviceSurface,
} from '../data-plane/copy-engine-types.ts';
import { KvtierError } from '../errors.ts';

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
  host: { buffers: CopySurface[]; ops: number[] };
  /** Host → device ops `[hostIndex, hostOffset, deviceIndex, deviceOffset, length]`. */
  h2d: { buffers: CopySurface[]; devices: DeviceSurface[]; ops: number[] };
  /** Device → host ops in the same order of fields. */
  d2h: { buffers: CopySurface[]; devices: DeviceSurface[]; ops: number[] };
}

/**
 * Splits a batch of `[src, srcOffset, dst, dstOffset, length]` ops over mixed surfaces into host
 * copies, host→device copies (loads into GPU blocks) and device→host copies (saves from them),
 * re-indexing each part's buffers. Device→device copies are refused (KVT_INVALID_ARGUMENT).
 */
export function planDeviceOps(
  surfaces: readonly CopySurface[],
  ops: Float64Array,
  isDevice: (s: CopySurface) => boolean,
): DeviceOpPlan {
  const plan: DeviceOpPlan = {
    host: { buffers: [], ops: [] },
    h2d: { buffers: [], devices: [], ops: [] },
    d2h: { buffers: [], devices: [], ops: [] },
  };
  const indexer =
    <T>(list: T[], map: Map<number, number>) =>
    (i: number) => {
      let j = map.get(i);
      if (j === undefined) {
        j = list.push(surfaces[i] as T) - 1;
        map.set(i, j);
      }
      return j;
    };
  const hostIdx = indexer(plan.host.buffers, new Map());
  const h2dHost = indexer(plan.h2d.buffers, new Map());
  const h2dDev = indexer(plan.h2d.devices as CopySurface[], new Map());
  const d2hHost = indexer(plan.d2h.buffers, new Map());
  const d2hDev = indexer(plan.d2h.devices as CopySurface[], new Map());
  for (let k = 0; k < ops.length; k += COPY_OP_WIDTH) {
    const src = ops[k]!;
    const srcOff = ops[k + 1]!;
    const dst = ops[k + 2]!;
    const dstOff = ops[k + 3]!;
    const len = ops[k + 4]!;
    const s = surfaces[src];
    const d = surfaces[dst];
    if (s === undefined || d === undefined) {
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `copy op ${k / COPY_OP_WIDTH} names surface ${s === undefined ? src : dst}, which does not exist`,
      );
    }
    const sd = isDevice(s);
    const dd = isDevice(d);
    if (sd && dd)
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `copy op ${k / COPY_OP_WIDTH} is device to device, which the data plane never asks for`,
      );
    if (!sd && !dd) plan.host.ops.push(hostIdx(src), srcOff, hostIdx(dst), dstOff, len);
    else if (dd) plan.h2d.ops.push(h2dHost(src), srcOff, h2dDev(dst), dstOff, len);
    else plan.d2h.ops.push(d2hHost(dst), dstOff, d2hDev(src), srcOff, len);
  }
  return plan;
}

/**
 * Splits a batch's ops by the CUDA device they touch (the device surface's `device`), so each
 * part runs on its own device; ops between host buffers only form the part keyed -1. One
 * engine's regions all live on one device, so a data-plane batch is normally a single part.
 */
export function splitOpsByDevice(
  surfaces: readonly CopySurface[],
  ops: Float64Array,
): Map<number, Float64Array> {
  const deviceOf = (i: number) => {
    const s = surfaces[i];
    return s instanceof CudaAllocation ? s.device : -1;
  };
  const parts = new Map<number, number[]>();
  for (let k = 0; k < ops.length; k += COPY_OP_WIDTH) {
    const d = Math.max(deviceOf(ops[k]!), deviceOf(ops[k + 2]!));
    let part = parts.get(d);
    if (part === undefined) {
      part = [];
      parts.set(d, part);
    }
    for (let j = 0; j < COPY_OP_WIDTH; j++) part.push(ops[k + j]!);
  }
  return new Map([...parts].map(([d, p]) => [d, Float64Array.from(p)]));
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
        ? addon.copyBatch(plan.host.buffers.map(hostBuffer), Float64Array.from(plan.host.ops))
        : null,
      plan.h2d.ops.length > 0
        ? addon.copyBatchDevice(
            'h2d',
            plan.h2d.buffers.map(hostBuffer),
            plan.h2d.devices.map(region),
            Float64Array.from(plan.h2d.ops),
            { device },
          )
        : null,
      plan.d2h.ops.length > 0
        ? addon.copyBatchDevice(
            'd2h',
            plan.d2h.buffers.map(hostBuffer),
            plan.d2h.devices.map(region),
            Float64Array.from(plan.d2h.ops),
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
