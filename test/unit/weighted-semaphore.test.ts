import assert from 'node:assert/strict';
import { getEventListeners } from 'node:events';
import { describe, it } from 'node:test';
import { isKvtierError, KvtierError } from '../../src/errors.ts';
import { type Release, WeightedSemaphore } from '../../src/serializer/weighted-semaphore.ts';

/** Lets every queued microtask and promise continuation run. */
const drainLoop = () => new Promise<void>((resolve) => setImmediate(resolve));

/** Tracks whether a promise has settled, without awaiting it. */
function track<T>(p: Promise<T>) {
  const t = { settled: false, value: undefined as T | undefined, error: undefined as unknown };
  p.then(
    (v) => {
      t.settled = true;
      t.value = v;
    },
    (e: unknown) => {
      t.settled = true;
      t.error = e;
    },
  );
  return t;
}

function code(err: unknown): string | undefined {
  return err instanceof KvtierError ? err.code : undefined;
}

describe('WeightedSemaphore', () => {
  it('validates capacity', () => {
    for (const bad of [
      0,
      -1,
      1.5,
      Number.NaN,
      Number.POSITIVE_INFINITY,
      '3' as unknown as number,
    ]) {
      assert.throws(
        () => new WeightedSemaphore(bad),
        (e) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
      );
    }
    assert.equal(new WeightedSemaphore(1).capacity, 1);
  });

  it('grants at once when free and tracks available; release is idempotent', async () => {
    const s = new WeightedSemaphore(5);
    const r1 = await s.acquire(2);
    const r2 = await s.acquire(3);
    assert.equal(s.available, 0);
    r1();
    r1();
    assert.equal(s.available, 2);
    r2();
    assert.equal(s.available, 5);
  });

  it('rejects bad weights with KVT_INVALID_ARGUMENT and changes nothing', async () => {
    const s = new WeightedSemaphore(4);
    for (const bad of [0, -2, 1.5, Number.NaN]) {
      await assert.rejects(s.acquire(bad), (e) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'));
      assert.throws(
        () => s.tryAcquire(bad),
        (e) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
      );
    }
    assert.equal(s.available, 4);
    assert.equal(s.pending, 0);
  });

  it('rejects weight > capacity at once with KVT_CAPACITY naming both numbers', async () => {
    const s = new WeightedSemaphore(4);
    const hold = await s.acquire(4);
    await assert.rejects(s.acquire(5), (e: unknown) => {
      assert.ok(isKvtierError(e, 'KVT_CAPACITY'));
      assert.match(e.message, /\b5\b/);
      assert.match(e.message, /\b4\b/);
      return true;
    });
    assert.throws(
      () => s.tryAcquire(9),
      (e) => isKvtierError(e, 'KVT_CAPACITY'),
    );
    assert.equal(s.pending, 0);
    hold();
  });

  it('serves strictly FIFO: a smaller later waiter does not overtake the head', async () => {
    const s = new WeightedSemaphore(4);
    const hold1 = await s.acquire(2);
    const hold2 = await s.acquire(2);
    const order: string[] = [];
    const a = s.acquire(3).then((r) => {
      order.push('a');
      return r;
    });
    const b = s.acquire(1).then((r) => {
      order.push('b');
      return r;
    });
    hold1();
    await drainLoop();
    // b would fit in the 2 now free, but a is ahead of it.
    assert.deepEqual(order, []);
    assert.equal(s.available, 2);
    assert.equal(s.pending, 2);
    assert.equal(s.pendingWeight, 4);
    hold2();
    const [ra, rb] = await Promise.all([a, b]);
    assert.deepEqual(order, ['a', 'b']);
    assert.equal(s.available, 0);
    assert.equal(s.pending, 0);
    assert.equal(s.pendingWeight, 0);
    ra();
    rb();
    assert.equal(s.available, 4);
  });

  it('tryAcquire never jumps the queue and returns null when it does not fit', async () => {
    const s = new WeightedSemaphore(4);
    const hold = s.tryAcquire(3);
    assert.ok(hold);
    assert.equal(s.tryAcquire(2), null);
    const waiting = track(s.acquire(4));
    assert.equal(s.tryAcquire(1), null, 'someone waits, so even a fitting weight must fail');
    hold();
    await drainLoop();
    assert.equal(waiting.settled, true);
    (waiting.value as Release)();
    const r = s.tryAcquire(4);
    assert.ok(r);
    r();
  });

  it('an aborted head waiter leaves at once and lets the next ones through', async () => {
    const s = new WeightedSemaphore(4);
    const hold = await s.acquire(3);
    const ac = new AbortController();
    const a = track(s.acquire(3, { signal: ac.signal }));
    const b = track(s.acquire(1));
    await drainLoop();
    assert.equal(b.settled, false);
    ac.abort();
    assert.equal(s.pending, 0, 'removal is synchronous');
    await drainLoop();
    assert.equal(code(a.error), 'KVT_ABORTED');
    assert.equal(b.settled, true);
    assert.equal(b.error, undefined);
    assert.equal(s.available, 0);
    hold();
    (b.value as Release)();
    assert.equal(s.available, 4);
  });

  it('an aborted middle waiter is removed without disturbing the others', async () => {
    const s = new WeightedSemaphore(2);
    const hold = await s.acquire(2);
    const ac = new AbortController();
    const a = track(s.acquire(1));
    const mid = track(s.acquire(2, { signal: ac.signal }));
    const c = track(s.acquire(1));
    ac.abort();
    assert.equal(s.pending, 2);
    assert.equal(s.pendingWeight, 2);
    hold();
    await drainLoop();
    assert.equal(code(mid.error), 'KVT_ABORTED');
    assert.equal(a.error, undefined);
    assert.equal(c.error, undefined);
    assert.equal(s.available, 0);
  });

  it('an already-aborted signal rejects immediately, keeping a timeout reason as KVT_TIMEOUT', async () => {
    const s = new WeightedSemaphore(4);
    await assert.rejects(s.acquire(1, { signal: AbortSignal.abort() }), (e) =>
      isKvtierError(e, 'KVT_ABORTED'),
    );
    const timeout = AbortSignal.abort(new DOMException('t', 'TimeoutError'));
    await assert.rejects(s.acquire(1, { signal: timeout }), (e) => isKvtierError(e, 'KVT_TIMEOUT'));
    assert.equal(s.available, 4, 'nothing was granted even though it fitted');
    assert.equal(s.pending, 0);
  });

  it('removes the abort listener when the waiter is served', async () => {
    const s = new WeightedSemaphore(1);
    const hold = await s.acquire(1);
    const ac = new AbortController();
    const p = s.acquire(1, { signal: ac.signal });
    assert.equal(getEventListeners(ac.signal, 'abort').length, 1);
    hold();
    const r = await p;
    assert.equal(getEventListeners(ac.signal, 'abort').length, 0);
    ac.abort();
    assert.equal(s.available, 0, 'a late abort must not touch a served grant');
    r();
    assert.equal(s.available, 1);
  });

  it('close rejects every waiter with KVT_CLOSED, removes listeners, and blocks later acquires', async () => {
    const s = new WeightedSemaphore(2);
    const hold = await s.acquire(2);
    const ac = new AbortController();
    const a = s.acquire(1, { signal: ac.signal });
    const b = s.acquire(2);
    s.close();
    s.close();
    await assert.rejects(a, (e) => isKvtierError(e, 'KVT_CLOSED'));
    await assert.rejects(b, (e) => isKvtierError(e, 'KVT_CLOSED'));
    assert.equal(getEventListeners(ac.signal, 'abort').length, 0);
    assert.equal(s.pending, 0);
    assert.equal(s.pendingWeight, 0);
    await assert.rejects(s.acquire(1), (e) => isKvtierError(e, 'KVT_CLOSED'));
    assert.throws(
      () => s.tryAcquire(1),
      (e) => isKvtierError(e, 'KVT_CLOSED'),
    );
    hold();
    assert.equal(s.available, 2, 'held grants still release after close');
  });

  it('grants many random-weight requests in request order and never over capacity', async () => {
    let seed = 12345;
    const rand = (n: number) => {
      seed = (seed * 1103515245 + 12345) % 2 ** 31;
      return 1 + ((seed >>> 8) % n);
    };
    const s = new WeightedSemaphore(10);
    const granted: number[] = [];
    let peak = 0;
    const tasks = Array.from({ length: 300 }, async (_, i) => {
      const release = await s.acquire(rand(10));
      granted.push(i);
      peak = Math.max(peak, s.capacity - s.available);
      assert.ok(s.available >= 0);
      await Promise.resolve();
      release();
    });
    await Promise.all(tasks);
    assert.deepEqual(
      granted,
      Array.from({ length: 300 }, (_, i) => i),
    );
    assert.ok(peak <= 10);
    assert.equal(s.available, 10);
    assert.equal(s.pending, 0);
  });
});
