import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { RecencyList, type RecencyNode } from '../../src/backends/index/recency-list.ts';

interface Item extends RecencyNode<Item> {
  id: number;
}
const item = (id: number): Item => ({ id, prev: null, next: null, listed: false });

function drain(list: RecencyList<Item>): number[] {
  const out: number[] = [];
  for (let n = list.popLeastRecent(); n !== undefined; n = list.popLeastRecent()) out.push(n.id);
  return out;
}

describe('RecencyList', () => {
  test('pops least recently used first; touch moves to most recent; remove unlinks', () => {
    const list = new RecencyList<Item>();
    const items = [0, 1, 2, 3, 4].map(item);
    for (const it of items) list.touch(it);
    list.touch(items[1]!);
    list.touch(items[4]!);
    assert.equal(list.remove(items[2]!), true);
    assert.equal(list.remove(items[2]!), false, 'removing twice is a no-op');
    assert.equal(list.size, 4);
    assert.deepEqual(drain(list), [0, 3, 1, 4]);
    assert.equal(list.size, 0);
    assert.equal(
      items.every((i) => !i.listed && i.prev === null && i.next === null),
      true,
    );
  });

  test('matches a reference model under a random workload', () => {
    let seed = 42;
    const rnd = () => {
      seed = (seed * 1103515245 + 12345) >>> 0;
      return seed / 2 ** 32;
    };
    const list = new RecencyList<Item>();
    const items = Array.from({ length: 50 }, (_, i) => item(i));
    const model: number[] = [];
    for (let step = 0; step < 5000; step++) {
      const it = items[Math.floor(rnd() * items.length)]!;
      const r = rnd();
      if (r < 0.5) {
        list.touch(it);
        const i = model.indexOf(it.id);
        if (i >= 0) model.splice(i, 1);
        model.push(it.id);
      } else if (r < 0.8) {
        assert.equal(list.remove(it), model.includes(it.id));
        const i = model.indexOf(it.id);
        if (i >= 0) model.splice(i, 1);
      } else {
        assert.equal(list.popLeastRecent()?.id, model.shift());
      }
      assert.equal(list.size, model.length);
    }
    assert.deepEqual(drain(list), model);
  });

  test('clear unlinks every node', () => {
    const list = new RecencyList<Item>();
    const items = [0, 1, 2].map(item);
    for (const it of items) list.touch(it);
    list.clear();
    assert.equal(list.size, 0);
    assert.equal(list.popLeastRecent(), undefined);
    assert.equal(
      items.every((i) => !i.listed),
      true,
    );
    list.touch(items[2]!);
    assert.deepEqual(drain(list), [2]);
  });
});
