import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { Chunk } from '../../src/backends/core/types.ts';
import {
  type ChunkReservation,
  createLocalCpuBackend,
  LocalCpuBackend,
} from '../../src/backends/local-cpu/local-cpu-backend.ts';
import { isKvtierError } from '../../src/errors.ts';
import { type ChunkHash, chunkHash } from '../../src/hashing/chunk-hash.ts';

const PAGE = 4096;
const NS = 'a'.repeat(32);
const NS2 = 'b'.repeat(32);

function h(i: number): ChunkHash {
  return chunkHash(i.toString(16).padStart(64, '0'));
}

function chunk(fill: number, bytes = PAGE, tokens = 16): Chunk {
  return { tokens, data: new Uint8Array(bytes).fill(fill) };
}

function filledWith(data: Uint8Array | undefined, value: number): boolean {
  return data?.every((x) => x === value) === true;
}

/** Explicit messages: a bare assert.ok failure makes Node re-read the .ts source, which can stall. */
function assertFilled(data: Uint8Array | undefined, value: number): void {
  assert.ok(data !== undefined, 'chunk bytes are missing');
  const bad = data.findIndex((x) => x !== value);
  assert.equal(bad, -1, `byte ${bad} is not ${value}`);
}

function backend(pages: number): LocalCpuBackend {
  return new LocalCpuBackend({ capacityBytes: pages * PAGE, pageBytes: PAGE }, { name: 'cpu' });
}

/** Deterministic PRNG (mulberry32) so failures reproduce. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

describe('LocalCpuBackend basics', () => {
  it('declares its kind and capabilities', () => {
    const b = new LocalCpuBackend({
      capacityBytes: 16 * PAGE,
      pageBytes: PAGE,
      slabBytes: 8 * PAGE,
    });
    assert.equal(b.kind, 'local-cpu');
    assert.equal(b.name, 'local-cpu');
    assert.deepEqual(b.capabilities, {
      pinning: true,
      hostMemory: true,
      persistent: false,
      shared: false,
      evicts: true,
      maxChunkBytes: 8 * PAGE,
    });
    assert.equal(b.health(), 'up');
  });

  it('stores a copy and returns it by hash', async () => {
    const b = backend(8);
    const src = chunk(3, 5000, 7);
    assert.equal(await b.put(NS, h(1), src), 'stored');
    src.data.fill(0);
    const got = await b.batchedGet(NS, [h(1)]);
    const c = got.get(h(1));
    assert.ok(c, 'chunk 1 is stored');
    assert.equal(c.tokens, 7);
    assert.equal(c.data.byteLength, 5000);
    assertFilled(c.data, 3);
    assert.equal(await b.put(NS, h(1), chunk(9)), 'exists');
    assert.ok(
      filledWith((await b.batchedGet(NS, [h(1)])).get(h(1))?.data, 3),
      'exists does not rewrite',
    );
    assert.deepEqual(b.stats(), {
      chunks: 1,
      bytesUsed: 2 * PAGE,
      capacityBytes: 8 * PAGE,
      pinnedChunks: 0,
      evictions: 0,
      droppedPuts: 0,
      namespaces: { [NS]: { chunks: 1, bytes: 5000 } },
    });
  });

  it('counts contiguous hits from the first hash and pins exactly those', async () => {
    const b = backend(8);
    for (const i of [0, 1, 2, 4]) await b.put(NS, h(i), chunk(i));
    const hashes = [0, 1, 2, 3, 4].map(h);
    assert.equal(await b.batchedContains(NS, hashes), 3);
    assert.equal(b.stats().pinnedChunks, 0);
    assert.equal(await b.batchedContains(NS, hashes, { pin: true }), 3);
    assert.equal(b.stats().pinnedChunks, 3);
    assert.equal(await b.batchedContains(NS, [h(3), h(4)], { pin: true }), 0);
    assert.equal(b.stats().pinnedChunks, 3, 'a miss on the first hash pins nothing');
    assert.equal(await b.batchedContains(NS, []), 0);
    b.unpin(NS, hashes);
    assert.equal(b.stats().pinnedChunks, 0);
  });

  it('answers a keyed get with a missing middle chunk without shifting later chunks', async () => {
    const b = backend(8);
    await b.put(NS, h(0), chunk(10));
    await b.put(NS, h(2), chunk(12));
    const got = await b.batchedGet(NS, [h(0), h(1), h(2)]);
    assert.deepEqual([...got.keys()], [h(0), h(1), h(2)]);
    assertFilled(got.get(h(0))?.data, 10);
    assert.equal(got.get(h(1)), null);
    assertFilled(got.get(h(2))?.data, 12);
  });

  it('keeps namespaces isolated', async () => {
    const b = backend(8);
    await b.put(NS, h(1), chunk(1));
    assert.equal(await b.batchedContains(NS2, [h(1)]), 0);
    assert.equal((await b.batchedGet(NS2, [h(1)])).get(h(1)), null);
    assert.equal(await b.put(NS2, h(1), chunk(2)), 'stored');
    await b.clear(NS);
    assert.equal(await b.batchedContains(NS, [h(1)]), 0);
    assertFilled((await b.batchedGet(NS2, [h(1)])).get(h(1))?.data, 2);
    assert.equal(await b.remove(NS, [h(1)]), 0);
    await b.clear();
    assert.equal(b.stats().chunks, 0);
    assert.equal(b.stats().bytesUsed, 0);
  });

  it('refcounts pins and pins on put (also when the chunk exists)', async () => {
    const b = backend(8);
    assert.equal(await b.put(NS, h(1), chunk(1), { pin: true }), 'stored');
    assert.equal(await b.put(NS, h(1), chunk(1), { pin: true }), 'exists');
    assert.equal(b.pin(NS, [h(1), h(2)]), 1);
    b.unpin(NS, [h(1)]);
    b.unpin(NS, [h(1)]);
    assert.equal(b.stats().pinnedChunks, 1, 'one pin is still held');
    b.unpin(NS, [h(1), h(1), h(9)]);
    assert.equal(b.stats().pinnedChunks, 0, 'extra unpins are ignored');
  });

  it('drops and counts a chunk larger than maxChunkBytes without throwing', async () => {
    const b = new LocalCpuBackend({
      capacityBytes: 8 * PAGE,
      pageBytes: PAGE,
      slabBytes: 2 * PAGE,
    });
    assert.equal(await b.put(NS, h(1), chunk(1, 2 * PAGE + 1)), 'dropped');
    assert.equal(b.stats().droppedPuts, 1);
    assert.equal(b.stats().chunks, 0);
  });

  it('rejects malformed chunks with KVT_INVALID_ARGUMENT', async () => {
    const b = backend(4);
    await assert.rejects(b.put(NS, h(1), { tokens: -1, data: new Uint8Array(1) }), (e: unknown) =>
      isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
    );
    await assert.rejects(b.put(NS, h(1), { tokens: 1, data: 'x' } as never), (e: unknown) =>
      isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
    );
  });

  it('rejects an already aborted signal', async () => {
    const b = backend(4);
    const ac = new AbortController();
    ac.abort();
    await assert.rejects(b.batchedGet(NS, [h(1)], { signal: ac.signal }), (e: unknown) =>
      isKvtierError(e, 'KVT_ABORTED'),
    );
  });
});

describe('LocalCpuBackend eviction', () => {
  it('evicts least recently used first; gets and contains refresh recency', async () => {
    const b = backend(4);
    for (let i = 0; i < 4; i++) await b.put(NS, h(i), chunk(i));
    await b.batchedGet(NS, [h(0)]);
    await b.batchedContains(NS, [h(1)]);
    assert.equal(await b.put(NS, h(4), chunk(4)), 'stored');
    assert.equal(await b.batchedContains(NS, [h(2)]), 0, 'chunk 2 was least recently used');
    assert.equal(await b.put(NS, h(5), chunk(5)), 'stored');
    assert.equal(await b.batchedContains(NS, [h(3)]), 0);
    assert.equal(await b.batchedContains(NS, [h(0), h(1), h(4), h(5)]), 4);
    assert.equal(b.stats().evictions, 2);
  });

  it('never evicts pinned chunks', async () => {
    const b = backend(4);
    for (let i = 0; i < 4; i++) await b.put(NS, h(i), chunk(i));
    b.pin(NS, [h(0), h(1)]);
    for (let i = 4; i < 10; i++) assert.equal(await b.put(NS, h(i), chunk(i)), 'stored');
    assert.equal(await b.batchedContains(NS, [h(0), h(1)]), 2);
    const got = await b.batchedGet(NS, [h(0), h(1)]);
    assertFilled(got.get(h(0))?.data, 0);
    assertFilled(got.get(h(1))?.data, 1);
    assert.equal(b.stats().evictions, 6);
  });

  it('drops and counts puts when only pinned data remains, evicting nothing', async () => {
    const b = backend(4);
    for (let i = 0; i < 3; i++) await b.put(NS, h(i), chunk(i), { pin: true });
    await b.put(NS, h(3), chunk(3));
    assert.equal(await b.put(NS, h(4), chunk(4, 2 * PAGE)), 'dropped');
    assert.equal(await b.batchedContains(NS, [h(3)]), 1, 'a put that cannot fit evicts nothing');
    assert.equal(await b.put(NS, h(5), chunk(5)), 'stored');
    assert.equal(await b.put(NS, h(6), chunk(6)), 'stored');
    assert.deepEqual(
      { dropped: b.stats().droppedPuts, evictions: b.stats().evictions },
      { dropped: 1, evictions: 2 },
    );
    b.pin(NS, [h(6)]);
    assert.equal(await b.put(NS, h(7), chunk(7)), 'dropped');
    assert.equal(b.stats().droppedPuts, 2);
    b.unpin(NS, [h(0)]);
    assert.equal(await b.put(NS, h(7), chunk(7)), 'stored', 'room again once unpinned');
  });
});

describe('LocalCpuBackend deferred free', () => {
  it('keeps a removed pinned chunk readable until its last unpin, then reclaims it', async () => {
    const b = backend(2);
    await b.put(NS, h(1), chunk(1), { pin: true });
    const view = (await b.batchedGet(NS, [h(1)])).get(h(1))!.data;
    assert.equal(await b.remove(NS, [h(1)]), 1);
    assert.equal(await b.batchedContains(NS, [h(1)]), 0, 'gone from the index at once');
    assert.equal(b.stats().bytesUsed, PAGE);
    // Fill the arena: the freed-later page must not be reused while pinned.
    assert.equal(await b.put(NS, h(2), chunk(2)), 'stored');
    assert.equal(await b.put(NS, h(3), chunk(3)), 'stored');
    assertFilled(view, 1);
    b.unpin(NS, [h(1)]);
    assert.equal(b.stats().pinnedChunks, 0);
    assert.equal(b.stats().bytesUsed, PAGE);
    assert.equal(await b.put(NS, h(4), chunk(4)), 'stored');
    assert.equal(b.stats().evictions, 1, 'the reclaimed page served one put without eviction');
  });

  it('defers the free on clear of a pinned chunk too', async () => {
    const b = backend(2);
    await b.put(NS, h(1), chunk(1), { pin: true });
    const view = (await b.batchedGet(NS, [h(1)])).get(h(1))!.data;
    await b.clear();
    await b.put(NS, h(2), chunk(2), { pin: true });
    assert.equal(await b.put(NS, h(3), chunk(3)), 'dropped', 'the cleared page is still held');
    assertFilled(view, 1);
    b.unpin(NS, [h(1)]);
    assert.equal(await b.put(NS, h(3), chunk(3)), 'stored');
  });

  it('keeps both copies intact when a key is re-put while the old copy awaits its free', async () => {
    const b = backend(4);
    await b.put(NS, h(1), chunk(1), { pin: true });
    const oldView = (await b.batchedGet(NS, [h(1)])).get(h(1))!.data;
    await b.remove(NS, [h(1)]);
    assert.equal(await b.put(NS, h(1), chunk(2), { pin: true }), 'stored');
    const newView = (await b.batchedGet(NS, [h(1)])).get(h(1))!.data;
    assertFilled(oldView, 1);
    assertFilled(newView, 2);
    // One pin is released: it may have been either holder's, so neither copy is reclaimed.
    b.unpin(NS, [h(1)]);
    for (let i = 10; i < 20; i++) await b.put(NS, h(i), chunk(i));
    assertFilled(oldView, 1);
    assertFilled(newView, 2);
    assert.equal(await b.batchedContains(NS, [h(1)]), 1);
    b.unpin(NS, [h(1)]);
    assert.equal(b.stats().pinnedChunks, 0);
    for (let i = 20; i < 30; i++) await b.put(NS, h(i), chunk(i));
    assert.equal(await b.batchedContains(NS, [h(1)]), 0, 'evictable once every pin is gone');
    assert.equal(b.stats().bytesUsed, 4 * PAGE);
    assert.equal(b.stats().chunks, 4);
  });
});

describe('LocalCpuBackend reserve', () => {
  it('commits a chunk written in place, and aborts cleanly', async () => {
    const b = backend(4);
    const r = b.reserve(NS, h(1), 100, 3) as ChunkReservation;
    assert.equal(typeof r, 'object');
    r.view.fill(8);
    assert.equal(await b.batchedContains(NS, [h(1)]), 0, 'invisible until committed');
    assert.equal(r.commit({ pin: true }), 'stored');
    assert.throws(
      () => r.commit(),
      (e: unknown) => isKvtierError(e, 'KVT_INTERNAL'),
    );
    const c = (await b.batchedGet(NS, [h(1)])).get(h(1))!;
    assert.equal(c.tokens, 3);
    assertFilled(c.data, 8);
    assert.equal(b.stats().pinnedChunks, 1);
    assert.equal(b.reserve(NS, h(1), 100, 3), 'exists');
    const a = b.reserve(NS, h(2), PAGE, 3) as ChunkReservation;
    a.abort();
    assert.equal(b.stats().bytesUsed, PAGE);
    const late = b.reserve(NS, h(3), PAGE, 3) as ChunkReservation;
    await b.put(NS, h(3), chunk(3));
    assert.equal(late.commit(), 'exists');
    assert.equal(b.stats().bytesUsed, 2 * PAGE);
  });
});

describe('LocalCpuBackend under a random workload', () => {
  it('never exceeds capacity and never corrupts pinned bytes (seeded)', async () => {
    const rand = prng(2024);
    const b = new LocalCpuBackend({
      capacityBytes: 24 * PAGE,
      pageBytes: PAGE,
      slabBytes: 8 * PAGE,
    });
    const pins = new Map<ChunkHash, { count: number; view: Uint8Array; fill: number }>();
    const fillOf = (i: number) => (i * 37) & 0xff;
    let stored = 0;
    for (let step = 0; step < 3000; step++) {
      const i = Math.floor(rand() * 60);
      const r = rand();
      if (r < 0.5) {
        const bytes = 1 + Math.floor(rand() * 3 * PAGE);
        const out = await b.put(NS, h(i), chunk(fillOf(i), bytes));
        if (out === 'stored') stored++;
      } else if (r < 0.65) {
        if ((await b.batchedContains(NS, [h(i)], { pin: true })) === 1) {
          const view = (await b.batchedGet(NS, [h(i)])).get(h(i))!.data;
          const p = pins.get(h(i)) ?? { count: 0, view, fill: fillOf(i) };
          p.count++;
          pins.set(h(i), p);
        }
      } else if (r < 0.85) {
        const p = pins.get(h(i));
        if (p !== undefined) {
          b.unpin(NS, [h(i)]);
          if (--p.count === 0) pins.delete(h(i));
        }
      } else if (r < 0.95) {
        await b.remove(NS, [h(i)]);
      } else {
        const got = (await b.batchedGet(NS, [h(i)])).get(h(i));
        if (got) assert.ok(filledWith(got.data, fillOf(i)), `chunk ${i} corrupted at step ${step}`);
      }
      const s = b.stats();
      assert.ok(s.bytesUsed <= 24 * PAGE, `bound exceeded at step ${step}`);
      for (const [key, p] of pins)
        assert.ok(filledWith(p.view, p.fill), `pinned ${key} corrupted at step ${step}`);
    }
    const s = b.stats();
    assert.ok(
      stored > 100 && s.evictions > 0 && s.droppedPuts > 0,
      JSON.stringify({ stored, ...s }),
    );
    for (const [key, p] of pins) for (let k = 0; k < p.count; k++) b.unpin(NS, [key]);
    await b.clear();
    assert.deepEqual(
      { chunks: b.stats().chunks, bytesUsed: b.stats().bytesUsed, pinned: b.stats().pinnedChunks },
      { chunks: 0, bytesUsed: 0, pinned: 0 },
    );
  });
});

describe('LocalCpuBackend lifecycle and factory', () => {
  it('rejects every call with KVT_CLOSED after close; close twice is fine', async () => {
    const b = backend(4);
    await b.put(NS, h(1), chunk(1), { pin: true });
    const p1 = b.close();
    assert.equal(b.close(), p1);
    await p1;
    const closed = (e: unknown) => isKvtierError(e, 'KVT_CLOSED');
    await assert.rejects(b.batchedContains(NS, [h(1)]), closed);
    await assert.rejects(b.batchedGet(NS, [h(1)]), closed);
    await assert.rejects(b.put(NS, h(2), chunk(2)), closed);
    await assert.rejects(b.remove(NS, [h(1)]), closed);
    await assert.rejects(b.clear(), closed);
    assert.throws(() => b.pin(NS, [h(1)]), closed);
    assert.throws(() => b.unpin(NS, [h(1)]), closed);
    assert.throws(() => b.stats(), closed);
    assert.throws(() => b.health(), closed);
    assert.throws(() => b.reserve(NS, h(3), 1, 1), closed);
  });

  it('builds from a plain config object through the factory', async () => {
    const b = await createLocalCpuBackend(
      { capacityBytes: 8 * PAGE, pageBytes: PAGE },
      { name: 'cpu0' },
    );
    assert.equal(b.name, 'cpu0');
    assert.equal(b.stats().capacityBytes, 8 * PAGE);
    await b.close();
  });

  it('fails loudly with KVT_CONFIG on bad or unknown options', async () => {
    await assert.rejects(
      createLocalCpuBackend({ capacityBytes: '8GiB' }, { name: 'cpu0' }),
      (e: unknown) =>
        isKvtierError(e, 'KVT_CONFIG') &&
        /tier "cpu0": capacityBytes must be an integer/.test(e.message),
    );
    await assert.rejects(
      createLocalCpuBackend({ capacityBytes: 1e6, pagebytes: 4096 }, { name: 'cpu0' }),
      (e: unknown) =>
        isKvtierError(e, 'KVT_CONFIG') && /unknown local-cpu option "pagebytes"/.test(e.message),
    );
    await assert.rejects(
      createLocalCpuBackend({ capacityBytes: 1e6, pageBytes: 5000 }, { name: 'cpu0' }),
      (e: unknown) => isKvtierError(e, 'KVT_CONFIG') && /power of two/.test(e.message),
    );
  });
});
