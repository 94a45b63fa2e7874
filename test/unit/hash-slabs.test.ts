import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { test } from 'node:test';
import { HashSlabs, type SlabCopy } from '../../src/storage-manager/hash-slabs.ts';
import { LookupHashes } from '../../src/storage-manager/lookup-hashes.ts';

test('live copies keep their bytes through frees, shrinks, moves and reuse; freed ones read empty', () => {
  const slabs = new HashSlabs(4096);
  const live = new Map<SlabCopy, Buffer>();
  const freed: SlabCopy[] = [];
  const buffers = new Map<ArrayBufferLike, number>();
  for (let i = 0; i < 3000; i++) {
    const src = randomBytes(32 * (1 + (i % 20)));
    const c = slabs.copy(src);
    live.set(c, Buffer.from(src));
    buffers.set(c.view.buffer, (buffers.get(c.view.buffer) ?? 0) + 1);
    if (i % 7 === 3) {
      const n = 32 * Math.floor(c.view.length / 64);
      slabs.shrink(c, n);
      live.set(c, live.get(c)!.subarray(0, n));
    }
    // Free the oldest copy most of the time, keeping about one in five for long.
    if (i % 5 !== 0 && (i * 7) % 10 < 6) {
      const [k] = live.keys();
      slabs.free(k!);
      slabs.free(k!); // idempotent
      live.delete(k!);
      freed.push(k!);
    }
    // Every live copy keeps its bytes, and no two live copies share room.
    if (i % 250 === 249) {
      for (const [c, bytes] of live) assert.deepEqual(Buffer.from(c.view), bytes, 'a live copy');
      const bySlab = new Map<ArrayBufferLike, [number, number][]>();
      for (const c of live.keys()) {
        if (c.view.length === 0) continue;
        const list = bySlab.get(c.view.buffer) ?? [];
        list.push([c.view.byteOffset, c.view.byteOffset + c.view.length]);
        bySlab.set(c.view.buffer, list);
      }
      for (const list of bySlab.values()) {
        list.sort((a, b) => a[0] - b[0]);
        for (let j = 1; j < list.length; j++)
          assert.ok(list[j]![0] >= list[j - 1]![1], 'no overlap');
      }
    }
  }
  for (const c of freed) assert.equal(c.view.length, 0, 'a freed copy reads empty');
  // Slabs other than the one being filled hold at least a quarter of live bytes.
  const liveBySlab = new Map<{ buf: Buffer }, number>();
  for (const c of live.keys())
    if (c.slab !== undefined) liveBySlab.set(c.slab, (liveBySlab.get(c.slab) ?? 0) + c.view.length);
  const under = [...liveBySlab].filter(([s, n]) => n * 4 < s.buf.length);
  assert.ok(
    under.length <= 1,
    `at most the current slab under a quarter full, got ${under.length}`,
  );
  assert.ok(buffers.size > 1, 'several slabs were used');
});

test('emptied slabs are reused: a bounded live set churns through a few slabs', () => {
  const slabs = new HashSlabs(4096);
  const queue: SlabCopy[] = [];
  const buffers = new Set<ArrayBufferLike>();
  let bytes = 0;
  for (let i = 0; i < 3000; i++) {
    const src = randomBytes(32 * (1 + (i % 20)));
    bytes += src.length;
    const c = slabs.copy(src);
    buffers.add(c.view.buffer);
    queue.push(c);
    if (queue.length > 20) slabs.free(queue.shift()!);
  }
  assert.ok(bytes / 4096 > 200, 'without reuse this would take over 200 slabs');
  assert.ok(buffers.size <= 10, `slabs used: ${buffers.size}`);
});

test('a copy larger than a quarter of a slab gets its own; empty copies take no room', () => {
  const slabs = new HashSlabs(4096);
  const big = slabs.copy(randomBytes(2048));
  assert.equal(big.view.buffer.byteLength, 2048);
  const empty = slabs.copy(new Uint8Array(0));
  assert.equal(empty.view.length, 0);
  slabs.free(empty);
  slabs.free(big);
  assert.equal(big.view.length, 0);
});

for (const chunks of [10, 300]) {
  test(`LookupHashes, ${chunks} chunks: compacted hashes read the same; freed ones read as none`, () => {
    const packed = randomBytes(32 * chunks);
    const keep = Buffer.from(packed);
    const a = LookupHashes.of(packed);
    const k = chunks - 4;
    a.compact(k);
    packed.fill(0); // the borrowed bytes are no longer read
    assert.deepEqual(Buffer.from(a.packed), keep.subarray(0, 32 * k));
    assert.deepEqual(Buffer.from(a.view(2, 3)), keep.subarray(64, 160));
    assert.equal(a.at(5), keep.toString('hex', 160, 192));
    assert.throws(() => a.view(k - 1, 2), RangeError, 'not past the hashes kept');
    a.compact(k - 2);
    assert.equal(a.length, k - 2);
    const hex = Array.from({ length: k - 2 }, (_, i) => keep.toString('hex', 32 * i, 32 * i + 32));
    assert.deepEqual(a.hexSlice(), hex);
    a.free();
    a.free();
    assert.equal(a.length, 0);
    assert.deepEqual(a.hexSlice(), []);
    assert.throws(() => a.view(0, 1), RangeError);

    // Released before its answer settled, then compacted: it keeps nothing.
    const b = LookupHashes.of(randomBytes(32 * chunks));
    b.free();
    b.compact(chunks);
    assert.equal(b.length, 0);
    assert.deepEqual(b.hexSlice(), []);
  });
}
