import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { getEventListeners } from 'node:events';
import { afterEach, beforeEach, describe, mock, test } from 'node:test';
import { CircuitBreakerBackend } from '../../src/backends/core/circuit-breaker.ts';
import { ForwardingBackend } from '../../src/backends/core/forwarding-backend.ts';
import type { Chunk, PutOutcome, StorageBackend } from '../../src/backends/core/types.ts';
import { type ChunkHash, chunkHash } from '../../src/hashing/chunk-hash.ts';
import { GatedBackend } from '../support/gated-backend.ts';

const NS = '0123456789abcdef0123456789abcdef';
const H = (i: number) => chunkHash(i.toString(16).padStart(64, '0'));

async function flush(): Promise<void> {
  for (let i = 0; i < 10; i++) await Promise.resolve();
}

describe('CircuitBreakerBackend', () => {
  beforeEach(() => mock.timers.enable({ apis: ['setTimeout'] }));
  afterEach(() => mock.timers.reset());

  test('a call slower than timeoutMs is answered as a miss and counted', async () => {
    const inner = new GatedBackend({ name: 'remote', gateContains: true, open: true });
    await inner.put(NS, H(1), { tokens: 4, data: randomBytes(16) });
    inner.gate.close();
    const b = new CircuitBreakerBackend(inner, { timeoutMs: 100, failureThreshold: 5 });
    const pending = b.batchedContains(NS, [H(1)]);
    await flush();
    mock.timers.tick(100);
    assert.equal(await pending, 0, 'timed-out contains is a miss');
    const get = b.batchedGet(NS, [H(1)]);
    await flush();
    mock.timers.tick(100);
    assert.deepEqual([...(await get).entries()], [[H(1), null]]);
    assert.equal(b.counters.failures, 2);
    assert.equal(b.isOpen, false, 'below the threshold the breaker stays closed');
    inner.gate.open();
    assert.equal(await b.batchedContains(NS, [H(1)]), 1, 'served again once the backend answers');
    await b.close();
  });

  test('consecutive failures open the breaker: misses and drops without touching the backend, health down', async () => {
    const inner = new GatedBackend({ name: 'remote', open: true });
    await inner.put(NS, H(1), { tokens: 4, data: randomBytes(16) });
    const b = new CircuitBreakerBackend(inner, {
      timeoutMs: 100,
      failureThreshold: 2,
      probeIntervalMs: 500,
    });
    inner.failGets = true;
    assert.equal((await b.batchedGet(NS, [H(1)])).get(H(1)), null);
    assert.equal(b.isOpen, false);
    assert.equal((await b.batchedGet(NS, [H(1)])).get(H(1)), null);
    assert.equal(b.isOpen, true, 'two failures in a row open it');
    assert.equal(b.health(), 'down');
    inner.failGets = false;
    inner.down = true;
    const callsBefore = { ...inner.calls };
    assert.equal(await b.batchedContains(NS, [H(1)]), 0);
    assert.equal(await b.put(NS, H(2), { tokens: 4, data: randomBytes(16) }), 'dropped');
    assert.deepEqual(inner.calls, callsBefore, 'an open breaker does not reach the backend');
    assert.equal(b.counters.bypassed, 2);
    await assert.rejects(b.remove(NS, [H(1)]), { code: 'KVT_BACKEND' });

    // A probe while the backend is still down keeps the breaker open.
    mock.timers.tick(500);
    await flush();
    assert.equal(b.isOpen, true);
    // The backend comes back: the next probe closes the breaker.
    inner.down = false;
    mock.timers.tick(500);
    await flush();
    assert.equal(b.isOpen, false, 'a successful probe restores the tier');
    assert.equal(b.health(), 'up');
    assert.equal(b.counters.restored, 1);
    assert.equal(await b.batchedContains(NS, [H(1)]), 1);
    await b.close();
  });

  test('a backend that reports itself down is bypassed at once: its writes are dropped untried', async () => {
    const inner = new GatedBackend({ name: 'remote', open: true });
    const b = new CircuitBreakerBackend(inner, { failureThreshold: 100, probeIntervalMs: 500 });
    inner.down = true;
    const callsBefore = { ...inner.calls };
    assert.equal(await b.put(NS, H(2), { tokens: 4, data: randomBytes(16) }), 'dropped');
    assert.deepEqual(inner.calls, callsBefore, 'the put did not reach the backend');
    assert.equal(b.isOpen, true);
    assert.equal(b.health(), 'down');
    inner.down = false;
    mock.timers.tick(500);
    await flush();
    assert.equal(b.health(), 'up', 'a probe brings it back');
    await b.close();
  });

  test('a success resets the failure count', async () => {
    const inner = new GatedBackend({ name: 'remote', open: true });
    const b = new CircuitBreakerBackend(inner, { failureThreshold: 2 });
    inner.failGets = true;
    await b.batchedGet(NS, [H(1)]);
    inner.failGets = false;
    await b.batchedGet(NS, [H(1)]);
    inner.failGets = true;
    await b.batchedGet(NS, [H(1)]);
    assert.equal(b.isOpen, false, 'failures were not consecutive');
    await b.close();
  });

  test('pins taken by a contains that answers after its timeout are released', async () => {
    const inner = new GatedBackend({ name: 'remote', gateContains: true, open: true });
    await inner.put(NS, H(1), { tokens: 4, data: randomBytes(16) });
    inner.gate.close();
    const pinned: string[][] = [];
    const unpinned: string[][] = [];
    // Records pins as they happen underneath the breaker.
    const spy: StorageBackend = {
      name: inner.name,
      kind: inner.kind,
      capabilities: inner.capabilities,
      batchedContains: async (ns, hs, o = {}) => {
        const k = await inner.batchedContains(ns, hs);
        if (o.pin === true) pinned.push(hs.slice(0, k));
        return k;
      },
      batchedGet: (ns, hs, o) => inner.batchedGet(ns, hs, o),
      put: (ns, h, c, o) => inner.put(ns, h, c, o),
      remove: (ns, hs) => inner.remove(ns, hs),
      pin: (ns, hs) => inner.pin(ns, hs),
      unpin: (_ns, hs) => {
        unpinned.push([...hs]);
      },
      clear: (ns) => inner.clear(ns),
      stats: () => inner.stats(),
      health: () => inner.health(),
      close: () => inner.close(),
    };
    const b = new CircuitBreakerBackend(spy, { timeoutMs: 100, failureThreshold: 5 });
    const pending = b.batchedContains(NS, [H(1)], { pin: true });
    await flush();
    mock.timers.tick(100);
    assert.equal(await pending, 0);
    inner.gate.open();
    await flush();
    assert.deepEqual(pinned, [[H(1)]]);
    assert.deepEqual(unpinned, [[H(1)]], 'the late pin is released');
    await b.close();
  });

  test('a put that lands after its timeout is answered dropped and removed again', async () => {
    const inner = new GatedBackend({ name: 'remote', open: true });
    let release: () => void = () => {};
    const held = new Promise<void>((r) => {
      release = r;
    });
    // A write the store finishes although its caller gave up (the signal is not honoured):
    // what a remote store does when the request was already on the wire.
    const slow = new (class extends ForwardingBackend {
      override async put(ns: string, h: ChunkHash, c: Chunk): Promise<PutOutcome> {
        await held;
        return this.inner.put(ns, h, c);
      }
    })(inner);
    const b = new CircuitBreakerBackend(slow, { timeoutMs: 100, failureThreshold: 5 });
    const pending = b.put(NS, H(7), { tokens: 4, data: randomBytes(16) });
    await flush();
    mock.timers.tick(100);
    assert.equal(await pending, 'dropped', 'a timed-out put is a drop');
    // A CLEAR of the namespace runs while the write is still in flight...
    await b.clear(NS);
    // ...and the write lands afterwards: the breaker removes it.
    release();
    await flush();
    await flush();
    assert.equal(await inner.batchedContains(NS, [H(7)]), 0, 'the late chunk is gone');
    assert.equal(b.counters.lateWritesRemoved, 1);
    await b.close();
  });

  test('the caller aborting is not a backend failure; close is idempotent and final', async () => {
    const inner = new GatedBackend({ name: 'remote' });
    const b = new CircuitBreakerBackend(inner, { timeoutMs: 100 });
    const ac = new AbortController();
    const pending = b.batchedGet(NS, [H(1)], { signal: ac.signal });
    await flush();
    ac.abort();
    await assert.rejects(pending, { code: 'KVT_ABORTED' });
    assert.equal(b.counters.failures, 0);
    await b.close();
    await b.close();
    await assert.rejects(b.batchedContains(NS, [H(1)]), { code: 'KVT_CLOSED' });
    assert.equal(b.health(), 'down');
  });

  test('an already-aborted caller signal is KVT_ABORTED without reaching the backend or counting', async () => {
    const inner = new GatedBackend({ name: 'remote', open: true });
    const b = new CircuitBreakerBackend(inner, { timeoutMs: 100 });
    const ac = new AbortController();
    ac.abort();
    await assert.rejects(b.batchedGet(NS, [H(1)], { signal: ac.signal }), { code: 'KVT_ABORTED' });
    await assert.rejects(b.batchedContains(NS, [H(1)], { signal: ac.signal }), {
      code: 'KVT_ABORTED',
    });
    assert.equal(inner.calls.get + inner.calls.contains, 0);
    assert.equal(b.counters.failures, 0);
    await b.close();
  });

  test("a timed-out call's signal stops the backend; no listener stays on the caller's signal", async () => {
    const inner = new GatedBackend({ name: 'remote', gateContains: true, open: true });
    const b = new CircuitBreakerBackend(inner, { timeoutMs: 100, failureThreshold: 1000 });
    const ac = new AbortController();
    for (let i = 0; i < 200; i++) await b.batchedContains(NS, [H(1)], { signal: ac.signal });
    assert.equal(getEventListeners(ac.signal, 'abort').length, 0, 'after calls that answered');
    inner.gate.close();
    const pending = b.batchedGet(NS, [H(2)], { signal: ac.signal });
    await inner.gate.whenWaiting(1);
    mock.timers.tick(100);
    assert.equal((await pending).get(H(2)), null);
    await flush();
    assert.equal(getEventListeners(ac.signal, 'abort').length, 0, 'after a timeout');
    assert.equal(b.counters.failures, 1);
    assert.equal(inner.gate.waiting, 0, 'the held call left the gate on the timeout signal');
    await b.close();
  });

  test('a probe that hangs is bounded by timeoutMs and the next probe restores the tier', async () => {
    const inner = new GatedBackend({ name: 'remote', gateContains: true, open: true });
    const b = new CircuitBreakerBackend(inner, {
      timeoutMs: 100,
      failureThreshold: 1,
      probeIntervalMs: 500,
    });
    inner.down = true;
    assert.equal(await b.batchedContains(NS, [H(1)]), 0);
    assert.equal(b.isOpen, true);
    inner.down = false;
    inner.gate.close();
    mock.timers.tick(500); // the probe starts and hangs at the gate
    await inner.gate.whenWaiting(1);
    mock.timers.tick(100); // ... until its deadline
    await flush();
    assert.equal(b.isOpen, true, 'a timed-out probe keeps the breaker open');
    inner.gate.open();
    mock.timers.tick(500);
    await flush();
    assert.equal(b.isOpen, false, 'the next probe, answered, restores the tier');
    assert.equal(b.counters.restored, 1);
    await b.close();
  });

  test('options are validated', () => {
    const inner = new GatedBackend();
    assert.throws(() => new CircuitBreakerBackend(inner, { timeoutMs: 0 }), {
      code: 'KVT_INVALID_ARGUMENT',
    });
    assert.throws(() => new CircuitBreakerBackend(inner, { failureThreshold: 1.5 }), {
      code: 'KVT_INVALID_ARGUMENT',
    });
  });
});
