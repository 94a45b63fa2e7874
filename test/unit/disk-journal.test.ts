/**
 * The local-disk index journal: whatever the journal says (cut at any byte, any byte damaged,
 * naming files that are gone), a restarted tier never serves a chunk whose file is gone or
 * corrupt, and once its scan is over it indexes exactly the files that are there.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import * as fsp from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import type { Chunk } from '../../src/backends/core/types.ts';
import { objectPath, realFileSystem } from '../../src/backends/files/file-store.ts';
import { CHUNK_HEADER_BYTES } from '../../src/backends/format/chunk-format.ts';
import { DiskIndex } from '../../src/backends/local-disk/disk-index.ts';
import {
  IndexJournal,
  JOURNAL_FILE,
  replayJournal,
} from '../../src/backends/local-disk/disk-journal.ts';
import { LocalDiskBackend } from '../../src/backends/local-disk/local-disk-backend.ts';
import { type ChunkHash, chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';
import { silentLogger } from '../../src/util/log.ts';

const dirs: string[] = [];
after(async () => {
  await Promise.all(dirs.map((d) => fsp.rm(d, { recursive: true, force: true })));
});

async function tempDir(): Promise<string> {
  const d = await fsp.mkdtemp(join(tmpdir(), 'kvtier-journal-'));
  dirs.push(d);
  return d;
}

const PAYLOAD = 3000;
const OBJ = CHUNK_HEADER_BYTES + PAYLOAD;
const CAPACITY = 6 * OBJ;
const ns = () => randomBytes(16).toString('hex');
const hash = () => chunkHashFromBytes(randomBytes(32));
const chunk = (): Chunk => ({ tokens: 256, data: randomBytes(PAYLOAD) });
const open = (dir: string) =>
  LocalDiskBackend.open({ path: dir, capacityBytes: CAPACITY }, { name: 'd' });
const exists = (p: string) =>
  fsp.stat(p).then(
    () => true,
    () => false,
  );

interface Store {
  dir: string;
  n: string;
  all: ChunkHash[];
  data: Map<ChunkHash, Buffer>;
  /** Files there and intact. */
  intact: ChunkHash[];
  /** Evicted, removed, or deleted behind the tier's back: no file. */
  gone: ChunkHash[];
  corrupt: ChunkHash;
  corruptBytes: Buffer;
  /** The journal as the running tier left it (appended records), and after a graceful close. */
  appended: Buffer;
  snapshot: Buffer;
}

/** A store whose history covers adds, a touch, an eviction and a remove, then damaged files. */
async function buildStore(): Promise<Store> {
  const dir = await tempDir();
  const n = ns();
  const h = Array.from({ length: 8 }, hash);
  const data = new Map<ChunkHash, Buffer>();
  const a = await open(dir);
  for (const x of h.slice(0, 6)) {
    const c = chunk();
    data.set(x, c.data as Buffer);
    assert.equal(await a.put(n, x, c), 'stored');
  }
  assert.equal(await a.batchedContains(n, [h[0]!]), 1); // h[1] is now the least recent
  for (const x of [h[6]!, h[7]!]) {
    const c = chunk();
    data.set(x, c.data as Buffer);
    assert.equal(await a.put(n, x, c), 'stored');
    if (x === h[6]) assert.equal(await a.remove(n, [h[2]!]), 1);
  }
  assert.equal(a.stats().evictions, 1, 'h1 was evicted for h6');
  await a.flushJournal();
  const appended = await fsp.readFile(join(dir, JOURNAL_FILE));
  await a.close();
  const snapshot = await fsp.readFile(join(dir, JOURNAL_FILE));
  // Behind the tier's back: h4's file is deleted, h5's damaged.
  await fsp.unlink(objectPath(dir, n, h[4]!, 2));
  const corruptBytes = await fsp.readFile(objectPath(dir, n, h[5]!, 2));
  corruptBytes[CHUNK_HEADER_BYTES + 7]! ^= 0x40;
  return {
    dir,
    n,
    all: h,
    data,
    intact: [h[0]!, h[3]!, h[6]!, h[7]!],
    gone: [h[1]!, h[2]!, h[4]!],
    corrupt: h[5]!,
    corruptBytes,
    appended,
    snapshot,
  };
}

/**
 * Restarts over `journal` and checks every answer. With `readFirst` every chunk is read at once
 * (before or while the scan runs); without, the first answers about gone chunks come from the
 * index after the scan. `twice` restarts once more afterwards.
 */
async function restartWith(
  s: Store,
  journal: Buffer,
  what: string,
  readFirst: boolean,
  twice: boolean,
): Promise<void> {
  const corruptPath = objectPath(s.dir, s.n, s.corrupt, 2);
  await fsp.writeFile(corruptPath, s.corruptBytes);
  await fsp.writeFile(join(s.dir, JOURNAL_FILE), journal);
  const b = await open(s.dir);
  try {
    // Whether or not the scan has got to them, a hit is only ever the chunk's own bytes.
    const early = readFirst ? await b.batchedGet(s.n, s.all) : new Map<ChunkHash, null>();
    for (const h of s.all) {
      const got = early.get(h);
      if (got === null || got === undefined) continue;
      assert.ok(s.intact.includes(h), `${what}: a hit for a chunk whose file is gone or damaged`);
      assert.deepEqual(Buffer.from(got.data), s.data.get(h), `${what}: the bytes of the chunk`);
    }
    const res = await b.indexed();
    assert.ok(res?.complete, `${what}: the scan completes`);
    assert.equal(await b.batchedContains(s.n, s.intact), s.intact.length, `${what}: intact`);
    for (const h of s.gone) assert.equal(await b.batchedContains(s.n, [h]), 0, `${what}: gone`);
    assert.equal((await b.batchedGet(s.n, [s.corrupt])).get(s.corrupt), null, `${what}: corrupt`);
    assert.equal(await b.batchedContains(s.n, [s.corrupt]), 0, `${what}: corrupt, after the read`);
    assert.equal(await exists(corruptPath), false, `${what}: the damaged file is deleted`);
    const got = await b.batchedGet(s.n, s.intact);
    for (const h of s.intact) assert.deepEqual(Buffer.from(got.get(h)!.data), s.data.get(h));
    assert.deepEqual(
      [b.stats().chunks, b.stats().bytesUsed],
      [s.intact.length, s.intact.length * OBJ],
      `${what}: the accounting matches the files`,
    );
  } finally {
    await b.close();
  }
  if (!twice) return;
  const c = await open(s.dir);
  try {
    assert.equal(await c.batchedContains(s.n, s.intact), s.intact.length, `${what}: then`);
    for (const h of [...s.gone, s.corrupt]) {
      assert.equal(await c.batchedContains(s.n, [h]), 0, `${what}: then, not ${h}`);
    }
  } finally {
    await c.close();
  }
}

describe('local-disk index journal', () => {
  it('a journal cut at every byte never yields a hit for a gone or damaged chunk', async () => {
    const s = await buildStore();
    assert.equal(s.appended.length % 64, 0);
    assert.ok(s.appended.length >= 64 * 11, 'header, 8 adds, 2 removes at least');
    for (let cut = 0; cut <= s.appended.length; cut++) {
      const what = `cut at ${cut}`;
      await restartWith(s, s.appended.subarray(0, cut), what, cut % 2 === 0, cut % 64 === 0);
    }
  });

  it('a damaged byte anywhere in the journal never yields a hit for a gone or damaged chunk', async () => {
    const s = await buildStore();
    assert.equal(s.snapshot.length, 64 * 7, 'header and the six entries left at close');
    for (let at = 0; at < s.snapshot.length; at++) {
      const bad = Buffer.from(s.snapshot);
      bad[at]! ^= 1 << (at % 8);
      await restartWith(s, bad, `bit ${at % 8} of byte ${at} flipped`, at % 2 === 1, false);
    }
  });

  it('a restart serves from the journal before the scan lists anything', async () => {
    const dir = await tempDir();
    const n = ns();
    const hs = [hash(), hash()];
    const first = await open(dir);
    for (const h of hs) await first.put(n, h, chunk());
    await first.close();
    let release = () => {};
    const held = new Promise<void>((r) => {
      release = r;
    });
    const readdir = (async (...args: Parameters<typeof fsp.readdir>) => {
      await held;
      return fsp.readdir(...args);
    }) as typeof fsp.readdir;
    const b = await LocalDiskBackend.open(
      { path: dir, capacityBytes: CAPACITY },
      { name: 'd' },
      { ...fsp, readdir },
    );
    try {
      assert.equal(b.stats().indexComplete, false, 'the scan is held');
      assert.equal(await b.batchedContains(n, hs), 2, 'both known from the journal');
      assert.notEqual((await b.batchedGet(n, [hs[1]!])).get(hs[1]!), null);
      release();
      assert.equal((await b.indexed())?.swept, 0);
      assert.equal(b.stats().indexComplete, true);
    } finally {
      release();
      await b.close();
    }
  });

  it('a journal written with another shard layout is ignored and replaced', async () => {
    const dir = await tempDir();
    const n = ns();
    const h = hash();
    const a = await LocalDiskBackend.open({ path: dir, capacityBytes: CAPACITY, shardChars: 1 });
    await a.put(n, h, chunk());
    await a.close();
    const b = await open(dir); // shardChars 2: the file is in the wrong place for this layout
    try {
      assert.equal(b.stats().chunks, 0, 'nothing taken from the other layout');
      assert.equal((await b.indexed())?.added, 0);
      assert.equal(await b.batchedContains(n, [h]), 0);
    } finally {
      await b.close();
    }
  });

  it('a journal that cannot be read is not fatal: the tier runs on what the scan finds', async () => {
    const dir = await tempDir();
    const n = ns();
    const h = hash();
    const first = await LocalDiskBackend.open({
      path: dir,
      capacityBytes: CAPACITY,
      journal: false,
    });
    const c = chunk();
    await first.put(n, h, c);
    await first.close();
    await fsp.mkdir(join(dir, JOURNAL_FILE)); // a directory where the journal file should be
    const b = await open(dir);
    try {
      assert.equal((await b.indexed())?.added, 1, 'the scan indexed the file');
      assert.deepEqual(Buffer.from((await b.batchedGet(n, [h])).get(h)!.data), c.data);
      assert.equal(await b.put(n, hash(), chunk()), 'stored', 'and it takes puts');
    } finally {
      await b.close();
    }
  });

  it('a snapshot taken while entries change replays to the same index, in recency order', async () => {
    const dir = await tempDir();
    const index = new DiskIndex(1 << 30, 1 << 20, () => {});
    const { journal } = await IndexJournal.open(realFileSystem, dir, 2, index, silentLogger);
    const n = ns();
    const live: ChunkHash[] = [];
    const add = (k: number) => {
      for (let i = 0; i < k; i++) {
        const h = hash();
        index.add(n, h, 200 + (live.length % 50));
        live.push(h);
      }
    };
    const removeSome = (k: number) => {
      for (let i = 0; i < k && live.length > 0; i++) {
        const [h] = live.splice((i * 7919) % live.length, 1);
        index.forget(index.find(n, h!));
      }
    };
    add(40_000);
    removeSome(15_000);
    const compacting = journal.compact();
    add(5000); // before the snapshot's first write
    removeSome(2000);
    for (let i = 0; i < 5; i++) {
      await new Promise((r) => setImmediate(r));
      add(1000);
      removeSome(300);
    }
    await compacting;
    add(100);
    removeSome(50);
    await journal.flush();
    const again = new DiskIndex(1 << 30, 1 << 20, () => {});
    const replay = await replayJournal(realFileSystem, join(dir, JOURNAL_FILE), 2, again);
    assert.equal(replay.droppedBytes, 0);
    assert.ok(replay.records < 40_000 + 5000 + 5000, 'the snapshot replaced the older records');
    const keys = (ix: DiskIndex) =>
      [...ix.recencyOrder()].map((s) => `${ix.hashOf(s)}:${ix.bytesOf(s)}`);
    assert.equal(again.size, live.length);
    assert.deepEqual(keys(again), keys(index));
    await journal.close();
  });
});
