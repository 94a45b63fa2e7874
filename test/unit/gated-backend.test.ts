import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { Chunk } from '../../src/backends/core/types.ts';
import { MemoryBackend } from '../../src/backends/memory/memory-backend.ts';
import { isKvtierError } from '../../src/errors.ts';
import { type ChunkHash, chunkHash } from '../../src/hashing/chunk-hash.ts';
import { Gate, GatedBackend } from '../support/gated-backend.ts';

const NS = 'c'.repeat(32);

function h(i: number): ChunkHash {
  return chunkHash(i.toString(16).padStart(64, '0'));
}

function chunk(fill: number): Chunk {
  return { tokens: 4, data: new Uint8Array(64).fill(fill) };
}

/** Settles-or-not probe without timers: true once `p` has settled. */
function tracker<T>(p: Promise<T>): { readonly settled: boolean; readonly promise: Promise<T> } {
  const state = { settled: false, promise: p };
  p.then(
    () => {
      state.settled = true;
    },
    () => {
      state.settled = true;
    },
  );
  return state;
}

/** Lets already-resolved promise chains run (microtasks plus one macrotask turn). */
function flush(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

async function seeded(
  options: ConstructorParameters<typeof GatedBackend>[0] = {},
): Promise<GatedBackend> {
  const b = new GatedBackend({ open: true, ...options });
  for (let i = 0; i < 4; i++) await b.put(NS, h(i), chunk(i));
  if (options.open !== true) b.gate.close();
  return b;
}

describe('Gate', () => {
  it('holds callers while closed and releases them one at a time, in order', async () => {
    const gate = new Gate();
    const order: number[] = [];
    const a = gate.wait().then(() => order.push(1));
    const b = gate.wait().then(() => order.push(2));
    await gate.whenWaiting(2);
    assert.equal(gate.waiting, 2);
    assert.equal(gate.releaseNext(), true);
    await a;
    assert.deepEqual(order, [1]);
    assert.equal(gate.waiting, 1);
    gate.open();
    await b;
    assert.deepEqual(order, [1, 2]);
    assert.equal(gate.releaseNext(), false, 'nobody is waiting');
    await gate.wait();
    gate.close();
    const c = tracker(gate.wait());
    await flush();
    assert.equal(c.settled, false);
    gate.releaseNext();
    await c.promise;
  });

  it('removes an aborted waiter from the queue', async () => {
    const gate = new Gate();
    const ac = new AbortController();
    const p = gate.wait(ac.signal);
    await gate.whenWaiting(1);
    ac.abort();
    await assert.rejects(p, (e: unknown) => isKvtierError(e, 'KVT_ABORTED'));
    assert.equal(gate.waiting, 0);
    assert.equal(gate.releaseNext(), false);
  });
});

describe('GatedBackend', () => {
  it('holds batchedGet on the gate and counts calls', async () => {
    const b = await seeded();
    const get = tracker(b.batchedGet(NS, [h(0), h(1)]));
    await b.gate.whenWaiting(1);
    await flush();
    assert.equal(get.settled, false, 'a get waits while the gate is closed');
    assert.equal(b.calls.get, 1);
    assert.equal(
      await b.batchedContains(NS, [h(0), h(1), h(9)]),
      2,
      'contains is not gated by default',
    );
    b.gate.releaseNext();
    const got = await get.promise;
    assert.deepEqual(got.get(h(1))?.data, chunk(1).data);
    assert.deepEqual(b.calls, { contains: 1, get: 1, put: 4, remove: 0 });
  });

  it('gates batchedContains too when asked', async () => {
    const b = await seeded({ gateContains: true });
    const c = tracker(b.batchedContains(NS, [h(0)]));
    await b.gate.whenWaiting(1);
    assert.equal(c.settled, false);
    b.gate.open();
    assert.equal(await c.promise, 1);
  });

  it('failGets rejects gets with KVT_BACKEND after the gate', async () => {
    const b = await seeded({ open: true });
    b.failGets = true;
    await assert.rejects(b.batchedGet(NS, [h(0)]), (e: unknown) => isKvtierError(e, 'KVT_BACKEND'));
    assert.equal(await b.batchedContains(NS, [h(0)]), 1, 'contains is unaffected');
    b.failGets = false;
    assert.notEqual((await b.batchedGet(NS, [h(0)])).get(h(0)), null);
  });

  it('shortGets returns fewer chunks than contains promised, keyed by hash', async () => {
    const b = await seeded({ open: true });
    b.shortGets = 2;
    const hashes = [h(0), h(1), h(2), h(3)];
    assert.equal(await b.batchedContains(NS, hashes), 4);
    const got = await b.batchedGet(NS, hashes);
    assert.deepEqual([...got.keys()], hashes);
    assert.deepEqual(got.get(h(0))?.data, chunk(0).data);
    assert.deepEqual(got.get(h(1))?.data, chunk(1).data);
    assert.equal(got.get(h(2)), null);
    assert.equal(got.get(h(3)), null);
  });

  it('down rejects every call, also one released from the gate, and reports health down', async () => {
    const b = await seeded();
    const held = b.batchedGet(NS, [h(0)]);
    await b.gate.whenWaiting(1);
    b.down = true;
    b.gate.open();
    const backendErr = (e: unknown) => isKvtierError(e, 'KVT_BACKEND');
    await assert.rejects(held, backendErr);
    await assert.rejects(b.batchedContains(NS, [h(0)]), backendErr);
    await assert.rejects(b.put(NS, h(5), chunk(5)), backendErr);
    await assert.rejects(b.remove(NS, [h(0)]), backendErr);
    await assert.rejects(b.clear(), backendErr);
    assert.throws(() => b.pin(NS, [h(0)]), backendErr);
    assert.throws(() => b.unpin(NS, [h(0)]), backendErr);
    assert.equal(b.health(), 'down');
    assert.equal(b.stats().chunks, 4);
    b.down = false;
    assert.equal(b.health(), 'up');
    assert.equal(await b.batchedContains(NS, [h(0)]), 1);
  });

  it('an aborted get leaves the gate queue', async () => {
    const b = await seeded();
    const ac = new AbortController();
    const p = b.batchedGet(NS, [h(0)], { signal: ac.signal });
    await b.gate.whenWaiting(1);
    ac.abort();
    await assert.rejects(p, (e: unknown) => isKvtierError(e, 'KVT_ABORTED'));
    assert.equal(b.gate.waiting, 0);
  });

  it('close rejects held calls with KVT_CLOSED and closes the inner backend', async () => {
    const inner = new MemoryBackend({}, { name: 'slow' });
    const b = new GatedBackend({ inner, name: 'slow' });
    const held = b.batchedGet(NS, [h(0)]);
    await b.gate.whenWaiting(1);
    const closing = b.close();
    assert.equal(b.close(), closing);
    await closing;
    const closed = (e: unknown) => isKvtierError(e, 'KVT_CLOSED');
    await assert.rejects(held, closed);
    await assert.rejects(b.batchedGet(NS, [h(0)]), closed);
    assert.throws(() => inner.stats(), closed);
  });
});

describe('MemoryBackend', () => {
  it('evicts unpinned chunks least recently used first and drops when only pinned data remains', async () => {
    const m = new MemoryBackend({ capacityBytes: 256 });
    assert.equal(m.capabilities.evicts, true);
    for (let i = 0; i < 4; i++) await m.put(NS, h(i), chunk(i));
    await m.batchedGet(NS, [h(0)]);
    m.pin(NS, [h(1)]);
    assert.equal(await m.put(NS, h(4), chunk(4)), 'stored');
    assert.equal(await m.batchedContains(NS, [h(2)]), 0, 'chunk 2 was the oldest unpinned');
    await m.batchedContains(NS, [h(0), h(3), h(4)], { pin: true });
    assert.equal(await m.put(NS, h(5), chunk(5)), 'dropped');
    assert.deepEqual(
      { ...m.stats() },
      {
        chunks: 4,
        bytesUsed: 256,
        capacityBytes: 256,
        pinnedChunks: 4,
        evictions: 1,
        droppedPuts: 1,
      },
    );
  });

  it('is unbounded by default and keeps private copies', async () => {
    const m = new MemoryBackend();
    assert.equal(m.capabilities.evicts, false);
    assert.equal(m.capabilities.hostMemory, false);
    const src = chunk(1);
    await m.put(NS, h(0), src);
    src.data.fill(0);
    assert.deepEqual((await m.batchedGet(NS, [h(0)])).get(h(0))?.data, chunk(1).data);
    assert.equal(m.stats().capacityBytes, null);
  });
});
