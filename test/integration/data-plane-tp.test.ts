/**
 * KV shared across tensor-parallel sizes: the two ranks of an engine at TP 2 register real
 * shared-memory files with an in-process sidecar over ZMQ and save; the ranks of engines at TP 1,
 * TP 4 and TP 8 (more ranks than KV heads: each head on two ranks), with token-major (NHD) and
 * head-major (HND) blocks, look up the TP 2 ranks' head shards that cover their own heads and
 * load, and every head of every token of every block of every layer is compared with what the
 * TP 2 rank holding that head saved.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, afterEach, before, describe, it } from 'node:test';
import { DataPlaneClient } from '../../src/data-plane/data-plane-client.ts';
import type { KvBlockLayout, KvRegistration } from '../../src/data-plane/kv-layout.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { headCovers, kvHeadRange, type NamespaceSpec } from '../../src/namespace/namespace.ts';
import type { Sidecar } from '../../src/sidecar.ts';
import { randomHashes, randomPayload } from '../support/fixtures.ts';
import { startHostSidecar } from '../support/host-sidecar.ts';

const LAYERS = 2;
const HEADS = 4;
const HEAD_DIM = 8;
const HEAD_BYTES = HEAD_DIM * 2; // bf16
const BS = 4;
const NB = 32;
const CHUNK = 2 * BS;
const SLOTS = 4;
const SAVER_TP = 2;
const MODEL = 'test/tp-sharing';

/** One rank of an engine: its TP size and rank, and its blocks' in-block order. */
interface Rank {
  tp: number;
  rank: number;
  order: KvBlockLayout;
}

const perRank = (tp: number) => Math.max(1, HEADS / tp);
const blockBytes = (tp: number) => BS * perRank(tp) * HEAD_BYTES;
/** FlashAttention's `[2, blocks, ...]` per layer: K blocks then V blocks. */
const layerBytes = (tp: number) => 2 * NB * blockBytes(tp);
const fileBytes = (tp: number) => LAYERS * layerBytes(tp);

/** Byte offset of local head `h` of token `t` of block `b` in layer `l`'s K (kv 0) or V. */
function headAt(r: Rank, l: number, kv: number, b: number, t: number, h: number): number {
  const heads = perRank(r.tp);
  const inBlock = r.order === 'NHD' ? t * heads + h : h * BS + t;
  return l * layerBytes(r.tp) + (kv * NB + b) * blockBytes(r.tp) + inBlock * HEAD_BYTES;
}

function spec(r: Rank): NamespaceSpec {
  return {
    modelId: MODEL,
    dtype: 'bfloat16',
    numLayers: LAYERS,
    numKvHeads: HEADS,
    headDim: HEAD_DIM,
    blockSize: BS,
    tpSize: r.tp,
    tpRank: r.rank,
    mla: false,
    layoutVersion: 1,
  };
}

const dir = mkdtempSync(join(tmpdir(), 'kvtier-dp-tp-'));
let fileNo = 0;
let sidecar: Sidecar;
const cleanups: (() => Promise<void>)[] = [];

function registration(r: Rank, path: string, engineId: string, state?: string): KvRegistration {
  return {
    engineId,
    device: 'host',
    modelId: MODEL,
    dtype: 'bf16',
    numKvHeads: HEADS,
    headDim: HEAD_DIM,
    tpSize: r.tp,
    tpRank: r.rank,
    mla: false,
    numBlocks: NB,
    blockSize: BS,
    blockStrideBytes: blockBytes(r.tp),
    chunkSize: CHUNK,
    blockLayout: r.order,
    layers: Array.from({ length: LAYERS }, (_, l) => ({
      k: { path, offsetBytes: l * layerBytes(r.tp) },
      v: { path, offsetBytes: l * layerBytes(r.tp) + NB * blockBytes(r.tp) },
    })),
    ...(state === undefined ? {} : { stateFile: { path: state, slots: SLOTS } }),
  };
}

function file(contents: Buffer): string {
  const path = join(dir, `f-${fileNo++}.bin`);
  writeFileSync(path, contents);
  return path;
}

function client(): DataPlaneClient {
  const c = new DataPlaneClient({
    endpoint: sidecar.server.endpoint,
    heartbeatIntervalMs: 0,
    requestTimeoutMs: 20_000,
  });
  cleanups.push(() => c.close());
  return c;
}

function lookupClient(namespaces: string[]): LookupClient {
  const c = new LookupClient({
    endpoint: sidecar.server.endpoint,
    namespaces,
    lookupTimeoutMs: 20_000,
  });
  cleanups.push(() => c.close());
  return c;
}

const packed = (hashes: string[]) => Buffer.from(hashes.join(''), 'hex');

before(async () => {
  sidecar = await startHostSidecar(8 * 1024 * 1024);
});
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});
after(async () => {
  await sidecar.close();
  rmSync(dir, { recursive: true, force: true });
});

/** The TP 2 engine's two ranks save the same three chunks; returns their files' bytes. */
async function saveAtTp2(from: number[], hashes: string[]): Promise<Buffer[]> {
  const out: Buffer[] = [];
  for (let rank = 0; rank < SAVER_TP; rank++) {
    const r: Rank = { tp: SAVER_TP, rank, order: rank === 0 ? 'NHD' : 'HND' };
    const path = file(randomPayload(fileBytes(SAVER_TP)));
    const saver = client();
    const id = `save-${fileNo}`;
    await saver.register(registration(r, path, id));
    const saved = await saver.save({ requestId: id, blockIds: from, chunkHashes: packed(hashes) });
    assert.deepEqual(saved, { saved: hashes.length, skipped: 0, dropped: 0 });
    out.push(readFileSync(path));
  }
  return out;
}

describe('KV shared across tensor-parallel sizes', () => {
  for (const tp of [1, 4, 8]) {
    for (const order of ['NHD', 'HND'] as const) {
      it(`what a TP 2 engine saves, every rank of a TP ${tp} ${order} engine loads head for head`, async () => {
        const from = [3, 17, 8, 30, 1, 12];
        const to = [0, 31, 5, 6, 22, 9];
        const hashes = randomHashes(from.length / 2);
        const saved = await saveAtTp2(from, hashes);
        const before = sidecar.dataPlane!.stats().crossTpLoads;
        for (let rank = 0; rank < tp; rank++) {
          const r: Rank = { tp, rank, order };
          const [a, b] = kvHeadRange(spec(r));
          const dstPath = file(Buffer.alloc(fileBytes(tp)));
          const statePath = file(Buffer.alloc(4 * SLOTS));
          const loader = client();
          const id = `load-${fileNo}`;
          const reg = await loader.register(registration(r, dstPath, id, statePath));

          // Its own namespace holds nothing: no engine at TP ${tp} saved.
          const own = await lookupClient([reg.namespace]).lookupAsync(
            `own-${id}`,
            packed(hashes),
            hashes.map(() => CHUNK),
          );
          assert.equal(own.hitTokens, 0);

          const cover = headCovers(spec(r)).find((c) => c.width === HEADS / SAVER_TP)!;
          assert.equal(cover.shards.length, tp === 1 ? 2 : 1);
          const answer = await lookupClient(cover.shards.map((s) => s.namespace.id)).lookupAsync(
            `lk-${id}`,
            packed(hashes),
            hashes.map(() => CHUNK),
          );
          assert.equal(answer.hitTokens, hashes.length * CHUNK);
          const loaded = await loader.load({
            requestId: `r-${id}`,
            lookupId: `lk-${id}`,
            blockIds: to,
            chunkHashes: packed(hashes),
            stateSlot: 1,
          });
          assert.deepEqual(loaded, { loadedTokens: hashes.length * CHUNK, invalidBlockIds: [] });
          const dst = readFileSync(dstPath);
          const untouched = Buffer.from(dst);
          for (let l = 0; l < LAYERS; l++)
            for (let kv = 0; kv < 2; kv++)
              from.forEach((blk, j) => {
                for (let t = 0; t < BS; t++)
                  for (let g = a; g < b; g++) {
                    const sr: Rank = {
                      tp: SAVER_TP,
                      rank: Math.floor(g / perRank(SAVER_TP)),
                      order: g < perRank(SAVER_TP) ? 'NHD' : 'HND',
                    };
                    const s = headAt(sr, l, kv, blk, t, g % perRank(SAVER_TP));
                    const d = headAt(r, l, kv, to[j]!, t, g - a);
                    const want = saved[sr.rank]!.subarray(s, s + HEAD_BYTES);
                    if (!want.equals(dst.subarray(d, d + HEAD_BYTES)))
                      assert.fail(
                        `TP ${tp} rank ${rank} ${order}: layer ${l} ${kv ? 'V' : 'K'} block ${blk} -> ${to[j]} token ${t} head ${g} differs`,
                      );
                    untouched.fill(0, d, d + HEAD_BYTES);
                  }
              });
          // Nothing outside the loaded heads of the loaded blocks was written.
          assert.ok(untouched.every((x) => x === 0));
        }
        assert.equal(sidecar.dataPlane!.stats().crossTpLoads - before, tp);
      });
    }
  }

  it('a lookup that names a cover the loader does not hold fails the load, never copies', async () => {
    const hashes = randomHashes(1);
    await saveAtTp2([2, 4], hashes);
    const r: Rank = { tp: 4, rank: 0, order: 'NHD' };
    const dstPath = file(Buffer.alloc(fileBytes(4)));
    const loader = client();
    await loader.register(registration(r, dstPath, `wrong-${fileNo}`));
    // Rank 3 of TP 4 holds head 3: the TP 2 shard covering it is rank 1's, not rank 0's heads.
    const other = headCovers(spec({ tp: 4, rank: 3, order: 'NHD' })).find((c) => c.width === 2)!;
    await lookupClient(other.shards.map((s) => s.namespace.id)).lookupAsync(
      'lk-wrong',
      packed(hashes),
      [CHUNK],
    );
    const loaded = await loader.load({
      requestId: 'r-wrong',
      lookupId: 'lk-wrong',
      blockIds: [7, 9],
      chunkHashes: packed(hashes),
    });
    assert.deepEqual(loaded, { loadedTokens: 0, invalidBlockIds: [7, 9] });
    assert.ok(readFileSync(dstPath).every((x) => x === 0));
  });
});
