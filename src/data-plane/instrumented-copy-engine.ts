import type { KvtierMetrics } from '../metrics/metrics.ts';
import type { CopyEngine, CopySurface } from './data-plane.ts';

/** Length of one op in a copy batch: `[srcSurface, srcOffset, dstSurface, dstOffset, length]`. */
const OP_FIELDS = 5;
/** Length of a strided op: `[..., length, count, srcStride, dstStride]` (`count` pieces of `length`). */
const STRIDED_OP_FIELDS = 8;

function isHost(s: CopySurface | undefined): boolean {
  return s instanceof Uint8Array;
}

/**
 * Wraps a copy engine so that the bytes it moves between the engine's KV memory (a device
 * surface) and host memory are counted in `kvtier_dataplane_bytes_total{direction}`: `save`
 * for device to host, `load` for host to device (the 4-byte load state word included).
 * Counted when a batch resolves; a rejected batch counts nothing (it may be partly written).
 * Host-to-host and device-to-device ops are not data-plane traffic and are not counted.
 * Optional methods (`copyStrided`, `openCuda`, `cudaDevices`) are present exactly when the inner engine has them.
 */
export function instrumentCopyEngine(inner: CopyEngine, metrics: KvtierMetrics): CopyEngine {
  const counter = metrics.dataPlaneBytes;
  const out: CopyEngine = {
    openFile: (path) => inner.openFile(path),
    async copy(surfaces, ops, options) {
      let save = 0;
      let load = 0;
      for (let i = 0; i + OP_FIELDS <= ops.length; i += OP_FIELDS) {
        const src = isHost(surfaces[ops[i]!]);
        const dst = isHost(surfaces[ops[i + 2]!]);
        if (src && !dst) load += ops[i + 4]!;
        else if (!src && dst) save += ops[i + 4]!;
      }
      await inner.copy(surfaces, ops, options);
      if (save > 0) counter.inc({ direction: 'save' }, save);
      if (load > 0) counter.inc({ direction: 'load' }, load);
    },
  };
  if (inner.copyStrided !== undefined) {
    const copyStrided = inner.copyStrided.bind(inner);
    out.copyStrided = async (surfaces, ops, options) => {
      let save = 0;
      let load = 0;
      for (let i = 0; i + STRIDED_OP_FIELDS <= ops.length; i += STRIDED_OP_FIELDS) {
        const src = isHost(surfaces[ops[i]!]);
        const dst = isHost(surfaces[ops[i + 2]!]);
        const bytes = ops[i + 4]! * ops[i + 5]!;
        if (src && !dst) load += bytes;
        else if (!src && dst) save += bytes;
      }
      await copyStrided(surfaces, ops, options);
      if (save > 0) counter.inc({ direction: 'save' }, save);
      if (load > 0) counter.inc({ direction: 'load' }, load);
    };
  }
  if (inner.openCuda !== undefined) {
    const openCuda = inner.openCuda.bind(inner);
    out.openCuda = (handle, bytes, device) => openCuda(handle, bytes, device);
  }
  if (inner.describe !== undefined) {
    const describe = inner.describe.bind(inner);
    out.describe = () => describe();
  }
  if (inner.cudaDevices !== undefined) {
    const cudaDevices = inner.cudaDevices.bind(inner);
    out.cudaDevices = () => cudaDevices();
  }
  return out;
}
