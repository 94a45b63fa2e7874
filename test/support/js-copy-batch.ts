/**
 * A pure-JS reference of the native addon's `copyBatch` (same op format, rules and errors), for
 * tests only: `test/unit/native.test.ts` runs one suite against both and compares them on random
 * batches. The sidecar never copies with it.
 */

import { abortedError } from '../../src/errors.ts';
import {
  COPY_OP_WIDTH,
  type CopyBatchOptions,
  type CopyBuffer,
  NativeError,
} from '../../src/native/native-addon.ts';
import { describe, requireInt } from '../../src/util/validate.ts';

interface Bytes {
  readonly ab: ArrayBufferLike;
  readonly base: number;
  readonly length: number;
}

interface PlannedRun {
  src: Bytes;
  srcAt: number;
  dst: Bytes;
  dstAt: number;
  length: number;
  srcIndex: number;
  dstIndex: number;
}

/**
 * The addon's host copy batch in plain JS, on the calling thread: the reference the addon is
 * tested against (tests only; the sidecar never uses it).
 *
 * `ops` holds 5-tuples `[srcIndex, srcOffset, dstIndex, dstOffset, length]` indexing `buffers`.
 * Every op is checked before anything is copied: fields are non-negative integers
 * (`ERR_BAD_OP`), indexes exist (`ERR_BAD_OP`), ranges lie inside their buffers
 * (`ERR_OUT_OF_RANGE`), and no byte is written twice or both read and written by the batch
 * (`ERR_OVERLAP`, judged per underlying ArrayBuffer), so the copies may run in any order. A bad
 * batch rejects with a {@link NativeError} (`KVT_INVALID_ARGUMENT`) and copies nothing.
 * Zero-length ops are checked and skipped; an op whose source and destination both continue
 * the previous op's (same buffers) is merged into it.
 * @returns the number of contiguous copies performed after coalescing.
 */
export async function jsCopyBatch(
  buffers: readonly CopyBuffer[],
  ops: Float64Array,
  options: CopyBatchOptions = {},
): Promise<number> {
  if (options.signal?.aborted) throw abortedError(options.signal, 'copyBatch');
  if (options.maxThreads !== undefined) requireInt('maxThreads', options.maxThreads, 1, 64);
  const runs = planJsCopies(buffers, ops);
  for (const r of runs) {
    const src = new Uint8Array(r.src.ab, r.src.base + r.srcAt, r.length);
    new Uint8Array(r.dst.ab, r.dst.base + r.dstAt, r.length).set(src);
  }
  return runs.length;
}

function bytesOf(buffer: unknown, i: number): Bytes {
  if (buffer instanceof ArrayBuffer) return { ab: buffer, base: 0, length: buffer.byteLength };
  if (ArrayBuffer.isView(buffer)) {
    return { ab: buffer.buffer, base: buffer.byteOffset, length: buffer.byteLength };
  }
  throw new NativeError(
    'ERR_INVALID_ARG',
    `buffers[${i}] is not an ArrayBuffer or a view of one, got ${describe(buffer)}`,
  );
}

function planJsCopies(buffers: readonly CopyBuffer[], ops: Float64Array): PlannedRun[] {
  if (!Array.isArray(buffers)) throw new NativeError('ERR_INVALID_ARG', 'buffers must be an array');
  if (!(ops instanceof Float64Array))
    throw new NativeError('ERR_INVALID_ARG', 'ops must be a Float64Array');
  const regions = buffers.map(bytesOf);
  if (ops.length % COPY_OP_WIDTH !== 0) {
    throw new NativeError(
      'ERR_BAD_OP',
      `ops length ${ops.length} is not a multiple of 5 ([aIndex, aOffset, bIndex, bOffset, length] per op)`,
    );
  }
  const runs: PlannedRun[] = [];
  for (let i = 0; i < ops.length / COPY_OP_WIDTH; i++) {
    const v = ops.subarray(i * COPY_OP_WIDTH, (i + 1) * COPY_OP_WIDTH);
    for (let k = 0; k < COPY_OP_WIDTH; k++) {
      const x = v[k]!;
      if (!Number.isSafeInteger(x) || x < 0) {
        throw new NativeError('ERR_BAD_OP', `op ${i}: field ${k} must be a non-negative integer`);
      }
    }
    const [si, so, di, dOff, len] = v as unknown as [number, number, number, number, number];
    const src = checkRange(regions, i, 'source', si, so, len);
    const dst = checkRange(regions, i, 'destination', di, dOff, len);
    if (len === 0) continue;
    const last = runs.at(-1);
    if (
      last !== undefined &&
      last.srcIndex === si &&
      last.dstIndex === di &&
      last.srcAt + last.length === so &&
      last.dstAt + last.length === dOff
    ) {
      last.length += len;
      continue;
    }
    runs.push({ src, srcAt: so, dst, dstAt: dOff, length: len, srcIndex: si, dstIndex: di });
  }
  checkJsOverlap(runs);
  return runs;
}

function checkRange(
  regions: Bytes[],
  op: number,
  side: string,
  index: number,
  offset: number,
  length: number,
): Bytes {
  const r = regions[index];
  if (r === undefined) {
    throw new NativeError(
      'ERR_BAD_OP',
      `op ${op}: ${side} buffer index ${index} is out of range (${regions.length} buffers)`,
    );
  }
  if (offset + length > r.length) {
    throw new NativeError(
      'ERR_OUT_OF_RANGE',
      `op ${op}: ${side} range [${offset}, ${offset + length}) exceeds buffer ${index} of ${r.length} bytes`,
    );
  }
  return r;
}

type Span = [number, number];

function checkJsOverlap(runs: readonly PlannedRun[]): void {
  const byBuffer = new Map<ArrayBufferLike, { dst: Span[]; src: Span[] }>();
  const spansOf = (ab: ArrayBufferLike) => {
    const known = byBuffer.get(ab);
    if (known !== undefined) return known;
    const fresh = { dst: [] as Span[], src: [] as Span[] };
    byBuffer.set(ab, fresh);
    return fresh;
  };
  for (const r of runs) {
    const s = r.src.base + r.srcAt;
    const d = r.dst.base + r.dstAt;
    spansOf(r.src.ab).src.push([s, s + r.length]);
    spansOf(r.dst.ab).dst.push([d, d + r.length]);
  }
  const order = (a: Span, b: Span) => a[0] - b[0] || a[1] - b[1];
  for (const { dst, src } of byBuffer.values()) {
    dst.sort(order);
    src.sort(order);
    for (let i = 1; i < dst.length; i++) {
      if (dst[i]![0] < dst[i - 1]![1]) {
        throw new NativeError('ERR_OVERLAP', 'two ops write the same destination bytes');
      }
    }
    let d = 0;
    for (const [start, end] of src) {
      while (d < dst.length && dst[d]![1] <= start) d++;
      if (d === dst.length) break;
      if (dst[d]![0] < end) {
        throw new NativeError('ERR_OVERLAP', 'an op reads bytes that the batch also writes');
      }
    }
  }
}
