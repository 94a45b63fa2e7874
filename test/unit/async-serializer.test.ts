import assert from 'node:assert/strict';
import { getEventListeners } from 'node:events';
import { describe, it } from 'node:test';
import { isKvtierError, KvtierError } from '../../src/errors.ts';
import { AsyncSerializer } from '../../src/serializer/async-serializer.ts';

const drainLoop = () => new Promise<void>((resolve) => setImmediate(resolve));

function deferred<T = void>() {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/**
 * A bounded page allocator like the host-memory allocator behind a prefetch: `alloc()` takes
 * one page, or waits (a promise, no polling) until another holder frees one.
 */
class PageAllocator {
  free: number;
  private readonly waiters: Array<{ resolve: () => void; reject: (e: unknown) => void }> = [];
  allocations = 0;

  constructor(readonly budget: number) {
    this.free = budget;
  }

  get waiting(): number {
    return this.waiters.length;
  }

  async alloc(): Promise<void> {
    while (this.free === 0) {
      await new Promise<void>((resolve, reject) => this.waiters.push({ resolve, reject }));
    }
    this.free--;
    this.allocations++;
  }

  release(pages: number): void {
    this.free += pages;
    for (const w of this.waiters.splice(0)) w.resolve();
  }

  /** Fails every waiter so a deadlocked test can end cleanly. */
  breakWaiters(): void {
    for (const w of this.waiters.splice(0)) w.reject(new Error('allocator torn down'));
  }
}

interface Run {
  /** Tasks not waiting inside the allocator. */
  running: number;
  started: number;
  finished: number;
  /** Most tasks started and not yet finished at one time. */
  peakActive: number;
  pagesHeld: number[];
}

/** A prefetch that materialises `need` pages one at a time, with an await between pages. */
async function prefetch(alloc: PageAllocator, need: number, idx: number, st: Run): Promise<number> {
  st.running++;
  st.started++;
  st.peakActive = Math.max(st.peakActive, st.started - st.finished);
  let held = 0;
  try {
    for (let i = 0; i < need; i++) {
      st.running--;
      try {
        await alloc.alloc();
      } finally {
        st.running++;
      }
      held++;
      st.pagesHeld[idx] = held;
      await Promise.resolve();
    }
    return held;
  } finally {
    alloc.release(held);
    st.running--;
    st.finished++;
  }
}

const BUDGET = 8;
// K = 4 prefetches, each needing more than BUDGET / K = 2 pages; 15 in total > 8.
const NEEDS = [3, 5, 3, 4];

describe('AsyncSerializer', () => {
  it('validates options', () => {
    for (const bad of [0, -1, 2.5, undefined]) {
      assert.throws(
        () => new AsyncSerializer({ capacityChunks: bad as number }),
        (e) => isKvtierError(e, 'KVT_INVALID_ARGUMENT') && /capacityChunks/.test(e.message),
      );
    }
  });

  it('deadlocks the allocator when prefetches are not serialized (the LMCache failure)', async () => {
    const alloc = new PageAllocator(BUDGET);
    const st: Run = {
      running: 0,
      started: 0,
      finished: 0,
      peakActive: 0,
      pagesHeld: NEEDS.map(() => 0),
    };
    const tasks = NEEDS.map((need, i) => prefetch(alloc, need, i, st));
    await drainLoop();
    const progress = alloc.allocations;
    await drainLoop();
    await drainLoop();
    // Every task waits inside the allocator holding part of the budget; none runs, none finished,
    // and a drained event loop brings no further allocation: a deadlock.
    assert.equal(alloc.free, 0);
    assert.equal(alloc.waiting, NEEDS.length);
    assert.equal(st.running, 0);
    assert.equal(st.finished, 0);
    assert.equal(alloc.allocations, progress);
    assert.equal(
      st.pagesHeld.reduce((a, b) => a + b, 0),
      BUDGET,
    );
    assert.ok(st.pagesHeld.every((held, i) => held > 0 && held < (NEEDS[i] ?? 0)));

    alloc.breakWaiters();
    const settled = await Promise.allSettled(tasks);
    assert.ok(settled.every((s) => s.status === 'rejected'));
  });

  it('with every prefetch run through the serializer, all finish and the budget holds', async () => {
    const alloc = new PageAllocator(BUDGET);
    const ser = new AsyncSerializer({ capacityChunks: BUDGET });
    const st: Run = {
      running: 0,
      started: 0,
      finished: 0,
      peakActive: 0,
      pagesHeld: NEEDS.map(() => 0),
    };
    let peakInUse = 0;
    const tasks = NEEDS.map((need, i) =>
      ser.run(need, async () => {
        peakInUse = Math.max(peakInUse, ser.inUse);
        return prefetch(alloc, need, i, st);
      }),
    );
    const results = await Promise.all(tasks);
    assert.deepEqual(results, NEEDS);
    assert.deepEqual(st.pagesHeld, NEEDS);
    assert.equal(st.finished, NEEDS.length);
    assert.ok(peakInUse <= BUDGET, `peak held weight ${peakInUse} exceeds ${BUDGET}`);
    assert.ok(st.peakActive >= 2, 'prefetches that fit together should run together');
    assert.equal(alloc.free, BUDGET);
    assert.equal(ser.inUse, 0);
    assert.equal(ser.waiters, 0);
  });

  it('fails a prefetch bigger than the whole budget at once with KVT_CAPACITY', async () => {
    const ser = new AsyncSerializer({ capacityChunks: BUDGET });
    let called = false;
    await assert.rejects(
      ser.run(BUDGET + 1, async () => {
        called = true;
      }),
      (e: unknown) => {
        assert.ok(isKvtierError(e, 'KVT_CAPACITY'));
        assert.match(e.message, new RegExp(`\\b${BUDGET + 1}\\b`));
        assert.match(e.message, new RegExp(`\\b${BUDGET}\\b`));
        return true;
      },
    );
    assert.equal(called, false);
    assert.equal(ser.waiters, 0);
    assert.equal(ser.inUse, 0);
  });

  it('aborting a queued prefetch removes it; the rest still finish', async () => {
    const alloc = new PageAllocator(BUDGET);
    const ser = new AsyncSerializer({ capacityChunks: BUDGET });
    const st: Run = { running: 0, started: 0, finished: 0, peakActive: 0, pagesHeld: [0, 0, 0] };
    const gate = deferred();
    const first = ser.run(BUDGET, async () => {
      await gate.promise;
      return prefetch(alloc, BUDGET, 0, st);
    });
    const ac = new AbortController();
    let abortedRan = false;
    const queued = ser.run(
      3,
      async () => {
        abortedRan = true;
        return 0;
      },
      { signal: ac.signal },
    );
    const last = ser.run(4, () => prefetch(alloc, 4, 2, st));
    await drainLoop();
    assert.equal(ser.waiters, 2);
    ac.abort();
    await assert.rejects(queued, (e) => isKvtierError(e, 'KVT_ABORTED'));
    assert.equal(ser.waiters, 1);
    gate.resolve();
    assert.deepEqual(await Promise.all([first, last]), [BUDGET, 4]);
    assert.equal(abortedRan, false);
    assert.equal(ser.inUse, 0);
    assert.equal(alloc.free, BUDGET);
  });

  it('releases the weight whatever fn does: rejects, throws synchronously, or resolves', async () => {
    const ser = new AsyncSerializer({ capacityChunks: 3 });
    await assert.rejects(
      ser.run(3, async () => {
        throw new Error('boom');
      }),
      /boom/,
    );
    assert.equal(ser.inUse, 0);
    await assert.rejects(
      ser.run(3, () => {
        throw new Error('sync boom');
      }),
      /sync boom/,
    );
    assert.equal(ser.inUse, 0);
    assert.equal(await ser.run(3, async () => 'ok'), 'ok');
    assert.equal(ser.available, 3);
  });

  it('aborts the signal given to fn when the caller aborts, and removes its listener', async () => {
    const ser = new AsyncSerializer({ capacityChunks: 2 });
    const ac = new AbortController();
    const started = deferred<AbortSignal>();
    const p = ser.run(
      1,
      (signal) => {
        started.resolve(signal);
        return new Promise<string>((_, reject) => {
          signal.addEventListener('abort', () => reject(signal.reason), { once: true });
        });
      },
      { signal: ac.signal },
    );
    const inner = await started.promise;
    assert.equal(inner.aborted, false);
    assert.equal(ser.inUse, 1);
    ac.abort(new KvtierError('KVT_ABORTED', 'caller gave up'));
    assert.equal(inner.aborted, true);
    await assert.rejects(p, (e) => isKvtierError(e, 'KVT_ABORTED'));
    assert.equal(ser.inUse, 0);
    assert.equal(getEventListeners(ac.signal, 'abort').length, 0);
  });

  it('close rejects waiters, aborts running fns and rejects later runs with KVT_CLOSED', async () => {
    const ser = new AsyncSerializer({ capacityChunks: 2 });
    const started = deferred<AbortSignal>();
    const running = ser.run(2, (signal) => {
      started.resolve(signal);
      return new Promise<void>((_, reject) => {
        signal.addEventListener('abort', () => reject(signal.reason), { once: true });
      });
    });
    const inner = await started.promise;
    const waiting = ser.run(1, async () => 'never');
    await drainLoop();
    assert.equal(ser.waiters, 1);
    ser.close();
    ser.close();
    assert.equal(inner.aborted, true);
    await assert.rejects(running, (e) => isKvtierError(e, 'KVT_CLOSED'));
    await assert.rejects(waiting, (e) => isKvtierError(e, 'KVT_CLOSED'));
    await assert.rejects(
      ser.run(1, async () => 0),
      (e) => isKvtierError(e, 'KVT_CLOSED'),
    );
    assert.equal(ser.inUse, 0);
  });
});
