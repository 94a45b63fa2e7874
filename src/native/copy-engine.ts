import type { CopyEngine, CopySurface, DeviceSurface } from '../data-plane/data-plane.ts';
import { type CopyBuffer, loadNative, type NativeAddon } from './native.ts';

/** A host KV file mapped shared into this process. */
class MappedFile implements DeviceSurface {
  readonly sizeBytes: number;
  #memory: Uint8Array | null;
  constructor(memory: ArrayBuffer) {
    this.#memory = new Uint8Array(memory);
    this.sizeBytes = memory.byteLength;
  }
  get memory(): Uint8Array {
    if (this.#memory === null) throw new Error('mapping is closed');
    return this.#memory;
  }
  close(): Promise<void> {
    // The mapping is unmapped when its ArrayBuffer is collected; dropping our reference is all.
    this.#memory = null;
    return Promise.resolve();
  }
}

/**
 * The data plane's copy engine on the native addon: the engine's KV file is mapped shared
 * (mmap), and each batch of block copies runs as memcpy on worker threads, off the event loop.
 * Returns `engine: null` with the reason when the addon is not built. CUDA devices are not
 * offered here yet (`openCuda` is absent, so a CUDA registration is refused with KVT_CONFIG).
 */
export function createNativeCopyEngine():
  | { engine: CopyEngine; reason: '' }
  | { engine: null; reason: string } {
  const loaded = loadNative();
  if (loaded.addon === null) return { engine: null, reason: loaded.reason };
  const addon: NativeAddon = loaded.addon;
  return {
    reason: '',
    engine: {
      async openFile(path: string): Promise<DeviceSurface> {
        return new MappedFile(addon.mapFile(path, { writable: true }));
      },
      async copy(surfaces: readonly CopySurface[], ops: Float64Array): Promise<void> {
        const buffers: CopyBuffer[] = surfaces.map((s) =>
          s instanceof Uint8Array ? s : (s as MappedFile).memory,
        );
        await addon.copyBatch(buffers, ops);
      },
    },
  };
}
