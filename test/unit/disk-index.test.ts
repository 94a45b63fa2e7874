import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { describe, it } from 'node:test';
import { hashOfWords, hashWordsInto } from '../../src/backends/index/hash-words.ts';
import { DiskIndex, type EvictedEntry } from '../../src/backends/local-disk/disk-index.ts';
import { type ChunkHash, chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';

const ns = () => randomBytes(16).toString('hex');
const hash = () => chunkHashFromBytes(randomBytes(32));

function indexOf(capacityBytes: number, maxChunks = 1 << 20) {
  const evicted: EvictedEntry[] = [];
  const index = new DiskIndex(capacityBytes, maxChunks, (e) => evicted.push(e));
  return { index, evicted };
}

describe('DiskIndex', () => {
  it('hash words round-trip the hex of every byte value', () => {
    const bytes = Buffer.from(Array.from({ length: 32 }, (_, i) => (i * 37 + 255) & 0xff));
    for (let shift = 0; shift < 8; shift++) {
      const h = chunkHashFromBytes(bytes.map((b) => (b + shift * 32) & 0xff));
      const words = new Int32Array(8);
      hashWordsInto(h, words, 0);
      assert.equal(hashOfWords(words, 0), h);
      assert.equal(
        words[0],
        Buffer.from(h, 'hex').readInt32LE(0),
        'little-endian words of the bytes',
      );
    }
  });

  it('finds entries by namespace and hash, and nothing across namespaces', () => {
    const { index } = indexOf(1 << 30);
    const [a, b] = [ns(), ns()];
    const h = hash();
    const s = index.add(a, h, 1000);
    assert.equal(index.find(a, h), s);
    assert.equal(index.find(b, h), -1, 'another namespace');
    assert.equal(index.find(a, hash()), -1);
    assert.equal(index.nsOf(s), a);
    assert.equal(index.hashOf(s), h);
    assert.equal(index.bytesOf(s), 1000);
    assert.equal(index.add(a, h, 1200), s, 'adding again updates the same entry');
    assert.deepEqual([index.size, index.bytesUsed], [1, 1200]);
  });

  it('evicts least recently used first, skipping pinned entries, and reports each eviction', () => {
    const { index, evicted } = indexOf(4 * 1000);
    const n = ns();
    const hs = [hash(), hash(), hash(), hash()];
    const slots = hs.map((h) => index.add(n, h, 1000));
    index.touch(slots[0]!); // order now 1, 2, 3, 0
    index.pin(slots[1]!);
    assert.equal(index.reserve(2000), true);
    assert.deepEqual(
      evicted.map((e) => e.hash),
      [hs[2], hs[3]],
      'the pinned one is skipped',
    );
    assert.equal(evicted[0]!.ns, n);
    assert.equal(index.reserve(2000), false, 'pinned and reserved bytes leave no room');
    index.unreserve(2000);
    index.unpin(slots[1]!);
    assert.equal(index.reserve(3000), true);
    assert.deepEqual(
      evicted.map((e) => e.hash),
      [hs[2], hs[3], hs[0]],
      'unpinned, it is the most recent',
    );
    assert.deepEqual([index.evictions, index.size, index.bytesUsed], [3, 1, 1000]);
  });

  it('a freed slot reused for another key is not held by the old generation', () => {
    const { index } = indexOf(1 << 30);
    const n = ns();
    const s = index.add(n, hash(), 10);
    const gen = index.genOf(s);
    assert.equal(index.holds(s, gen), true);
    index.forget(s);
    assert.equal(index.holds(s, gen), false);
    const again = index.add(n, hash(), 10);
    assert.equal(again, s, 'the slot is reused');
    assert.equal(index.holds(s, gen), false, 'by a new generation');
  });

  it('keeps the chunk-count bound by evicting the least recent', () => {
    const { index, evicted } = indexOf(1 << 30, 3);
    const n = ns();
    const hs = [hash(), hash(), hash(), hash()];
    for (const h of hs) index.add(n, h, 10);
    assert.equal(index.size, 3);
    assert.deepEqual(
      evicted.map((e) => e.hash),
      [hs[0]],
    );
  });

  it('grows past its first arrays and keeps every entry; sized from a count, 68 bytes a chunk', () => {
    const { index } = indexOf(2 ** 40);
    const n = ns();
    const hs: ChunkHash[] = Array.from({ length: 100_000 }, hash);
    for (const [i, h] of hs.entries()) index.add(n, h, 200 + (i % 7));
    for (const [i, h] of hs.entries()) {
      const s = index.find(n, h);
      assert.ok(s >= 0 && index.bytesOf(s) === 200 + (i % 7), `entry ${i}`);
    }
    // 64-byte records grown by half again, 4-byte buckets to the next power of two.
    assert.ok(index.arrayBytes / index.size <= 1.5 * 64 + 2 * 4, `${index.arrayBytes} bytes`);
    const packed = new DiskIndex(2 ** 40, 1 << 20, () => {}, 100_000);
    for (const h of hs) packed.add(n, h, 200);
    const each = packed.arrayBytes / packed.size;
    assert.ok(each <= 64 + 2 * 4 + 1, `sized up front from a count: ${each} bytes a chunk`);
  });

  it('sweeps entries never verified, and orders the least recent end', () => {
    const { index } = indexOf(1 << 30);
    const n = ns();
    const [a, b, c] = [hash(), hash(), hash()];
    const sa = index.add(n, a, 10, { verified: false });
    const sb = index.add(n, b, 10, { verified: false });
    const sc = index.add(n, c, 10);
    index.markVerified(sb);
    assert.equal(index.sweepUnverified(), 1);
    assert.equal(index.find(n, a), -1);
    index.moveToLeastRecent([sc, sb]);
    assert.deepEqual([...index.recencyOrder()], [sc, sb]);
    assert.notEqual(sa, sc);
  });
});
