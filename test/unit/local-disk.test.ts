import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import * as fsp from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it, mock } from 'node:test';
import { setImmediate as turn } from 'node:timers/promises';
import type { Chunk } from '../../src/backends/core/types.ts';
import { type FileSystem, objectPath } from '../../src/backends/files/file-store.ts';
import { CHUNK_HEADER_BYTES } from '../../src/backends/format/chunk-format.ts';
import { LOCK_FILE } from '../../src/backends/local-disk/dir-lock.ts';
import { JOURNAL_FILE } from '../../src/backends/local-disk/disk-journal.ts';
import {
  createLocalDiskBackend,
  LocalDiskBackend,
  type LocalDiskOptions,
} from '../../src/backends/local-disk/local-disk-backend.ts';
import {
  localDiskOptionsFromConfig,
  resolveLocalDiskOptions,
} from '../../src/backends/local-disk/local-disk-options.ts';
import { isKvtierError } from '../../src/errors.ts';
import { chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';

const dirs: string[] = [];
after(async () => {
  await Promise.all(dirs.map((d) => fsp.rm(d, { recursive: true, force: true })));
});

async function tempDir(): Promise<string> {
  const d = await fsp.mkdtemp(join(tmpdir(), 'kvtier-disk-unit-'));
  dirs.push(d);
  return d;
}

const ns = () => randomBytes(16).toString('hex');
const hash = () => chunkHashFromBytes(randomBytes(32));
const chunk = (bytes: number, tokens = 256): Chunk => ({ tokens, data: randomBytes(bytes) });
/** Bytes one object of `payload` bytes takes on disk. */
const obj = (payload: number) => CHUNK_HEADER_BYTES + payload;

async function exists(path: string): Promise<boolean> {
  return fsp.stat(path).then(
    () => true,
    () => false,
  );
}

/** Every file under `dir`, relative. */
async function files(dir: string): Promise<string[]> {
  return (await fsp.readdir(dir, { recursive: true, withFileTypes: true }))
    .filter((e) => e.isFile())
    .map((e) => join(e.parentPath, e.name).slice(dir.length + 1))
    .sort();
}

function open(path: string, extra: Partial<LocalDiskOptions> = {}) {
  return LocalDiskBackend.open({ path, capacityBytes: 64 * 1024 * 1024, ...extra }, { name: 'd' });
}

describe('LocalDiskBackend', () => {
  it('a restarted instance answers hits at once from the warm directory without re-storing', async () => {
    const dir = await tempDir();
    const n = ns();
    const hs = [hash(), hash(), hash()];
    const cs = hs.map((_, i) => chunk(10_000 + i, 100 + i));
    const first = await open(dir);
    for (const [i, h] of hs.entries()) assert.equal(await first.put(n, h, cs[i]!), 'stored');
    assert.equal(first.stats().filesWritten, 3);
    await first.close();

    const second = await open(dir);
    try {
      const s = second.stats();
      assert.equal(s.chunks, 3, 'indexed from the directory');
      assert.equal(s.bytesUsed, obj(10_000) + obj(10_001) + obj(10_002), 'sizes from the files');
      assert.equal(await second.batchedContains(n, hs), 3);
      for (const [i, h] of hs.entries()) assert.equal(await second.put(n, h, cs[i]!), 'exists');
      const got = await second.batchedGet(n, hs);
      for (const [i, h] of hs.entries()) {
        assert.equal(got.get(h)?.tokens, cs[i]!.tokens, `tokens of chunk ${i}`);
        assert.deepEqual(Buffer.from(got.get(h)!.data), cs[i]!.data, `bytes of chunk ${i}`);
      }
      assert.equal(second.stats().filesWritten, 0, 'nothing was written again');
    } finally {
      await second.close();
    }
  });

  it('start-up deletes stray temp files and ignores (keeps) files with invalid names', async () => {
    const dir = await tempDir();
    const n = ns();
    const h = hash();
    const final = objectPath(dir, n, h, 2);
    await fsp.mkdir(join(dir, n, h.slice(0, 2)), { recursive: true });
    const stray = `${final}.4242.abcdef.tmp`;
    await fsp.writeFile(stray, 'half-written');
    const foreign = [
      join(dir, 'README'),
      join(dir, n, h.slice(0, 2), 'nothex.kvc'),
      join(dir, n, 'ff', `${h}.kvc`), // a valid name in the wrong shard
      join(dir, 'NotANamespace', 'ab', `ab${h.slice(2)}.kvc`),
    ];
    for (const f of foreign) {
      await fsp.mkdir(join(f, '..'), { recursive: true });
      await fsp.writeFile(f, 'x'.repeat(300));
    }
    const b = await open(dir);
    try {
      assert.equal((await b.indexed())?.tempsDeleted, 1, 'the scan deletes it');
      assert.equal(await exists(stray), false, 'the temp file is deleted');
      for (const f of foreign) assert.equal(await exists(f), true, `${f} is left alone`);
      assert.equal(b.stats().chunks, 0, 'none of them is indexed');
    } finally {
      await b.close();
    }
  });

  it('a put leaves exactly one object file and no temp file', async () => {
    const dir = await tempDir();
    const b = await open(dir);
    const n = ns();
    const h = hash();
    assert.equal(await b.put(n, h, chunk(5000)), 'stored');
    assert.deepEqual(await files(dir), [
      LOCK_FILE,
      join(n, h.slice(0, 2), `${h}.kvc`),
      JOURNAL_FILE,
    ]);
    assert.equal((await fsp.stat(objectPath(dir, n, h, 2))).size, obj(5000));
    await b.close();
    assert.ok(!(await files(dir)).includes(LOCK_FILE), 'close removes the lock');
  });

  it('accepts each fsync policy and rejects others with what is allowed', async () => {
    for (const fsync of ['none', 'data', 'always'] as const) {
      const b = await open(await tempDir(), { fsync });
      const [n, h, c] = [ns(), hash(), chunk(3000)];
      assert.equal(await b.put(n, h, c), 'stored', `put with fsync ${fsync}`);
      assert.deepEqual(Buffer.from((await b.batchedGet(n, [h])).get(h)!.data), c.data);
      await b.close();
    }
    assert.throws(
      () =>
        resolveLocalDiskOptions({
          path: '/x',
          capacityBytes: 1 << 20,
          fsync: 'sometimes' as 'none',
        }),
      (err: unknown) =>
        isKvtierError(err, 'KVT_INVALID_ARGUMENT') &&
        /fsync must be one of "none", "data", "always"/.test(err.message),
    );
  });

  it('config errors are KVT_CONFIG naming the tier and the key', async () => {
    const bad: [Record<string, unknown>, RegExp][] = [
      [{ path: '/x', capacityBytes: 1 << 20, fsync: 'yes' }, /tier "disk0".*fsync/],
      [
        { path: '/x', capacityBytes: 1 << 20, bogus: 1 },
        /tier "disk0".*unknown local-disk option "bogus"/,
      ],
      [{ path: '', capacityBytes: 1 << 20 }, /tier "disk0".*path must be a non-empty string/],
      [{ path: '/x' }, /tier "disk0".*capacityBytes is required/],
      [
        { path: '/x', capacityBytes: 1 << 20, shardChars: 9 },
        /shardChars must be an integer in \[0, 8\]/,
      ],
    ];
    for (const [raw, re] of bad) {
      assert.throws(
        () => localDiskOptionsFromConfig(raw, 'disk0'),
        (err: unknown) => isKvtierError(err, 'KVT_CONFIG') && re.test(err.message),
        JSON.stringify(raw),
      );
    }
    const dir = await tempDir();
    const b = await createLocalDiskBackend(
      { path: dir, capacityBytes: 1 << 20 },
      { name: 'disk0' },
    );
    assert.equal(b.kind, 'local-disk');
    assert.equal(b.name, 'disk0');
    assert.deepEqual(b.capabilities, {
      pinning: true,
      hostMemory: false,
      persistent: true,
      shared: false,
      evicts: true,
      maxChunkBytes: (1 << 20) - CHUNK_HEADER_BYTES,
    });
    await b.close();
  });

  it('evicts the least recently used unpinned chunk and deletes its file', async () => {
    const dir = await tempDir();
    const b = await open(dir, { capacityBytes: 3 * obj(1000) });
    const n = ns();
    const [a, c, d, e] = [hash(), hash(), hash(), hash()];
    for (const h of [a, c, d]) assert.equal(await b.put(n, h, chunk(1000)), 'stored');
    assert.equal(await b.batchedContains(n, [a]), 1, 'touch a: c is now the oldest');
    assert.equal(await b.put(n, e, chunk(1000)), 'stored');
    assert.equal(await exists(objectPath(dir, n, c, 2)), false, 'the evicted file is deleted');
    for (const h of [a, d, e]) assert.equal(await exists(objectPath(dir, n, h, 2)), true);
    assert.equal(await b.batchedContains(n, [c]), 0);
    const s = b.stats();
    assert.equal(s.evictions, 1);
    assert.equal(s.bytesUsed, 3 * obj(1000));
    await b.close();
  });

  it('drops (and counts) a put that cannot fit beside pinned chunks', async () => {
    const dir = await tempDir();
    const b = await open(dir, { capacityBytes: 2 * obj(1000) });
    const n = ns();
    const [x, y, z] = [hash(), hash(), hash()];
    assert.equal(await b.put(n, x, chunk(1000), { pin: true }), 'stored');
    assert.equal(await b.put(n, y, chunk(1000), { pin: true }), 'stored');
    assert.equal(await b.put(n, z, chunk(1000)), 'dropped');
    assert.equal(b.stats().droppedPuts, 1);
    assert.equal(await exists(objectPath(dir, n, z, 2)), false);
    b.unpin(n, [x]);
    assert.equal(await b.put(n, z, chunk(1000)), 'stored', 'room once x is unpinned');
    assert.equal(await exists(objectPath(dir, n, x, 2)), false, 'x was evicted');
    await b.close();
  });

  it('without a journal, a restart keeps recency by mtime and evicts down to a lowered bound', async () => {
    const dir = await tempDir();
    const n = ns();
    const hs = [hash(), hash(), hash()];
    const first = await open(dir, { journal: false });
    for (const h of hs) await first.put(n, h, chunk(1000));
    await first.close();
    // hs[1] oldest, then hs[2], then hs[0].
    const times = [3000, 1000, 2000];
    for (const [i, h] of hs.entries()) {
      const t = new Date(times[i]! * 1000);
      await fsp.utimes(objectPath(dir, n, h, 2), t, t);
    }
    const second = await open(dir, { capacityBytes: 2 * obj(1000), journal: false });
    try {
      assert.equal((await second.indexed())?.added, 3, 'every file indexed by the scan');
      assert.equal(second.stats().chunks, 2);
      assert.equal(await exists(objectPath(dir, n, hs[1]!, 2)), false, 'the oldest is evicted');
      assert.equal(await second.put(n, hash(), chunk(1000)), 'stored');
      assert.equal(await exists(objectPath(dir, n, hs[2]!, 2)), false, 'then the next oldest');
      assert.equal(await second.batchedContains(n, [hs[0]!]), 1, 'the newest stays');
    } finally {
      await second.close();
    }
  });

  it('with the journal, a restart keeps the recency order of the last run', async () => {
    const dir = await tempDir();
    const n = ns();
    const hs = [hash(), hash(), hash(), hash()];
    const first = await open(dir);
    for (const h of hs) await first.put(n, h, chunk(1000));
    // Used last to first: hs[3] is now the least recent, hs[0] the most.
    for (const h of [...hs].reverse()) assert.equal(await first.batchedContains(n, [h]), 1);
    await first.close();
    const second = await open(dir, { capacityBytes: 3 * obj(1000) });
    try {
      assert.equal(second.stats().chunks, 3, 'the lowered bound applies at once');
      assert.equal(await exists(objectPath(dir, n, hs[3]!, 2)), false, 'least recent evicted');
      assert.equal(await second.put(n, hash(), chunk(1000)), 'stored');
      assert.equal(await exists(objectPath(dir, n, hs[2]!, 2)), false, 'then the next');
      assert.equal(await second.batchedContains(n, [hs[0]!, hs[1]!]), 2);
      assert.equal((await second.indexed())?.swept, 0);
    } finally {
      await second.close();
    }
  });

  it('a file deleted behind its back is a miss and leaves the index', async () => {
    const dir = await tempDir();
    const b = await open(dir);
    const n = ns();
    const [x, y] = [hash(), hash()];
    await b.put(n, x, chunk(2000));
    await b.put(n, y, chunk(2000));
    await fsp.unlink(objectPath(dir, n, x, 2));
    assert.equal(await b.batchedContains(n, [x]), 1, 'contains trusts the index (no I/O)');
    const got = await b.batchedGet(n, [x, y]);
    assert.equal(got.get(x), null);
    assert.notEqual(got.get(y), null);
    assert.equal(await b.batchedContains(n, [x]), 0, 'gone from the index after the read');
    assert.equal(b.stats().chunks, 1);
    assert.equal(b.stats().bytesUsed, obj(2000));
    assert.equal(b.health(), 'up', 'a vanished file is not an I/O fault');
    await b.close();
  });

  it('a corrupt object is a miss, deleted, counted and reported', async () => {
    const dir = await tempDir();
    const reasons: string[] = [];
    const b = await open(dir, { onCorrupt: (r) => reasons.push(r) });
    const [n, h] = [ns(), hash()];
    await b.put(n, h, chunk(2000));
    const path = objectPath(dir, n, h, 2);
    const bytes = await fsp.readFile(path);
    bytes[CHUNK_HEADER_BYTES + 5]! ^= 1;
    await fsp.writeFile(path, bytes);
    assert.equal((await b.batchedGet(n, [h])).get(h), null);
    assert.deepEqual(reasons, ['checksum']);
    assert.equal(b.stats().corruptObjects, 1);
    assert.equal(await exists(path), false, 'the corrupt file is deleted');
    assert.equal(b.stats().chunks, 0);
    await b.close();
  });

  it('a read that hangs past timeoutMs is a miss and marks the tier degraded', async () => {
    const dir = await tempDir();
    const [n, h] = [ns(), hash()];
    let hang = false;
    const slow: FileSystem = {
      ...fsp,
      open: ((...args: Parameters<typeof fsp.open>) =>
        hang ? new Promise(() => {}) : fsp.open(...args)) as typeof fsp.open,
    };
    const b = await LocalDiskBackend.open(
      { path: dir, capacityBytes: 1 << 20, timeoutMs: 20 },
      { name: 'd' },
      slow,
    );
    await b.indexed();
    // Timers are mocked from here: the hung read times out when the test moves the clock, and
    // the put before it and the real read after it can never time out however loaded this
    // machine is (a put that outlived its deadline would still finish, and mark the tier up).
    mock.timers.enable({ apis: ['setTimeout'] });
    try {
      assert.equal(await b.put(n, h, chunk(1000)), 'stored');
      hang = true;
      const hung = b.batchedGet(n, [h]);
      let done = false;
      const settled = () => {
        done = true;
      };
      hung.then(settled, settled);
      for (let i = 0; i < 10_000 && !done; i++) {
        mock.timers.tick(5);
        await turn();
      }
      assert.equal((await hung).get(h), null);
      assert.equal(b.health(), 'degraded');
      assert.equal(b.stats().ioErrors, 1);
      hang = false;
      assert.notEqual((await b.batchedGet(n, [h])).get(h), null, 'served once the disk answers');
      assert.equal(b.health(), 'up');
    } finally {
      mock.timers.reset();
    }
    await b.close();
  });

  it('rejects namespaces the format cannot store (a ChunkHash is valid by construction)', async () => {
    const b = await open(await tempDir());
    for (const n of ['../etc', 'ABC', `../${ns().slice(3)}`]) {
      await assert.rejects(b.put(n, hash(), chunk(10)), (err: unknown) =>
        isKvtierError(err, 'KVT_INVALID_ARGUMENT'),
      );
    }
    await b.close();
  });
});
