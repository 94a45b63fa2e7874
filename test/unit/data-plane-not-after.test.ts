/**
 * SAVE and LOAD not-after times (docs/protocol.md 4.9): on the host's monotonic clock, a SAVE
 * copies nothing past it and discards a copy that finishes after it; a LOAD starts no chunk
 * past it. The clock is injected; the copies are real (host files).
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
import { createFsCopyEngine } from '../../src/data-plane/fs-copy-engine.ts';
import type { KvRegistration } from '../../src/data-plane/kv-layout.ts';
import { type ChunkHash, chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';
import { StorageManager } from '../../src/storage-manager/storage-manager.ts';

const NUM_BLOCKS = 16;
const BLOCK_BYTES = 64; // 4 tokens x 1 head x 8 dims x 2 bytes
const dir = mkdtempSync(join(tmpdir(), 'kvtier-notafter-'));
after(() => rmSync(dir, { recursive: true, force: true }));
let files = 0;

function kvFile(): string {
  const path = join(dir, `kv-${files++}.bin`);
  writeFileSync(path, randomBytes(2 * NUM_BLOCKS * BLOCK_BYTES));
  return path;
}

function registration(path: string, engineId: string): KvRegistration {
  return {
    engineId,
    device: 'host',
    modelId: 'test/not-after',
    dtype: 'float16',
    numKvHeads: 1,
    headDim: 8,
    tpSize: 1,
    tpRank: 0,
    mla: false,
    numBlocks: NUM_BLOCKS,
    blockSize: 4,
    blockStrideBytes: BLOCK_BYTES,
    chunkSize: 8,
    layers: [{ k: { path, offsetBytes: 0 }, v: { path, offsetBytes: NUM_BLOCKS * BLOCK_BYTES } }],
  };
}

interface Env {
  dp: DataPlane;
  sm: StorageManager;
  cpu: LocalCpuBackend;
  clock: { ns: bigint };
  /** Added to the clock by every copy (a copy that takes that long). */
  copyTakesNs: { ns: bigint };
}

const envs: Env[] = [];
afterEach(async () => {
  for (const e of envs.splice(0)) {
    await e.dp.close();
    await e.sm.close();
  }
});

function env(opts: { chunkPerGroup?: boolean } = {}): Env {
  const clock = { ns: 1_000_000_000n };
  const copyTakesNs = { ns: 0n };
  const fs = createFsCopyEngine();
  const copyEngine: CopyEngine = {
    openFile: (path) => fs.openFile(path),
    copy: async (surfaces, ops) => {
      await fs.copy(surfaces, ops);
      clock.ns += copyTakesNs.ns;
    },
  };
  const cpu = new LocalCpuBackend({ capacityBytes: 1 << 20, pageBytes: 4096 }, { name: 'cpu' });
  const sm = new StorageManager({ tiers: [cpu], sweepIntervalMs: 0, pinTtlMs: 60_000 });
  // chunkPerGroup: one chunk per copy group, one group at a time; a LOAD's not-after time is
  // checked before each group, so then before each chunk.
  const dp = new DataPlane({
    storage: sm,
    copyEngine,
    sweepIntervalMs: 0,
    monotonicNs: () => clock.ns,
    ...(opts.chunkPerGroup === true ? { copyGroupBytes: 1, copyGroupsInFlight: 1 } : {}),
  });
  const e = { dp, sm, cpu, clock, copyTakesNs };
  envs.push(e);
  return e;
}

const hashes = (n: number): ChunkHash[] =>
  Array.from({ length: n }, () => chunkHashFromBytes(randomBytes(32)));

async function pinned(e: Env, lookupId: string, ns: string, hs: ChunkHash[]): Promise<void> {
  const out = await e.sm.lookup({
    lookupId,
    namespaces: [ns],
    hashes: hs,
    tokenCounts: hs.map(() => 8),
  });
  assert.equal(out.hitChunks, hs.length);
}

describe('SAVE not-after time', () => {
  test('a SAVE read past its not-after time copies nothing', async () => {
    const e = env();
    await e.dp.register(registration(kvFile(), 'A'));
    const hs = hashes(2);
    const r = await e.dp.save({
      engineId: 'A',
      requestId: 'r',
      blockIds: [0, 1, 2, 3],
      chunkHashes: hs,
      notAfterNs: e.clock.ns - 1n,
    });
    assert.deepEqual(r, { saved: 0, skipped: 0, dropped: 2 });
    assert.equal(e.cpu.stats().chunks, 0);
    assert.equal(e.dp.stats().lateSaves, 1);
  });

  test('a copy that finishes after the not-after time is discarded, one before it is stored', async () => {
    const e = env();
    await e.dp.register(registration(kvFile(), 'A'));
    e.copyTakesNs.ns = 1000n;
    const late = await e.dp.save({
      engineId: 'A',
      requestId: 'r',
      blockIds: [0, 1, 2, 3],
      chunkHashes: hashes(2),
      notAfterNs: e.clock.ns + 999n,
    });
    assert.deepEqual(late, { saved: 0, skipped: 0, dropped: 2 });
    assert.equal(e.cpu.stats().chunks, 0, 'nothing indexed');
    assert.equal(e.cpu.stats().pinnedChunks, 0, 'the reservations were given back');
    const onTime = await e.dp.save({
      engineId: 'A',
      requestId: 'r',
      blockIds: [4, 5, 6, 7],
      chunkHashes: hashes(2),
      notAfterNs: e.clock.ns + 1000n,
    });
    assert.deepEqual(onTime, { saved: 2, skipped: 0, dropped: 0 });
    assert.deepEqual([e.dp.stats().saves, e.dp.stats().lateSaves], [2, 1]);
  });
});

describe('LOAD not-after time', () => {
  test('no chunk starts past it: the rest are invalid blocks, the engine blocks untouched', async () => {
    const e = env({ chunkPerGroup: true });
    const src = kvFile();
    const dst = kvFile();
    const ns = (await e.dp.register(registration(src, 'A'))).namespace.id;
    await e.dp.register(registration(dst, 'B'));
    const hs = hashes(3);
    await e.dp.save({
      engineId: 'A',
      requestId: 'w',
      blockIds: [0, 1, 2, 3, 4, 5],
      chunkHashes: hs,
    });
    await pinned(e, 'L', ns, hs);
    const before = readFileSync(dst);
    e.copyTakesNs.ns = 1000n;
    const r = await e.dp.load({
      engineId: 'B',
      requestId: 'x',
      lookupId: 'L',
      blockIds: [9, 8, 7, 6, 5, 4],
      chunkHashes: hs,
      notAfterNs: e.clock.ns + 500n,
    });
    // chunk 0 starts in time; its copy passes the not-after time, so chunk 1 never starts
    assert.deepEqual(r, { loadedTokens: 8, invalidBlockIds: [7, 6, 5, 4] });
    const afterLoad = readFileSync(dst);
    for (const b of [7, 6, 5, 4])
      for (const region of [0, NUM_BLOCKS])
        assert.equal(
          Buffer.compare(
            afterLoad.subarray((region + b) * BLOCK_BYTES, (region + b + 1) * BLOCK_BYTES),
            before.subarray((region + b) * BLOCK_BYTES, (region + b + 1) * BLOCK_BYTES),
          ),
          0,
          `block ${b} was written after the not-after time`,
        );
    assert.equal(e.dp.stats().lateLoads, 1);
    assert.equal(e.cpu.stats().pinnedChunks, 0, 'the lookup pins were released');
  });
});
