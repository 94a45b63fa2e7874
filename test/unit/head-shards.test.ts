/**
 * Address math of loads across TP sizes (src/data-plane/head-shards.ts): which saved head shards
 * a rank reads, and where each head of each token goes, checked against the stored form written
 * out element by element; NHD and HND blocks, TP 1, 2, 4 and 8 loaders of a 4-head model.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  coverAmong,
  ownHeads,
  shardPayloadBytes,
  shardRegionOpSlots,
  writeShardOps,
} from '../../src/data-plane/head-shards.ts';
import {
  type KvBlockLayout,
  type KvLayout,
  resolveKvRegistration,
} from '../../src/data-plane/kv-layout.ts';
import { headCovers } from '../../src/namespace/namespace.ts';

const HEADS = 4;
const HEAD_BYTES = 4; // headDim 2, bf16
const BS = 3;
const NB = 6;
const LAYERS = 2;

function layout(tp: number, rank: number, order: KvBlockLayout): KvLayout {
  const per = Math.max(1, HEADS / tp);
  const stride = BS * per * HEAD_BYTES + 8;
  const region = NB * stride;
  return resolveKvRegistration({
    engineId: `e${tp}-${rank}`,
    device: 'host',
    modelId: 'test/heads',
    dtype: 'bf16',
    numKvHeads: HEADS,
    headDim: 2,
    tpSize: tp,
    tpRank: rank,
    mla: false,
    numBlocks: NB,
    blockSize: BS,
    blockStrideBytes: stride,
    chunkSize: 2 * BS,
    blockLayout: order,
    layers: Array.from({ length: LAYERS }, (_, l) => ({
      k: { path: '/dev/shm/kv', offsetBytes: 2 * l * region },
      v: { path: '/dev/shm/kv', offsetBytes: (2 * l + 1) * region },
    })),
  });
}

/** A byte that names region `r`, block `j` of the chunk, token `t`, model head `h`, byte `x`. */
const mark = (r: number, j: number, t: number, h: number, x: number) =>
  (((r * 7 + j) * 5 + t) * 11 + h * 3 + x) & 0xff;

/** The stored form of a shard `[s0, s1)`, element by element: regions, blocks, tokens, heads. */
function shardPayload(regions: number, blocks: number, s0: number, s1: number): Uint8Array {
  const out = new Uint8Array(regions * blocks * BS * (s1 - s0) * HEAD_BYTES);
  let o = 0;
  for (let r = 0; r < regions; r++)
    for (let j = 0; j < blocks; j++)
      for (let t = 0; t < BS; t++)
        for (let h = s0; h < s1; h++)
          for (let x = 0; x < HEAD_BYTES; x++) out[o++] = mark(r, j, t, h, x);
  return out;
}

function run(surfaces: Uint8Array[], ops: Float64Array, n: number): void {
  for (let i = 0; i < n; i += 5)
    surfaces[ops[i + 2]!]!.set(
      surfaces[ops[i]!]!.subarray(ops[i + 1]!, ops[i + 1]! + ops[i + 4]!),
      ops[i + 3]!,
    );
}

describe('loads across TP sizes: head shard address math', () => {
  for (const tp of [1, 2, 4, 8])
    for (const order of ['NHD', 'HND'] as const)
      test(`TP ${tp} ${order} ranks assembled from TP 2 and TP 4 shards, head by head`, () => {
        for (let rank = 0; rank < tp; rank++) {
          const lay = layout(tp, rank, order);
          const [a, b] = ownHeads(lay);
          for (const width of [1, 2, 4]) {
            const cover = headCovers(lay.namespace.spec).find((c) => c.width === width);
            if (width === b - a) {
              assert.equal(cover, undefined, 'the own width is no cover');
              continue;
            }
            assert.ok(cover !== undefined);
            // The lookup's namespaces pick this cover, whatever their order.
            const ids = cover.shards.map((s) => s.namespace.id).reverse();
            assert.equal(coverAmong(lay, ids)?.width, width);
            const ids2 = [0, 4, 1];
            const blocks = ids2.length;
            const dev = new Uint8Array(lay.regions.length * NB * lay.blockStrideBytes);
            const surfaces: Uint8Array[] = [dev];
            let slots = 0;
            for (const s of cover.shards)
              slots +=
                lay.regions.length *
                shardRegionOpSlots(lay, blocks, Math.min(b, s.end) - Math.max(a, s.start));
            const ops = new Float64Array(slots);
            let at = 0;
            for (const s of cover.shards) {
              const payload = shardPayload(lay.regions.length, blocks, s.start, s.end);
              assert.equal(payload.byteLength, shardPayloadBytes(lay, blocks, s.end - s.start));
              const p = surfaces.push(payload) - 1;
              for (let r = 0; r < lay.regions.length; r++)
                at = writeShardOps(ops, at, lay, ids2, r, 0, p, s);
            }
            assert.ok(at <= slots);
            run(surfaces, ops, at);
            const heads = b - a;
            const written = new Uint8Array(dev.byteLength);
            for (let r = 0; r < lay.regions.length; r++)
              ids2.forEach((blk, j) => {
                const base = lay.regions[r]!.offsetBytes + blk * lay.blockStrideBytes;
                for (let t = 0; t < BS; t++)
                  for (let h = a; h < b; h++) {
                    const inBlock = order === 'NHD' ? t * heads + h - a : (h - a) * BS + t;
                    for (let x = 0; x < HEAD_BYTES; x++) {
                      const at2 = base + inBlock * HEAD_BYTES + x;
                      assert.equal(
                        dev[at2],
                        mark(r, j, t, h, x),
                        `tp ${tp} r${rank} w${width} region ${r} block ${blk} token ${t} head ${h}`,
                      );
                      written[at2] = 1;
                    }
                  }
              });
            // Nothing else in the engine's memory was written.
            dev.forEach((v, i) => {
              if (written[i] === 0) assert.equal(v, 0, `byte ${i} written`);
            });
          }
        }
      });

  test('one op per token into NHD blocks, one per head and token into HND ones', () => {
    const nhd = layout(1, 0, 'NHD');
    const hnd = layout(1, 0, 'HND');
    const shard = { start: 0, end: 2 };
    for (const [lay, perToken] of [
      [nhd, 1],
      [hnd, 2],
    ] as const) {
      const ops = new Float64Array(shardRegionOpSlots(lay, 2, 2));
      const end = writeShardOps(ops, 0, lay, [3, 5], 0, 0, 1, shard);
      assert.equal(end, 5 * 2 * BS * perToken);
      for (let i = 0; i < end; i += 5) assert.equal(ops[i + 4], (2 / perToken) * HEAD_BYTES);
    }
  });

  test('ops that continue each other merge: a one-head rank reads a contiguous run per block', () => {
    // TP 4 reads head 1 from a one-head shard: the shard's block is the rank's block.
    const lay = layout(4, 1, 'NHD');
    const ops = new Float64Array(shardRegionOpSlots(lay, 1, 1));
    const end = writeShardOps(ops, 0, lay, [2], 0, 0, 1, { start: 1, end: 2 });
    assert.equal(end, 5);
    assert.equal(ops[4], BS * HEAD_BYTES);
    // A shard that does not overlap the rank writes nothing.
    assert.equal(writeShardOps(ops, 0, lay, [2], 0, 0, 1, { start: 2, end: 4 }), 0);
  });

  test('no cover among namespaces that miss a shard, and none for the own namespace', () => {
    const lay = layout(1, 0, 'NHD');
    const half = headCovers(lay.namespace.spec).find((c) => c.width === 2)!;
    assert.equal(coverAmong(lay, [half.shards[0]!.namespace.id]), undefined);
    assert.equal(coverAmong(lay, [lay.namespace.id]), undefined);
  });
});
