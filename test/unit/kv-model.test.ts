import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  blockKey,
  fillKv,
  fillKvWords,
  kvWordsEqual,
  prefixHashes,
  resolveKvModelShape,
} from '../../src/sim/kv-model.ts';

const BPTL = 64;

function kv(tokens: number[], start: number, end: number, layer: number, kind: 0 | 1): Buffer {
  const out = Buffer.alloc((end - start) * BPTL);
  fillKv(prefixHashes(Uint32Array.from(tokens)), start, end, layer, kind, BPTL, out);
  return out;
}

const base = Array.from({ length: 40 }, (_, i) => (i * 7919 + 13) % 32_000);

describe('kv-model', () => {
  it('is a pure function of the prefix: equal prefixes give equal bytes, whatever follows', () => {
    const other = [...base.slice(0, 20), ...base.slice(20).map((t) => t + 1)];
    assert.deepEqual(kv(base, 0, 20, 1, 0), kv(other, 0, 20, 1, 0));
    assert.notDeepEqual(kv(base, 20, 21, 1, 0), kv(other, 20, 21, 1, 0), 'position 20 differs');
    assert.deepEqual(kv(base, 5, 30, 3, 1), kv([...base], 5, 30, 3, 1), 'deterministic');
  });

  it('a different early token changes every later position', () => {
    const changed = [...base];
    changed[3] = changed[3]! + 1;
    assert.deepEqual(kv(base, 0, 3, 0, 0), kv(changed, 0, 3, 0, 0));
    for (let p = 3; p < base.length; p++)
      assert.notDeepEqual(kv(base, p, p + 1, 0, 0), kv(changed, p, p + 1, 0, 0), `position ${p}`);
  });

  it('layer and K/V select different bytes', () => {
    const k0 = kv(base, 0, 8, 0, 0);
    assert.notDeepEqual(k0, kv(base, 0, 8, 0, 1));
    assert.notDeepEqual(k0, kv(base, 0, 8, 1, 0));
    assert.notDeepEqual(kv(base, 0, 8, 1, 0), kv(base, 0, 8, 1, 1));
  });

  it('prefix hashes are incremental and a range equals its single-token pieces', () => {
    const all = prefixHashes(Uint32Array.from(base));
    assert.deepEqual(prefixHashes(base.slice(0, 17)), all.subarray(0, 34));
    const range = kv(base, 4, 12, 2, 1);
    const pieces = Buffer.concat(Array.from({ length: 8 }, (_, i) => kv(base, 4 + i, 5 + i, 2, 1)));
    assert.deepEqual(range, pieces);
    assert.equal(blockKey(all, 15), blockKey(prefixHashes(base.slice(0, 16)), 15));
    assert.notEqual(blockKey(all, 15), blockKey(all, 16));
  });

  it('writes through an unaligned view the same bytes', () => {
    const h = prefixHashes(base);
    const aligned = Buffer.alloc(4 * BPTL);
    fillKv(h, 0, 4, 0, 0, BPTL, aligned);
    const backing = new Uint8Array(4 * BPTL + 1);
    const unaligned = backing.subarray(1);
    fillKv(h, 0, 4, 0, 0, BPTL, unaligned);
    assert.deepEqual(Buffer.from(unaligned), aligned);
  });

  it('rejects ranges outside the hashes, short outputs and bad shapes', () => {
    const h = prefixHashes(base);
    assert.throws(() => fillKv(h, 0, 41, 0, 0, BPTL, Buffer.alloc(41 * BPTL)), {
      code: 'KVT_INVALID_ARGUMENT',
    });
    assert.throws(() => fillKv(h, 0, 4, 0, 0, BPTL, Buffer.alloc(10)), {
      code: 'KVT_INVALID_ARGUMENT',
    });
    assert.throws(
      () => resolveKvModelShape({ numLayers: 2, bytesPerTokenPerLayer: 6 }),
      /multiple of 4/,
    );
    assert.deepEqual(resolveKvModelShape({ numLayers: 2, bytesPerTokenPerLayer: 8 }), {
      numLayers: 2,
      bytesPerTokenPerLayer: 8,
    });
  });
});

describe("kv-model in 32-bit words (the engine's mapped fast path)", () => {
  it('writes the words fillKv writes, and finds a flipped word', () => {
    const h = prefixHashes(base);
    const bytes = Buffer.alloc(10 * BPTL);
    fillKv(h, 3, 13, 1, 1, BPTL, bytes);
    const words = new Uint32Array(5 + 10 * (BPTL / 4));
    fillKvWords(h, 3, 13, 1, 1, BPTL / 4, words, 5);
    assert.deepEqual(Buffer.from(words.buffer, 20, 10 * BPTL), bytes);
    assert.equal(kvWordsEqual(h, 3, 13, 1, 1, BPTL / 4, words, 5), true);
    assert.equal(kvWordsEqual(h, 3, 13, 1, 0, BPTL / 4, words, 5), false, 'the other region');
    words[5 + 7 * (BPTL / 4) + 2]! ^= 1;
    assert.equal(kvWordsEqual(h, 3, 13, 1, 1, BPTL / 4, words, 5), false, 'one bit flipped');
  });
});
