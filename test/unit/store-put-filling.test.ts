/**
 * A store with `putFilling` gets the value while the wrapper still encodes it: it reads the value
 * only once `filled` resolves, and may answer before that (the key exists). The wrapper must not
 * hand the buffer to another put until the encoder is done with it, and must store whole objects.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { describe, it } from 'node:test';
import type { Chunk, ChunkHash } from '../../src/backends/core/types.ts';
import type { KvStore, StoreKey, StorePutOptions } from '../../src/backends/store/kv-store.ts';
import { StoreBackend } from '../../src/backends/store/store-backend.ts';
import { randomHashes } from '../support/fixtures.ts';

const NS = '0123456789abcdef0123456789abcdef';

/** A Map store whose puts go through `putFilling` (its plain `put` fails the test). */
class FillingStore implements KvStore {
  readonly info = { persistent: false, shared: false, evicts: false, ttl: false };
  readonly values = new Map<StoreKey, Uint8Array>();
  /** Keys `putFilling` answers "exists" for at once, before the value is filled. */
  readonly present = new Set<StoreKey>();
  fillingCalls = 0;
  /** Buffers whose encode has not finished, and how often such a buffer came back in a put. */
  readonly encoding = new Set<ArrayBufferLike>();
  reusedWhileEncoding = 0;
  async get(key: StoreKey) {
    return this.values.get(key) ?? null;
  }
  async has(key: StoreKey) {
    return this.values.has(key) || this.present.has(key);
  }
  async put(): Promise<boolean> {
    throw new Error('put called although putFilling exists');
  }
  async putFilling(key: StoreKey, value: Uint8Array, filled: Promise<void>, _o: StorePutOptions) {
    this.fillingCalls++;
    if (this.encoding.has(value.buffer)) this.reusedWhileEncoding++;
    this.encoding.add(value.buffer);
    filled.then(
      () => this.encoding.delete(value.buffer),
      () => this.encoding.delete(value.buffer),
    );
    if (this.present.has(key) || this.values.has(key)) return false;
    await filled;
    this.values.set(key, Uint8Array.from(value));
    return true;
  }
  async delete(key: StoreKey) {
    return this.values.delete(key);
  }
  async *list(prefix: string) {
    for (const key of this.values.keys()) if (key.startsWith(prefix)) yield { key };
  }
  async close() {}
}

const chunk = (bytes: number): Chunk => ({ tokens: 16, data: randomBytes(bytes) });
const same = (a: Uint8Array | undefined, b: Uint8Array) =>
  a !== undefined && Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(b);

describe('StoreBackend over a store with putFilling', () => {
  it('stores whole objects that read back byte-exact', async () => {
    const store = new FillingStore();
    const b = new StoreBackend(store, { kind: 'filling' }, { name: 'f' });
    await b.start();
    const hashes = randomHashes(6);
    const chunks = hashes.map(() => chunk(2 * 1024 * 1024));
    const outcomes = await Promise.all(hashes.map((h, i) => b.put(NS, h, chunks[i]!)));
    assert.deepEqual(outcomes, Array(6).fill('stored'));
    assert.equal(store.fillingCalls, 6);
    const got = await b.batchedGet(NS, hashes);
    for (const [i, h] of hashes.entries())
      assert.ok(same(got.get(h)?.data, chunks[i]!.data), `chunk ${i} read back byte-exact`);
    await b.close();
  });

  it('an "exists" answered before the encode ends does not free the buffer under the encoder', async () => {
    const store = new FillingStore();
    const b = new StoreBackend(store, { kind: 'filling' }, { name: 'f' });
    await b.start();
    const size = 8 * 1024 * 1024;
    for (let round = 0; round < 8; round++) {
      const [known, fresh] = randomHashes(2) as [ChunkHash, ChunkHash];
      store.present.add(`${NS}/${known}` as StoreKey);
      const c = chunk(size);
      // The first put is answered "exists" at once; the second, of the same size, asks the pool
      // for a buffer right after, while the first one's encode may still be writing into its own.
      assert.equal(await b.put(NS, known, chunk(size)), 'exists');
      assert.equal(await b.put(NS, fresh, c), 'stored');
      const got = await b.batchedGet(NS, [fresh]);
      assert.ok(same(got.get(fresh)?.data, c.data), `round ${round}: the object read back whole`);
      assert.equal(b.stats().corruptObjects, 0);
    }
    assert.equal(store.reusedWhileEncoding, 0, 'a buffer came back while still being encoded');
    await b.close();
  });
});
