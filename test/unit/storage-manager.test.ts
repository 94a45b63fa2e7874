import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { afterEach, describe, test } from 'node:test';
import type { StorageBackend } from '../../src/backends/core/types.ts';
import { LocalCpuBackend } from '../../src/backends/local-cpu/local-cpu-backend.ts';
import { MemoryBackend } from '../../src/backends/memory/memory-backend.ts';
import { KvtierError } from '../../src/errors.ts';
import type { ChunkHash } from '../../src/hashing/chunk-hash.ts';
import { instrumentBackend, instrumentHostTier } from '../../src/metrics/instrumented-backend.ts';
import { KvtierMetrics } from '../../src/metrics/metrics.ts';
import { StorageManager } from '../../src/storage-manager/storage-manager.ts';
import type { StorageManagerOptions } from '../../src/storage-manager/storage-types.ts';
import { GatedBackend } from '../../test/support/gated-backend.ts';
import { taggedHashes } from '../support/fixtures.ts';

/** A lookup that must fail: errors come as a rejected promise, never thrown nor an outcome. */
function promised(x: unknown): Promise<unknown> {
  assert.ok(x instanceof Promise, 'a refused lookup answers with a promise');
  return x;
}
const NS = '0123456789abcdef0123456789abcdef';
const NS2 = 'fedcba9876543210fedcba9876543210';
const CHUNK_BYTES = 4096;

const hashes = taggedHashes;

function chunk(tokens = 16, bytes = CHUNK_BYTES) {
  return { tokens, data: randomBytes(bytes) };
}

const open: StorageManager[] = [];

function manager(
  tiers: StorageBackend[],
  extra: Partial<StorageManagerOptions> = {},
): StorageManager {
  const m = new StorageManager({ tiers, sweepIntervalMs: 0, ...extra });
  open.push(m);
  return m;
}

function cpuTier(capacityBytes = 64 * CHUNK_BYTES) {
  return new LocalCpuBackend({ capacityBytes, pageBytes: CHUNK_BYTES }, { name: 'cpu' });
}

afterEach(async () => {
  await Promise.all(open.splice(0).map((m) => m.close()));
});

/** Lets pending promise chains run without any timer. */
async function turns(n = 5): Promise<void> {
  for (let i = 0; i < n; i++) await new Promise((r) => setImmediate(r));
}

describe('StorageManager lookup', () => {
  test('counts contiguous CPU hits, pins them, and cancel releases the pins', async () => {
    const cpu = cpuTier();
    const sm = manager([cpu]);
    const hs = hashes(5);
    for (const h of hs.slice(0, 3)) await cpu.put(NS, h, chunk());
    await cpu.put(NS, hs[4]!, chunk()); // after the gap: must not count
    const out = await sm.lookup({
      lookupId: 'a',
      namespaces: [NS],
      hashes: hs,
      tokenCounts: [16, 16, 16, 16, 16],
    });
    assert.equal(out.status, 'ok');
    assert.equal(out.hitChunks, 3);
    assert.equal(out.hitTokens, 48);
    assert.deepEqual(out.tiers, [{ tier: 'cpu', tokens: 48 }]);
    assert.equal(cpu.stats().pinnedChunks, 3);
    assert.equal(sm.events.state('a'), 'done');
    assert.equal(sm.cancel('a'), true);
    assert.equal(cpu.stats().pinnedChunks, 0);
    assert.equal(sm.events.state('a'), 'not_found');
  });

  test('pin: false answers without keeping pins or an entry', async () => {
    const cpu = cpuTier();
    const sm = manager([cpu]);
    const hs = hashes(2);
    for (const h of hs) await cpu.put(NS, h, chunk());
    const out = await sm.lookup({
      lookupId: 'p',
      namespaces: [NS],
      hashes: hs,
      tokenCounts: [16, 7],
      pin: false,
    });
    assert.equal(out.hitTokens, 23);
    assert.equal(cpu.stats().pinnedChunks, 0);
    assert.equal(sm.events.state('p'), 'not_found');
  });

  test('continues in the next tier where the CPU tier stopped and prefetches into host memory', async () => {
    const cpu = cpuTier();
    const lower = new GatedBackend({ name: 'slow' });
    const sm = manager([cpu, lower]);
    const hs = hashes(7);
    for (const h of hs.slice(0, 2)) await cpu.put(NS, h, chunk());
    const lowerChunks = new Map<ChunkHash, ReturnType<typeof chunk>>();
    for (const h of hs.slice(2, 5)) {
      const c = chunk();
      lowerChunks.set(h, c);
      await lower.put(NS, h, c);
    }
    const pending = sm.lookup({
      lookupId: 'x',
      namespaces: [NS],
      hashes: hs,
      tokenCounts: Array(7).fill(16),
    });
    await lower.gate.whenWaiting(1);
    assert.equal(sm.events.state('x'), 'ongoing');
    assert.equal(sm.serializer.inUse, 3, 'the prefetch holds its chunk budget while it runs');
    lower.gate.open();
    const out = await pending;
    assert.equal(out.hitChunks, 5);
    assert.equal(out.hitTokens, 80);
    assert.deepEqual(out.tiers, [
      { tier: 'cpu', tokens: 32 },
      { tier: 'slow', tokens: 48 },
    ]);
    assert.equal(sm.serializer.inUse, 0);
    assert.equal(cpu.stats().pinnedChunks, 5, 'prefetched chunks are pinned in the CPU tier');
    const got = await cpu.batchedGet(NS, hs.slice(2, 5));
    for (const [h, c] of lowerChunks)
      assert.deepEqual(
        Buffer.from(got.get(h)!.data),
        c.data,
        'prefetched bytes are the stored bytes',
      );
    sm.cancel('x');
    assert.equal(cpu.stats().pinnedChunks, 0);
  });

  test('a tier that returns fewer chunks than it promised shortens the answer and releases the extra pins', async () => {
    const cpu = cpuTier();
    const lower = new GatedBackend({ name: 'slow', open: true });
    const sm = manager([cpu, lower]);
    const hs = hashes(5);
    await cpu.put(NS, hs[0]!, chunk());
    for (const h of hs.slice(1)) await lower.put(NS, h, chunk());
    lower.shortGets = 2;
    const out = await sm.lookup({
      lookupId: 's',
      namespaces: [NS],
      hashes: hs,
      tokenCounts: Array(5).fill(16),
    });
    assert.equal(out.hitChunks, 3);
    assert.equal(cpu.stats().pinnedChunks, 3);
    assert.equal(
      lower.inner.stats().pinnedChunks,
      0,
      'lower-tier pins are released after the prefetch',
    );
  });

  test('a chunk whose token count differs from the request is a miss', async () => {
    const cpu = cpuTier();
    const lower = new GatedBackend({ name: 'slow', open: true });
    const sm = manager([cpu, lower]);
    const hs = hashes(3);
    await lower.put(NS, hs[0]!, chunk(16));
    await lower.put(NS, hs[1]!, chunk(9));
    await lower.put(NS, hs[2]!, chunk(16));
    const out = await sm.lookup({
      lookupId: 't',
      namespaces: [NS],
      hashes: hs,
      tokenCounts: [16, 16, 16],
    });
    assert.equal(out.hitChunks, 1);
  });

  test('a missing middle chunk in a lower tier stops the prefix there', async () => {
    const cpu = cpuTier();
    const lower = new GatedBackend({ name: 'slow', open: true });
    const sm = manager([cpu, lower]);
    const hs = hashes(4);
    await lower.put(NS, hs[0]!, chunk());
    await lower.put(NS, hs[2]!, chunk());
    await lower.put(NS, hs[3]!, chunk());
    const out = await sm.lookup({
      lookupId: 'm',
      namespaces: [NS],
      hashes: hs,
      tokenCounts: Array(4).fill(16),
    });
    assert.equal(out.hitChunks, 1);
  });

  test('a tier that is down or failing is a miss, never an error', async () => {
    const cpu = cpuTier();
    const lower = new GatedBackend({ name: 'slow', open: true });
    const sm = manager([cpu, lower]);
    const hs = hashes(3);
    await cpu.put(NS, hs[0]!, chunk());
    for (const h of hs.slice(1)) await lower.put(NS, h, chunk());
    lower.down = true;
    const counts = [16, 16, 16];
    assert.equal(
      (await sm.lookup({ lookupId: 'd1', namespaces: [NS], hashes: hs, tokenCounts: counts }))
        .hitChunks,
      1,
    );
    lower.down = false;
    lower.failGets = true;
    assert.equal(
      (await sm.lookup({ lookupId: 'd2', namespaces: [NS], hashes: hs, tokenCounts: counts }))
        .hitChunks,
      1,
    );
    assert.equal(cpu.stats().pinnedChunks, 1, 'only the answered CPU hit stays pinned');
    assert.equal(lower.inner.stats().pinnedChunks, 0, 'pins on the failing tier are released');
    lower.failGets = false;
    sm.cancel('d1');
    assert.equal(cpu.stats().pinnedChunks, 1, 'still pinned by the other lookup');
    sm.cancel('d2');
    assert.equal(cpu.stats().pinnedChunks, 0);
    assert.equal(
      (await sm.lookup({ lookupId: 'd3', namespaces: [NS], hashes: hs, tokenCounts: counts }))
        .hitChunks,
      3,
    );
  });

  test('with several namespaces a chunk counts only when every namespace has it', async () => {
    const cpu = cpuTier();
    const sm = manager([cpu]);
    const hs = hashes(4);
    for (const h of hs) await cpu.put(NS, h, chunk());
    for (const h of hs.slice(0, 2)) await cpu.put(NS2, h, chunk());
    const out = await sm.lookup({
      lookupId: 'r',
      namespaces: [NS, NS2],
      hashes: hs,
      tokenCounts: Array(4).fill(16),
    });
    assert.equal(out.hitChunks, 2);
    assert.equal(cpu.stats().pinnedChunks, 4, 'two chunks in each namespace, the rest released');
  });

  test('the prefetch is clamped to the serializer budget', async () => {
    const cpu = cpuTier();
    const lower = new GatedBackend({ name: 'slow', open: true });
    const sm = manager([cpu, lower], { prefetchBudgetChunks: 2 });
    const hs = hashes(6);
    await cpu.put(NS, hs[0]!, chunk());
    for (const h of hs.slice(1)) await lower.put(NS, h, chunk());
    const out = await sm.lookup({
      lookupId: 'b',
      namespaces: [NS],
      hashes: hs,
      tokenCounts: Array(6).fill(16),
    });
    assert.equal(out.hitChunks, 3);
  });

  test('prefetch into a CPU tier full of pinned data is a short answer, not a wait', async () => {
    const cpu = cpuTier(4 * CHUNK_BYTES);
    const lower = new GatedBackend({ name: 'slow', open: true });
    const sm = manager([cpu, lower]);
    const filler = hashes(3, 'f');
    for (const h of filler) await cpu.put(NS, h, chunk());
    cpu.pin(NS, filler);
    const hs = hashes(4);
    for (const h of hs) await lower.put(NS, h, chunk());
    const out = await sm.lookup({
      lookupId: 'full',
      namespaces: [NS],
      hashes: hs,
      tokenCounts: Array(4).fill(16),
    });
    assert.equal(out.hitChunks, 1);
    assert.ok(cpu.stats().droppedPuts >= 1);
  });

  test('cancel during a prefetch aborts it, returns the budget and leaves no pins', async () => {
    const cpu = cpuTier();
    const lower = new GatedBackend({ name: 'slow' });
    const sm = manager([cpu, lower]);
    const hs = hashes(3);
    await cpu.put(NS, hs[0]!, chunk());
    for (const h of hs.slice(1)) await lower.put(NS, h, chunk());
    const pending = sm.lookup({
      lookupId: 'c',
      namespaces: [NS],
      hashes: hs,
      tokenCounts: [4, 4, 4],
    });
    await lower.gate.whenWaiting(1);
    assert.equal(sm.cancel('c'), true);
    const out = await pending;
    assert.equal(out.status, 'canceled');
    assert.equal(out.hitTokens, 0);
    await turns();
    assert.equal(cpu.stats().pinnedChunks, 0);
    assert.equal(lower.inner.stats().pinnedChunks, 0);
    assert.equal(sm.serializer.inUse, 0);
  });

  test('reusing a lookup id cancels the earlier lookup', async () => {
    const cpu = cpuTier();
    const lower = new GatedBackend({ name: 'slow' });
    const sm = manager([cpu, lower]);
    const hs = hashes(2);
    for (const h of hs) await lower.put(NS, h, chunk());
    const first = sm.lookup({
      lookupId: 'same',
      namespaces: [NS],
      hashes: hs,
      tokenCounts: [16, 16],
    });
    await lower.gate.whenWaiting(1);
    lower.gate.open();
    const second = sm.lookup({
      lookupId: 'same',
      namespaces: [NS],
      hashes: hs,
      tokenCounts: [16, 16],
    });
    assert.equal((await first).status, 'canceled');
    const out = await second;
    assert.equal(out.hitTokens, 32);
    sm.cancel('same');
    await turns();
    assert.equal(cpu.stats().pinnedChunks, 0);
  });

  test('a clear during a prefetch makes the answer stale and bumps the epoch', async () => {
    const cpu = cpuTier();
    const lower = new GatedBackend({ name: 'slow' });
    const sm = manager([cpu, lower]);
    const hs = hashes(2);
    for (const h of hs) await lower.put(NS, h, chunk());
    const pending = sm.lookup({ lookupId: 'e', namespaces: [NS], hashes: hs, tokenCounts: [4, 4] });
    await lower.gate.whenWaiting(1);
    const before = sm.epoch;
    const epoch = await sm.clear();
    assert.equal(epoch, before + 1);
    lower.gate.open();
    const out = await pending;
    assert.equal(out.status, 'stale');
    assert.equal(out.hitTokens, 0);
    assert.equal(out.epoch, before + 1);
    assert.equal(cpu.stats().pinnedChunks, 0);
    const again = await sm.lookup({
      lookupId: 'e2',
      namespaces: [NS],
      hashes: hs,
      tokenCounts: [4, 4],
    });
    assert.equal(again.hitChunks, 0, 'clear dropped the chunks from every tier');
  });

  test('the epoch starts from the clock so a restarted sidecar never goes back', () => {
    const a = manager([cpuTier()]);
    assert.ok(a.epoch > 60_000_000, 'seconds since 2024');
    assert.equal(manager([cpuTier()], { initialEpoch: 7 }).epoch, 7);
  });

  test('answered pins expire after the pin TTL', async () => {
    let now = 0;
    const cpu = cpuTier();
    const sm = manager([cpu], { pinTtlMs: 1000, now: () => now });
    const hs = hashes(2);
    for (const h of hs) await cpu.put(NS, h, chunk());
    await sm.lookup({ lookupId: 'ttl', namespaces: [NS], hashes: hs, tokenCounts: [4, 4] });
    assert.equal(cpu.stats().pinnedChunks, 2);
    now = 500;
    assert.equal(sm.sweep(), 0);
    assert.equal(cpu.stats().pinnedChunks, 2);
    now = 1001;
    assert.equal(sm.sweep(), 1);
    assert.equal(cpu.stats().pinnedChunks, 0);
  });

  test('takeLookup hands the pins to the caller', async () => {
    const cpu = cpuTier();
    const sm = manager([cpu]);
    const hs = hashes(2);
    for (const h of hs) await cpu.put(NS, h, chunk());
    await sm.lookup({ lookupId: 'k', namespaces: [NS], hashes: hs, tokenCounts: [4, 4] });
    const taken = sm.takeLookup('k');
    assert.ok(taken);
    assert.deepEqual(taken.hashes, hs);
    assert.equal(sm.events.state('k'), 'not_found');
    assert.equal(cpu.stats().pinnedChunks, 2);
    sm.releaseLookup(taken);
    assert.equal(cpu.stats().pinnedChunks, 0);
  });

  test('too many tracked lookups is KVT_CAPACITY and takes no pins', async () => {
    const cpu = cpuTier();
    const sm = manager([cpu], { maxLookups: 2 });
    const hs = hashes(1);
    await cpu.put(NS, hs[0]!, chunk());
    const lower = new GatedBackend({ name: 'never' });
    const blocked = manager([cpuTier(), lower], { maxLookups: 1 });
    await lower.put(NS, hs[0]!, chunk());
    const held = blocked.lookup({
      lookupId: 'held',
      namespaces: [NS],
      hashes: hs,
      tokenCounts: [16],
    });
    await lower.gate.whenWaiting(1);
    await assert.rejects(
      promised(
        blocked.lookup({ lookupId: 'next', namespaces: [NS], hashes: hs, tokenCounts: [16] }),
      ),
      (e: unknown) => e instanceof KvtierError && e.code === 'KVT_CAPACITY',
    );
    lower.gate.open();
    assert.equal((await held).hitChunks, 1);
    // Answered, pinned lookups are evicted oldest-first to make room.
    const own = hashes(3, 'own');
    for (const h of own) await cpu.put(NS, h, chunk());
    for (let i = 0; i < 3; i++)
      await sm.lookup({
        lookupId: `l${i}`,
        namespaces: [NS],
        hashes: [own[i]!],
        tokenCounts: [16],
      });
    assert.equal(sm.events.state('l0'), 'not_found');
    assert.equal(cpu.stats().pinnedChunks, 2, 'the evicted lookup released its pin');
  });

  test('rejects inconsistent input and work after close', async () => {
    const sm = manager([cpuTier()]);
    await assert.rejects(
      promised(sm.lookup({ lookupId: 'z', namespaces: [NS], hashes: hashes(2), tokenCounts: [1] })),
      { code: 'KVT_INVALID_ARGUMENT' },
    );
    await assert.rejects(
      promised(sm.lookup({ lookupId: 'z', namespaces: [], hashes: [], tokenCounts: [] })),
      { code: 'KVT_INVALID_ARGUMENT' },
    );
    await sm.close();
    await sm.close();
    await assert.rejects(
      promised(sm.lookup({ lookupId: 'z', namespaces: [NS], hashes: [], tokenCounts: [] })),
      { code: 'KVT_CLOSED' },
    );
    await assert.rejects(sm.put(NS, hashes(1)[0]!, chunk()), { code: 'KVT_CLOSED' });
  });

  test('the first tier must be host memory and names must be unique', () => {
    assert.throws(() => new StorageManager({ tiers: [new MemoryBackend({}, { name: 'm' })] }), {
      code: 'KVT_CONFIG',
    });
    assert.throws(() => new StorageManager({ tiers: [] }), { code: 'KVT_CONFIG' });
    const a = cpuTier();
    assert.throws(
      () => new StorageManager({ tiers: [a, new MemoryBackend({}, { name: 'cpu' })] }),
      { code: 'KVT_CONFIG' },
    );
  });
});

describe('StorageManager put and write-through', () => {
  test('puts land in the CPU tier and are written through to every lower tier', async () => {
    const cpu = cpuTier();
    const a = new MemoryBackend({}, { name: 'a' });
    const b = new MemoryBackend({}, { name: 'b' });
    const sm = manager([cpu, a, b]);
    const hs = hashes(3);
    const chunks = hs.map(() => chunk());
    for (let i = 0; i < 3; i++) assert.equal(await sm.put(NS, hs[i]!, chunks[i]!), 'stored');
    await sm.writeQueue.idle();
    for (const tier of [a, b]) {
      const got = await tier.batchedGet(NS, hs);
      hs.forEach((h, i) => {
        assert.deepEqual(Buffer.from(got.get(h)!.data), chunks[i]!.data);
      });
    }
    assert.equal(cpu.stats().pinnedChunks, 0, 'write-through pins are released');
    assert.equal(await sm.put(NS, hs[0]!, chunks[0]!), 'exists');
  });

  test('a full write-through queue drops and counts instead of waiting', async () => {
    const cpu = cpuTier();
    let releasePuts!: () => void;
    const putsHeld = new Promise<void>((r) => {
      releasePuts = r;
    });
    class SlowPuts extends MemoryBackend {
      override async put(...args: Parameters<MemoryBackend['put']>) {
        await putsHeld;
        return super.put(...args);
      }
    }
    const slow = new SlowPuts({}, { name: 'slow' });
    const metrics = new KvtierMetrics({ defaultMetrics: false });
    const sm = manager([cpu, slow], { writeThrough: { maxChunks: 2, concurrency: 1 }, metrics });
    const hs = hashes(4);
    for (const h of hs)
      assert.equal(await sm.put(NS, h, chunk()), 'stored', 'the CPU tier took it');
    assert.equal(sm.writeQueue.depth, 2);
    assert.equal(
      cpu.stats().pinnedChunks,
      2,
      'only queued chunks are pinned for the write-through',
    );
    const text = await metrics.text();
    assert.match(text, /kvtier_writethrough_dropped_total\{tier="slow",reason="queue_full"\} 2/);
    releasePuts();
    await sm.writeQueue.idle();
    assert.equal(slow.stats().chunks, 2);
    assert.equal(cpu.stats().pinnedChunks, 0);
  });

  test('get reads from the first tier that has the chunk and returns a copy', async () => {
    const cpu = cpuTier();
    const lower = new MemoryBackend({}, { name: 'low' });
    const sm = manager([cpu, lower]);
    const [h1, h2, h3] = hashes(3);
    const c1 = chunk();
    const c2 = chunk(5);
    await cpu.put(NS, h1!, c1);
    await lower.put(NS, h2!, c2);
    assert.deepEqual(Buffer.from((await sm.get(NS, h1!))!.data), c1.data);
    const g2 = await sm.get(NS, h2!);
    assert.equal(g2!.tokens, 5);
    assert.deepEqual(Buffer.from(g2!.data), c2.data);
    assert.equal(await sm.get(NS, h3!), null);
  });
});

describe('StorageManager host-memory port: reserve, commit, and CLEAR', () => {
  /** A lower tier whose puts wait until released, to hold a write-through running or queued. */
  function heldLower(name = 'slow') {
    let release!: () => void;
    const held = new Promise<void>((r) => {
      release = r;
    });
    let started = 0;
    class Held extends MemoryBackend {
      override async put(...args: Parameters<MemoryBackend['put']>) {
        started++;
        await held;
        return super.put(...args);
      }
    }
    return { tier: new Held({}, { name }), release, started: () => started };
  }

  test('commit indexes, pins until written through, and queues the write-through', async () => {
    const cpu = cpuTier();
    const low = new MemoryBackend({}, { name: 'low' });
    const sm = manager([cpu, low]);
    const [h] = hashes(1);
    const r = sm.reserve(NS, h!, CHUNK_BYTES, 16);
    assert.ok(typeof r === 'object');
    r.view.fill(7);
    assert.equal((await cpu.batchedGet(NS, [h!])).get(h!), null, 'invisible before commit');
    assert.equal(r.commit(), 'stored');
    assert.throws(() => r.commit(), { code: 'KVT_INTERNAL' });
    assert.equal(cpu.stats().pinnedChunks, 1, 'pinned while its write-through is queued');
    await sm.writeQueue.idle();
    assert.equal(cpu.stats().pinnedChunks, 0);
    assert.deepEqual(
      Buffer.from((await low.batchedGet(NS, [h!])).get(h!)!.data),
      Buffer.from(r.view),
    );
    assert.equal(sm.reserve(NS, h!, CHUNK_BYTES, 16), 'exists');
  });

  test('a decorated host tier keeps its port; an undecorated-port tier is refused', () => {
    const metrics = new KvtierMetrics({ defaultMetrics: false });
    const sm = manager([instrumentHostTier(cpuTier(), metrics)]);
    assert.ok(typeof sm.reserve(NS, hashes(1)[0]!, CHUNK_BYTES, 16) === 'object');
    assert.throws(() => manager([instrumentBackend(cpuTier(), metrics)]), {
      code: 'KVT_CONFIG',
      message: /HostMemoryTier\.reserve/,
    });
  });

  test('a commit after a CLEAR of its namespace is dropped; other namespaces commit', async () => {
    const cpu = cpuTier();
    const sm = manager([cpu, new MemoryBackend({}, { name: 'low' })]);
    const [a, b] = hashes(2);
    const ra = sm.reserve(NS, a!, CHUNK_BYTES, 16);
    const rb = sm.reserve(NS2, b!, CHUNK_BYTES, 16);
    assert.ok(typeof ra === 'object' && typeof rb === 'object');
    await sm.clear([NS]);
    assert.equal(ra.commit(), 'dropped');
    assert.equal(rb.commit(), 'stored');
    await sm.writeQueue.idle();
    assert.equal(await sm.get(NS, a!), null);
    assert.notEqual(await sm.get(NS2, b!), null);
    assert.equal(cpu.stats().pinnedChunks, 0);
  });

  test('CLEAR drops queued write-throughs and waits for running ones before clearing', async () => {
    const cpu = cpuTier();
    const low = heldLower();
    const sm = manager([cpu, low.tier], { writeThrough: { concurrency: 1 } });
    const hs = hashes(3);
    for (const h of hs) assert.equal(await sm.put(NS, h, chunk()), 'stored');
    await turns();
    assert.equal(low.started(), 1, 'one write-through runs, two are queued');
    let cleared = false;
    const clearing = sm.clear([NS]).then(() => {
      cleared = true;
    });
    await turns();
    assert.equal(cleared, false, 'CLEAR waits for the running write-through');
    assert.equal(sm.writeQueue.depth, 1, 'the queued ones were dropped');
    low.release();
    await clearing;
    await sm.writeQueue.idle();
    assert.equal(low.started(), 1);
    for (const h of hs) assert.equal(await sm.get(NS, h), null);
    assert.equal(low.tier.stats().chunks, 0);
    assert.equal(cpu.stats().pinnedChunks, 0);
  });

  test('a prefetch that read before a CLEAR does not bring the chunk back', async () => {
    const cpu = cpuTier();
    const lower = new GatedBackend({ name: 'slow' });
    const sm = manager([cpu, lower]);
    const [h] = hashes(1);
    await lower.put(NS, h!, chunk());
    const running = sm.lookup({
      lookupId: 'pf',
      namespaces: [NS],
      hashes: [h!],
      tokenCounts: [16],
    });
    await lower.gate.whenWaiting(1);
    lower.gate.open();
    const cleared = sm.clear([NS]);
    const out = await running;
    await cleared;
    assert.equal(out.status, 'stale');
    assert.equal(await sm.get(NS, h!), null);
    assert.equal(cpu.stats().chunks, 0);
  });

  test('CLEAR releases the pins of answered lookups, also ones taken by a caller', async () => {
    const cpu = cpuTier();
    const sm = manager([cpu]);
    const hs = hashes(2);
    for (const h of hs) await cpu.put(NS, h, chunk());
    await cpu.put(NS2, hs[0]!, chunk());
    const ask = (id: string, ns: string) =>
      sm.lookup({ lookupId: id, namespaces: [ns], hashes: hs, tokenCounts: [16, 16] });
    assert.equal((await ask('kept', NS)).hitChunks, 2);
    assert.equal((await ask('taken', NS)).hitChunks, 2);
    assert.equal((await ask('other', NS2)).hitChunks, 1);
    const taken = sm.takeLookup('taken')!;
    assert.equal(cpu.stats().pinnedChunks, 3);
    await sm.clear([NS]);
    assert.equal(cpu.stats().pinnedChunks, 1, 'only the other namespace keeps its pin');
    assert.equal(sm.events.state('kept'), 'not_found');
    assert.equal(sm.events.state('other'), 'done');
    assert.equal(taken.status, 'stale');
    assert.equal(taken.hitChunks, 0);
    sm.releaseLookup(taken);
  });
});
