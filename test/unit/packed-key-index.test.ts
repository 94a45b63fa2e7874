import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { describe, test } from 'node:test';
import { keyOfHash, PackedKeyIndex } from '../../src/backends/index/packed-key-index.ts';
import { LocalCpuBackend } from '../../src/backends/local-cpu/local-cpu-backend.ts';
import { type ChunkHash, chunkHashesFromPacked } from '../../src/hashing/chunk-hash.ts';

const NS = '0123456789abcdef0123456789abcdef';
const NS2 = 'fedcba9876543210fedcba9876543210';

interface Node {
  ns: string;
  key: Int32Array;
  keyNext: Node | null;
}

function cpu(): LocalCpuBackend {
  return new LocalCpuBackend({ capacityBytes: 64 * 4096, pageBytes: 4096 }, { name: 'cpu' });
}

describe('PackedKeyIndex', () => {
  test('finds entries by their bytes, namespace included; delete unlinks from the chain', () => {
    const packed = randomBytes(32 * 50);
    const hashes = chunkHashesFromPacked(packed);
    const index = new PackedKeyIndex<Node>();
    const nodes = hashes.map((h) => ({ ns: NS, key: keyOfHash(h), keyNext: null }));
    for (const n of nodes) index.add(n);
    const dv = new DataView(packed.buffer, packed.byteOffset, packed.byteLength);
    for (let i = 0; i < nodes.length; i++) assert.equal(index.find(NS, dv, i * 32), nodes[i]);
    assert.equal(index.find(NS2, dv, 0), undefined);
    for (let i = 0; i < nodes.length; i += 2) index.delete(nodes[i]!);
    for (let i = 0; i < nodes.length; i++)
      assert.equal(index.find(NS, dv, i * 32), i % 2 === 0 ? undefined : nodes[i]);
    const other = Buffer.from(packed.subarray(0, 32));
    other[31] = other[31]! ^ 1;
    assert.equal(index.find(NS, new DataView(other.buffer, other.byteOffset, 32), 0), undefined);
  });
});

describe('LocalCpuBackend.packedIndex', () => {
  test('counts and pins the same prefix as batchedContains; unpin matches unpin', async () => {
    const b = cpu();
    const packed = randomBytes(32 * 6);
    const hashes = chunkHashesFromPacked(packed);
    for (const h of hashes.slice(0, 4)) await b.put(NS, h, { tokens: 1, data: Buffer.alloc(10) });
    const idx = b.packedIndex;
    assert.equal(idx.contains(NS, packed, 0, 6, true), 4);
    assert.equal(idx.contains(NS, packed, 1, 2, false), 2);
    assert.equal(idx.contains(NS2, packed, 0, 6, true), 0);
    assert.equal(b.stats().pinnedChunks, 4);
    idx.unpin(NS, packed, 0, 6);
    assert.equal(b.stats().pinnedChunks, 0);
    idx.unpin(NS, packed, 0, 6); // unpinned hashes are ignored
    assert.equal(b.stats().pinnedChunks, 0);
    await b.close();
  });

  test('a chunk removed while pinned stays until its packed unpin', async () => {
    const b = cpu();
    const packed = randomBytes(32 * 2);
    const hashes = chunkHashesFromPacked(packed) as ChunkHash[];
    for (const h of hashes) await b.put(NS, h, { tokens: 1, data: Buffer.alloc(10) });
    assert.equal(b.packedIndex.contains(NS, packed, 0, 2, true), 2);
    assert.equal(await b.remove(NS, [hashes[0]!]), 1);
    assert.equal(b.packedIndex.contains(NS, packed, 0, 2, false), 0, 'removed from the index');
    const used = b.stats().bytesUsed;
    b.packedIndex.unpin(NS, packed, 0, 2);
    assert.equal(b.stats().pinnedChunks, 0);
    assert.ok(b.stats().bytesUsed < used, 'the orphan is freed on its unpin');
    await b.close();
  });

  test('pins taken with handles are released by handle, and by hash while an orphan exists', async () => {
    const b = cpu();
    const idx = b.packedIndex;
    const packed = randomBytes(32 * 3);
    const hashes = chunkHashesFromPacked(packed) as ChunkHash[];
    for (const h of hashes.slice(0, 2)) await b.put(NS, h, { tokens: 1, data: Buffer.alloc(10) });
    const handles: unknown[] = [];
    assert.equal(idx.containsPinned!(NS, packed, 0, 3, handles), 2);
    assert.equal(handles.length, 2, 'one handle per pinned chunk');
    assert.equal(b.stats().pinnedChunks, 2);
    assert.equal(idx.unpinHandles!(handles, 1, 1), true);
    assert.equal(b.stats().pinnedChunks, 1);
    assert.equal(idx.unpinHandles!(handles, 0, 1), true);
    assert.equal(b.stats().pinnedChunks, 0);
    assert.equal(idx.unpinHandles!(handles, 0, 2), true, 'unpinned handles are ignored');
    assert.equal(b.stats().pinnedChunks, 0);

    // A chunk removed while pinned (an orphan): handles cannot tell, the hashes are released.
    const again: unknown[] = [];
    assert.equal(idx.containsPinned!(NS, packed, 0, 2, again), 2);
    assert.equal(await b.remove(NS, [hashes[0]!]), 1);
    assert.equal(idx.unpinHandles!(again, 0, 2), false, 'nothing released while an orphan exists');
    assert.equal(b.stats().pinnedChunks, 2);
    idx.unpin(NS, packed, 0, 2);
    assert.equal(b.stats().pinnedChunks, 0, 'the orphan and the live chunk released by hash');
    await b.close();
    assert.throws(() => idx.unpinHandles!(again, 0, 2), { code: 'KVT_CLOSED' });
  });
});
