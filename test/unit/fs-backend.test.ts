import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import * as fsp from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it, mock } from 'node:test';
import { setImmediate as turn } from 'node:timers/promises';
import { CircuitBreakerBackend } from '../../src/backends/core/circuit-breaker.ts';
import type { Chunk } from '../../src/backends/core/types.ts';
import { type FileSystem, objectPath } from '../../src/backends/files/file-store.ts';
import { CHUNK_HEADER_BYTES } from '../../src/backends/format/chunk-format.ts';
import {
  createFsBackend,
  FsBackend,
  type FsBackendOptions,
  fsOptionsFromConfig,
} from '../../src/backends/fs/fs-backend.ts';
import { isKvtierError } from '../../src/errors.ts';
import { chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';

const dirs: string[] = [];
after(async () => {
  await Promise.all(dirs.map((d) => fsp.rm(d, { recursive: true, force: true })));
});

async function tempDir(): Promise<string> {
  const d = await fsp.mkdtemp(join(tmpdir(), 'kvtier-fs-unit-'));
  dirs.push(d);
  return d;
}

const ns = () => randomBytes(16).toString('hex');
const hash = () => chunkHashFromBytes(randomBytes(32));
const chunk = (bytes: number, tokens = 256): Chunk => ({ tokens, data: randomBytes(bytes) });
const obj = (payload: number) => CHUNK_HEADER_BYTES + payload;

async function exists(path: string): Promise<boolean> {
  return fsp.stat(path).then(
    () => true,
    () => false,
  );
}

async function setMtime(path: string, ms: number): Promise<void> {
  const t = new Date(ms);
  await fsp.utimes(path, t, t);
}

/** A settable clock, ms since the epoch. */
function clock(start: number) {
  const c = { now: start, read: () => c.now };
  return c;
}

function open(path: string, extra: Partial<FsBackendOptions> = {}) {
  return FsBackend.open({ path, ...extra }, { name: 'shared' });
}

describe('FsBackend', () => {
  it('objects of another instance over the same directory are seen at once, deletes too', async () => {
    const dir = await tempDir();
    const [a, b] = [await open(dir), await open(dir)];
    const [n, h, c] = [ns(), hash(), chunk(3000)];
    assert.equal(await a.batchedContains(n, [h]), 0);
    assert.equal(await b.put(n, h, c), 'stored');
    assert.equal(await a.batchedContains(n, [h]), 1);
    assert.deepEqual(Buffer.from((await a.batchedGet(n, [h])).get(h)!.data), c.data);
    assert.equal(await a.put(n, h, c), 'exists', 'not rewritten');
    assert.equal(await b.remove(n, [h]), 1);
    assert.equal((await a.batchedGet(n, [h])).get(h), null, 'deleted by the other: a miss');
    await Promise.all([a.close(), b.close()]);
  });

  it('re-creates namespace and shard directories removed under it', async () => {
    const dir = await tempDir();
    const b = await open(dir);
    const n = ns();
    await b.put(n, hash(), chunk(100));
    await fsp.rm(join(dir, n), { recursive: true });
    const h = hash();
    assert.equal(await b.put(n, h, chunk(100)), 'stored');
    assert.equal(await exists(objectPath(dir, n, h, 2)), true);
    assert.equal(b.health(), 'up');
    await b.close();
  });

  it('a TTL makes old objects misses at once and the sweep deletes them (injected clock)', async () => {
    const dir = await tempDir();
    const t = clock(Date.now());
    const b = await open(dir, { ttlMs: 60_000, now: t.read });
    const n = ns();
    const [old, fresh] = [hash(), hash()];
    await b.put(n, old, chunk(1000));
    await b.put(n, fresh, chunk(1000));
    await setMtime(objectPath(dir, n, old, 2), t.now - 30_000);
    assert.equal(await b.batchedContains(n, [old, fresh]), 2, 'within the TTL');
    t.now += 40_000; // old is 70 s old, fresh 40 s
    assert.equal(await b.batchedContains(n, [old]), 0, 'expired: a miss before any sweep');
    assert.equal((await b.batchedGet(n, [old])).get(old), null);
    assert.equal(await exists(objectPath(dir, n, old, 2)), true, 'deleting is the sweep’s job');
    const report = await b.sweep();
    assert.deepEqual(report, {
      chunks: 1,
      bytes: obj(1000),
      expired: 1,
      evicted: 0,
      tempsRemoved: 0,
    });
    assert.equal(await exists(objectPath(dir, n, old, 2)), false);
    assert.equal(await b.batchedContains(n, [fresh]), 1);
    const s = b.stats();
    assert.equal(s.evictions, 1);
    assert.equal(s.chunks, 1);
    assert.equal(s.lastSweepAtMs, t.now);
    await b.close();
  });

  it('the sweep deletes the oldest objects (by mtime) beyond capacityBytes', async () => {
    const dir = await tempDir();
    const b = await open(dir, { capacityBytes: 2 * obj(1000) });
    assert.equal(b.capabilities.evicts, true);
    const n = ns();
    const hs = [hash(), hash(), hash(), hash()];
    for (const h of hs) assert.equal(await b.put(n, h, chunk(1000)), 'stored');
    assert.equal(b.stats().bytesUsed, 4 * obj(1000), 'own writes are counted');
    const base = Date.now() - 100_000;
    const order = [2, 0, 3, 1]; // hs[2] oldest ... hs[1] newest
    for (const [rank, i] of order.entries())
      await setMtime(objectPath(dir, n, hs[i]!, 2), base + rank * 1000);
    const report = await b.sweep();
    assert.equal(report.evicted, 2);
    assert.equal(report.bytes, 2 * obj(1000));
    for (const i of [2, 0])
      assert.equal(await exists(objectPath(dir, n, hs[i]!, 2)), false, `hs[${i}] evicted`);
    assert.equal(await b.batchedContains(n, [hs[3]!, hs[1]!]), 2, 'the two newest stay');
    assert.equal(b.stats().bytesUsed, 2 * obj(1000));
    assert.equal(b.stats().evictions, 2);
    await b.close();
  });

  it('the sweep removes stale temp files only, and ignores foreign files', async () => {
    const dir = await tempDir();
    const t = clock(Date.now());
    const b = await open(dir, { staleTempMs: 60_000, now: t.read });
    const [n, h] = [ns(), hash()];
    const final = objectPath(dir, n, h, 2);
    await fsp.mkdir(join(final, '..'), { recursive: true });
    const [stale, live, foreign] = [
      `${final}.1.aa.tmp`,
      `${final}.2.bb.tmp`,
      join(dir, n, 'notes.txt'),
    ];
    for (const f of [stale, live, foreign]) await fsp.writeFile(f, 'x');
    await setMtime(stale, t.now - 120_000);
    await setMtime(live, t.now - 1000);
    const report = await b.sweep();
    assert.equal(report.tempsRemoved, 1);
    assert.equal(await exists(stale), false, 'a crashed writer’s temp file is removed');
    assert.equal(await exists(live), true, 'another sidecar may still be writing this one');
    assert.equal(await exists(foreign), true);
    await b.clear();
    assert.equal(await exists(foreign), true, 'clear() deletes objects only');
    await b.close();
  });

  it('stats count what is there at open, plus and minus own writes and deletes', async () => {
    const dir = await tempDir();
    const first = await open(dir);
    const n = ns();
    const hs = [hash(), hash(), hash()];
    for (const h of hs) await first.put(n, h, chunk(500));
    await first.close();
    const b = await open(dir);
    assert.equal(b.stats().chunks, 3);
    assert.equal(b.stats().bytesUsed, 3 * obj(500));
    assert.equal(await b.remove(n, [hs[0]!, hash()]), 1);
    assert.equal(b.stats().chunks, 2);
    assert.equal(b.stats().bytesUsed, 2 * obj(500));
    assert.equal(b.stats().capacityBytes, null);
    assert.equal(b.capabilities.evicts, false, 'no bound, no eviction');
    await b.close();
  });

  it('pins nothing: pinning is false, pin returns 0, unpin is a no-op', async () => {
    const b = await open(await tempDir());
    const [n, h] = [ns(), hash()];
    await b.put(n, h, chunk(100), { pin: true });
    assert.equal(b.capabilities.pinning, false);
    assert.equal(b.capabilities.shared, true);
    assert.equal(b.pin(n, [h]), 0);
    b.unpin(n, [h]);
    assert.equal(await b.batchedContains(n, [h], { pin: true }), 1);
    assert.equal(b.stats().pinnedChunks, 0);
    await b.close();
  });

  it('a hung mount: calls fail with KVT_TIMEOUT, the breaker answers misses and drops, goes down, and its probe restores the tier', async () => {
    // Timers are mocked: a hung call times out when the test moves the clock, and a real file
    // operation can never time out however slow this machine is (the clock does not move).
    mock.timers.enable({ apis: ['setTimeout'] });
    try {
      const dir = await tempDir();
      const probeDir = join(dir, '0'.repeat(32));
      let hang = false;
      let probed: (() => void) | null = null;
      const never = () => new Promise<never>(() => {});
      const mount: FileSystem = {
        ...fsp,
        stat: ((path: string) => {
          if (!hang && path.startsWith(probeDir) && probed !== null) probed();
          return hang ? never() : fsp.stat(path);
        }) as typeof fsp.stat,
        open: ((...args: Parameters<typeof fsp.open>) =>
          hang ? never() : fsp.open(...args)) as typeof fsp.open,
      };
      /** Moves the mocked clock 5 ms per event-loop turn until `p` settles (hung calls time out). */
      const settle = async <T>(p: Promise<T>): Promise<T> => {
        let done = false;
        p.then(
          () => {
            done = true;
          },
          () => {
            done = true;
          },
        );
        for (let i = 0; i < 10_000 && !done; i++) {
          mock.timers.tick(5);
          await turn();
        }
        return p;
      };
      const raw = await open(dir, { fsImpl: mount, timeoutMs: 25 });
      // As the host wraps it: the breaker is the tier's one health mechanism.
      const b = new CircuitBreakerBackend(raw, {
        timeoutMs: 10_000,
        failureThreshold: 2,
        probeIntervalMs: 5,
      });
      const [n, h, c] = [ns(), hash(), chunk(1000)];
      assert.equal(await b.put(n, h, c), 'stored');
      hang = true;
      await assert.rejects(settle(raw.batchedContains(n, [h])), (err: unknown) =>
        isKvtierError(err, 'KVT_TIMEOUT'),
      );
      assert.equal(raw.health(), 'degraded', 'the tier reports its latest failure, never down');
      assert.equal(
        await settle(b.batchedContains(n, [h, hash()])),
        0,
        'a timed-out stat is a miss',
      );
      assert.equal((await settle(b.batchedGet(n, [h]))).get(h), null, 'a timed-out read is a miss');
      assert.equal(b.health(), 'down', 'the breaker opened');
      assert.equal(await b.put(n, hash(), c), 'dropped', 'a put while down is dropped at once');
      assert.ok(raw.stats().timeouts >= 3, `timeouts counted: ${raw.stats().timeouts}`);
      const probeSeen = new Promise<void>((resolve) => {
        probed = resolve;
      });
      hang = false;
      // The next probe is due within probeIntervalMs; once it has started, the clock stands
      // still, so its real stat cannot time out.
      let started = false;
      void probeSeen.then(() => {
        started = true;
      });
      for (let i = 0; i < 10_000 && !started; i++) {
        mock.timers.tick(1);
        await turn();
      }
      await probeSeen;
      for (let i = 0; i < 100_000 && b.health() !== 'up'; i++) await turn();
      assert.equal(b.health(), 'up', 'restored by the probe alone');
      assert.equal(await b.batchedContains(n, [h]), 1, 'served again');
      assert.equal(raw.health(), 'up');
      await b.close();
    } finally {
      mock.timers.reset();
    }
  });

  it('validates options and config with the tier and key named', async () => {
    const bad: [Record<string, unknown>, RegExp][] = [
      [{ path: '/x', timeoutMs: 0 }, /tier "nfs".*timeoutMs must be an integer in \[1, 3600000\]/],
      [{ path: '/x', fsync: 'maybe' }, /tier "nfs".*fsync must be one of/],
      [{ path: '/x', ttlMs: -5 }, /tier "nfs".*ttlMs must be an integer >= 1/],
      [{ path: '/x', capacityBytes: 10 }, /tier "nfs".*capacityBytes must be an integer >= 129/],
      [{ path: '/x', fsImpl: {} }, /tier "nfs".*unknown fs option "fsImpl"/],
      [{}, /tier "nfs".*path is required/],
    ];
    for (const [raw, re] of bad) {
      assert.throws(
        () => fsOptionsFromConfig(raw, 'nfs'),
        (err: unknown) => isKvtierError(err, 'KVT_CONFIG') && re.test(err.message),
        JSON.stringify(raw),
      );
    }
    const dir = await tempDir();
    const b = await createFsBackend({ path: join(dir, 'a', 'b'), ttlMs: 1000 }, { name: 'nfs' });
    assert.equal(b.kind, 'fs');
    assert.equal(b.capabilities.evicts, true, 'a TTL evicts');
    assert.equal(await exists(join(dir, 'a', 'b')), true, 'the directory is created');
    await b.close();
  });
});
