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

  it('gives a chunk used since it reached the old end a second chance (a clock, not moves)', () => {
    const { index, evicted } = indexOf(5 * 1000);
    const n = ns();
    const hs = [hash(), hash(), hash(), hash(), hash()];
    const slots = hs.map((h) => index.add(n, h, 1000));
    // Used 3, then 1, then 0: the journal's order is the unused ones, then by last use.
    index.touch(slots[3]!);
    assert.equal(index.prefixHits(n, [hs[1]!, hs[0]!], false), 2);
    assert.deepEqual(
      [...index.recencyOrder()],
      [2, 4, 3, 1, 0].map((i) => slots[i]!),
    );
    assert.equal(index.reserve(2000), true);
    assert.deepEqual(
      evicted.map((e) => e.hash),
      [hs[2], hs[4]],
      'the unused ones go first, passing over the used ones',
    );
    // The used ones were moved to the new end, unstamped, in list order (not by last use).
    assert.deepEqual(
      [...index.recencyOrder()],
      [0, 1, 3].map((i) => slots[i]!),
    );
    index.unreserve(2000);
    index.touch(slots[0]!);
    assert.equal(index.reserve(4000), true);
    assert.deepEqual(
      evicted.slice(2).map((e) => e.hash),
      [hs[1], hs[3]],
    );
    assert.deepEqual([index.size, index.evictions], [1, 4]);
  });

  it('a pinned chunk stays where it is until eviction reaches it; unpinned, it counts as used', () => {
    const { index, evicted } = indexOf(3 * 1000);
    const n = ns();
    const hs = [hash(), hash(), hash()];
    const slots = hs.map((h) => index.add(n, h, 1000));
    assert.equal(index.prefixHits(n, [hs[0]!, hs[1]!], true), 2, 'lookups pin what they count');
    assert.equal(index.pinnedChunks, 2);
    index.unpin(slots[1]!); // still listed: now as if just used
    assert.deepEqual(
      [...index.recencyOrder()],
      [2, 1, 0].map((i) => slots[i]!),
    );
    assert.equal(index.reserve(1000), true);
    assert.deepEqual(
      evicted.map((e) => e.hash),
      [hs[2]],
    );
    index.unreserve(1000);
    assert.equal(index.reserve(2500), false, 'one chunk is pinned');
    assert.equal(evicted.length, 1, 'a reservation that cannot fit evicts nothing');
    index.unpin(slots[0]!);
    assert.equal(index.reserve(2500), true);
    assert.deepEqual(
      evicted.map((e) => e.hash),
      [hs[2], hs[1], hs[0]],
      '0 left the list when eviction passed it pinned; unpinned, it went to the new end',
    );
  });

  it('finds every key after lookups reorder crowded hash chains, and still removes them', () => {
    // About one key per bucket: hundreds of chains of two or more, a key found down one moved
    // to its head.
    const { index } = indexOf(2 ** 40);
    const n = ns();
    const hs: ChunkHash[] = Array.from({ length: 5000 }, hash);
    for (const h of hs) index.add(n, h, 100);
    for (let round = 0; round < 3; round++) {
      for (let i = round; i < hs.length; i += 16) {
        const q = hs.slice(i, i + 16);
        assert.equal(index.prefixHits(n, q, false), q.length);
      }
    }
    assert.equal(index.prefixHits(n, [hs[0]!, hash(), hs[1]!], false), 1, 'a miss ends the count');
    for (const [i, h] of hs.entries()) if (i % 3 === 0) index.forget(index.find(n, h));
    for (const [i, h] of hs.entries()) {
      assert.equal(index.find(n, h) >= 0, i % 3 !== 0, `key ${i}`);
    }
    assert.equal(index.size, hs.length - Math.ceil(hs.length / 3));
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

  it("takes its large arrays from the memory it is given, and Node's when that gives none or fails", () => {
    const asked: number[] = [];
    const index = new DiskIndex(
      2 ** 40,
      1 << 20,
      () => {},
      600_000,
      (bytes) => {
        asked.push(bytes);
        return asked.length === 1 ? new Uint8Array(bytes) : null;
      },
    );
    assert.deepEqual(asked, [600_064 * 64, 2 ** 20 * 4], 'records, then buckets (2 MiB or more)');
    const n = ns();
    const hs: ChunkHash[] = Array.from({ length: 1000 }, hash);
    for (const h of hs) index.add(n, h, 100);
    assert.equal(index.prefixHits(n, hs, false), hs.length);
    const small = new DiskIndex(
      2 ** 40,
      1 << 20,
      () => {},
      1000,
      () => {
        throw new Error('asked for a small array');
      },
    );
    assert.equal(small.find(n, hs[0]!), -1);
    const failing = new DiskIndex(
      2 ** 40,
      1 << 20,
      () => {},
      600_000,
      () => {
        throw new Error('no slab');
      },
    );
    failing.add(n, hs[0]!, 100);
    assert.equal(failing.prefixHits(n, [hs[0]!], false), 1, 'memory that fails is not fatal');
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
