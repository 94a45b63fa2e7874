import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, afterEach, describe, test } from 'node:test';
import { LocalCpuBackend } from '../../src/backends/local-cpu/local-cpu-backend.ts';
import { MemoryBackend } from '../../src/backends/memory/memory-backend.ts';
import {
  type CopyEngine,
  DataPlane,
  type DataPlaneOptions,
  LOAD_STATE,
} from '../../src/data-plane/data-plane.ts';
import { createFsCopyEngine } from '../../src/data-plane/fs-copy-engine.ts';
import type { KvRegistration } from '../../src/data-plane/kv-layout.ts';
import { KvtierError } from '../../src/errors.ts';
import { type ChunkHash, chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';
import { StorageManager } from '../../src/storage-manager/storage-manager.ts';

// 8 layers, K and V, 2 heads x 8 dims bf16 = 32 B/token/layer; 4-token blocks (128 B) at a
// 160-byte stride (the padding must never be touched); 16-token chunks = 4 blocks = 8 KiB.
const LAYERS = 8;
const NUM_BLOCKS = 64;
const STRIDE = 160;
const BLOCK_BYTES = 128;
const HEADER = 64;
const CHUNK_TOKENS = 16;
const BPC = 4;

const dir = mkdtempSync(join(tmpdir(), 'kvtier-dp-'));
after(() => rmSync(dir, { recursive: true, force: true }));
let fileNo = 0;

function regionOffset(r: number, mla: boolean): number {
  return HEADER + r * NUM_BLOCKS * STRIDE * (mla ? 2 : 1);
}

/** A shared-memory-style KV file filled with random bytes. */
function kvFile(bytes = HEADER + 2 * LAYERS * NUM_BLOCKS * STRIDE): string {
  const path = join(dir, `kv-${fileNo++}.bin`);
  writeFileSync(path, randomBytes(bytes));
  return path;
}

function registration(path: string, engineId: string, mla = false): KvRegistration {
  return {
    engineId,
    device: 'host',
    modelId: 'test/llama-tiny',
    dtype: 'bf16',
    numKvHeads: mla ? 1 : 2,
    headDim: mla ? 16 : 8,
    tpSize: 1,
    tpRank: 0,
    mla,
    numBlocks: NUM_BLOCKS,
    blockSize: 4,
    blockStrideBytes: STRIDE,
    chunkSize: CHUNK_TOKENS,
    layers: Array.from({ length: LAYERS }, (_, l) =>
      mla
        ? { k: { path, offsetBytes: regionOffset(l, true) } }
        : {
            k: { path, offsetBytes: regionOffset(2 * l, false) },
            v: { path, offsetBytes: regionOffset(2 * l + 1, false) },
          },
    ),
  };
}

/** Every region's bytes of one block (stride padding included), read straight from the file. */
function blockBytes(path: string, blockId: number, mla = false): Buffer[] {
  const file = readFileSync(path);
  const regions = mla ? LAYERS : 2 * LAYERS;
  return Array.from({ length: regions }, (_, r) => {
    const at = regionOffset(r, mla) + blockId * STRIDE;
    return file.subarray(at, at + STRIDE);
  });
}

function hashes(n: number): ChunkHash[] {
  return Array.from({ length: n }, () => chunkHashFromBytes(randomBytes(32)));
}

function shuffledBlocks(): number[] {
  const ids = Array.from({ length: NUM_BLOCKS }, (_, i) => i);
  for (let i = ids.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [ids[i], ids[j]] = [ids[j]!, ids[i]!];
  }
  return ids;
}

interface Env {
  sm: StorageManager;
  dp: DataPlane;
  cpu: LocalCpuBackend;
  lower: MemoryBackend;
  clock: { now: number };
}

const envs: Env[] = [];
afterEach(async () => {
  for (const e of envs.splice(0)) {
    await e.dp.close();
    await e.sm.close();
  }
});

function env(opts: Partial<DataPlaneOptions> = {}, lowerTier = true): Env {
  const clock = { now: 1_000_000 };
  const cpu = new LocalCpuBackend({ capacityBytes: 1 << 20, pageBytes: 4096 }, { name: 'cpu' });
  const lower = new MemoryBackend({}, { name: 'mem' });
  const sm = new StorageManager({
    tiers: lowerTier ? [cpu, lower] : [cpu],
    sweepIntervalMs: 0,
    pinTtlMs: 1000,
    now: () => clock.now,
  });
  const dp = new DataPlane({ storage: sm, sweepIntervalMs: 0, now: () => clock.now, ...opts });
  const e = { sm, dp, cpu, lower, clock };
  envs.push(e);
  return e;
}

function pins(e: Env): number {
  return e.cpu.stats().pinnedChunks;
}

async function lookup(e: Env, lookupId: string, ns: string, hs: ChunkHash[]): Promise<number> {
  const out = await e.sm.lookup({
    lookupId,
    namespaces: [ns],
    hashes: hs,
    tokenCounts: hs.map(() => CHUNK_TOKENS),
  });
  return out.hitChunks;
}

/** The stored bytes (stride padding excluded) of every region of each block. */
function snapshot(path: string, ids: readonly number[], mla = false): Buffer[][] {
  return ids.map((b) =>
    blockBytes(path, b, mla).map((r) => Buffer.from(r.subarray(0, BLOCK_BYTES))),
  );
}

function assertLoaded(before: Buffer[][], path: string, dst: readonly number[], mla = false): void {
  assert.equal(before.length, dst.length);
  const after = snapshot(path, dst, mla);
  for (const [i, regions] of after.entries())
    for (const [r, region] of regions.entries())
      assert.equal(
        Buffer.compare(region, before[i]![r]!),
        0,
        `block ${dst[i]} region ${r} differs`,
      );
}

async function expectCode(p: Promise<unknown> | (() => unknown), code: string, re?: RegExp) {
  const run = typeof p === 'function' ? async () => p() : () => p;
  await assert.rejects(run, (err: unknown) => {
    assert.equal(err instanceof KvtierError, true, `expected a KvtierError, got ${String(err)}`);
    assert.equal((err as KvtierError).code, code);
    if (re !== undefined) assert.match((err as KvtierError).message, re);
    return true;
  });
}

describe('DataPlane save and load on the host device', () => {
  test('byte-exact round trips for several requests at once into different block ids', async () => {
    const e = env();
    const srcPath = kvFile();
    const dstPath = kvFile();
    const layout = await e.dp.register(registration(srcPath, 'A'));
    await e.dp.register(registration(dstPath, 'B'));
    const ns = layout.namespace.id;
    const src = shuffledBlocks();
    const dst = shuffledBlocks();
    const dstBefore = readFileSync(dstPath);
    // three requests of 3, 4 and 2.5 chunks (the last ends in a 2-block chunk)
    const reqs = [
      { id: 'r0', hs: hashes(3), src: src.slice(0, 12), dst: dst.slice(0, 12) },
      { id: 'r1', hs: hashes(4), src: src.slice(12, 28), dst: dst.slice(12, 28) },
      { id: 'r2', hs: hashes(3), src: src.slice(28, 38), dst: dst.slice(28, 38) },
    ];
    const saved = await Promise.all(
      reqs.map((r) =>
        e.dp.save({ engineId: 'A', requestId: r.id, blockIds: r.src, chunkHashes: r.hs }),
      ),
    );
    assert.deepEqual(
      saved.map((s) => s.saved),
      [3, 4, 3],
    );
    await e.sm.writeQueue.idle();
    assert.equal(e.lower.stats().chunks, 10, 'every chunk was written through');
    assert.equal(pins(e), 0);

    const words = reqs.map(() => new Int32Array(new SharedArrayBuffer(4)));
    const loaded = await Promise.all(
      reqs.map(async (r, i) => {
        assert.equal(await lookup(e, `L-${r.id}`, ns, r.hs), r.hs.length);
        return e.dp.load({
          engineId: 'B',
          requestId: r.id,
          lookupId: `L-${r.id}`,
          blockIds: r.dst,
          chunkHashes: r.hs,
          stateWord: words[i]!,
        });
      }),
    );
    assert.deepEqual(loaded, [
      { loadedTokens: 48, invalidBlockIds: [] },
      { loadedTokens: 64, invalidBlockIds: [] },
      { loadedTokens: 40, invalidBlockIds: [] },
    ]);
    assert.deepEqual(
      words.map((w) => Atomics.load(w, 0)),
      [LOAD_STATE.DONE, LOAD_STATE.DONE, LOAD_STATE.DONE],
    );
    for (const r of reqs) assertLoaded(snapshot(srcPath, r.src), dstPath, r.dst);
    // padding of written blocks and every block not loaded are untouched
    const dstAfter = readFileSync(dstPath);
    const written = new Set(reqs.flatMap((r) => r.dst));
    for (let r = 0; r < 2 * LAYERS; r++)
      for (let b = 0; b < NUM_BLOCKS; b++) {
        const at = regionOffset(r, false) + b * STRIDE;
        const from = written.has(b) ? at + BLOCK_BYTES : at;
        assert.equal(
          Buffer.compare(
            dstBefore.subarray(from, at + STRIDE),
            dstAfter.subarray(from, at + STRIDE),
          ),
          0,
          `region ${r} block ${b} changed outside the loaded bytes`,
        );
      }
    assert.equal(pins(e), 0, 'loads release their pins');
  });

  test('a chunk only in the lower tier is prefetched by the lookup and loads byte-exact', async () => {
    const e = env();
    const srcPath = kvFile();
    const layout = await e.dp.register(registration(srcPath, 'A'));
    const hs = hashes(2);
    const src = shuffledBlocks().slice(0, 8);
    await e.dp.save({ engineId: 'A', requestId: 'r', blockIds: src, chunkHashes: hs });
    await e.sm.writeQueue.idle();
    await e.cpu.clear();
    assert.equal(await lookup(e, 'L', layout.namespace.id, hs), 2);
    const dst = [40, 3, 17, 60, 9, 33, 1, 22];
    const before = snapshot(srcPath, src);
    const out = await e.dp.load({
      engineId: 'A',
      requestId: 'r2',
      lookupId: 'L',
      blockIds: dst,
      chunkHashes: hs,
    });
    assert.deepEqual(out, { loadedTokens: 32, invalidBlockIds: [] });
    assertLoaded(before, srcPath, dst);
  });

  test('the stored payload follows the documented layout: region-major, blocks in chunk order', async () => {
    const e = env({}, false);
    const path = kvFile();
    const layout = await e.dp.register(registration(path, 'A'));
    const [h] = hashes(1);
    const ids = [9, 2, 40];
    await e.dp.save({ engineId: 'A', requestId: 'r', blockIds: ids, chunkHashes: [h!] });
    const chunk = await e.sm.get(layout.namespace.id, h!);
    assert.equal(chunk?.tokens, 12);
    assert.equal(chunk?.data.byteLength, 2 * LAYERS * 3 * BLOCK_BYTES);
    const blocks = snapshot(path, ids);
    for (let r = 0; r < 2 * LAYERS; r++)
      for (let j = 0; j < ids.length; j++) {
        const at = (r * ids.length + j) * BLOCK_BYTES;
        assert.equal(
          Buffer.compare(chunk!.data.subarray(at, at + BLOCK_BYTES), blocks[j]![r]!),
          0,
          `region ${r} block ${j} is not at payload offset ${at}`,
        );
      }
  });

  test('MLA: one latent region per layer round-trips', async () => {
    const e = env({}, false);
    const path = kvFile();
    const layout = await e.dp.register(registration(path, 'A', true));
    assert.equal(layout.regions.length, LAYERS);
    const hs = hashes(2);
    await e.dp.save({
      engineId: 'A',
      requestId: 'r',
      blockIds: [1, 3, 5, 7, 9, 11, 13, 15],
      chunkHashes: hs,
    });
    assert.equal(await lookup(e, 'L', layout.namespace.id, hs), 2);
    const dst = [50, 51, 2, 4, 6, 8, 10, 12];
    const before = snapshot(path, [1, 3, 5, 7, 9, 11, 13, 15], true);
    const out = await e.dp.load({
      engineId: 'A',
      requestId: 'r',
      lookupId: 'L',
      blockIds: dst,
      chunkHashes: hs,
    });
    assert.deepEqual(out, { loadedTokens: 32, invalidBlockIds: [] });
    assertLoaded(before, path, dst, true);
  });

  test('chunks already stored and skipped chunks are not gathered again', async () => {
    const e = env({}, false);
    const layout = await e.dp.register(registration(kvFile(), 'A'));
    const hs = hashes(3);
    const blocks = shuffledBlocks().slice(0, 12);
    assert.deepEqual(
      await e.dp.save({
        engineId: 'A',
        requestId: 'r',
        blockIds: blocks.slice(0, 8),
        chunkHashes: hs.slice(0, 2),
      }),
      { saved: 2, skipped: 0, dropped: 0 },
    );
    assert.deepEqual(
      await e.dp.save({ engineId: 'A', requestId: 'r', blockIds: blocks, chunkHashes: hs }),
      { saved: 1, skipped: 2, dropped: 0 },
    );
    const hs2 = hashes(3);
    assert.deepEqual(
      await e.dp.save({
        engineId: 'A',
        requestId: 'r',
        blockIds: blocks,
        chunkHashes: hs2,
        skipChunks: 2,
      }),
      { saved: 1, skipped: 2, dropped: 0 },
    );
    assert.equal(
      await e.cpu.batchedContains(layout.namespace.id, [hs2[0]!]),
      0,
      'a skipped chunk is not stored',
    );
    assert.equal(e.cpu.stats().chunks, 4);
  });

  test('a CPU tier without room drops and counts', async () => {
    const clock = { now: 0 };
    const cpu = new LocalCpuBackend({ capacityBytes: 16384, pageBytes: 4096 }, { name: 'cpu' });
    const sm = new StorageManager({ tiers: [cpu], sweepIntervalMs: 0, now: () => clock.now });
    const dp = new DataPlane({ storage: sm, sweepIntervalMs: 0 });
    envs.push({ sm, dp, cpu, lower: new MemoryBackend(), clock });
    const layout = await dp.register(registration(kvFile(), 'A'));
    const hs = hashes(4);
    const blocks = shuffledBlocks().slice(0, 8);
    assert.deepEqual(
      await dp.save({
        engineId: 'A',
        requestId: 'r',
        blockIds: blocks,
        chunkHashes: hs.slice(0, 2),
      }),
      { saved: 2, skipped: 0, dropped: 0 },
    );
    assert.equal(cpu.pin(layout.namespace.id, hs.slice(0, 2)), 2);
    assert.deepEqual(
      await dp.save({ engineId: 'A', requestId: 'r', blockIds: blocks, chunkHashes: hs.slice(2) }),
      { saved: 0, skipped: 0, dropped: 2 },
    );
    assert.equal(cpu.stats().droppedPuts, 2);
    assert.equal(cpu.stats().chunks, 2);
  });
});

describe('DataPlane SAVE with a CUDA event', () => {
  test('every copy of the save gets the event to wait for; loads get none', async () => {
    const base = createFsCopyEngine();
    const seen: Array<{ ops: number; waitEvent: Uint8Array | undefined }> = [];
    const spy: CopyEngine = {
      openFile: (p) => base.openFile(p),
      copy: async (s, o, options) => {
        seen.push({ ops: o.length / 5, waitEvent: options?.waitEvent });
        await base.copy(s, o, options);
      },
    };
    // Two chunks per copy group: a 3-chunk save is two copies.
    const e = env({ copyEngine: spy, copyGroupBytes: 2 * 8192 }, false);
    const path = kvFile();
    const layout = await e.dp.register(registration(path, 'A'));
    const hs = hashes(3);
    const event = Buffer.from(Array.from({ length: 64 }, (_, i) => 255 - i));
    const src = Array.from({ length: 12 }, (_, i) => i);
    const out = await e.dp.save({
      engineId: 'A',
      requestId: 'w',
      blockIds: src,
      chunkHashes: hs,
      cudaEvent: event,
    });
    assert.deepEqual(out, { saved: 3, skipped: 0, dropped: 0 });
    assert.equal(seen.length, 2);
    for (const c of seen) assert.equal(c.waitEvent, event);
    seen.length = 0;
    assert.equal(await lookup(e, 'L', layout.namespace.id, hs), 3);
    const dst = Array.from({ length: 12 }, (_, i) => 30 + i);
    const loaded = await e.dp.load({
      engineId: 'A',
      requestId: 'r',
      lookupId: 'L',
      blockIds: dst,
      chunkHashes: hs,
    });
    assert.deepEqual(loaded, { loadedTokens: 48, invalidBlockIds: [] });
    assert.ok(seen.length > 0);
    for (const c of seen) assert.equal(c.waitEvent, undefined);
    for (let i = 0; i < 12; i++)
      assert.deepEqual(
        blockBytes(path, dst[i]!).map((b) => b.subarray(0, BLOCK_BYTES)),
        blockBytes(path, src[i]!).map((b) => b.subarray(0, BLOCK_BYTES)),
      );
  });
});

describe('DataPlane load failures', () => {
  async function saved(e: Env, n: number) {
    const path = kvFile();
    const layout = await e.dp.register(registration(path, 'A'));
    const hs = hashes(n);
    const src = shuffledBlocks().slice(0, n * BPC);
    await e.dp.save({ engineId: 'A', requestId: 'w', blockIds: src, chunkHashes: hs });
    await e.sm.writeQueue.idle();
    return { path, ns: layout.namespace.id, hs, src, dst: shuffledBlocks().slice(0, n * BPC) };
  }

  test('a chunk removed between lookup and load: its blocks and later ones are invalid and not written', async () => {
    const e = env();
    const { path, ns, hs, dst } = await saved(e, 3);
    assert.equal(await lookup(e, 'L', ns, hs), 3);
    assert.equal(pins(e), 3);
    await e.cpu.remove(ns, [hs[1]!]);
    const before = dst.map((b) => blockBytes(path, b));
    const word = new Int32Array(new SharedArrayBuffer(4));
    const out = await e.dp.load({
      engineId: 'A',
      requestId: 'r',
      lookupId: 'L',
      blockIds: dst,
      chunkHashes: hs,
      stateWord: word,
    });
    assert.deepEqual(out, { loadedTokens: 16, invalidBlockIds: dst.slice(4) });
    assert.equal(Atomics.load(word, 0), LOAD_STATE.FAILED);
    for (const [i, b] of dst.entries())
      if (i >= 4) assert.deepEqual(blockBytes(path, b), before[i], `block ${b} was written`);
    assert.equal(pins(e), 0, 'pins of loaded, removed and unread chunks are all released');
  });

  test('expired lookup pins (then eviction) leave every block invalid', async () => {
    const e = env();
    const { ns, hs, dst } = await saved(e, 2);
    assert.equal(await lookup(e, 'L', ns, hs), 2);
    e.clock.now += 5000;
    assert.equal(e.sm.sweep(), 1);
    assert.equal(pins(e), 0);
    await e.cpu.clear();
    const out = await e.dp.load({
      engineId: 'A',
      requestId: 'r',
      lookupId: 'L',
      blockIds: dst,
      chunkHashes: hs,
    });
    assert.deepEqual(out, { loadedTokens: 0, invalidBlockIds: dst });
  });

  test('chunks are matched by hash: unpinned or malformed chunks end the loaded prefix', async () => {
    const e = env();
    const { path, src, ns, hs, dst } = await saved(e, 3);
    const before = snapshot(path, src.slice(4, 8));
    // a lower-tier chunk of the wrong size (large enough to copy) is prefetched but never scattered
    const bad = hashes(1)[0]!;
    await e.lower.put(ns, bad, { tokens: CHUNK_TOKENS, data: randomBytes(2 * 8192) });
    assert.equal(await lookup(e, 'L', ns, [hs[0]!, hs[1]!, bad]), 3);
    const out = await e.dp.load({
      engineId: 'A',
      requestId: 'r',
      lookupId: 'L',
      blockIds: dst.slice(0, 12),
      chunkHashes: [hs[1]!, bad, hs[0]!],
    });
    assert.deepEqual(out, { loadedTokens: 16, invalidBlockIds: dst.slice(4, 12) });
    assertLoaded(before, path, dst.slice(0, 4));
    // hs[2] was never looked up: not in the pinned set even though it is stored
    assert.equal(await lookup(e, 'L2', ns, hs.slice(0, 2)), 2);
    const out2 = await e.dp.load({
      engineId: 'A',
      requestId: 'r',
      lookupId: 'L2',
      blockIds: dst,
      chunkHashes: hs,
    });
    assert.deepEqual(out2, { loadedTokens: 32, invalidBlockIds: dst.slice(8) });
    assert.equal(pins(e), 0);
  });

  test('deadline: chunks not started in time are invalid', async () => {
    const clockRef = { now: 0 };
    const base = createFsCopyEngine();
    // each copy takes one tick of the injected clock
    const ticking: CopyEngine = {
      openFile: (p) => base.openFile(p),
      copy: async (s, o) => {
        await base.copy(s, o);
        clockRef.now += 1;
      },
    };
    // One chunk per copy group, one group at a time: the deadline is checked before each chunk.
    const e = env({
      copyEngine: ticking,
      now: () => clockRef.now,
      copyGroupBytes: 1,
      copyGroupsInFlight: 1,
    });
    const { ns, hs, dst } = await saved(e, 3);
    clockRef.now = 100;
    assert.equal(await lookup(e, 'L', ns, hs), 3);
    const out = await e.dp.load({
      engineId: 'A',
      requestId: 'r',
      lookupId: 'L',
      blockIds: dst,
      chunkHashes: hs,
      deadlineMs: 101,
    });
    assert.deepEqual(out, { loadedTokens: 16, invalidBlockIds: dst.slice(4) });
    assert.equal(await lookup(e, 'L', ns, hs), 3);
    const late = await e.dp.load({
      engineId: 'A',
      requestId: 'r',
      lookupId: 'L',
      blockIds: dst,
      chunkHashes: hs,
      deadlineMs: clockRef.now,
    });
    assert.deepEqual(late, { loadedTokens: 0, invalidBlockIds: dst });
    assert.equal(pins(e), 0);
  });

  test('completion is written to the registered state file slot', async () => {
    const e = env();
    const path = kvFile();
    const statePath = join(dir, `state-${fileNo++}.bin`);
    writeFileSync(statePath, Buffer.alloc(32));
    const layout = await e.dp.register({
      ...registration(path, 'A'),
      stateFile: { path: statePath, slots: 8 },
    });
    const hs = hashes(1);
    await e.dp.save({ engineId: 'A', requestId: 'w', blockIds: [1, 2, 3, 4], chunkHashes: hs });
    assert.equal(await lookup(e, 'L', layout.namespace.id, hs), 1);
    await e.dp.load({
      engineId: 'A',
      requestId: 'r',
      lookupId: 'L',
      blockIds: [5, 6, 7, 8],
      chunkHashes: hs,
      stateSlot: 3,
    });
    await e.dp.load({
      engineId: 'A',
      requestId: 'r',
      lookupId: 'gone',
      blockIds: [5, 6, 7, 8],
      chunkHashes: hs,
      stateSlot: 5,
    });
    const words = readFileSync(statePath);
    assert.equal(words.readInt32LE(12), LOAD_STATE.DONE);
    assert.equal(words.readInt32LE(20), LOAD_STATE.FAILED);
    assert.equal(words.readInt32LE(0), LOAD_STATE.PENDING);
    await expectCode(
      e.dp.load({
        engineId: 'A',
        requestId: 'r',
        lookupId: 'L',
        blockIds: [5, 6, 7, 8],
        chunkHashes: hs,
        stateSlot: 8,
      }),
      'KVT_INVALID_ARGUMENT',
      /load\.stateSlot/,
    );
  });
});

describe('DataPlane lifecycle', () => {
  async function held(e: Env, requestId: string, lookupId: string) {
    const layout = await e.dp.register(registration(kvFile(), 'A'));
    const hs = hashes(2);
    await e.dp.save({
      engineId: 'A',
      requestId: 'w',
      blockIds: [0, 1, 2, 3, 4, 5, 6, 7],
      chunkHashes: hs,
    });
    assert.equal(await lookup(e, lookupId, layout.namespace.id, hs), 2);
    assert.equal(e.dp.holdLookup('A', requestId, lookupId), 2);
    return hs;
  }

  test('preemption keeps the pins; the held pins serve a later load; finish releases', async () => {
    const e = env({}, false);
    const hs = await held(e, 'r1', 'L1');
    assert.equal(e.sm.takeLookup('L1'), undefined, 'the pins moved to the request');
    e.clock.now += 10_000;
    e.sm.sweep();
    e.dp.requestPreempted('A', 'r1');
    assert.equal(pins(e), 2, 'preemption and the pin TTL do not release held pins');
    const out = await e.dp.load({
      engineId: 'A',
      requestId: 'r1',
      lookupId: 'L1',
      blockIds: [10, 11, 12, 13, 14, 15, 16, 17],
      chunkHashes: hs,
    });
    assert.deepEqual(out, { loadedTokens: 32, invalidBlockIds: [] });
    assert.equal(pins(e), 0);
    e.dp.requestFinished('A', 'r1');
    assert.equal(e.dp.stats().requests, 0);
  });

  test('a terminal finish releases held pins, and a later load is invalid', async () => {
    const e = env({}, false);
    const hs = await held(e, 'r1', 'L1');
    assert.equal(pins(e), 2);
    e.dp.requestFinished('A', 'r1');
    assert.equal(pins(e), 0);
    assert.deepEqual(e.dp.stats(), {
      engines: 1,
      requests: 0,
      heldLookups: 0,
      writeThroughDropped: 0,
      saves: 1,
      loads: 0,
      lateSaves: 0,
      cancelledSaves: 0,
      lateLoads: 0,
      layerwiseLoads: 0,
      crossTpLoads: 0,
    });
    const out = await e.dp.load({
      engineId: 'A',
      requestId: 'r1',
      lookupId: 'L1',
      blockIds: [10, 11, 12, 13, 14, 15, 16, 17],
      chunkHashes: hs,
    });
    assert.equal(out.invalidBlockIds.length, 8);
  });

  test('finish during a load stops it at the next chunk and keeps pins until the copy ends', async () => {
    let gate!: () => void;
    let entered!: () => void;
    const inCopy = new Promise<void>((r) => {
      entered = r;
    });
    const base = createFsCopyEngine();
    let scatters = 0;
    const gated: CopyEngine = {
      openFile: (p) => base.openFile(p),
      copy: async (s, o) => {
        if (s.length > 1 && o[0] === 1 && scatters++ === 0) {
          entered();
          await new Promise<void>((r) => {
            gate = r;
          });
        }
        await base.copy(s, o);
      },
    };
    const e = env({ copyEngine: gated, copyGroupBytes: 1, copyGroupsInFlight: 1 }, false);
    const hs = await held(e, 'r1', 'L1');
    const dst = [10, 11, 12, 13, 14, 15, 16, 17];
    const loading = e.dp.load({
      engineId: 'A',
      requestId: 'r1',
      lookupId: 'L1',
      blockIds: dst,
      chunkHashes: hs,
    });
    await inCopy;
    e.dp.requestFinished('A', 'r1');
    assert.equal(pins(e), 2, 'pins stay while the copy can still read the chunks');
    gate();
    assert.deepEqual(await loading, { loadedTokens: 16, invalidBlockIds: dst.slice(4) });
    assert.equal(pins(e), 0);
    assert.equal(e.dp.stats().requests, 0);
  });

  test('with two copy groups in flight, a finish stops the next group and pins last until both copies end', async () => {
    const gates: Array<() => void> = [];
    let started!: () => void;
    const bothStarted = new Promise<void>((r) => {
      started = r;
    });
    const base = createFsCopyEngine();
    const gated: CopyEngine = {
      openFile: (p) => base.openFile(p),
      copy: async (s, o) => {
        if (s.length > 1 && o[0] === 1) {
          await new Promise<void>((r) => {
            gates.push(r);
            if (gates.length === 2) started();
          });
        }
        await base.copy(s, o);
      },
    };
    const e = env({ copyEngine: gated, copyGroupBytes: 1, copyGroupsInFlight: 2 }, false);
    const path = kvFile();
    const layout = await e.dp.register(registration(path, 'A'));
    const hs = hashes(3);
    const src = Array.from({ length: 12 }, (_, i) => i);
    await e.dp.save({ engineId: 'A', requestId: 'w', blockIds: src, chunkHashes: hs });
    assert.equal(await lookup(e, 'L', layout.namespace.id, hs), 3);
    const dst = Array.from({ length: 12 }, (_, i) => 20 + i);
    const loading = e.dp.load({
      engineId: 'A',
      requestId: 'r',
      lookupId: 'L',
      blockIds: dst,
      chunkHashes: hs,
    });
    await bothStarted;
    e.dp.requestFinished('A', 'r');
    assert.equal(pins(e), 3, 'pins stay while either copy can still read its chunk');
    gates[1]!();
    await new Promise((r) => setImmediate(r));
    assert.equal(pins(e), 3, 'the second group finished first: the first still reads');
    gates[0]!();
    // Both groups started before the finish, so both count; the third was never issued.
    assert.deepEqual(await loading, { loadedTokens: 32, invalidBlockIds: dst.slice(8) });
    assert.equal(gates.length, 2);
    assert.equal(pins(e), 0);
    for (let i = 0; i < 8; i++) {
      const want = blockBytes(path, src[i]!).map((b) => b.subarray(0, BLOCK_BYTES));
      const got = blockBytes(path, dst[i]!).map((b) => b.subarray(0, BLOCK_BYTES));
      assert.deepEqual(got, want, `block ${dst[i]} holds block ${src[i]}'s bytes`);
    }
  });

  test('engine gone (explicit or by missed heartbeats) releases every pin and mapping', async () => {
    const e = env({ heartbeatTimeoutMs: 1000 }, false);
    await held(e, 'r1', 'L1');
    await e.dp.register(registration(kvFile(), 'B'));
    assert.equal(e.dp.holdLookup('A', 'r2', 'nope'), 0);
    assert.equal(pins(e), 2);
    assert.equal(await e.dp.engineGone('A'), true);
    assert.equal(pins(e), 0);
    assert.equal(await e.dp.engineGone('A'), false);
    await expectCode(
      e.dp.save({ engineId: 'A', requestId: 'x', blockIds: [], chunkHashes: [] }),
      'KVT_NOT_FOUND',
    );

    await held(e, 'r1', 'L4');
    e.clock.now += 600;
    assert.equal(e.dp.heartbeat('A'), true);
    e.clock.now += 600;
    assert.equal(await e.dp.sweep(), 1, 'B missed its heartbeats');
    assert.equal(e.dp.heartbeat('B'), false);
    assert.equal(pins(e), 2);
    e.clock.now += 1001;
    assert.equal(await e.dp.sweep(), 1);
    assert.equal(pins(e), 0);
    assert.equal(e.dp.stats().engines, 0);
  });

  test('close releases everything and later work is refused', async () => {
    const e = env({}, false);
    await held(e, 'r1', 'L1');
    await e.dp.close();
    await e.dp.close();
    assert.equal(pins(e), 0);
    await expectCode(e.dp.register(registration(kvFile(), 'A')), 'KVT_CLOSED');
  });
});

describe('DataPlane registration and request validation', () => {
  test('refuses files that are too small or missing, and cuda without a CUDA engine', async () => {
    const e = env({}, false);
    const small = kvFile(1000);
    await expectCode(
      e.dp.register(registration(small, 'A')),
      'KVT_INVALID_ARGUMENT',
      /layers\[0\]\.k: .*beyond file/,
    );
    await expectCode(
      e.dp.register(registration(join(dir, 'absent'), 'A')),
      'KVT_INVALID_ARGUMENT',
      /cannot open/,
    );
    await expectCode(
      e.dp.register({
        ...registration('/x', 'A'),
        device: 'cuda',
        mla: true,
        numKvHeads: 1,
        headDim: 16,
        layers: [{ k: { ipcHandle: '0'.repeat(128), allocationBytes: 1 << 20, offsetBytes: 0 } }],
      }),
      'KVT_CONFIG',
    );
    assert.equal(e.dp.stats().engines, 0);
  });

  test('refuses bad save and load arguments with named fields', async () => {
    const e = env({}, false);
    await e.dp.register(registration(kvFile(), 'A'));
    const hs = hashes(2);
    await expectCode(
      e.dp.save({ engineId: 'A', requestId: 'r', blockIds: [1, 2, 3], chunkHashes: hs }),
      'KVT_INVALID_ARGUMENT',
      /2 chunks of 4 blocks need 5\.\.8/,
    );
    await expectCode(
      e.dp.save({
        engineId: 'A',
        requestId: 'r',
        blockIds: [1, 2, 3, 64],
        chunkHashes: hs.slice(0, 1),
      }),
      'KVT_INVALID_ARGUMENT',
      /blockIds\[3\]/,
    );
    await expectCode(
      e.dp.save({
        engineId: 'A',
        requestId: 'r',
        blockIds: [1],
        chunkHashes: hs.slice(0, 1),
        skipChunks: 2,
      }),
      'KVT_INVALID_ARGUMENT',
      /skipChunks/,
    );
    const word = new Int32Array(new SharedArrayBuffer(4));
    await expectCode(
      e.dp.load({
        engineId: 'A',
        requestId: 'r',
        lookupId: 'L',
        blockIds: [1, 1],
        chunkHashes: hs.slice(0, 1),
        stateWord: word,
      }),
      'KVT_INVALID_ARGUMENT',
      /must not repeat/,
    );
    assert.equal(
      Atomics.load(word, 0),
      LOAD_STATE.FAILED,
      'a refused load still completes its word',
    );
    await expectCode(
      e.dp.load({
        engineId: 'Z',
        requestId: 'r',
        lookupId: 'L',
        blockIds: [1],
        chunkHashes: hs.slice(0, 1),
      }),
      'KVT_NOT_FOUND',
    );
  });
});

describe('DataPlane partial-chunk loads (skipBlocks)', () => {
  test('skipped blocks are not written, the rest land byte-exact, loadedTokens leaves them out', async () => {
    const e = env({}, false);
    const srcPath = kvFile();
    const dstPath = kvFile();
    const layout = await e.dp.register(registration(srcPath, 'A'));
    await e.dp.register(registration(dstPath, 'B'));
    const hs = hashes(3);
    // 2.5 chunks: 4 + 4 + 2 blocks
    const src = shuffledBlocks().slice(0, 10);
    await e.dp.save({ engineId: 'A', requestId: 'w', blockIds: src, chunkHashes: hs });
    for (const skip of [1, 3]) {
      assert.equal(await lookup(e, `L${skip}`, layout.namespace.id, hs), 3);
      const dst = shuffledBlocks().slice(0, 10 - skip);
      const before = readFileSync(dstPath);
      const word = new Int32Array(1);
      const out = await e.dp.load({
        engineId: 'B',
        requestId: `r${skip}`,
        lookupId: `L${skip}`,
        blockIds: dst,
        chunkHashes: hs,
        skipBlocks: skip,
        stateWord: word,
      });
      assert.deepEqual(out, { loadedTokens: (10 - skip) * 4, invalidBlockIds: [] });
      assert.equal(word[0], LOAD_STATE.DONE);
      // dst[j] holds the chunk-sequence block skip + j of the saved request
      assertLoaded(snapshot(srcPath, src.slice(skip)), dstPath, dst);
      const after = readFileSync(dstPath);
      const written = new Set(dst);
      for (let r = 0; r < 2 * LAYERS; r++)
        for (let b = 0; b < NUM_BLOCKS; b++) {
          const at = regionOffset(r, false) + b * STRIDE;
          const from = written.has(b) ? at + BLOCK_BYTES : at;
          assert.equal(
            Buffer.compare(before.subarray(from, at + STRIDE), after.subarray(from, at + STRIDE)),
            0,
            `skip ${skip}: region ${r} block ${b} changed outside the loaded bytes`,
          );
        }
    }
    assert.equal(pins(e), 0);
  });

  test('a failing chunk reports only listed blocks invalid, never the skipped ones', async () => {
    const e = env({}, false);
    const layout = await e.dp.register(registration(kvFile(), 'A'));
    const hs = hashes(2);
    await e.dp.save({
      engineId: 'A',
      requestId: 'w',
      blockIds: [0, 1, 2, 3, 4, 5, 6, 7],
      chunkHashes: hs,
    });
    assert.equal(await lookup(e, 'L', layout.namespace.id, hs), 2);
    const unknown = hashes(2);
    const out = await e.dp.load({
      engineId: 'A',
      requestId: 'r',
      lookupId: 'L',
      blockIds: [20, 21, 22, 23, 24, 25],
      chunkHashes: [unknown[0]!, hs[1]!],
      skipBlocks: 2,
    });
    assert.deepEqual(out, { loadedTokens: 0, invalidBlockIds: [20, 21, 22, 23, 24, 25] });
    // The second chunk is the first to fail: only its blocks are invalid.
    assert.equal(await lookup(e, 'L2', layout.namespace.id, hs), 2);
    const second = await e.dp.load({
      engineId: 'A',
      requestId: 'r',
      lookupId: 'L2',
      blockIds: [30, 31, 32, 33, 34],
      chunkHashes: [hs[0]!, unknown[1]!],
      skipBlocks: 3,
    });
    assert.deepEqual(second, { loadedTokens: 4, invalidBlockIds: [31, 32, 33, 34] });
  });

  test('a stored chunk shorter than skip + listed blocks is invalid, not misread', async () => {
    const e = env({}, false);
    const layout = await e.dp.register(registration(kvFile(), 'A'));
    const hs = hashes(1);
    // A short chunk of 2 blocks.
    await e.dp.save({ engineId: 'A', requestId: 'w', blockIds: [0, 1], chunkHashes: hs });
    assert.equal(await lookup(e, 'L', layout.namespace.id, hs), 1);
    const out = await e.dp.load({
      engineId: 'A',
      requestId: 'r',
      lookupId: 'L',
      blockIds: [9, 10],
      chunkHashes: hs,
      skipBlocks: 1,
    });
    assert.deepEqual(out, { loadedTokens: 0, invalidBlockIds: [9, 10] });
  });

  test('refuses a skip of a whole chunk, a skip without chunks and a block count that does not fit', async () => {
    const e = env({}, false);
    await e.dp.register(registration(kvFile(), 'A'));
    const hs = hashes(2);
    const base = { engineId: 'A', requestId: 'r', lookupId: 'L', chunkHashes: hs };
    const word = new Int32Array(1);
    await expectCode(
      e.dp.load({ ...base, blockIds: [1, 2, 3, 4], skipBlocks: 4, stateWord: word }),
      'KVT_INVALID_ARGUMENT',
      /load\.skipBlocks must be an integer in \[0, 3\]/,
    );
    assert.equal(word[0], LOAD_STATE.FAILED);
    await expectCode(
      e.dp.load({ ...base, blockIds: [1, 2], skipBlocks: 2 }),
      'KVT_INVALID_ARGUMENT',
      /2 chunks of 4 blocks skipping 2 need 3\.\.6 block ids, got 2/,
    );
    await expectCode(
      e.dp.load({ ...base, blockIds: [1, 2, 3, 4, 5, 6, 7], skipBlocks: 2 }),
      'KVT_INVALID_ARGUMENT',
      /need 3\.\.6 block ids, got 7/,
    );
    await expectCode(
      e.dp.load({ ...base, chunkHashes: [], blockIds: [], skipBlocks: 1 }),
      'KVT_INVALID_ARGUMENT',
      /skipBlocks is 1 but there are no chunks/,
    );
  });
});

describe('DataPlane cuda registrations: the GPU by UUID', () => {
  const GPUS = [
    'GPU-00000000-1111-2222-3333-444444444444',
    'GPU-abcdef01-2345-6789-abcd-ef0123456789',
    'GPU-5b4c7ab1-8e0a-4f1d-9a3e-0123456789ab',
  ];

  /** A copy engine that claims CUDA and records where each IPC handle was opened. */
  function fakeCuda(visible: readonly string[] | undefined) {
    const opened: { handle: string; device: number }[] = [];
    let closed = 0;
    const base = createFsCopyEngine();
    const engine: CopyEngine = {
      openFile: (p) => base.openFile(p),
      copy: (s, o) => base.copy(s, o),
      openCuda: async (handle, allocationBytes, device) => {
        opened.push({ handle, device });
        return {
          sizeBytes: allocationBytes,
          close: async () => {
            closed++;
          },
        };
      },
      ...(visible === undefined ? {} : { cudaDevices: () => visible }),
    };
    return { engine, opened, closedCount: () => closed };
  }

  function cudaRegistration(engineId: string, deviceUuid?: string): KvRegistration {
    const handle = (l: number) => l.toString(16).padStart(2, '0').repeat(64);
    return {
      ...registration('/unused', engineId),
      device: 'cuda',
      ...(deviceUuid === undefined ? {} : { deviceUuid }),
      layers: Array.from({ length: LAYERS }, (_, l) => ({
        k: { ipcHandle: handle(l), allocationBytes: 1 << 20, offsetBytes: 0 },
        v: { ipcHandle: handle(l), allocationBytes: 1 << 20, offsetBytes: 1 << 19 },
      })),
    };
  }

  test('opens every handle on the device whose UUID the registration names', async () => {
    const cuda = fakeCuda(GPUS);
    const e = env({ copyEngine: cuda.engine }, false);
    const layout = await e.dp.register(cudaRegistration('A', GPUS[2]!.slice(4).toUpperCase()));
    assert.equal(layout.deviceUuid, GPUS[2]);
    assert.equal(cuda.opened.length, LAYERS, 'one open per allocation');
    assert.deepEqual(new Set(cuda.opened.map((o) => o.device)), new Set([2]));
    await e.dp.register(cudaRegistration('B', GPUS[0]));
    assert.deepEqual(
      cuda.opened.slice(LAYERS).map((o) => o.device),
      Array.from({ length: LAYERS }, () => 0),
    );
    assert.equal(await e.dp.engineGone('A'), true);
    assert.equal(cuda.closedCount(), LAYERS);
  });

  test('a UUID the sidecar does not see, or none among several GPUs, is refused before opening', async () => {
    const cuda = fakeCuda(GPUS.slice(0, 2));
    const e = env({ copyEngine: cuda.engine }, false);
    await expectCode(
      e.dp.register(cudaRegistration('A', GPUS[2])),
      'KVT_INVALID_ARGUMENT',
      /deviceUuid GPU-5b4c7ab1-8e0a-4f1d-9a3e-0123456789ab is not a device the sidecar sees \(0: GPU-00000000.*, 1: GPU-abcdef01.*\).*CUDA_VISIBLE_DEVICES/,
    );
    await expectCode(
      e.dp.register(cudaRegistration('A')),
      'KVT_INVALID_ARGUMENT',
      /deviceUuid is required: the sidecar sees 2 CUDA devices/,
    );
    assert.equal(cuda.opened.length, 0);
    assert.equal(e.dp.stats().engines, 0);
  });

  test('without a UUID the only visible GPU is used', async () => {
    const cuda = fakeCuda(GPUS.slice(1, 2));
    const e = env({ copyEngine: cuda.engine }, false);
    const layout = await e.dp.register(cudaRegistration('A'));
    assert.equal(layout.deviceUuid, null);
    assert.deepEqual(new Set(cuda.opened.map((o) => o.device)), new Set([0]));
  });

  test('a deviceUuid with the host device is refused; without a CUDA engine cuda stays KVT_CONFIG', async () => {
    const e = env({}, false);
    await expectCode(
      e.dp.register({ ...registration(kvFile(), 'A'), deviceUuid: GPUS[0]! }),
      'KVT_INVALID_ARGUMENT',
      /deviceUuid is for the cuda device/,
    );
    await expectCode(e.dp.register(cudaRegistration('A', GPUS[0])), 'KVT_CONFIG');
  });
});

describe('DataPlane engine release during a load (UNREGISTER)', () => {
  test('a running load stops before its next chunk; the rest is invalid; pins are released', async () => {
    let gate!: () => void;
    let entered!: () => void;
    const inCopy = new Promise<void>((r) => {
      entered = r;
    });
    const base = createFsCopyEngine();
    let scatters = 0;
    const gated: CopyEngine = {
      openFile: (p) => base.openFile(p),
      copy: async (s, o) => {
        if (s.length > 1 && o[0] === 1 && scatters++ === 0) {
          entered();
          await new Promise<void>((r) => {
            gate = r;
          });
        }
        await base.copy(s, o);
      },
    };
    const e = env({ copyEngine: gated, copyGroupBytes: 1, copyGroupsInFlight: 1 }, false);
    const layout = await e.dp.register(registration(kvFile(), 'A'));
    const hs = hashes(3);
    await e.dp.save({
      engineId: 'A',
      requestId: 'w',
      blockIds: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
      chunkHashes: hs,
    });
    assert.equal(await lookup(e, 'L', layout.namespace.id, hs), 3);
    const dst = [20, 21, 22, 23, 24, 25, 26, 27];
    const loading = e.dp.load({
      engineId: 'A',
      requestId: 'r',
      lookupId: 'L',
      blockIds: dst,
      chunkHashes: hs,
      skipBlocks: 2,
    });
    await inCopy;
    const gone = e.dp.engineGone('A');
    gate();
    assert.equal(await gone, true);
    assert.deepEqual(await loading, { loadedTokens: 8, invalidBlockIds: dst.slice(2) });
    assert.equal(pins(e), 0);
    assert.deepEqual(e.dp.stats(), {
      engines: 0,
      requests: 0,
      heldLookups: 0,
      writeThroughDropped: 0,
      saves: 1,
      loads: 1,
      lateSaves: 0,
      cancelledSaves: 0,
      lateLoads: 0,
      layerwiseLoads: 0,
      crossTpLoads: 0,
    });
  });
});
