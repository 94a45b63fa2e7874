/**
 * A put whose caller stops waiting (its abort, the tier's deadline) while the store still writes:
 * the caller gets its abort error at once, and when the store's write lands after all it is in the
 * tier's stats (`chunks`, `bytesUsed`, `latePuts`) like any other; one that does not land is not.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { describe, it } from 'node:test';
import type { Chunk } from '../../src/backends/core/types.ts';
import { chunkObjectBytes } from '../../src/backends/format/chunk-format.ts';
import type { KvStore, StoreKey } from '../../src/backends/store/kv-store.ts';
import { StoreBackend } from '../../src/backends/store/store-backend.ts';
import { isKvtierError } from '../../src/errors.ts';
import { randomHashes } from '../support/fixtures.ts';

const NS = '0123456789abcdef0123456789abcdef';

/** A Map store whose puts wait until the test lets them finish (or fail). */
class GatedStore implements KvStore {
  readonly info = { persistent: false, shared: false, evicts: false, ttl: false };
  readonly values = new Map<StoreKey, Uint8Array>();
  readonly #gates: Array<(ok: boolean) => void> = [];
  get waiting(): number {
    return this.#gates.length;
  }
  /** Lets every waiting put write (`ok`) or fail. */
  finish(ok: boolean): void {
    for (const g of this.#gates.splice(0)) g(ok);
  }
  /** Lets the put that has waited longest write (`ok`) or fail. */
  finishOldest(ok: boolean): void {
    this.#gates.shift()?.(ok);
  }
  async get(key: StoreKey) {
    return this.values.get(key) ?? null;
  }
  async has(key: StoreKey) {
    return this.values.has(key);
  }
  /** Every put's own promise, settled or not. */
  readonly calls: Promise<boolean>[] = [];
  put(key: StoreKey, value: Uint8Array): Promise<boolean> {
    const call = this.#put(key, value);
    this.calls.push(call);
    return call;
  }
  async #put(key: StoreKey, value: Uint8Array): Promise<boolean> {
    const copy = Uint8Array.from(value);
    const ok = await new Promise<boolean>((r) => this.#gates.push(r));
    if (!ok) throw new Error('disk full');
    if (this.values.has(key)) return false;
    this.values.set(key, copy);
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

async function untilWaiting(store: GatedStore, n: number): Promise<void> {
  while (store.waiting < n) await new Promise((r) => setImmediate(r));
}

describe('StoreBackend: puts that land after their caller stopped waiting', () => {
  it('an aborted put the store then writes is counted in chunks, bytesUsed and latePuts', async () => {
    const store = new GatedStore();
    const b = await StoreBackend.started(new StoreBackend(store, { kind: 'gated' }, { name: 'g' }));
    const [h1, h2] = randomHashes(2);
    const ac = new AbortController();
    const put = b.put(NS, h1!, chunk(4096), { signal: ac.signal });
    await untilWaiting(store, 1);
    ac.abort();
    await assert.rejects(put, (e) => isKvtierError(e, 'KVT_ABORTED'));
    assert.equal(b.stats().chunks, 0, 'nothing landed yet');
    store.finish(true);
    await settled(store);
    assert.deepEqual(pick(b.stats()), {
      chunks: 1,
      bytesUsed: chunkObjectBytes(4096),
      latePuts: 1,
    });
    // The landed chunk reads back; a second put of it finds it.
    assert.equal((await b.batchedGet(NS, [h1!])).get(h1!)?.data.byteLength, 4096);
    const again = b.put(NS, h1!, chunk(4096));
    await untilWaiting(store, 1);
    store.finish(true);
    assert.equal(await again, 'exists');
    // A put that waits for its answer is not late.
    const normal = b.put(NS, h2!, chunk(1024));
    await untilWaiting(store, 1);
    store.finish(true);
    assert.equal(await normal, 'stored');
    assert.deepEqual(pick(b.stats()), {
      chunks: 2,
      bytesUsed: chunkObjectBytes(4096) + chunkObjectBytes(1024),
      latePuts: 1,
    });
    await b.close();
  });

  it('a put past the deadline that lands is counted; one that fails after its abort is not', async () => {
    const store = new GatedStore();
    const b = await StoreBackend.started(
      new StoreBackend(store, { kind: 'gated', timeoutMs: 20 }, { name: 'g' }),
    );
    const [h1, h2] = randomHashes(2);
    await assert.rejects(b.put(NS, h1!, chunk(2048)), (e) => isKvtierError(e, 'KVT_TIMEOUT'));
    const ac = new AbortController();
    const put2 = b.put(NS, h2!, chunk(2048), { signal: ac.signal });
    await untilWaiting(store, 2);
    ac.abort();
    await assert.rejects(put2, (e) => isKvtierError(e, 'KVT_ABORTED'));
    // h1 lands, h2's write fails: only h1 counts.
    store.finishOldest(true);
    store.finishOldest(false);
    await settled(store);
    assert.deepEqual(pick(b.stats()), {
      chunks: 1,
      bytesUsed: chunkObjectBytes(2048),
      latePuts: 1,
    });
    assert.equal(store.values.size, 1);
    await b.close();
  });
});

function pick(s: ReturnType<StoreBackend['stats']>) {
  return { chunks: s.chunks, bytesUsed: s.bytesUsed, latePuts: s.latePuts };
}

/** Once every store put has settled and its answer has been taken in. */
async function settled(store: GatedStore): Promise<void> {
  await Promise.allSettled(store.calls);
  await new Promise((r) => setImmediate(r));
}

describe('StoreBackend refuses what is not a KvStore', () => {
  it('names what is missing: info flags, methods, list or clear', () => {
    const bad = {
      info: { persistent: false, shared: 'no', evicts: false },
      get: async () => null,
      put: async () => true,
      has: async () => false,
      delete: async () => false,
    } as unknown as KvStore;
    assert.throws(
      () => new StoreBackend(bad, { kind: 'bad' }, { name: 'b' }),
      (e: unknown) =>
        isKvtierError(e, 'KVT_INVALID_ARGUMENT') &&
        /the bad store is not a KvStore/.test(e.message) &&
        /info\.shared is not a boolean/.test(e.message) &&
        /info\.ttl is not a boolean/.test(e.message) &&
        /missing methods: close/.test(e.message) &&
        /neither list nor clear/.test(e.message),
    );
    // With list (or clear) and close it is one.
    const good = Object.assign(Object.create(null), bad, {
      info: { persistent: false, shared: false, evicts: false, ttl: false },
      close: async () => {},
      list: async function* () {},
    }) as KvStore;
    assert.doesNotThrow(() => new StoreBackend(good, { kind: 'good' }, { name: 'g' }));
  });
});
