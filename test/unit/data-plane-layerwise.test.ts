/**
 * Layer-wise loads (LOAD's `progressSlot`): every chunk's layer 0, then layer 1, ...; the state
 * file's progress slot counts the layers in place, written only after their copies completed;
 * all or nothing per chunk; checked with the file copy engine (progress written by a copy) and
 * the addon's (written into the mapping).
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, afterEach, describe, test } from 'node:test';
import { LocalCpuBackend } from '../../src/backends/local-cpu/local-cpu-backend.ts';
import type { CopyEngine } from '../../src/data-plane/copy-engine-types.ts';
import { DataPlane } from '../../src/data-plane/data-plane.ts';
import { LOAD_STATE } from '../../src/data-plane/data-plane-types.ts';
import { createFsCopyEngine } from '../../src/data-plane/fs-copy-engine.ts';
import type { KvRegistration } from '../../src/data-plane/kv-layout.ts';
import { createNativeCopyEngine } from '../../src/data-plane/native-copy-engine.ts';
import { KvtierError } from '../../src/errors.ts';
import { type ChunkHash, chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';
import { StorageManager } from '../../src/storage-manager/storage-manager.ts';

const LAYERS = 6;
const BLOCKS = 64;
const BLOCK = 64; // bytes of one block of one region (no stride padding)
const BPC = 4; // blocks per chunk
const REGION = BLOCKS * BLOCK;

const dir = mkdtempSync(join(tmpdir(), 'kvtier-layerwise-'));
after(() => rmSync(dir, { recursive: true, force: true }));
let files = 0;

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0)) await c();
});

/** Which layer a byte offset of the KV file lies in (K and V of layer l are regions 2l, 2l+1). */
const layerAt = (offset: number) => Math.floor(offset / REGION / 2);

interface Rig {
  dp: DataPlane;
  sm: StorageManager;
  kv: string;
  state: string;
  /** What the engine saw, in order: copies of KV bytes (their layers) and progress writes. */
  log: Array<{ issued?: number[]; done?: number[]; progress?: number }>;
  ns: string;
  /** Called after each KV copy completed, with how many have. */
  onDone?: (copies: number) => void;
}

async function rig(
  engine: CopyEngine,
  opts: { groupBytes: number; inFlight: number },
): Promise<Rig> {
  const kv = join(dir, `kv-${files}.bin`);
  const state = join(dir, `state-${files++}.bin`);
  writeFileSync(kv, randomBytes(2 * LAYERS * REGION));
  writeFileSync(state, Buffer.alloc(16 * 4));
  const log: Rig['log'] = [];
  let dones = 0;
  let self: Rig | undefined;
  let kvSurface: unknown;
  let stateSurface: unknown;
  const spy: CopyEngine = {
    async openFile(path) {
      const s = await engine.openFile(path);
      if (path === kv) kvSurface = s;
      if (path === state) {
        stateSurface = s;
        if (s.writeWord !== undefined) {
          const write = s.writeWord.bind(s);
          (s as { writeWord: (o: number, v: number) => void }).writeWord = (o, v) => {
            if (o === 4) log.push({ progress: v });
            write(o, v);
          };
        }
      }
      return s;
    },
    async copy(surfaces, ops, options) {
      const layers: number[] = [];
      for (let i = 0; i < ops.length; i += 5) {
        if (surfaces[ops[i + 2]!] === kvSurface) layers.push(layerAt(ops[i + 3]!));
        if (surfaces[ops[i + 2]!] === stateSurface && ops[i + 3] === 4) {
          const src = surfaces[ops[i]!] as Uint8Array;
          log.push({ progress: new DataView(src.buffer, src.byteOffset).getUint32(0, true) });
        }
      }
      if (layers.length > 0) log.push({ issued: [...new Set(layers)] });
      await engine.copy(surfaces, ops, options);
      if (layers.length > 0) {
        log.push({ done: [...new Set(layers)] });
        self?.onDone?.(++dones);
      }
    },
  };
  const cpu = new LocalCpuBackend({ capacityBytes: 1 << 20, pageBytes: 4096 }, { name: 'cpu' });
  const sm = new StorageManager({ tiers: [cpu], sweepIntervalMs: 0, pinTtlMs: 60_000 });
  const dp = new DataPlane({
    storage: sm,
    copyEngine: spy,
    sweepIntervalMs: 0,
    loadGroupBytes: opts.groupBytes,
    loadGroupsInFlight: opts.inFlight,
  });
  cleanups.push(async () => {
    await dp.close();
    await sm.close();
  });
  const reg: KvRegistration = {
    engineId: 'E',
    device: 'host',
    modelId: 'test/layerwise',
    dtype: 'bf16',
    numKvHeads: 2,
    headDim: 4,
    tpSize: 1,
    tpRank: 0,
    mla: false,
    numBlocks: BLOCKS,
    blockSize: 4,
    blockStrideBytes: BLOCK,
    chunkSize: 4 * BPC,
    stateFile: { path: state, slots: 16 },
    layers: Array.from({ length: LAYERS }, (_, l) => ({
      k: { path: kv, offsetBytes: 2 * l * REGION },
      v: { path: kv, offsetBytes: (2 * l + 1) * REGION },
    })),
  };
  const layout = await dp.register(reg);
  self = { dp, sm, kv, state, log, ns: layout.namespace.id };
  return self;
}

function hashes(n: number): ChunkHash[] {
  return Array.from({ length: n }, () => chunkHashFromBytes(randomBytes(32)));
}

/** Every region's bytes of one block. */
function block(path: string, id: number): Buffer[] {
  const f = readFileSync(path);
  return Array.from({ length: 2 * LAYERS }, (_, r) =>
    Buffer.from(f.subarray(r * REGION + id * BLOCK, r * REGION + (id + 1) * BLOCK)),
  );
}

async function saveAndLookUp(r: Rig, chunks: number, lookupId: string) {
  const hs = hashes(chunks);
  const src = Array.from({ length: chunks * BPC }, (_, i) => i);
  const dst = Array.from({ length: chunks * BPC }, (_, i) => 32 + i);
  const saved = await r.dp.save({ engineId: 'E', requestId: 'w', blockIds: src, chunkHashes: hs });
  assert.equal(saved.saved, chunks);
  r.log.length = 0;
  const hit = await r.sm.lookup({
    lookupId,
    namespaces: [r.ns],
    hashes: hs,
    tokenCounts: hs.map(() => 4 * BPC),
  });
  assert.equal(hit.hitChunks, chunks);
  return { hs, src, dst };
}

const word = (path: string, slot: number) => readFileSync(path).readInt32LE(4 * slot);

/** Request `q`'s layer-wise LOAD of lookup `L` into `blockIds`. */
function layerwiseLoad(
  r: Rig,
  blockIds: number[],
  chunkHashes: ChunkHash[],
  stateSlot: number,
  progressSlot: number,
) {
  return r.dp.load({
    engineId: 'E',
    requestId: 'q',
    lookupId: 'L',
    blockIds,
    chunkHashes,
    stateSlot,
    progressSlot,
  });
}

const native = createNativeCopyEngine().engine;
const engines: Array<[string, () => CopyEngine]> = [['file copy engine', createFsCopyEngine]];
if (native !== null) engines.push(['native addon (mapped state file)', () => native]);

for (const [name, make] of engines) {
  describe(`layer-wise LOAD, ${name}`, () => {
    test('copies layer by layer and counts layers only once their copies completed', async () => {
      // Groups of 3 regions' blocks of 4 chunks: a layer (2 regions x 4 chunks) spans 3 groups.
      const r = await rig(make(), { groupBytes: 3 * BPC * BLOCK, inFlight: 2 });
      const { src, dst, hs } = await saveAndLookUp(r, 4, 'L');
      const res = await layerwiseLoad(r, dst, hs, 0, 1);
      assert.deepEqual(res, { loadedTokens: 4 * BPC * 4, invalidBlockIds: [] });
      for (let i = 0; i < src.length; i++)
        assert.deepEqual(block(r.kv, dst[i]!), block(r.kv, src[i]!));
      assert.equal(word(r.state, 0), LOAD_STATE.DONE);
      assert.equal(word(r.state, 1), LAYERS);
      // Layer-major: no group mixes layers, layers never go back.
      const issued = r.log.filter((e) => e.issued !== undefined).map((e) => e.issued!);
      assert.ok(
        issued.every((ls) => ls.length === 1),
        JSON.stringify(issued),
      );
      const order = issued.map((ls) => ls[0]!);
      assert.deepEqual(
        order,
        [...order].sort((a, b) => a - b),
      );
      assert.ok(issued.length > LAYERS, 'a layer spans several groups');
      // Progress 1..LAYERS, each after every copy of the layers it counts completed.
      const progress = r.log.filter((e) => e.progress !== undefined).map((e) => e.progress!);
      assert.deepEqual(
        progress,
        Array.from({ length: LAYERS }, (_, l) => l + 1),
      );
      for (const [at, e] of r.log.entries()) {
        const p = e.progress;
        if (p === undefined) continue;
        const before = r.log.slice(0, at);
        for (const [i, ev] of before.entries()) {
          if (ev.issued === undefined || ev.issued[0]! >= p) continue;
          const doneAfter = before.slice(i + 1).some((d) => d.done?.[0] === ev.issued![0]);
          assert.ok(
            doneAfter,
            `progress ${e.progress} written before layer ${ev.issued[0]} completed`,
          );
        }
        const later = r.log.slice(at + 1).filter((d) => d.issued !== undefined && d.issued[0]! < p);
        assert.deepEqual(later, [], `layer copies after progress ${e.progress}`);
      }
    });

    test('a chunk that cannot load: the others load layer by layer, the completion word fails', async () => {
      const r = await rig(make(), { groupBytes: 1 << 20, inFlight: 4 });
      const { dst, hs } = await saveAndLookUp(r, 3, 'L');
      const missing = [...hs, chunkHashFromBytes(randomBytes(32))];
      const extra = [...dst, 60, 61, 62, 63];
      const res = await layerwiseLoad(r, extra, missing, 2, 3);
      assert.deepEqual(res, { loadedTokens: 3 * BPC * 4, invalidBlockIds: [60, 61, 62, 63] });
      assert.equal(word(r.state, 2), LOAD_STATE.FAILED);
      // The last layer is never announced: the engine learns the outcome from the completion word.
      assert.equal(word(r.state, 3), LAYERS - 1);
    });

    test('cut short between layers: nothing counts as loaded, every block invalid', async () => {
      const r = await rig(make(), { groupBytes: 2 * BPC * BLOCK, inFlight: 1 });
      const { dst, hs } = await saveAndLookUp(r, 2, 'L');
      // One group is one chunk's K and V of a layer: the request ends once both chunks' layer 0
      // is in, so the next group is never started.
      let copied = 0;
      r.onDone = (n) => {
        copied = n;
        if (n === 2) r.dp.requestFinished('E', 'q');
      };
      const res = await layerwiseLoad(r, dst, hs, 4, 5);
      assert.equal(copied, 2);
      assert.deepEqual(res, { loadedTokens: 0, invalidBlockIds: dst });
      assert.equal(word(r.state, 4), LOAD_STATE.FAILED);
      assert.equal(word(r.state, 5), 1, 'layer 0 was in place');
    });

    test('progressSlot is checked against the state file', async () => {
      const r = await rig(make(), { groupBytes: 1 << 20, inFlight: 2 });
      const { dst, hs } = await saveAndLookUp(r, 1, 'L');
      for (const [progressSlot, re] of [
        [16, /load\.progressSlot/],
        [-1, /load\.progressSlot/],
        [0, /must differ from load\.stateSlot/],
      ] as const) {
        await assert.rejects(
          r.dp.load({
            engineId: 'E',
            requestId: 'q',
            lookupId: 'L',
            blockIds: dst.slice(0, BPC),
            chunkHashes: hs,
            stateSlot: 0,
            progressSlot,
          }),
          (err: unknown) =>
            err instanceof KvtierError &&
            err.code === 'KVT_INVALID_ARGUMENT' &&
            re.test(err.message),
        );
      }
    });
  });
}
