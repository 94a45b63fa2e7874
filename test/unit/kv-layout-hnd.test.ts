/**
 * In-block order (NHD / HND) and the stored form: HND blocks are reordered to the token-major
 * stored form on copy, so both orders derive one namespace and produce the same payload bytes.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { CopyEngine, CopySurface } from '../../src/data-plane/copy-engine-types.ts';
import { copyChunks, opFormFor, scatterLayerwise } from '../../src/data-plane/copy-groups.ts';
import {
  chunkOpSlots,
  chunkPayloadBytes,
  type KvBlockLayout,
  type KvRegistration,
  opsPerBlock,
  regionOpSlots,
  resolveKvRegistration,
  writeChunkOps,
  writeRegionOps,
} from '../../src/data-plane/kv-layout.ts';
import { isKvtierError } from '../../src/errors.ts';

const HEADS = 4;
const HEAD_DIM = 8; // bf16: 16 bytes per head per token
const BS = 4;
const NB = 8;
const LAYERS = 2;
const HEAD_BYTES = HEAD_DIM * 2;
const BLOCK_BYTES = BS * HEADS * HEAD_BYTES;
const STRIDE = BLOCK_BYTES + 32;
const REGION_BYTES = NB * STRIDE;

function reg(blockLayout?: KvBlockLayout, over: Partial<KvRegistration> = {}): KvRegistration {
  return {
    engineId: 'e',
    device: 'host',
    modelId: 'test/model',
    dtype: 'bf16',
    numKvHeads: HEADS,
    headDim: HEAD_DIM,
    tpSize: 1,
    tpRank: 0,
    mla: false,
    numBlocks: NB,
    blockSize: BS,
    blockStrideBytes: STRIDE,
    chunkSize: 2 * BS,
    layers: Array.from({ length: LAYERS }, (_, l) => ({
      k: { path: '/dev/shm/kv', offsetBytes: 2 * l * REGION_BYTES },
      v: { path: '/dev/shm/kv', offsetBytes: (2 * l + 1) * REGION_BYTES },
    })),
    ...(blockLayout === undefined ? {} : { blockLayout }),
    ...over,
  };
}

/** Runs an op table over byte arrays (surface index -> array). */
function run(surfaces: Uint8Array[], ops: Float64Array): void {
  for (let i = 0; i < ops.length; i += 5) {
    const [s, so, d, dd, len] = [ops[i]!, ops[i + 1]!, ops[i + 2]!, ops[i + 3]!, ops[i + 4]!];
    surfaces[d]!.set(surfaces[s]!.subarray(so, so + len), dd);
  }
}

/** Byte offset in the engine file of (region, block, token, head) for an in-block order. */
function at(order: KvBlockLayout, r: number, b: number, t: number, h: number): number {
  const inBlock = order === 'NHD' ? t * HEADS + h : h * BS + t;
  return r * REGION_BYTES + b * STRIDE + inBlock * HEAD_BYTES;
}

/** An engine file where every (region, block, token, head) holds a distinct pattern. */
function engineFile(order: KvBlockLayout): Uint8Array {
  const file = new Uint8Array(2 * LAYERS * REGION_BYTES);
  for (let r = 0; r < 2 * LAYERS; r++)
    for (let b = 0; b < NB; b++)
      for (let t = 0; t < BS; t++)
        for (let h = 0; h < HEADS; h++) {
          const o = at(order, r, b, t, h);
          file.fill((r * 131 + b * 31 + t * 7 + h * 3 + 1) & 0xff, o, o + HEAD_BYTES - 1);
          file[o + HEAD_BYTES - 1] = h;
        }
  return file;
}

function gather(order: KvBlockLayout, file: Uint8Array, ids: number[]): Uint8Array {
  const layout = resolveKvRegistration(reg(order));
  const payload = new Uint8Array(chunkPayloadBytes(layout, ids.length));
  const ops = new Float64Array(chunkOpSlots(layout, ids.length));
  assert.equal(writeChunkOps(ops, 0, layout, 'gather', ids, [0, 0, 0, 0], 1), ops.length);
  run([file, payload], ops);
  return payload;
}

describe('in-block layout', () => {
  test('blockLayout defaults to NHD, does not enter the namespace, and HND needs heads and tokens', () => {
    const nhd = resolveKvRegistration(reg());
    const hnd = resolveKvRegistration(reg('HND'));
    assert.equal(nhd.blockLayout, 'NHD');
    assert.equal(hnd.blockLayout, 'HND');
    assert.equal(hnd.namespace.id, nhd.namespace.id);
    assert.equal(hnd.headsPerRank, HEADS);
    assert.equal(hnd.headBytes, HEAD_BYTES);
    assert.equal(opsPerBlock(nhd), 1);
    assert.equal(opsPerBlock(hnd), BS * HEADS);
    assert.equal(regionOpSlots(hnd, 3), 5 * 3 * BS * HEADS);
    // One head per rank: both orders are the same bytes, so the copy stays one op per block.
    const oneHead = resolveKvRegistration(
      reg('HND', { tpSize: 4, tpRank: 1, blockStrideBytes: STRIDE / 4 }),
    );
    assert.equal(oneHead.headsPerRank, 1);
    assert.equal(oneHead.blockLayout, 'NHD');
  });

  test('rejects HND for MLA and unknown orders', () => {
    const mla: KvRegistration = {
      ...reg('HND'),
      mla: true,
      numKvHeads: 1,
      headDim: 64,
      blockStrideBytes: BS * 128,
      layers: [{ k: { path: '/dev/shm/kv', offsetBytes: 0 } }],
    };
    assert.throws(
      () => resolveKvRegistration(mla),
      (e) => isKvtierError(e) && /blockLayout must be NHD/.test(e.message),
    );
    assert.equal(resolveKvRegistration({ ...mla, blockLayout: 'NHD' }).blockLayout, 'NHD');
    assert.throws(
      () => resolveKvRegistration(reg('XYZ' as KvBlockLayout)),
      (e) => isKvtierError(e) && /registration\.blockLayout/.test(e.message),
    );
  });

  test('an HND engine gathers the same payload bytes as an NHD engine holding the same KV', () => {
    const ids = [5, 2];
    const a = gather('NHD', engineFile('NHD'), ids);
    const b = gather('HND', engineFile('HND'), ids);
    assert.ok(Buffer.from(a).equals(Buffer.from(b)));
  });

  test('HND ops address token t of head h, in payload order, and scatter back byte for byte', () => {
    const layout = resolveKvRegistration(reg('HND'));
    const ops = new Float64Array(regionOpSlots(layout, 1));
    // Region 3 (layer 1 V), block 6 as the chunk's second block (skip 1), payload base 100.
    writeRegionOps(ops, 0, layout, 'gather', [6], 3, 0, 1, 1, 100);
    const first = 100 + (3 * 2 + 1) * BLOCK_BYTES;
    for (let t = 0; t < BS; t++)
      for (let h = 0; h < HEADS; h++) {
        const o = 5 * (t * HEADS + h);
        assert.deepEqual(Array.from(ops.subarray(o, o + 5)), [
          0,
          at('HND', 3, 6, t, h),
          1,
          first + (t * HEADS + h) * HEAD_BYTES,
          HEAD_BYTES,
        ]);
      }
    const src = engineFile('HND');
    const payload = gather('HND', src, [1, 7]);
    const dst = new Uint8Array(src.length);
    const back = new Float64Array(chunkOpSlots(layout, 2));
    writeChunkOps(back, 0, layout, 'scatter', [4, 0], [0, 0, 0, 0], 1);
    run([dst, payload], back);
    for (let r = 0; r < 2 * LAYERS; r++)
      for (const [from, to] of [
        [1, 4],
        [7, 0],
      ] as const) {
        const s = at('HND', r, from, 0, 0);
        const d = at('HND', r, to, 0, 0);
        assert.ok(
          Buffer.from(dst.subarray(d, d + BLOCK_BYTES)).equals(
            Buffer.from(src.subarray(s, s + BLOCK_BYTES)),
          ),
        );
      }
  });

  test('a layer-wise load of HND blocks writes what the chunk-wise ops write', async () => {
    const layout = resolveKvRegistration(reg('HND'));
    const payload = gather('NHD', engineFile('NHD'), [2, 3]);
    const engine: CopyEngine = {
      openFile: () => Promise.reject(new Error('unused')),
      copy: async (surfaces: readonly CopySurface[], ops: Float64Array) =>
        run(surfaces as Uint8Array[], ops),
    };
    const dst = new Uint8Array(2 * LAYERS * REGION_BYTES);
    let layers = 0;
    const res = await scatterLayerwise(
      engine,
      { layout, surfaces: [dst], regionSurface: [0, 0, 0, 0] },
      [{ ids: Uint32Array.of(6, 1), payload }],
      { groupBytes: BLOCK_BYTES, onLayers: (n) => (layers = n) },
    );
    assert.equal(res.error, undefined);
    assert.equal(layers, LAYERS);
    const want = new Uint8Array(dst.length);
    const ops = new Float64Array(chunkOpSlots(layout, 2));
    writeChunkOps(ops, 0, layout, 'scatter', [6, 1], [0, 0, 0, 0], 1);
    run([want, payload], ops);
    assert.ok(Buffer.from(dst).equals(Buffer.from(want)));
    const src = engineFile('HND');
    for (let r = 0; r < 2 * LAYERS; r++)
      for (const [from, to] of [
        [2, 6],
        [3, 1],
      ] as const) {
        const s = at('HND', r, from, 0, 0);
        const d = at('HND', r, to, 0, 0);
        assert.ok(
          Buffer.from(dst.subarray(d, d + BLOCK_BYTES)).equals(
            Buffer.from(src.subarray(s, s + BLOCK_BYTES)),
          ),
        );
      }
  });
});

/** Runs a strided op table (8-tuples) over byte arrays. */
function runStrided(surfaces: Uint8Array[], ops: Float64Array): void {
  for (let i = 0; i < ops.length; i += 8) {
    const [s, so, d, dd, len, count, ss, ds] = ops.subarray(i, i + 8) as unknown as number[];
    for (let k = 0; k < count!; k++)
      surfaces[d!]!.set(surfaces[s!]!.subarray(so! + k * ss!, so! + k * ss! + len!), dd! + k * ds!);
  }
}

describe('strided op form', () => {
  test('HND blocks: one op per head to gather, one per token to scatter, the same bytes as plain ops', () => {
    const layout = resolveKvRegistration(reg('HND'));
    assert.equal(opsPerBlock(layout, 'strided', 'gather'), HEADS);
    assert.equal(opsPerBlock(layout, 'strided', 'scatter'), BS);
    assert.equal(regionOpSlots(layout, 3, 'strided', 'gather'), 8 * 3 * HEADS);
    const src = engineFile('HND');
    // Gather blocks 5 and 2 as blocks 1..2 of a 3-block chunk at byte 64 of the payload.
    const ids = [5, 2];
    const size = 64 + chunkPayloadBytes(layout, 3);
    const plain = new Uint8Array(size);
    const strided = new Uint8Array(size);
    const p = new Float64Array(chunkOpSlots(layout, 2));
    writeChunkOps(p, 0, layout, 'gather', ids, [0, 0, 0, 0], 1, 64, 1);
    run([src, plain], p);
    const s = new Float64Array(chunkOpSlots(layout, 2, 'strided', 'gather'));
    const end = writeChunkOps(s, 0, layout, 'gather', ids, [0, 0, 0, 0], 1, 64, 1, 'strided');
    assert.equal(end, s.length);
    runStrided([src, strided], s);
    assert.ok(Buffer.from(strided).equals(Buffer.from(plain)));
    // Every strided gather reads one head of a block whole and writes its tokens a row apart.
    for (let i = 0; i < s.length; i += 8) {
      assert.deepEqual(
        [...s.subarray(i + 4, i + 8)],
        [HEAD_BYTES, BS, HEAD_BYTES, HEADS * HEAD_BYTES],
      );
    }
    const back = [new Uint8Array(src.length), new Uint8Array(src.length)];
    const q = new Float64Array(chunkOpSlots(layout, 2));
    writeChunkOps(q, 0, layout, 'scatter', [3, 7], [0, 0, 0, 0], 1, 64, 1);
    run([back[0]!, plain], q);
    const r = new Float64Array(chunkOpSlots(layout, 2, 'strided', 'scatter'));
    writeChunkOps(r, 0, layout, 'scatter', [3, 7], [0, 0, 0, 0], 1, 64, 1, 'strided');
    for (let i = 0; i < r.length; i += 8) {
      assert.deepEqual(
        [...r.subarray(i + 4, i + 8)],
        [HEAD_BYTES, HEADS, HEAD_BYTES, BS * HEAD_BYTES],
      );
    }
    runStrided([back[1]!, strided], r);
    assert.ok(Buffer.from(back[1]!).equals(Buffer.from(back[0]!)));
    for (let r2 = 0; r2 < 2 * LAYERS; r2++) {
      const a = at('HND', r2, 5, 0, 0);
      const b = at('HND', r2, 3, 0, 0);
      assert.ok(
        Buffer.from(back[1]!.subarray(b, b + BLOCK_BYTES)).equals(
          Buffer.from(src.subarray(a, a + BLOCK_BYTES)),
        ),
      );
    }
  });

  test('NHD blocks in the strided form are one op of one piece per block', () => {
    const layout = resolveKvRegistration(reg('NHD'));
    const s = new Float64Array(chunkOpSlots(layout, 2, 'strided', 'gather'));
    writeChunkOps(s, 0, layout, 'gather', [1, 4], [0, 0, 0, 0], 1, 0, 0, 'strided');
    assert.equal(s.length, 8 * 2 * 2 * LAYERS);
    for (let i = 0; i < s.length; i += 8)
      assert.deepEqual([...s.subarray(i + 4, i + 8)], [BLOCK_BYTES, 1, BLOCK_BYTES, BLOCK_BYTES]);
  });

  test('copy groups send strided ops to an engine that takes them, plain ops to one that does not', async () => {
    const layout = resolveKvRegistration(reg('HND'));
    const payload = gather('NHD', engineFile('NHD'), [2, 3]);
    const calls: string[] = [];
    const plainEngine: CopyEngine = {
      openFile: () => Promise.reject(new Error('unused')),
      copy: async (surfaces, ops) => {
        calls.push('plain');
        run(surfaces as Uint8Array[], ops);
      },
    };
    const stridedEngine: CopyEngine = {
      ...plainEngine,
      copyStrided: async (surfaces, ops) => {
        calls.push('strided');
        runStrided(surfaces as Uint8Array[], ops);
      },
    };
    assert.equal(opFormFor(plainEngine, layout), 'plain');
    assert.equal(opFormFor(stridedEngine, layout), 'strided');
    assert.equal(opFormFor(stridedEngine, resolveKvRegistration(reg('NHD'))), 'plain');
    const outs: Uint8Array[] = [];
    for (const engine of [plainEngine, stridedEngine]) {
      const dst = new Uint8Array(2 * LAYERS * REGION_BYTES);
      const eng = { layout, surfaces: [dst], regionSurface: [0, 0, 0, 0] };
      const items = [{ ids: Uint32Array.of(6, 1), payload }];
      assert.equal(
        (await scatterLayerwise(engine, eng, items, { groupBytes: BLOCK_BYTES })).error,
        undefined,
      );
      const again = new Uint8Array(payload.length);
      const res = await copyChunks(engine, eng, 'gather', [
        { ids: Uint32Array.of(6, 1), payload: again },
      ]);
      assert.equal(res.error, undefined);
      assert.ok(Buffer.from(again).equals(Buffer.from(payload)), 'gathered back as saved');
      outs.push(dst);
    }
    assert.ok(Buffer.from(outs[0]!).equals(Buffer.from(outs[1]!)));
    assert.ok(calls.includes('plain') && calls.includes('strided'));
    assert.equal(
      calls.indexOf('strided'),
      calls.lastIndexOf('plain') + 1,
      'the plain engine never saw strided ops',
    );
  });
});
