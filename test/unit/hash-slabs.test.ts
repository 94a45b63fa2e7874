import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { test } from 'node:test';
import { HashSlabs, type SlabCopy } from '../../src/storage-manager/hash-slabs.ts';
import { LookupHashes } from '../../src/storage-manager/lookup-hashes.ts';

test('copies keep their bytes through frees, shrinks and moves; memory is never handed out twice', () => {
  const slabs = new HashSlabs(4096);
  const live = new Map<SlabCopy, Buffer>();
  const freed: [SlabCopy, Buffer][] = [];
  const seen = new Set<ArrayBuffer>();
  for (let i = 0; i < 2000; i++) {
    const src = randomBytes(32 * (1 + (i % 20)));
    const c = slabs.copy(src);
    live.set(c, Buffer.from(src));
    seen.add(c.view.buffer as ArrayBuffer);
    if (i % 7 === 3) {
      const n = 32 * Math.floor(c.view.length / 64);
      slabs.shrink(c, n);
      live.set(c, live.get(c)!.subarray(0, n));
    }
    // Free most copies, keeping about one in five for long.
    if (i % 5 !== 0) {
      for (const [k, v] of live) {
        if ((i * 7) % 10 < 6) {
          slabs.free(k);
          slabs.free(k); // idempotent
          live.delete(k);
          freed.push([k, v]);
        }
        break;
      }
    }
  }
  for (const [c, bytes] of live) assert.deepEqual(Buffer.from(c.view), bytes, 'a live copy');
  for (const [c, bytes] of freed) assert.deepEqual(Buffer.from(c.view), bytes, 'a freed copy');
  // Copies that share a slab never overlap.
  const all = [...live.keys(), ...freed.map(([c]) => c)];
  const bySlab = new Map<ArrayBufferLike, [number, number][]>();
  for (const c of all) {
    if (c.view.length === 0) continue;
    const list = bySlab.get(c.view.buffer) ?? [];
    list.push([c.view.byteOffset, c.view.byteOffset + c.view.length]);
    bySlab.set(c.view.buffer, list);
  }
  for (const list of bySlab.values()) {
    list.sort((a, b) => a[0] - b[0]);
    for (let i = 1; i < list.length; i++) assert.ok(list[i]![0] >= list[i - 1]![1], 'no overlap');
  }
  // Slabs other than the one being filled hold at least a quarter of live bytes.
  const liveBySlab = new Map<object, number>();
  for (const c of live.keys())
    if (c.slab !== undefined) liveBySlab.set(c.slab, (liveBySlab.get(c.slab) ?? 0) + c.view.length);
  const sizes = [...liveBySlab.entries()].map(([s, n]) => [n, (s as { buf: Buffer }).buf.length]);
  const under = sizes.filter(([n, size]) => n! * 4 < size!);
  assert.ok(
    under.length <= 1,
    `at most the current slab under a quarter full, got ${under.length}`,
  );
  assert.ok(seen.size > 1, 'several slabs were used');
});

test('a copy larger than a quarter of a slab gets its own; empty copies take no room', () => {
  const slabs = new HashSlabs(4096);
  const big = slabs.copy(randomBytes(2048));
  assert.equal(big.view.buffer.byteLength, 2048);
  const empty = slabs.copy(new Uint8Array(0));
  assert.equal(empty.view.length, 0);
  slabs.free(empty);
  slabs.free(big);
});

for (const chunks of [10, 300]) {
  test(`LookupHashes, ${chunks} chunks: compacted hashes read the same, after free too`, () => {
    const packed = randomBytes(32 * chunks);
    const keep = Buffer.from(packed);
    const a = LookupHashes.of(packed);
    const k = chunks - 4;
    a.compact(k);
    packed.fill(0); // the borrowed bytes are no longer read
    assert.deepEqual(Buffer.from(a.packed), keep.subarray(0, 32 * k));
    assert.deepEqual(Buffer.from(a.view(2, 3)), keep.subarray(64, 160));
    assert.equal(a.at(5), keep.toString('hex', 160, 192));
    a.compact(k - 2);
    assert.equal(a.length, k - 2);
    a.free();
    a.free();
    const hex = Array.from({ length: k - 2 }, (_, i) => keep.toString('hex', 32 * i, 32 * i + 32));
    assert.deepEqual(a.hexSlice(), hex);
    assert.deepEqual(Buffer.from(a.view(0, k - 2)), keep.subarray(0, 32 * (k - 2)));

    // Compacted after it was freed (released before its answer settled): a copy of its own.
    const src = randomBytes(32 * chunks);
    const b = LookupHashes.of(src);
    b.free();
    b.compact(chunks);
    const copy = Buffer.from(src);
    src.fill(1);
    assert.deepEqual(Buffer.from(b.packed), copy);
  });
}
