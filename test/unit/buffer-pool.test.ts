import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { BufferPool } from '../../src/backends/arena/buffer-pool.ts';

describe('BufferPool', () => {
  it('hands back a released buffer of the same size, and a new one of another size', () => {
    const pool = new BufferPool(4, 1024);
    const a = pool.acquire(100);
    pool.release(a);
    assert.equal(pool.pooledBytes, 100);
    assert.equal(pool.acquire(100), a);
    assert.equal(pool.pooledBytes, 0);
    assert.notEqual(pool.acquire(100), a);
    assert.equal(pool.acquire(50).byteLength, 50);
  });

  it('keeps at most maxPerSize idle buffers of one size', () => {
    const pool = new BufferPool(2, 1 << 20);
    for (const b of [pool.acquire(10), pool.acquire(10), pool.acquire(10)]) pool.release(b);
    assert.equal(pool.pooledBytes, 20);
  });

  it('drops idle buffers of the sizes released least recently to make room for another size', () => {
    const pool = new BufferPool(8, 400);
    const small = [pool.acquire(100), pool.acquire(100)];
    const mid = pool.acquire(50);
    for (const b of small) pool.release(b);
    pool.release(mid);
    assert.equal(pool.pooledBytes, 250);
    // 250 + 300 is over the bound: the 100-byte buffers (released first) go, not the 50-byte one.
    const big = pool.acquire(300);
    pool.release(big);
    assert.equal(pool.pooledBytes, 350);
    assert.equal(pool.acquire(300), big);
    assert.equal(pool.acquire(50), mid);
    assert.equal(pool.pooledBytes, 0);
  });

  it('keeps the buffers of the size in use when the bound is reached by that size alone', () => {
    const pool = new BufferPool(8, 250);
    const bufs = [pool.acquire(100), pool.acquire(100), pool.acquire(100)];
    for (const b of bufs) pool.release(b);
    assert.equal(pool.pooledBytes, 200);
    assert.equal(pool.acquire(100), bufs[1]);
  });

  it('never keeps a buffer larger than the bound, and clear drops everything', () => {
    const pool = new BufferPool(4, 100);
    pool.release(pool.acquire(10));
    pool.release(pool.acquire(200));
    assert.equal(pool.pooledBytes, 10);
    pool.clear();
    assert.equal(pool.pooledBytes, 0);
  });
});
