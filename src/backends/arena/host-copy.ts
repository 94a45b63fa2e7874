/**
 * Large host-memory copies that do not hold the event loop: on the libuv pool through the
 * native addon when it is loaded, otherwise in slices across event-loop turns.
 */
import { setImmediate as nextTurn } from 'node:timers/promises';
import { COPY_OP_WIDTH, loadNative, type NativeAddon } from '../../native/native-addon.ts';

/**
 * Copies up to this size run on the calling thread: 4 MiB takes about 0.2-0.3 ms at memory
 * speed, and a round trip through the libuv pool costs more than copying 2 MiB.
 */
export const HOST_COPY_SYNC_MAX_BYTES = 4 * 1024 * 1024;

/** Bytes copied per event-loop turn when the addon is not loaded (about 0.1-0.2 ms each). */
const SLICE_BYTES = 2 * 1024 * 1024;

let native: NativeAddon | null | undefined;

function addon(): NativeAddon | null {
  native ??= process.env.KVTIER_NATIVE_HOST_COPY === '0' ? null : loadNative().addon;
  return native;
}

/**
 * Copies all of `src` to the start of `dst`. Up to {@link HOST_COPY_SYNC_MAX_BYTES} the copy is
 * done before this returns; larger copies run on one libuv pool thread when the addon is loaded
 * (the other cores stay free for the event loop), or in 2 MiB slices, one per event-loop turn,
 * without it. Neither buffer may change until the promise settles.
 * @throws RangeError when `src` is longer than `dst`.
 */
export function copyHostBytes(src: Uint8Array, dst: Uint8Array): Promise<void> | undefined {
  const n = src.byteLength;
  if (n > dst.byteLength) {
    throw new RangeError(`cannot copy ${n} bytes into ${dst.byteLength}`);
  }
  if (n <= HOST_COPY_SYNC_MAX_BYTES) {
    dst.set(src);
    return undefined;
  }
  const a = addon();
  return a === null ? copyHostBytesSliced(src, dst) : copyOnPool(a, src, dst);
}

async function copyOnPool(a: NativeAddon, src: Uint8Array, dst: Uint8Array): Promise<void> {
  const ops = new Float64Array(COPY_OP_WIDTH);
  ops[4] = src.byteLength; // [src 0 at 0] -> [dst 1 at 0]
  ops[2] = 1;
  const copied = await a.copyBatch([src, dst], ops, { maxThreads: 1 }).then(
    () => true,
    () => false,
  );
  // The addon refuses only what it cannot copy safely (views of one buffer that overlap).
  if (!copied) dst.set(src);
}

/**
 * The copy {@link copyHostBytes} makes without the addon: 2 MiB per event-loop turn (views of
 * one buffer at once). Exported for tests. @throws RangeError when `src` is longer than `dst`.
 */
export async function copyHostBytesSliced(src: Uint8Array, dst: Uint8Array): Promise<void> {
  if (src.byteLength > dst.byteLength) {
    throw new RangeError(`cannot copy ${src.byteLength} bytes into ${dst.byteLength}`);
  }
  // Views of one buffer may overlap, which only a single set() copies correctly.
  if (src.buffer === dst.buffer) {
    dst.set(src);
    return;
  }
  for (let off = 0; off < src.byteLength; off += SLICE_BYTES) {
    if (off > 0) await nextTurn();
    dst.set(src.subarray(off, Math.min(src.byteLength, off + SLICE_BYTES)), off);
  }
}
