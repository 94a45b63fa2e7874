import { type FileHandle, open } from 'node:fs/promises';
import { KvtierError } from '../errors.ts';
import { requireInt } from '../util/validate.ts';
import type { CopyEngine, CopySurface, DeviceSurface } from './copy-engine-types.ts';

class FsSurface implements DeviceSurface {
  #closing: Promise<void> | undefined;
  constructor(
    readonly handle: FileHandle,
    readonly sizeBytes: number,
  ) {}
  close(): Promise<void> {
    this.#closing ??= this.handle.close().catch(() => {});
    return this.#closing;
  }
}

/**
 * The fallback engine: host files by positional reads and writes on the libuv pool (never a
 * private in-memory copy, so the engine process sees every write), memory by `set`. Adjacent
 * ops are coalesced; at most `concurrency` file ops run at once (default 16).
 */
export function createFsCopyEngine(opts: { concurrency?: number } = {}): CopyEngine {
  const concurrency = requireInt('copyEngine.concurrency', opts.concurrency ?? 16, 1, 1024);
  return {
    describe: () => ({
      kind: 'file-io',
      cuda: { available: false, reason: 'native addon not loaded' },
    }),
    async openFile(path) {
      const handle = await open(path, 'r+');
      try {
        return new FsSurface(handle, (await handle.stat()).size);
      } catch (err) {
        await handle.close();
        throw err;
      }
    },
    async copy(surfaces, ops) {
      const runs = coalesce(ops);
      for (let i = 0; i < runs.length; i += 5) checkOp(surfaces, runs, i);
      let next = 0;
      const worker = async () => {
        while (next < runs.length) {
          const i = next;
          next += 5;
          await copyOne(
            surfaces[runs[i]!]!,
            runs[i + 1]!,
            surfaces[runs[i + 2]!]!,
            runs[i + 3]!,
            runs[i + 4]!,
          );
        }
      };
      await Promise.all(Array.from({ length: Math.min(concurrency, runs.length / 5) }, worker));
    },
  };
}

function coalesce(ops: Float64Array): number[] {
  const out: number[] = [];
  for (let i = 0; i + 4 < ops.length; i += 5) {
    const [s, so, d, dd, len] = [ops[i]!, ops[i + 1]!, ops[i + 2]!, ops[i + 3]!, ops[i + 4]!];
    const n = out.length;
    if (
      n > 0 &&
      out[n - 5] === s &&
      out[n - 3] === d &&
      out[n - 4]! + out[n - 1]! === so &&
      out[n - 2]! + out[n - 1]! === dd
    )
      out[n - 1] = out[n - 1]! + len;
    else out.push(s, so, d, dd, len);
  }
  return out;
}

function checkOp(surfaces: readonly CopySurface[], ops: number[], i: number): void {
  const len = ops[i + 4]!;
  for (const [s, off] of [
    [ops[i]!, ops[i + 1]!],
    [ops[i + 2]!, ops[i + 3]!],
  ] as const) {
    const surface = surfaces[s];
    const size = surface instanceof Uint8Array ? surface.byteLength : surface?.sizeBytes;
    if (size === undefined || off < 0 || len < 0 || off + len > size)
      throw new KvtierError(
        'KVT_INTERNAL',
        `copy op ${i / 5} is out of bounds (surface ${s}, offset ${off}, length ${len})`,
      );
  }
}

async function copyOne(
  src: CopySurface,
  so: number,
  dst: CopySurface,
  dd: number,
  len: number,
): Promise<void> {
  if (src instanceof Uint8Array && dst instanceof Uint8Array) {
    dst.set(src.subarray(so, so + len), dd);
    return;
  }
  if (src instanceof FsSurface && dst instanceof Uint8Array) {
    for (let done = 0; done < len; ) {
      const { bytesRead } = await src.handle.read(dst, dd + done, len - done, so + done);
      if (bytesRead === 0)
        throw new KvtierError('KVT_BACKEND', 'KV file ended before the requested block');
      done += bytesRead;
    }
    return;
  }
  if (src instanceof Uint8Array && dst instanceof FsSurface) {
    for (let done = 0; done < len; ) {
      const { bytesWritten } = await dst.handle.write(src, so + done, len - done, dd + done);
      done += bytesWritten;
    }
    return;
  }
  throw new KvtierError(
    'KVT_INTERNAL',
    'the fs copy engine copies only between host memory and files',
  );
}
