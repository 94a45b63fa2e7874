/**
 * Engines whose KV tensors differ in layout share chunks: FlashAttention
 * (`[2, blocks, ...]`) and FlashInfer (`[blocks, 2, ...]`) tensors, each with token-major (NHD)
 * or head-major (HND) blocks, register real shared-memory files with an in-process sidecar over
 * ZMQ, derive one namespace, and what one saves the others load, compared head by head for every
 * token of every block of every layer.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, afterEach, before, describe, it } from 'node:test';
import { DataPlaneClient } from '../../src/data-plane/data-plane-client.ts';
import type { KvBlockLayout, KvRegistration } from '../../src/data-plane/kv-layout.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
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
const BLOCK_BYTES = BS * HEADS * HEAD_BYTES;
const LAYER_BYTES = 2 * NB * BLOCK_BYTES;
const FILE_BYTES = LAYERS * LAYER_BYTES;
const SLOTS = 4;

/** A vLLM attention backend's KV tensor shape and in-block order. */
interface Engine {
  name: string;
  /** `flash_attn`: `[2, blocks, ...]`; `flashinfer` (and Triton): `[blocks, 2, ...]`. */
  shape: 'flash_attn' | 'flashinfer';
  order: KvBlockLayout;
}

const ENGINES: Engine[] = [
  { name: 'FlashAttention NHD', shape: 'flash_attn', order: 'NHD' },
  { name: 'FlashAttention HND', shape: 'flash_attn', order: 'HND' },
  { name: 'FlashInfer NHD', shape: 'flashinfer', order: 'NHD' },
  { name: 'FlashInfer HND', shape: 'flashinfer', order: 'HND' },
];

/** Where block 0 of layer `l`'s K (kv 0) or V (kv 1) is, and the block stride. */
function region(e: Engine, l: number, kv: number): { offset: number; stride: number } {
  const base = l * LAYER_BYTES;
  return e.shape === 'flash_attn'
    ? { offset: base + kv * NB * BLOCK_BYTES, stride: BLOCK_BYTES }
    : { offset: base + kv * BLOCK_BYTES, stride: 2 * BLOCK_BYTES };
}

/** Byte offset of head `h` of token `t` of block `b` in layer `l`'s K or V. */
function headAt(e: Engine, l: number, kv: number, b: number, t: number, h: number): number {
  const { offset, stride } = region(e, l, kv);
  const inBlock = e.order === 'NHD' ? t * HEADS + h : h * BS + t;
  return offset + b * stride + inBlock * HEAD_BYTES;
}

const dir = mkdtempSync(join(tmpdir(), 'kvtier-dp-layouts-'));
let fileNo = 0;
let sidecar: Sidecar;
const cleanups: (() => Promise<void>)[] = [];

function registration(e: Engine, path: string, engineId: string, state?: string): KvRegistration {
  return {
    engineId,
    device: 'host',
    modelId: 'test/layouts',
    dtype: 'bf16',
    numKvHeads: HEADS,
    headDim: HEAD_DIM,
    tpSize: 1,
    tpRank: 0,
    mla: false,
    numBlocks: NB,
    blockSize: BS,
    blockStrideBytes: region(e, 0, 0).stride,
    chunkSize: CHUNK,
    blockLayout: e.order,
    layers: Array.from({ length: LAYERS }, (_, l) => ({
      k: { path, offsetBytes: region(e, l, 0).offset },
      v: { path, offsetBytes: region(e, l, 1).offset },
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

describe('KV shared across attention layouts', () => {
  for (const saverEngine of ENGINES) {
    it(`what a ${saverEngine.name} engine saves, every layout loads head for head`, async () => {
      const from = [3, 17, 8, 30, 1, 12];
      const to = [0, 31, 5, 6, 22, 9];
      const hashes = randomHashes(from.length / 2);
      const srcPath = file(randomPayload(FILE_BYTES));
      const saver = client();
      const reg = await saver.register(registration(saverEngine, srcPath, `save-${fileNo}`));
      const saved = await saver.save({
        requestId: `save-${fileNo}`,
        blockIds: from,
        chunkHashes: packed(hashes),
      });
      assert.deepEqual(saved, { saved: hashes.length, skipped: 0, dropped: 0 });
      const src = readFileSync(srcPath);

      for (const e of ENGINES) {
        const dstPath = file(Buffer.alloc(FILE_BYTES));
        const statePath = file(Buffer.alloc(4 * SLOTS));
        const loader = client();
        const id = `load-${fileNo}`;
        const reg2 = await loader.register(registration(e, dstPath, id, statePath));
        assert.equal(reg2.namespace, reg.namespace, `${e.name}: one namespace for every layout`);
        // The answer confirms the order the copies assume (a worker of HND blocks needs it).
        assert.equal(reg2.blockLayout, e.order, `${e.name}: the sidecar says it copies ${e.order}`);
        const lookup = new LookupClient({
          endpoint: sidecar.server.endpoint,
          namespaces: [reg.namespace],
          lookupTimeoutMs: 20_000,
        });
        cleanups.push(() => lookup.close());
        const answer = await lookup.lookupAsync(
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
        for (let l = 0; l < LAYERS; l++)
          for (let kv = 0; kv < 2; kv++)
            from.forEach((b, j) => {
              for (let t = 0; t < BS; t++)
                for (let h = 0; h < HEADS; h++) {
                  const s = headAt(saverEngine, l, kv, b, t, h);
                  const d = headAt(e, l, kv, to[j]!, t, h);
                  if (!src.subarray(s, s + HEAD_BYTES).equals(dst.subarray(d, d + HEAD_BYTES)))
                    assert.fail(
                      `${saverEngine.name} -> ${e.name}: layer ${l} ${kv ? 'V' : 'K'} block ${b} -> ${to[j]} token ${t} head ${h} differs`,
                    );
                }
            });
      }
    });
  }
});
