/**
 * The addon's strided host copies (`copyBatchStrided`): bounds, strides, zero counts, the exact
 * overlap check (per-op bounds, piece arithmetic where bounds meet, piece by piece when that runs
 * out of budget) against a byte-by-byte reference on random batches, threads and streaming
 * stores, and the expansion to plain ops for the device paths.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { expandStridedOps } from '../../src/data-plane/native-copy-engine.ts';
import { isKvtierError } from '../../src/errors.ts';
import {
  type CopyBuffer,
  loadNative,
  type NativeAddon,
  NativeError,
} from '../../src/native/native-addon.ts';

const loaded = loadNative();
const addon = loaded.addon as NativeAddon;
const skip = loaded.addon === null ? loaded.reason : false;

/** mulberry32: seeded, so every run sees the same batches. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

type Op = [number, number, number, number, number, number, number, number];

async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof NativeError, `expected a NativeError, got ${String(err)}`);
    return err.nativeCode ?? '';
  }
  return 'ok';
}

/**
 * Byte-level reference over views of shared ArrayBuffers: whether the batch writes a byte twice
 * or reads a byte it writes (by ArrayBuffer and absolute offset), and what it would write.
 */
function reference(views: Uint8Array[], ops: Op[]): { overlap: boolean; after: Uint8Array[] } {
  const written = new Map<ArrayBufferLike, Uint8Array>();
  const mark = (v: Uint8Array) => {
    let m = written.get(v.buffer);
    if (m === undefined) {
      m = new Uint8Array(v.buffer.byteLength);
      written.set(v.buffer, m);
    }
    return m;
  };
  let overlap = false;
  for (const [, , d, doff, len, count, , ds] of ops)
    for (let k = 0; k < count; k++)
      for (let i = 0; i < len; i++) {
        const m = mark(views[d]!);
        const at = views[d]!.byteOffset + doff + k * ds + i;
        if (m[at]! > 0) overlap = true;
        m[at] = 1;
      }
  for (const [s, soff, , , len, count, ss] of ops)
    for (let k = 0; k < count; k++)
      for (let i = 0; i < len; i++) {
        const m = written.get(views[s]!.buffer);
        if (m !== undefined && m[views[s]!.byteOffset + soff + k * ss + i] === 1) overlap = true;
      }
  const copies = new Map<ArrayBufferLike, Uint8Array>();
  for (const v of views)
    if (!copies.has(v.buffer)) copies.set(v.buffer, new Uint8Array(v.buffer.slice(0)));
  const view = (v: Uint8Array) =>
    new Uint8Array(copies.get(v.buffer)!.buffer, v.byteOffset, v.length);
  if (!overlap)
    for (const [s, soff, d, doff, len, count, ss, ds] of ops)
      for (let k = 0; k < count; k++)
        view(views[d]!).set(views[s]!.subarray(soff + k * ss, soff + k * ss + len), doff + k * ds);
  return { overlap, after: views.map(view) };
}

/** Three views: two that may overlap in one ArrayBuffer, and one of their own. */
function surfaces(seed: number): Uint8Array[] {
  const next = rng(seed);
  const shared = new ArrayBuffer(6144);
  const own = new Uint8Array(4096);
  const views = [
    new Uint8Array(shared, 0, 4096),
    new Uint8Array(shared, next() < 0.5 ? 2048 : 4096, 2048),
    own,
  ];
  for (const v of [new Uint8Array(shared), own])
    for (let i = 0; i < v.length; i++) v[i] = (next() * 256) | 0;
  return views;
}

/** A random batch: transposes like an HND block (same stride, interleaved), other strides, plain runs. */
function batch(seed: number, views: Uint8Array[]): Op[] {
  const next = rng(seed);
  const int = (n: number) => Math.floor(next() * n);
  const out: Op[] = [];
  const ops = 1 + int(6);
  for (let o = 0; o < ops; o++) {
    const src = int(3);
    let dst = int(3);
    if (next() < 0.7 && dst === src) dst = (src + 1) % 3;
    const kind = int(3);
    if (kind === 0) {
      // An HND-like transpose: `heads` ops of `bs` pieces, the pieces of one op `heads * len` apart.
      const heads = 1 + int(4);
      const bs = 1 + int(5);
      const len = 1 + int(24);
      const bytes = heads * bs * len;
      if (bytes > views[src]!.length || bytes > views[dst]!.length) continue;
      const so = int(views[src]!.length - bytes + 1);
      const dd = int(views[dst]!.length - bytes + 1);
      const gap = next() < 0.15 ? 1 : 0; // sometimes one op lands a byte into its neighbour
      for (let h = 0; h < heads; h++)
        out.push([
          src,
          so + h * bs * len,
          dst,
          Math.max(0, dd + h * len - gap * h),
          len,
          bs,
          len,
          heads * len,
        ]);
    } else {
      const len = 1 + int(40);
      const count = int(9);
      const ss = len + int(50);
      const ds = count > 1 ? len + int(50) : 0;
      const span = (s: number) => (count === 0 ? 0 : (count - 1) * s + len);
      if (span(ss) > views[src]!.length || span(ds) > views[dst]!.length) continue;
      out.push([
        src,
        int(views[src]!.length - span(ss) + 1),
        dst,
        int(views[dst]!.length - span(ds) + 1),
        len,
        count,
        ss,
        kind === 1 ? ds : Math.max(len, ds),
      ]);
    }
  }
  return out;
}

describe('native strided copies', { skip }, () => {
  it('matches a byte-by-byte reference on random batches, refusing exactly the overlapping ones', async () => {
    let refused = 0;
    let copied = 0;
    for (let seed = 1; seed <= 400; seed++) {
      const views = surfaces(seed);
      const ops = batch(seed * 7919, views);
      const want = reference(views, ops);
      const before = views.map((v) => Buffer.from(v));
      const code = await codeOf(addon.copyBatchStrided(views, new Float64Array(ops.flat())));
      const what = `seed ${seed}: ${JSON.stringify(ops)}`;
      if (want.overlap) {
        assert.equal(code, 'ERR_OVERLAP', what);
        views.forEach((v, i) => {
          assert.ok(Buffer.from(v).equals(before[i]!), `${what}: nothing copied`);
        });
        refused++;
      } else {
        assert.equal(code, 'ok', what);
        views.forEach((v, i) => {
          assert.ok(Buffer.from(v).equals(Buffer.from(want.after[i]!)), `${what}: view ${i}`);
        });
        copied++;
      }
    }
    assert.ok(
      refused > 40 && copied > 40,
      `both outcomes seen (${refused} refused, ${copied} copied)`,
    );
  });

  it('decides batches too interleaved for per-op arithmetic piece by piece, both ways', async () => {
    // 300 ops of one stride, all bounds meeting, and one plain op among them: the same-stride
    // shortcut does not apply and the pairs exceed the budget, so every piece is checked.
    const build = (plainAt: number) => {
      const ops: Op[] = [];
      for (let i = 0; i < 300; i++) ops.push([0, i * 10, 1, i, 1, 10, 1, 301]);
      ops.push([0, 3000, 1, plainAt, 1, 1, 1, 1]);
      return new Float64Array(ops.flat());
    };
    const src = Uint8Array.from({ length: 4096 }, (_, i) => (i * 7 + 1) & 0xff);
    const dst = new Uint8Array(4096);
    assert.equal(await codeOf(addon.copyBatchStrided([src, dst], build(301))), 'ERR_OVERLAP');
    assert.ok(dst.every((b) => b === 0));
    assert.equal(await codeOf(addon.copyBatchStrided([src, dst], build(300))), 'ok');
    for (let i = 0; i < 300; i++)
      for (let k = 0; k < 10; k++) assert.equal(dst[i + k * 301], src[i * 10 + k]);
    assert.equal(dst[300], src[3000]);
  });

  it('checks bounds, strides, counts and fields, and copies nothing from a bad batch', async () => {
    const src = new Uint8Array(1024).fill(7);
    const dst = new Uint8Array(1024);
    const good: Op = [0, 0, 1, 0, 16, 4, 16, 64];
    const cases: [number[], string][] = [
      [[0, 0, 1, 1024 - 16 - 3 * 64, 16, 4, 16, 64], 'ok'],
      [[0, 0, 1, 1024 - 16 - 3 * 64 + 1, 16, 4, 16, 64], 'ERR_OUT_OF_RANGE'],
      [[0, 1024 - 64, 1, 512, 16, 4, 17, 16], 'ERR_OUT_OF_RANGE'],
      [[0, 0, 1, 0, 1, 2 ** 52, 2 ** 52, 2 ** 52], 'ERR_OUT_OF_RANGE'],
      [[0, 0, 1, 512, 16, 4, 15, 16], 'ERR_BAD_OP'],
      [[0, 0, 1, 512, 16, 4, 16, 8], 'ERR_BAD_OP'],
      [[0, 0, 1, 512, 16, 1, 0, 0], 'ok'],
      [[0, 0, 1, 512, 16, 0, 0, 0], 'ok'],
      [[0, 0, 2, 512, 16, 0, 16, 16], 'ERR_BAD_OP'],
      [[0, 0, 1, 1025, 16, 0, 16, 16], 'ERR_OUT_OF_RANGE'],
      [[0, 0, 1, 512, 0, 5, 0, 0], 'ok'],
      [[0, 0, 1, 512, 16, 2.5, 16, 16], 'ERR_BAD_OP'],
      [[0, 0, 1, 512, 16, 2, -16, 16], 'ERR_BAD_OP'],
      [[0, 0, 1, 512, 16, 2], 'ERR_BAD_OP'],
      [[0, 0, 1, 48, 16, 2, 16, 16], 'ERR_OVERLAP'],
      [[1, 0, 1, 512, 16, 2, 64, 64], 'ERR_OVERLAP'],
      [[0, 0, 0, 16, 16, 1, 16, 16], 'ERR_OVERLAP'],
    ];
    for (const [op, code] of cases) {
      dst.fill(0);
      const list =
        code === 'ok' || op.length < 8 ? [...(code === 'ok' ? [] : good), ...op] : [...good, ...op];
      const got = await codeOf(addon.copyBatchStrided([src, dst], new Float64Array(list)));
      assert.equal(got, code, JSON.stringify(op));
      if (code !== 'ok')
        assert.equal(dst.indexOf(7), -1, `nothing copied for ${JSON.stringify(op)}`);
    }
  });

  it('counts the copies left after coalescing: a strided op contiguous on both sides merges with its neighbours', async () => {
    const src = Uint8Array.from({ length: 256 }, (_, i) => i);
    const dst = new Uint8Array(256);
    const n = await addon.copyBatchStrided(
      [src, dst],
      new Float64Array([
        0, 0, 1, 0, 16, 1, 0, 0, 0, 16, 1, 16, 8, 4, 8, 8, 0, 48, 1, 48, 16, 1, 0, 0,
      ]),
    );
    assert.equal(n, 1);
    assert.deepEqual([...dst.subarray(0, 64)], [...src.subarray(0, 64)]);
    const m = await addon.copyBatchStrided(
      [src, dst],
      new Float64Array([0, 0, 1, 128, 8, 4, 8, 16, 0, 32, 1, 136, 8, 4, 8, 16]),
    );
    assert.equal(m, 2, 'two interleaved strided ops stay two copies');
    for (let k = 0; k < 4; k++) {
      assert.deepEqual(
        [...dst.subarray(128 + 16 * k, 136 + 16 * k)],
        [...src.subarray(8 * k, 8 * k + 8)],
      );
      assert.deepEqual(
        [...dst.subarray(136 + 16 * k, 144 + 16 * k)],
        [...src.subarray(32 + 8 * k, 40 + 8 * k)],
      );
    }
  });

  for (const [threads, len] of [
    [1, 256],
    [4, 256],
    [4, 200],
  ] as const) {
    it(`a ${threads}-thread strided batch of 48 MiB (pieces of ${len} bytes, slices cutting pieces) is exact`, async () => {
      // An HND-like transpose of the whole buffer: 8 heads per 16-token block, plus the reverse.
      const heads = 8;
      const bs = 16;
      const block = heads * bs * len;
      const blocks = Math.floor((48 * 1024 * 1024) / block);
      const src = Buffer.allocUnsafe(blocks * block);
      const next = rng(len);
      for (let i = 0; i < src.length; i += 4) src.writeUInt32LE((next() * 2 ** 32) >>> 0, i);
      const mid = Buffer.alloc(src.length, 0xee);
      const ops: number[] = [];
      for (let b = blocks - 1; b >= 0; b--)
        for (let h = 0; h < heads; h++)
          ops.push(0, b * block + h * bs * len, 1, b * block + h * len, len, bs, len, heads * len);
      const opts = { maxThreads: threads };
      assert.equal(
        await addon.copyBatchStrided([src, mid], new Float64Array(ops), opts),
        blocks * heads,
      );
      for (const b of [0, 1, blocks >> 1, blocks - 1])
        for (let t = 0; t < bs; t++)
          for (let h = 0; h < heads; h++) {
            const s = b * block + (h * bs + t) * len;
            const d = b * block + (t * heads + h) * len;
            assert.ok(
              mid.subarray(d, d + len).equals(src.subarray(s, s + len)),
              `block ${b} token ${t} head ${h}`,
            );
          }
      const back = Buffer.alloc(src.length, 0xee);
      const rev: number[] = [];
      for (let b = 0; b < blocks; b++)
        for (let t = 0; t < bs; t++)
          rev.push(
            0,
            b * block + t * heads * len,
            1,
            b * block + t * len,
            len,
            heads,
            len,
            bs * len,
          );
      await addon.copyBatchStrided([mid, back], new Float64Array(rev), opts);
      assert.equal(
        Buffer.compare(back, src),
        0,
        'the transpose and its inverse give the bytes back',
      );
    });
  }

  it('plain ops still run through copyBatch unchanged beside the strided form', async () => {
    const src = Uint8Array.from({ length: 64 }, (_, i) => i + 1);
    const dst = new Uint8Array(64);
    assert.equal(
      await addon.copyBatch(
        [src, dst] as CopyBuffer[],
        new Float64Array([0, 0, 1, 8, 8, 0, 8, 1, 16, 8]),
      ),
      1,
    );
    assert.deepEqual([...dst.subarray(8, 24)], [...src.subarray(0, 16)]);
    assert.equal(
      await codeOf(addon.copyBatch([src, dst], new Float64Array([0, 0, 1, 0, 8, 4, 8, 16]))),
      'ERR_BAD_OP',
    );
  });
});

describe('expandStridedOps', () => {
  it('writes one plain op per piece, skipping empty ops', () => {
    const plain = expandStridedOps(
      new Float64Array([0, 10, 1, 20, 4, 3, 4, 8, 2, 0, 3, 0, 0, 5, 1, 1, 0, 0, 1, 0, 8, 1, 0, 0]),
    );
    assert.deepEqual(
      [...plain],
      [0, 10, 1, 20, 4, 0, 14, 1, 28, 4, 0, 18, 1, 36, 4, 0, 0, 1, 0, 8],
    );
  });

  it('refuses counts and strides that are not non-negative integers, strides below the length, and ragged tables', () => {
    for (const ops of [
      [0, 0, 1, 0, 4, 1.5, 4, 4],
      [0, 0, 1, 0, 4, 2, -4, 4],
      [0, 0, 1, 0, 4, 2, 2, 4],
      [0, 0, 1, 0, 4, 2, 4],
    ])
      assert.throws(
        () => expandStridedOps(new Float64Array(ops)),
        (e) => isKvtierError(e) && e.code === 'KVT_INVALID_ARGUMENT',
      );
  });
});
