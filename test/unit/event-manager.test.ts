import assert from 'node:assert/strict';
import { getEventListeners } from 'node:events';
import { describe, it, mock } from 'node:test';
import { isKvtierError } from '../../src/errors.ts';
import { EventManager, type EventManagerOptions } from '../../src/event-manager/event-manager.ts';
import { createLogger } from '../../src/util/log.ts';

const drainLoop = () => new Promise<void>((resolve) => setImmediate(resolve));

function deferred<T>() {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/** A result that records who owns it in the end. */
interface Res {
  id: string;
}

/** Builds a manager with a manual clock and counts every hook call per result. */
function setup(opts: EventManagerOptions = {}) {
  let t = 1_000;
  const em = new EventManager<Res>({ sweepIntervalMs: 0, now: () => t, ...opts });
  const disposed = new Map<string, number>();
  const aborted = new Map<string, number>();
  const works = new Map<string, ReturnType<typeof deferred<Res>>>();
  const add = (id: string) => {
    const d = deferred<Res>();
    em.add(id, d.promise, {
      abort: () => aborted.set(id, (aborted.get(id) ?? 0) + 1),
      dispose: (r) => disposed.set(r.id, (disposed.get(r.id) ?? 0) + 1),
    });
    works.set(id, d);
    return d;
  };
  const finish = async (id: string) => {
    works.get(id)?.resolve({ id });
    await drainLoop();
  };
  return {
    em,
    add,
    finish,
    disposed,
    aborted,
    works,
    advance: (ms: number) => {
      t += ms;
    },
  };
}

describe('EventManager', () => {
  it('validates options', () => {
    const bad: EventManagerOptions[] = [
      { maxEntries: 0 },
      { maxEntries: 1.5 },
      { ttlMs: 0 },
      { sweepIntervalMs: -1 },
      { now: 5 as unknown as () => number },
    ];
    for (const opts of bad) {
      assert.throws(
        () => new EventManager(opts),
        (e) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
      );
    }
  });

  it('goes ongoing -> done; result and wait see the value; take hands it over without dispose', async () => {
    const h = setup();
    h.add('a');
    assert.equal(h.em.state('a'), 'ongoing');
    assert.equal(h.em.result('a'), undefined);
    assert.equal(h.em.take('a'), undefined, 'take of an ongoing entry changes nothing');
    assert.deepEqual(h.em.sizes(), { ongoing: 1, done: 0 });
    const waited = h.em.wait('a');
    await h.finish('a');
    assert.deepEqual(await waited, { id: 'a' });
    assert.equal(h.em.state('a'), 'done');
    assert.deepEqual(h.em.result('a'), { id: 'a' });
    assert.deepEqual(await h.em.wait('a'), { id: 'a' });
    assert.deepEqual(h.em.sizes(), { ongoing: 0, done: 1 });
    assert.deepEqual(h.em.take('a'), { id: 'a' });
    assert.equal(h.em.state('a'), 'not_found');
    assert.equal(h.em.take('a'), undefined);
    assert.deepEqual(h.em.sizes(), { ongoing: 0, done: 0 });
    h.em.close();
    assert.equal(h.disposed.size, 0, 'a taken result is never disposed');
  });

  it('rejects a duplicate id and a bad id with KVT_INVALID_ARGUMENT', async () => {
    const h = setup();
    h.add('a');
    assert.throws(
      () => h.add('a'),
      (e) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
    );
    await h.finish('a');
    assert.throws(
      () => h.add('a'),
      (e) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
    );
    assert.throws(
      () => h.add(''),
      (e) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
    );
    assert.deepEqual(h.em.sizes(), { ongoing: 0, done: 1 });
  });

  it('wait on an unknown id rejects KVT_NOT_FOUND', async () => {
    const h = setup();
    await assert.rejects(h.em.wait('nope'), (e) => isKvtierError(e, 'KVT_NOT_FOUND'));
  });

  it('a rejected work removes the entry and its waiters get that error; nothing is disposed', async () => {
    const h = setup();
    const d = h.add('a');
    const waited = h.em.wait('a');
    const boom = new Error('backend down');
    d.reject(boom);
    await assert.rejects(waited, (e) => e === boom);
    assert.equal(h.em.state('a'), 'not_found');
    assert.deepEqual(h.em.sizes(), { ongoing: 0, done: 0 });
    assert.equal(h.disposed.size, 0);
    assert.equal(h.aborted.size, 0);
    h.add('a');
    assert.equal(h.em.state('a'), 'ongoing', 'the id is free again');
  });

  it('cancel of an ongoing entry aborts it, rejects waiters, and disposes the late result once', async () => {
    const h = setup();
    h.add('a');
    const waited = h.em.wait('a');
    assert.equal(h.em.cancel('a'), true);
    assert.equal(h.aborted.get('a'), 1);
    assert.equal(h.em.state('a'), 'not_found');
    await assert.rejects(waited, (e) => isKvtierError(e, 'KVT_NOT_FOUND'));
    assert.equal(h.disposed.get('a'), undefined, 'nothing to dispose before the work settles');
    await h.finish('a');
    assert.equal(h.disposed.get('a'), 1);
    assert.equal(h.em.cancel('a'), false);
    h.em.close();
    assert.equal(h.disposed.get('a'), 1);
  });

  it('cancel of an ongoing entry whose work then rejects disposes nothing', async () => {
    const h = setup();
    const d = h.add('a');
    h.em.cancel('a');
    d.reject(new Error('aborted'));
    await drainLoop();
    assert.equal(h.disposed.size, 0);
  });

  it('a new entry under a cancelled id is not confused with the old work', async () => {
    const h = setup();
    const old = h.add('a');
    h.em.cancel('a');
    h.add('a');
    old.resolve({ id: 'old' });
    await drainLoop();
    assert.equal(h.disposed.get('old'), 1);
    assert.equal(h.em.state('a'), 'ongoing');
    await h.finish('a');
    assert.deepEqual(h.em.take('a'), { id: 'a' });
  });

  it('cancel of a done entry disposes it at once, exactly once', async () => {
    const h = setup();
    h.add('a');
    await h.finish('a');
    assert.equal(h.em.cancel('a'), true);
    assert.equal(h.disposed.get('a'), 1);
    assert.equal(h.aborted.size, 0);
    assert.equal(h.em.cancel('a'), false);
    assert.equal(h.disposed.get('a'), 1);
  });

  it('sweep expires old entries: ongoing aborted (+dispose on settle), done disposed; young kept', async () => {
    const h = setup({ ttlMs: 100 });
    h.add('old-ongoing');
    h.add('old-done');
    await h.finish('old-done');
    h.advance(100);
    h.add('young');
    const waited = h.em.wait('old-ongoing');
    assert.equal(h.em.sweep(), 2);
    assert.equal(h.em.expiredTotal, 2);
    assert.equal(h.aborted.get('old-ongoing'), 1);
    assert.equal(h.disposed.get('old-done'), 1);
    await assert.rejects(waited, (e) => isKvtierError(e, 'KVT_NOT_FOUND'));
    assert.equal(h.em.state('young'), 'ongoing');
    assert.equal(h.em.state('old-ongoing'), 'not_found');
    await h.finish('old-ongoing');
    assert.equal(h.disposed.get('old-ongoing'), 1);
    assert.equal(h.em.sweep(), 0);
    assert.equal(h.em.expiredTotal, 2);
    assert.equal(h.aborted.has('young'), false);
  });

  it('a done entry ages from its completion, not from add', async () => {
    const h = setup({ ttlMs: 100 });
    h.add('a');
    h.advance(90);
    await h.finish('a');
    h.advance(50);
    assert.equal(h.em.sweep(), 0, '50 ms after completion is not expired');
    h.advance(50);
    assert.equal(h.em.sweep(), 1);
    assert.equal(h.disposed.get('a'), 1);
  });

  it('when full, drops the oldest done entries (disposing them) and keeps ongoing ones', async () => {
    const h = setup({ maxEntries: 3 });
    h.add('d1');
    h.add('d2');
    h.add('o1');
    await h.finish('d1');
    await h.finish('d2');
    h.add('x');
    assert.equal(h.disposed.get('d1'), 1);
    assert.equal(h.em.state('d1'), 'not_found');
    assert.equal(h.em.state('d2'), 'done');
    assert.equal(h.em.evictedTotal, 1);
    assert.deepEqual(h.em.sizes(), { ongoing: 2, done: 1 });
  });

  it('when full, sweeps expired entries before evicting done ones', async () => {
    const h = setup({ maxEntries: 2, ttlMs: 100 });
    h.add('old');
    h.advance(100);
    h.add('done');
    await h.finish('done');
    h.add('x');
    assert.equal(h.em.state('old'), 'not_found');
    assert.equal(h.aborted.get('old'), 1);
    assert.equal(h.em.state('done'), 'done', 'the young done entry survives');
    assert.equal(h.em.expiredTotal, 1);
    assert.equal(h.em.evictedTotal, 0);
  });

  it('when full of ongoing entries, add throws KVT_CAPACITY and registers nothing', () => {
    const h = setup({ maxEntries: 2 });
    h.add('a');
    h.add('b');
    assert.throws(
      () => h.add('c'),
      (e) => isKvtierError(e, 'KVT_CAPACITY'),
    );
    assert.equal(h.em.state('c'), 'not_found');
    assert.deepEqual(h.em.sizes(), { ongoing: 2, done: 0 });
    assert.equal(h.aborted.size, 0);
  });

  it('an aborted wait rejects and leaves the prefetch running; its listener is removed', async () => {
    const h = setup();
    h.add('a');
    const ac = new AbortController();
    const waited = h.em.wait('a', { signal: ac.signal });
    assert.equal(getEventListeners(ac.signal, 'abort').length, 1);
    ac.abort();
    await assert.rejects(waited, (e) => isKvtierError(e, 'KVT_ABORTED'));
    assert.equal(h.em.state('a'), 'ongoing');
    await assert.rejects(h.em.wait('a', { signal: ac.signal }), (e) =>
      isKvtierError(e, 'KVT_ABORTED'),
    );

    const ac2 = new AbortController();
    const served = h.em.wait('a', { signal: ac2.signal });
    await h.finish('a');
    assert.deepEqual(await served, { id: 'a' });
    assert.equal(getEventListeners(ac2.signal, 'abort').length, 0);
  });

  it('close cancels everything, rejects waiters KVT_CLOSED, and later add/wait KVT_CLOSED', async () => {
    const h = setup();
    h.add('ongoing');
    h.add('done');
    await h.finish('done');
    const waited = h.em.wait('ongoing');
    h.em.close();
    h.em.close();
    await assert.rejects(waited, (e) => isKvtierError(e, 'KVT_CLOSED'));
    assert.equal(h.aborted.get('ongoing'), 1);
    assert.equal(h.disposed.get('done'), 1);
    assert.deepEqual(h.em.sizes(), { ongoing: 0, done: 0 });
    await h.finish('ongoing');
    assert.equal(h.disposed.get('ongoing'), 1);
    assert.throws(
      () => h.add('new'),
      (e) => isKvtierError(e, 'KVT_CLOSED'),
    );
    await assert.rejects(h.em.wait('done'), (e) => isKvtierError(e, 'KVT_CLOSED'));
    assert.equal(h.em.cancel('done'), false);
  });

  it('a throwing dispose hook is logged and does not stop a sweep', async () => {
    const lines: string[] = [];
    const logger = createLogger('test', { level: 'error', write: (l) => lines.push(l) });
    let t = 0;
    const em = new EventManager<number>({ sweepIntervalMs: 0, now: () => t, ttlMs: 10, logger });
    const disposed: number[] = [];
    em.add('bad', Promise.resolve(1), {
      abort: () => {},
      dispose: () => {
        throw new Error('dispose failed');
      },
    });
    em.add('good', Promise.resolve(2), { abort: () => {}, dispose: (r) => disposed.push(r) });
    await drainLoop();
    t = 10;
    assert.equal(em.sweep(), 2);
    assert.deepEqual(disposed, [2]);
    assert.equal(lines.length, 1);
    assert.match(lines[0] ?? '', /dispose hook threw/);
  });

  it('runs sweep on an unref-ed timer and clears it on close', () => {
    mock.timers.enable({ apis: ['setInterval'] });
    try {
      let t = 0;
      let clockReads = 0;
      const em = new EventManager<number>({
        ttlMs: 50,
        sweepIntervalMs: 100,
        now: () => {
          clockReads++;
          return t;
        },
      });
      const aborted: string[] = [];
      em.add('a', new Promise<number>(() => {}), {
        abort: () => aborted.push('a'),
        dispose: () => {},
      });
      t = 60;
      mock.timers.tick(99);
      assert.deepEqual(aborted, []);
      mock.timers.tick(1);
      assert.deepEqual(aborted, ['a']);
      assert.equal(em.expiredTotal, 1);
      em.close();
      const reads = clockReads;
      mock.timers.tick(1000);
      assert.equal(clockReads, reads, 'no sweep runs after close');
    } finally {
      mock.timers.reset();
    }
  });

  it('disposes every untaken result exactly once under a random mix of operations', async () => {
    let seed = 99;
    const rand = (n: number) => {
      seed = (seed * 1103515245 + 12345) % 2 ** 31;
      return (seed >>> 8) % n;
    };
    const h = setup({ maxEntries: 8, ttlMs: 50 });
    const taken = new Map<string, number>();
    // How each work settled first: only 'ok' results exist and need an owner.
    const outcome = new Map<string, 'ok' | 'err'>();
    const settle = (id: string, how: 'ok' | 'err') => {
      if (outcome.has(id)) return;
      outcome.set(id, how);
      if (how === 'ok') h.works.get(id)?.resolve({ id });
      else h.works.get(id)?.reject(new Error('failed'));
    };
    let next = 0;
    const live: string[] = [];
    for (let step = 0; step < 2000; step++) {
      const op = rand(8);
      // Recent ids, so operations hit entries that still exist.
      const id = live[live.length - 1 - rand(Math.min(live.length, 12) || 1)];
      if (op <= 1 || id === undefined) {
        const nid = `p${next++}`;
        try {
          h.add(nid);
          live.push(nid);
        } catch (e) {
          assert.ok(isKvtierError(e, 'KVT_CAPACITY'));
        }
      } else if (op === 2) {
        settle(id, 'ok');
      } else if (op === 3) {
        settle(id, rand(4) === 0 ? 'err' : 'ok');
      } else if (op === 4) {
        const r = h.em.take(id);
        if (r !== undefined) taken.set(r.id, (taken.get(r.id) ?? 0) + 1);
      } else if (op === 5) {
        h.em.cancel(id);
      } else if (op === 6) {
        h.advance(rand(30));
        h.em.sweep();
      } else {
        await drainLoop();
      }
    }
    h.em.close();
    // Late results still need their dispose after close.
    for (const id of live) settle(id, 'ok');
    await drainLoop();
    for (const id of live) {
      const owners = (taken.get(id) ?? 0) + (h.disposed.get(id) ?? 0);
      assert.equal(owners, outcome.get(id) === 'ok' ? 1 : 0, `${id}: ${owners} owners`);
    }
    assert.ok(taken.size >= 5 && h.disposed.size >= 50, 'the mix exercised both paths');
    assert.ok([...outcome.values()].includes('err'), 'the mix exercised failures');
    assert.ok(
      h.em.expiredTotal > 0 && h.em.evictedTotal > 0,
      'the mix exercised expiry and eviction',
    );
  });
});

describe('EventManager.addPending (settled synchronously by its owner)', () => {
  const hooks = (log: string[]) => ({
    abort: () => log.push('abort'),
    dispose: (r: Res) => log.push(`dispose ${r.id}`),
  });

  it('is done as soon as fulfil returns, and a take hands the result over', () => {
    const em = new EventManager<Res>({ sweepIntervalMs: 0 });
    const log: string[] = [];
    const p = em.addPending('a', hooks(log));
    assert.equal(em.state('a'), 'ongoing');
    em.fulfil(p, { id: 'a' });
    assert.equal(em.state('a'), 'done');
    assert.deepEqual(em.take('a'), { id: 'a' });
    assert.equal(em.state('a'), 'not_found');
    assert.deepEqual(log, []);
  });

  it('a result fulfilled after cancel is disposed; fail removes the entry and rejects waiters', async () => {
    const em = new EventManager<Res>({ sweepIntervalMs: 0 });
    const log: string[] = [];
    const p = em.addPending('a', hooks(log));
    assert.equal(em.cancel('a'), true);
    em.fulfil(p, { id: 'a' });
    assert.deepEqual(log, ['abort', 'dispose a']);

    const q = em.addPending('b', hooks(log));
    const waiting = em.wait('b');
    em.fail(q, new Error('boom'));
    await assert.rejects(waiting, /boom/);
    assert.equal(em.state('b'), 'not_found');
    assert.deepEqual(em.sizes(), { ongoing: 0, done: 0 });
  });
});
