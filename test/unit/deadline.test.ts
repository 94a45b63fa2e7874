import assert from 'node:assert/strict';
import { getEventListeners } from 'node:events';
import { describe, test } from 'node:test';
import { isKvtierError, KvtierError } from '../../src/errors.ts';
import { Deadline, withDeadline } from '../../src/util/deadline.ts';
import { ManualTimers } from '../support/manual-timers.ts';

/** Lets promise reactions run (no timers involved). */
async function flush(): Promise<void> {
  for (let i = 0; i < 10; i++) await Promise.resolve();
}

/** A promise the test settles by hand. */
function gate<T>() {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/** Records how `p` settles without awaiting it. */
function watch<T>(p: Promise<T>) {
  const state: { done: boolean; value?: T; error?: unknown } = { done: false };
  p.then(
    (value) => {
      state.done = true;
      state.value = value;
    },
    (error: unknown) => {
      state.done = true;
      state.error = error;
    },
  );
  return state;
}

const listeners = (s: AbortSignal) => getEventListeners(s, 'abort').length;

describe('withDeadline', () => {
  test('settles with the work when it finishes first', async () => {
    const timers = new ManualTimers();
    assert.equal(await withDeadline({ what: 'op', timeoutMs: 100, timers }, Promise.resolve(7)), 7);
    const g = gate<number>();
    const r = watch(withDeadline({ what: 'op', timeoutMs: 100, timers }, g.promise));
    timers.advance(99);
    await flush();
    assert.equal(r.done, false);
    g.resolve(8);
    await flush();
    assert.equal(r.value, 8);
  });

  test('the work rejecting first rejects with its error', async () => {
    const timers = new ManualTimers();
    const boom = new Error('boom');
    await assert.rejects(
      withDeadline({ what: 'op', timeoutMs: 100, timers }, Promise.reject(boom)),
      (e) => e === boom,
    );
  });

  test('the deadline passing rejects with KVT_TIMEOUT, aborts the signal and ignores a late outcome', async () => {
    const timers = new ManualTimers();
    const g = gate<number>();
    let seen: AbortSignal | undefined;
    const r = watch(
      withDeadline({ what: 'tier "x" get', timeoutMs: 100, timers }, (signal) => {
        seen = signal;
        return g.promise;
      }),
    );
    timers.advance(100);
    await flush();
    assert.ok(r.done);
    assert.ok(isKvtierError(r.error, 'KVT_TIMEOUT'), String(r.error));
    assert.match((r.error as Error).message, /tier "x" get timed out after 100 ms/);
    assert.equal(seen?.aborted, true, 'the work was told to stop');
    assert.equal(seen?.reason, r.error, "the signal's reason is the error");
    g.reject(new Error('late')); // never unhandled
    await flush();
  });

  test("a caller's abort rejects with KVT_ABORTED, not a timeout, and is told apart", async () => {
    const timers = new ManualTimers();
    const ac = new AbortController();
    const d = new Deadline({ what: 'op', timeoutMs: 100, signal: ac.signal, timers });
    const r = watch(d.race(new Promise(() => {})));
    ac.abort();
    await flush();
    assert.ok(isKvtierError(r.error, 'KVT_ABORTED'), String(r.error));
    assert.equal(d.timedOut, false);
    assert.equal(d.ended, true);
    timers.advance(100);
    assert.equal(d.timedOut, false, 'the timer no longer counts once the caller aborted');
    d.dispose();
  });

  test("a caller's KvtierError reason (an owner's close, an outer deadline) is kept", async () => {
    const ac = new AbortController();
    const closed = new KvtierError('KVT_CLOSED', 'backend is closed');
    const p = withDeadline({ what: 'op', signal: ac.signal }, new Promise(() => {}));
    ac.abort(closed);
    await assert.rejects(p, (e) => e === closed);
    const outer = new AbortController();
    const q = withDeadline({ what: 'op', signal: outer.signal }, new Promise(() => {}));
    outer.abort(new DOMException('t', 'TimeoutError'));
    await assert.rejects(q, { code: 'KVT_TIMEOUT' });
  });

  test('any of several signals ends the operation', async () => {
    const a = new AbortController();
    const b = new AbortController();
    const p = withDeadline({ what: 'op', signal: [a.signal, undefined, b.signal] }, (s) => {
      return new Promise((_, reject) => s.addEventListener('abort', () => reject(s.reason)));
    });
    b.abort();
    await assert.rejects(p, { code: 'KVT_ABORTED' });
    assert.equal(listeners(a.signal), 0, 'the other signal is left clean');
  });

  test('an already-aborted signal rejects at once without starting the work', async () => {
    const ac = new AbortController();
    ac.abort();
    let started = false;
    await assert.rejects(
      withDeadline({ what: 'op', timeoutMs: 100, signal: ac.signal }, async () => {
        started = true;
        return 1;
      }),
      { code: 'KVT_ABORTED' },
    );
    assert.equal(started, false);
    // A promise already under way is not awaited and its rejection is not unhandled.
    await assert.rejects(
      withDeadline({ what: 'op', signal: ac.signal }, Promise.reject(new Error('x'))),
      { code: 'KVT_ABORTED' },
    );
    const d = new Deadline({ what: 'op', signal: ac.signal, timeoutMs: 5 });
    assert.throws(() => d.throwIfEnded(), { code: 'KVT_ABORTED' });
    assert.equal(d.error()?.code, 'KVT_ABORTED');
  });

  test('a zero deadline passes at the next timer turn; no deadline never passes', async () => {
    const timers = new ManualTimers();
    const d = new Deadline({ what: 'op', timeoutMs: 0, timers });
    assert.equal(d.ended, false);
    timers.advance(0);
    assert.equal(d.timedOut, true);
    const none = new Deadline({ what: 'op' });
    assert.equal(none.ended, false);
    assert.equal(none.error(), undefined);
    none.dispose();
    assert.throws(() => new Deadline({ what: 'op', timeoutMs: -1 }), RangeError);
    // The real timer source.
    await assert.rejects(withDeadline({ what: 'op', timeoutMs: 1 }, new Promise(() => {})), {
      code: 'KVT_TIMEOUT',
    });
  });

  test('no listener or timer is left behind after many calls', async () => {
    const ac = new AbortController();
    const timers = new ManualTimers();
    for (let i = 0; i < 5000; i++) {
      const outcome = i % 3;
      const work =
        outcome === 0
          ? Promise.resolve(i)
          : outcome === 1
            ? Promise.reject(new Error('fail'))
            : new Promise<number>(() => {});
      const p = withDeadline({ what: 'op', timeoutMs: 10, signal: ac.signal, timers }, work);
      if (outcome === 2) timers.advance(10);
      await p.catch(() => {});
      assert.equal(listeners(ac.signal), 0, `call ${i} left a listener on the caller's signal`);
      assert.equal(timers.armed, 0, `call ${i} left its timer armed`);
    }
    // An abort by the caller clears the timer too.
    const aborted = new AbortController();
    const q = withDeadline(
      { what: 'op', timeoutMs: 10, signal: aborted.signal, timers },
      new Promise(() => {}),
    );
    aborted.abort();
    await assert.rejects(q, { code: 'KVT_ABORTED' });
    assert.equal(timers.armed, 0);
    // A Deadline disposed without racing leaves nothing either.
    const d = new Deadline({ what: 'op', timeoutMs: 10, signal: ac.signal, timers });
    assert.equal(listeners(ac.signal), 1);
    d.dispose();
    d.dispose();
    assert.equal(listeners(ac.signal), 0);
    // race leaves no listener on the deadline's own signal either.
    const e = new Deadline({ what: 'op', timeoutMs: 10, timers });
    for (let i = 0; i < 100; i++) await e.race(Promise.resolve(i));
    assert.equal(listeners(e.signal), 0);
    e.dispose();
  });
});
