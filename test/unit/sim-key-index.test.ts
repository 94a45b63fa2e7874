/**
 * The engine prefix cache's key index (open addressing, backward-shift deletion) against a Map,
 * under random inserts and deletes dense enough that probe runs wrap around the table.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { KeyIndex } from '../../src/sim/key-index.ts';

describe('KeyIndex', () => {
  it('agrees with a Map through random inserts and deletes', () => {
    const ix = new KeyIndex(64);
    const ref = new Map<number, number>();
    let x = 12345;
    const rand = () => {
      x = (Math.imul(x, 1103515245) + 12345) >>> 0;
      return x;
    };
    // Keys from a small pool, 53-bit, so that inserts collide with live keys and deletes find them.
    const pool = Array.from({ length: 96 }, (_, i) => (i + 1) * 2 ** 31 + (rand() % 1000));
    for (let step = 0; step < 20_000; step++) {
      const k = pool[rand() % pool.length] as number;
      if (rand() % 3 === 0 || ref.size >= 64) {
        assert.equal(ix.delete(k), ref.delete(k), `delete ${k} at ${step}`);
      } else {
        const v = rand() % 1000;
        assert.equal(ix.setIfAbsent(k, v), !ref.has(k), `insert ${k} at ${step}`);
        if (!ref.has(k)) ref.set(k, v);
      }
      assert.equal(ix.size, ref.size);
    }
    for (const k of pool) assert.equal(ix.get(k), ref.get(k) ?? -1, `key ${k}`);
    ix.clear();
    assert.equal(ix.size, 0);
    assert.equal(ix.has(pool[0] as number), false);
  });
});
