import assert from 'node:assert/strict';
import { randomFillSync } from 'node:crypto';
import { describe, it } from 'node:test';
import {
  copyHostBytes,
  copyHostBytesSliced,
  HOST_COPY_SYNC_MAX_BYTES,
} from '../../src/backends/arena/host-copy.ts';
import { LocalCpuBackend } from '../../src/backends/local-cpu/local-cpu-backend.ts';
import { isKvtierError } from '../../src/errors.ts';
import { chunkHash } from '../../src/hashing/chunk-hash.ts';

const MiB = 1024 * 1024;
const NS = 'c'.repeat(32);
const LARGE = HOST_COPY_SYNC_MAX_BYTES + 3 * MiB + 123;

function random(bytes: number): Uint8Array {
  return randomFillSync(new Uint8Array(bytes));
}

/** Explicit messages: a bare assert.ok failure makes Node re-read the .ts source. */
function assertSame(a: Uint8Array, b: Uint8Array): void {
  assert.equal(a.byteLength, b.byteLength, 'lengths differ');
  assert.equal(Buffer.compare(a, b), 0, 'bytes differ');
}

describe('copyHostBytes', () => {
  it('copies a small buffer before it returns', () => {
    const src = random(HOST_COPY_SYNC_MAX_BYTES);
    const dst = new Uint8Array(src.byteLength + 7);
    assert.equal(copyHostBytes(src, dst), undefined);
    assertSame(dst.subarray(0, src.byteLength), src);
  });

  it('copies a large buffer off the event loop, all of it', async () => {
    const src = random(LARGE);
    const dst = new Uint8Array(LARGE);
    const pending = copyHostBytes(src, dst);
    assert.ok(pending instanceof Promise, 'a large copy returns a promise');
    await pending;
    assertSame(dst, src);
  });

  it('copies in slices across turns without the addon, views of one buffer at once', async () => {
    const src = random(LARGE);
    const dst = new Uint8Array(LARGE + 1);
    await copyHostBytesSliced(src, dst.subarray(1));
    assertSame(dst.subarray(1), src);
    const both = random(LARGE + MiB);
    const expect = Buffer.from(both.subarray(0, LARGE));
    await copyHostBytesSliced(both.subarray(0, LARGE), both.subarray(MiB));
    assertSame(both.subarray(MiB), expect);
  });

  it('refuses a destination that is too short', () => {
    assert.throws(() => copyHostBytes(random(8), new Uint8Array(4)), RangeError);
  });
});

describe('LocalCpuBackend puts of large chunks', () => {
  const cpu = () =>
    new LocalCpuBackend({ capacityBytes: 64 * MiB, pageBytes: MiB }, { name: 'cpu' });

  it('stores the bytes exactly, and a concurrent put of the same key finds it stored', async () => {
    const b = cpu();
    const data = random(LARGE);
    const hash = chunkHash('ab'.repeat(32));
    const outcomes = await Promise.all([
      b.put(NS, hash, { tokens: 256, data }),
      b.put(NS, hash, { tokens: 256, data }, { pin: true }),
    ]);
    assert.deepEqual([...outcomes].sort(), ['exists', 'stored']);
    const got = (await b.batchedGet(NS, [hash])).get(hash);
    assertSame(got!.data, data);
    const s = b.stats();
    assert.equal(s.chunks, 1);
    assert.equal(s.pinnedChunks, 1);
    assert.equal(s.bytesUsed, Math.ceil(LARGE / MiB) * MiB, 'the losing copy was freed');
    await b.close();
  });

  it('rejects a put still copying when the tier closes, with KVT_CLOSED', async () => {
    const b = cpu();
    const pending = b.put(NS, chunkHash('cd'.repeat(32)), { tokens: 256, data: random(LARGE) });
    await b.close();
    await assert.rejects(pending, (err) => isKvtierError(err) && err.code === 'KVT_CLOSED');
  });
});
