import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { groupByBytes, runWindowed } from '../../src/data-plane/copy-groups.ts';

describe('groupByBytes', () => {
  test('consecutive ranges up to the bound; a larger item stands alone', () => {
    assert.deepEqual(groupByBytes([4, 4, 4, 4, 4], 8), [
      [0, 2],
      [2, 4],
      [4, 5],
    ]);
    assert.deepEqual(groupByBytes([3, 20, 3, 3], 8), [
      [0, 1],
      [1, 2],
      [2, 4],
    ]);
    assert.deepEqual(groupByBytes([], 8), []);
    assert.deepEqual(groupByBytes([1, 1, 1], 1), [
      [0, 1],
      [1, 2],
      [2, 3],
    ]);
  });
});

/** A group run that settles only when the test says so. */
function deferredRuns() {
  const settle: Array<(err?: Error) => void> = [];
  const started: number[] = [];
  const run = (_g: number, i: number) =>
    new Promise<void>((resolve, reject) => {
      started.push(i);
      settle[i] = (err) => (err === undefined ? resolve() : reject(err));
    });
  return { settle, started, run };
}

const tick = () => new Promise((r) => setImmediate(r));

describe('runWindowed', () => {
  test('keeps at most `window` groups in flight and counts leading completions in order', async () => {
    const d = deferredRuns();
    const done = runWindowed([0, 1, 2, 3], d.run, { window: 2 });
    await tick();
    assert.deepEqual(d.started, [0, 1]);
    d.settle[1]!();
    await tick();
    assert.deepEqual(d.started, [0, 1], 'the oldest group still holds its slot');
    d.settle[0]!();
    await tick();
    assert.deepEqual(d.started, [0, 1, 2, 3], 'both slots free again');
    d.settle[3]!();
    d.settle[2]!();
    assert.deepEqual(await done, { completed: 4 });
  });

  test('a failure stops issuing; groups after it do not count even when they completed', async () => {
    const d = deferredRuns();
    const done = runWindowed([0, 1, 2, 3], d.run, { window: 2 });
    await tick();
    const boom = new Error('copy failed');
    d.settle[1]!();
    d.settle[0]!(boom);
    const out = await done;
    assert.deepEqual(d.started, [0, 1]);
    assert.equal(out.completed, 0);
    assert.equal(out.error, boom);
  });

  test('resolves only after every issued group settled', async () => {
    const d = deferredRuns();
    let stop = false;
    let resolved = false;
    const done = runWindowed([0, 1, 2], d.run, { window: 2, stop: () => stop }).then((o) => {
      resolved = true;
      return o;
    });
    await tick();
    stop = true;
    d.settle[0]!();
    await tick();
    assert.equal(resolved, false, 'group 1 is still copying');
    assert.deepEqual(d.started, [0, 1], 'nothing is issued after stop()');
    d.settle[1]!();
    assert.deepEqual(await done, { completed: 2 });
  });
});
