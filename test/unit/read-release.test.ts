import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import * as fsp from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, describe, it } from 'node:test';
import { ForwardingBackend } from '../../src/backends/core/forwarding-backend.ts';
import type {
  Chunk,
  ChunkHash,
  GetOptions,
  NamespaceId,
  StorageBackend,
} from '../../src/backends/core/types.ts';
import {
  ChunkFiles,
  type FileOp,
  POOLED_READ_MIN_BYTES,
} from '../../src/backends/files/chunk-files.ts';
import { realFileSystem } from '../../src/backends/files/file-store.ts';
import { CHUNK_HEADER_BYTES } from '../../src/backends/format/chunk-format.ts';
import { FsBackend } from '../../src/backends/fs/fs-backend.ts';
import { LocalCpuBackend } from '../../src/backends/local-cpu/local-cpu-backend.ts';
import { LocalDiskBackend } from '../../src/backends/local-disk/local-disk-backend.ts';
import { MemoryBackend } from '../../src/backends/memory/memory-backend.ts';
import { chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';
import { StorageManager } from '../../src/storage-manager/storage-manager.ts';
import { silentLogger } from '../../src/util/log.ts';

const MiB = 1024 * 1024;
const dirs: string[] = [];
after(async () => {
  await Promise.all(dirs.map((d) => fsp.rm(d, { recursive: true, force: true })));
});

async function tempDir(): Promise<string> {
  const d = await fsp.mkdtemp(join(tmpdir(), 'kvtier-release-unit-'));
  dirs.push(d);
  return d;
}

const newNs = () => randomBytes(16).toString('hex');
const newHash = () => chunkHashFromBytes(randomBytes(32));
const chunkOf = (bytes: number, tokens = 256): Chunk => ({ tokens, data: randomBytes(bytes) });

async function getOne(b: StorageBackend, ns: NamespaceId, h: ChunkHash): Promise<Chunk> {
  const c = (await b.batchedGet(ns, [h])).get(h);
  assert.ok(c != null, 'a stored chunk was a miss');
  return c;
}

const tiers: [string, () => Promise<StorageBackend>][] = [
  [
    'local-disk',
    async () =>
      LocalDiskBackend.open({ path: await tempDir(), capacityBytes: 256 * MiB, fsync: 'none' }),
  ],
  ['fs', async () => FsBackend.open({ path: await tempDir(), fsync: 'none' })],
];

for (const [kind, open] of tiers) {
  describe(`${kind} read buffers`, () => {
    it('a released buffer is reused by the next get of the same size', async () => {
      const b = await open();
      try {
        const ns = newNs();
        const [x, y] = [newHash(), newHash()];
        const [cx, cy] = [chunkOf(2 * MiB), chunkOf(2 * MiB)];
        await b.put(ns, x, cx);
        await b.put(ns, y, cy);
        const gx = await getOne(b, ns, x);
        assert.equal(typeof gx.release, 'function', 'a 2 MiB read carries a release hook');
        assert.deepEqual(Buffer.from(gx.data), cx.data);
        const memory = gx.data.buffer;
        gx.release!();
        const gy = await getOne(b, ns, y);
        assert.equal(gy.data.buffer, memory, 'the released buffer was reused');
        assert.deepEqual(Buffer.from(gy.data), cy.data, 'and holds only the new bytes');
        gy.release!();
      } finally {
        await b.close();
      }
    });

    it('a buffer not released is never reused, however many gets follow', async () => {
      const b = await open();
      try {
        const ns = newNs();
        const hs = [newHash(), newHash(), newHash()];
        const cs = hs.map(() => chunkOf(2 * MiB));
        for (const [i, h] of hs.entries()) await b.put(ns, h, cs[i]!);
        const held = await getOne(b, ns, hs[0]!);
        const seen = new Set<ArrayBufferLike>();
        for (let r = 0; r < 4; r++) {
          const got = await b.batchedGet(ns, hs.slice(1));
          for (const [i, h] of hs.slice(1).entries()) {
            const c = got.get(h)!;
            assert.notEqual(c.data.buffer, held.data.buffer, 'a held buffer was handed out again');
            assert.deepEqual(Buffer.from(c.data), cs[i + 1]!.data);
            seen.add(c.data.buffer);
            c.release!();
          }
        }
        assert.ok(seen.size <= 2, 'the two released buffers were reused round after round');
        assert.deepEqual(Buffer.from(held.data), cs[0]!.data, 'the held chunk is untouched');
      } finally {
        await b.close();
      }
    });

    it('a double release gives the buffer back once: two held chunks never share it', async () => {
      const b = await open();
      try {
        const ns = newNs();
        const hs = [newHash(), newHash()];
        const cs = hs.map(() => chunkOf(2 * MiB));
        for (const [i, h] of hs.entries()) await b.put(ns, h, cs[i]!);
        const first = await getOne(b, ns, hs[0]!);
        first.release!();
        first.release!();
        const both = await b.batchedGet(ns, hs);
        const [x, y] = [both.get(hs[0]!)!, both.get(hs[1]!)!];
        assert.notEqual(x.data.buffer, y.data.buffer);
        assert.deepEqual(Buffer.from(x.data), cs[0]!.data);
        assert.deepEqual(Buffer.from(y.data), cs[1]!.data);
      } finally {
        await b.close();
      }
    });
  });
}

describe('ChunkFiles read buffers', () => {
  async function files() {
    const root = await tempDir();
    const cf = new ChunkFiles({
      fs: realFileSystem,
      root,
      shardChars: 2,
      maxChunkBytes: 64 * MiB,
      fsync: 'none',
      createRoot: true,
      tier: 't',
      log: silentLogger,
      onCorrupt() {},
    });
    const ns = newNs();
    const store = async (c: Chunk) => {
      const h = newHash();
      const path = cf.path(ns, h);
      await cf.write(ns, h, c, path, () => fsp.mkdir(dirname(path), { recursive: true }).then());
      return { h, path };
    };
    return { cf, ns, store };
  }
  const direct: FileOp = (fn) => fn();

  it('small objects are plain allocations, with no release hook', async () => {
    const { cf, ns, store } = await files();
    const { h, path } = await store(chunkOf(POOLED_READ_MIN_BYTES - CHUNK_HEADER_BYTES - 1));
    const res = await cf.read(ns, h, path, direct);
    assert.equal(res.kind, 'ok');
    assert.equal(res.kind === 'ok' && res.chunk.release, undefined);
  });

  it('a buffer whose read was given up on (a deadline) is never reused', async () => {
    const { cf, ns, store } = await files();
    const c = chunkOf(2 * MiB);
    const { h, path } = await store(c);
    const ok = await cf.read(ns, h, path, direct);
    assert.ok(ok.kind === 'ok');
    ok.chunk.release!();
    assert.equal(cf.pooledBytes, CHUNK_HEADER_BYTES + 2 * MiB);
    // The deadline fires while the read goes on in the background, into the pooled buffer.
    let inner: Promise<unknown> | undefined;
    const giveUp: FileOp = (fn) => {
      inner = fn();
      return Promise.reject(new Error('deadline'));
    };
    await assert.rejects(cf.read(ns, h, path, giveUp), /deadline/);
    await inner; // the abandoned read, finished in the background
    assert.equal(cf.pooledBytes, 0, 'it took the pooled buffer, which never came back');
    const again = await cf.read(ns, h, path, direct);
    assert.ok(again.kind === 'ok');
    assert.notEqual(again.chunk.data.buffer, ok.chunk.data.buffer);
    assert.deepEqual(Buffer.from(again.chunk.data), c.data);
  });

  it('a buffer that read a corrupt object is never handed out nor reused', async () => {
    const { cf, ns, store } = await files();
    const good = await store(chunkOf(2 * MiB));
    const bad = await store(chunkOf(2 * MiB));
    // Flip every bit of one payload byte, so the object is corrupt whatever the byte was.
    const fh = await fsp.open(bad.path, 'r+');
    const byte = Buffer.alloc(1);
    await fh.read(byte, 0, 1, CHUNK_HEADER_BYTES + 5);
    byte[0] = byte[0]! ^ 0xff;
    await fh.write(byte, 0, 1, CHUNK_HEADER_BYTES + 5);
    await fh.close();
    const first = await cf.read(ns, good.h, good.path, direct);
    assert.ok(first.kind === 'ok');
    const pooled = first.chunk.data.buffer;
    first.chunk.release!();
    const corrupt = await cf.read(ns, bad.h, bad.path, direct);
    assert.equal(corrupt.kind, 'corrupt');
    assert.equal(cf.pooledBytes, 0, 'the buffer holding corrupt bytes did not go back');
    const next = await cf.read(ns, good.h, good.path, direct);
    assert.ok(next.kind === 'ok');
    assert.notEqual(next.chunk.data.buffer, pooled);
  });
});

/** A lower tier whose gets carry a release hook that scribbles over the bytes, as reuse would. */
class ReusingTier extends ForwardingBackend {
  handedOut = 0;
  released = 0;

  override async batchedGet(ns: NamespaceId, hashes: readonly ChunkHash[], opts?: GetOptions) {
    const got = await this.inner.batchedGet(ns, hashes, opts);
    const out = new Map<ChunkHash, Chunk | null>();
    for (const [h, c] of got) {
      if (c === null) {
        out.set(h, null);
        continue;
      }
      this.handedOut++;
      const data = Buffer.from(c.data);
      let held = true;
      const release = () => {
        if (!held) return;
        held = false;
        this.released++;
        data.fill(0xaa);
      };
      out.set(h, { tokens: c.tokens, data, release });
    }
    return out;
  }
}

describe('StorageManager releases what it read from a lower tier', () => {
  const NS = '0123456789abcdef0123456789abcdef';
  const setup = () => {
    const cpu = new LocalCpuBackend({ capacityBytes: 64 * 4096, pageBytes: 4096 }, { name: 'cpu' });
    const lower = new ReusingTier(new MemoryBackend({}, { name: 'lower' }));
    const sm = new StorageManager({ tiers: [cpu, lower], sweepIntervalMs: 0 });
    return { cpu, lower, sm };
  };

  it('a prefetch releases every chunk it fetched, after copying it into host memory', async () => {
    const { cpu, lower, sm } = setup();
    try {
      const hs = [newHash(), newHash(), newHash(), newHash()];
      const cs = hs.map(() => chunkOf(4096, 16));
      for (const [i, h] of hs.entries()) await lower.put(NS, h, cs[i]!);
      // The third chunk's token count does not match: fetched, not stored, released all the same.
      const out = await sm.lookup({
        lookupId: 'p',
        namespaces: [NS],
        hashes: hs,
        tokenCounts: [16, 16, 15, 16],
      });
      assert.equal(out.hitChunks, 2);
      assert.equal(lower.handedOut, 4);
      assert.equal(lower.released, 4);
      const got = await cpu.batchedGet(NS, hs.slice(0, 2));
      for (const [i, h] of hs.slice(0, 2).entries())
        assert.deepEqual(Buffer.from(got.get(h)!.data), cs[i]!.data, 'host copy intact');
      sm.cancel('p');
    } finally {
      await sm.close();
    }
  });

  it('get releases the tier chunk after copying it', async () => {
    const { lower, sm } = setup();
    try {
      const h = newHash();
      const c = chunkOf(4096, 16);
      await lower.put(NS, h, c);
      const got = await sm.get(NS, h);
      assert.equal(lower.released, 1);
      assert.deepEqual(Buffer.from(got!.data), c.data, 'the copy is taken before the release');
    } finally {
      await sm.close();
    }
  });
});
