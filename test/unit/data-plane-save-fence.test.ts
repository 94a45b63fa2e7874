/**
 * SAVE fences (docs/protocol.md 4.9): a SAVE stands while its slot of the engine's state file
 * holds its ticket. The engine writes anything else there to cancel it, and may then reuse the
 * blocks at once: a fence found changed before the copy copies nothing, one found changed after
 * the copy stores nothing. Real copies (host files), with both copy engines: the fallback one
 * reads the word with a copy, the native one from its mapping. The engine's cancel during a copy
 * is written by the copy engine wrapper between the copy and its completion, as an engine
 * thread would.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, afterEach, describe, test } from 'node:test';
import { LocalCpuBackend } from '../../src/backends/local-cpu/local-cpu-backend.ts';
import type { CopyEngine } from '../../src/data-plane/copy-engine-types.ts';
import { DataPlane } from '../../src/data-plane/data-plane.ts';
import { createFsCopyEngine } from '../../src/data-plane/fs-copy-engine.ts';
import type { KvRegistration } from '../../src/data-plane/kv-layout.ts';
import { createNativeCopyEngine } from '../../src/data-plane/native-copy-engine.ts';
import { type ChunkHash, chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';
import { StorageManager } from '../../src/storage-manager/storage-manager.ts';

const NUM_BLOCKS = 16;
const BLOCK_BYTES = 64; // 4 tokens x 1 head x 8 dims x 2 bytes
const SLOTS = 8;
const dir = mkdtempSync(join(tmpdir(), 'kvtier-fence-'));
after(() => rmSync(dir, { recursive: true, force: true }));
let files = 0;

function file(bytes: number): string {
  const path = join(dir, `f-${files++}.bin`);
  writeFileSync(path, bytes === 0 ? Buffer.alloc(0) : randomBytes(bytes));
  return path;
}

/** Writes a fence word as the engine does (little-endian u32 at 4 x slot). */
async function setWord(path: string, slot: number, value: number): Promise<void> {
  const fh = await open(path, 'r+');
  try {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(value >>> 0);
    await fh.write(b, 0, 4, slot * 4);
  } finally {
    await fh.close();
  }
}

function registration(kv: string, state: string | undefined, engineId: string): KvRegistration {
  return {
    engineId,
    device: 'host',
    modelId: 'test/fence',
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
    layers: [
      { k: { path: kv, offsetBytes: 0 }, v: { path: kv, offsetBytes: NUM_BLOCKS * BLOCK_BYTES } },
    ],
    ...(state === undefined ? {} : { stateFile: { path: state, slots: SLOTS } }),
  };
}

interface Env {
  dp: DataPlane;
  sm: StorageManager;
  /** Copies of KV bytes (a state word read by a copy is 4 bytes and not counted). */
  kvCopies: { n: number };
  /** Runs after each copy, before it is reported complete (an engine thread cancelling). */
  afterCopy: { fn: (() => Promise<void>) | null };
}

const envs: Env[] = [];
afterEach(async () => {
  for (const e of envs.splice(0)) {
    await e.dp.close();
    await e.sm.close();
  }
});

function env(base: CopyEngine): Env {
  const afterCopy: Env['afterCopy'] = { fn: null };
  const kvCopies = { n: 0 };
  const copyEngine: CopyEngine = {
    openFile: (path) => base.openFile(path),
    copy: async (surfaces, ops, options) => {
      await base.copy(surfaces, ops, options);
      if (ops.length !== 5 || ops[4] !== 4) kvCopies.n++;
      const fn = afterCopy.fn;
      afterCopy.fn = null;
      if (fn !== null) await fn();
    },
  };
  const cpu = new LocalCpuBackend({ capacityBytes: 1 << 20, pageBytes: 4096 }, { name: 'cpu' });
  const sm = new StorageManager({ tiers: [cpu], sweepIntervalMs: 0, pinTtlMs: 60_000 });
  const dp = new DataPlane({ storage: sm, copyEngine, sweepIntervalMs: 0 });
  const e = { dp, sm, afterCopy, kvCopies };
  envs.push(e);
  return e;
}

const hashes = (n: number): ChunkHash[] =>
  Array.from({ length: n }, () => chunkHashFromBytes(randomBytes(32)));

async function held(e: Env, ns: string, hs: ChunkHash[]): Promise<number> {
  const out = await e.sm.lookup({
    lookupId: `probe-${Math.random()}`,
    namespaces: [ns],
    hashes: hs,
    tokenCounts: hs.map(() => 8),
    pin: false,
  });
  return out.hitChunks;
}

/** An engine `A` registered with a state file of `SLOTS` words, on a fresh data plane. */
async function fencedEngine(make: () => CopyEngine) {
  const e = env(make());
  const state = file(SLOTS * 4);
  const layout = await e.dp.register(registration(file(2 * NUM_BLOCKS * BLOCK_BYTES), state, 'A'));
  return { e, state, ns: layout.namespace.id };
}

/** A SAVE of two chunks (blocks 0..3) fenced by `slot`/`ticket`: its result and hashes. */
async function saveTwo(e: Env, slot: number, ticket: number) {
  const hs = hashes(2);
  const r = await e.dp.save({
    engineId: 'A',
    requestId: 'r',
    blockIds: [0, 1, 2, 3],
    chunkHashes: hs,
    fence: { slot, ticket },
  });
  return { r, hs };
}

const native = createNativeCopyEngine();
const engines: Array<[string, () => CopyEngine, string | false]> = [
  ['fallback copy engine (the word read by a copy)', () => createFsCopyEngine(), false],
  [
    'native copy engine (the word read from its mapping)',
    () => native.engine!,
    native.engine === null ? `no native addon: ${native.reason}` : false,
  ],
];

for (const [name, make, skip] of engines) {
  describe(`SAVE fence, ${name}`, { skip }, () => {
    test('a fence that holds its ticket: the save is stored', async () => {
      const { e, state, ns } = await fencedEngine(make);
      await setWord(state, 3, 0x1235);
      const { r, hs } = await saveTwo(e, 3, 0x1235);
      assert.deepEqual(r, { saved: 2, skipped: 0, dropped: 0 });
      assert.equal(await held(e, ns, hs), 2);
      assert.equal(e.dp.stats().cancelledSaves, 0);
    });

    test('cancelled before the copy: nothing is copied or stored', async () => {
      const { e, state, ns } = await fencedEngine(make);
      await setWord(state, 0, 0x1237); // the engine's cancel: ticket | 3
      const { r, hs } = await saveTwo(e, 0, 0x1235);
      assert.deepEqual(r, { saved: 0, skipped: 0, dropped: 2 });
      assert.equal(await held(e, ns, hs), 0);
      assert.equal(e.dp.stats().cancelledSaves, 1);
      assert.equal(e.kvCopies.n, 0, 'no block was read');
    });

    test('cancelled while the copy runs: the copy is discarded', async () => {
      const { e, state, ns } = await fencedEngine(make);
      await setWord(state, 7, 0x40001);
      e.afterCopy.fn = () => setWord(state, 7, 0x40003);
      const { r, hs } = await saveTwo(e, 7, 0x40001);
      assert.deepEqual(r, { saved: 0, skipped: 0, dropped: 2 });
      assert.equal(await held(e, ns, hs), 0, 'nothing stored under the hashes');
      assert.equal(e.dp.stats().cancelledSaves, 1);
    });

    test('a slot reused for a newer save cancels the older one (another ticket)', async () => {
      const e = env(make());
      const state = file(SLOTS * 4);
      await e.dp.register(registration(file(2 * NUM_BLOCKS * BLOCK_BYTES), state, 'A'));
      await setWord(state, 1, 0x80001); // the newer save's ticket
      const r = await e.dp.save({
        engineId: 'A',
        requestId: 'old',
        blockIds: [0, 1],
        chunkHashes: hashes(1),
        fence: { slot: 1, ticket: 0x40001 },
      });
      assert.deepEqual(r, { saved: 0, skipped: 0, dropped: 1 });
    });

    test('a fence without a state file, or past its slots, is refused', async () => {
      const e = env(make());
      await e.dp.register(registration(file(2 * NUM_BLOCKS * BLOCK_BYTES), undefined, 'A'));
      await assert.rejects(
        e.dp.save({
          engineId: 'A',
          requestId: 'r',
          blockIds: [0, 1],
          chunkHashes: hashes(1),
          fence: { slot: 0, ticket: 1 },
        }),
        (err: { code?: string; message?: string }) =>
          err.code === 'KVT_INVALID_ARGUMENT' && /state file \(0 slots\)/.test(err.message ?? ''),
      );
      await e.dp.register(registration(file(2 * NUM_BLOCKS * BLOCK_BYTES), file(SLOTS * 4), 'B'));
      await assert.rejects(
        e.dp.save({
          engineId: 'B',
          requestId: 'r',
          blockIds: [0, 1],
          chunkHashes: hashes(1),
          fence: { slot: SLOTS, ticket: 1 },
        }),
        { code: 'KVT_INVALID_ARGUMENT' },
      );
    });
  });
}
