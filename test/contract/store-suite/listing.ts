/**
 * The store contract's `listing` group: `list` is called whenever the store has it (a `clear` of
 * its own does not excuse a listing that misses keys), and `count` and `clear` are checked
 * against what was put.
 */
import assert from 'node:assert/strict';
import type { NamespaceId } from '../../../src/backends/core/types.ts';
import { type KvStore, type StoreKey, storeKey } from '../../../src/backends/store/kv-store.ts';
import { bytesOf, KiB, listed, Pattern, randomHash, randomNs, type StoreCtx } from './context.ts';

/** Keys put in the first namespace: more than a small page of a paged listing. */
const KEYS_PER_NS = 37;

interface Space {
  readonly ns: NamespaceId;
  /** Key → value size. */
  readonly keys: Map<StoreKey, number>;
}

/** Puts `n` values of varied sizes (0 bytes included) under a fresh namespace. */
async function fillSpace(store: KvStore, n: number): Promise<Space> {
  const ns = randomNs();
  const keys = new Map<StoreKey, number>();
  for (let i = 0; i < n; i++) {
    const key = storeKey(ns, randomHash());
    const bytes = i === 0 ? 0 : (i * 7919) % (64 * KiB);
    assert.equal(await store.put(key, new Pattern(bytes).make(), {}), true, `put ${i}`);
    keys.set(key, bytes);
  }
  return { ns, keys };
}

function tally(s: Space): { keys: number; bytes: number } {
  return { keys: s.keys.size, bytes: [...s.keys.values()].reduce((a, b) => a + b, 0) };
}

/** Fails unless the listing of `<ns>/` is exactly `s`, sizes matching where the store gives them. */
function sameListing(got: Map<string, number | undefined>, s: Space, what: string): void {
  for (const [key, bytes] of s.keys) {
    assert.ok(got.has(key), `${what}: ${key} (${bytes} bytes) is not listed`);
    const size = got.get(key);
    if (size !== undefined) assert.equal(size, bytes, `${what}: the size listed for ${key}`);
  }
  for (const key of got.keys())
    assert.ok(s.keys.has(key as StoreKey), `${what}: ${key} is listed but was never put`);
}

export async function listKeys({ store }: StoreCtx): Promise<void> {
  const a = await fillSpace(store, KEYS_PER_NS);
  const b = await fillSpace(store, 3);
  sameListing(await listed(store, `${a.ns}/`, 'list(ns a)'), a, 'list(ns a)');
  sameListing(await listed(store, `${b.ns}/`, 'list(ns b)'), b, 'list(ns b)');
  const all = await listed(store, '', 'list("")');
  for (const s of [a, b])
    for (const [key] of s.keys) assert.ok(all.has(key), `list(""): ${key} is not listed`);
  const gone = [...a.keys.keys()].filter((_, i) => i % 5 === 0);
  for (const key of gone) {
    assert.notEqual(await store.delete(key, {}), false, `delete of ${key}`);
    a.keys.delete(key);
  }
  sameListing(await listed(store, `${a.ns}/`, 'list after deletes'), a, 'list after deletes');
  assert.equal((await listed(store, `${randomNs()}/`, 'list(empty ns)')).size, 0, 'empty ns');
}

export async function countKeys({ store }: StoreCtx): Promise<void> {
  const a = await fillSpace(store, 12);
  const b = await fillSpace(store, 2);
  assert.deepEqual(await store.count!(`${a.ns}/`, {}), tally(a), 'count(ns a)');
  assert.deepEqual(await store.count!(`${b.ns}/`, {}), tally(b), 'count(ns b)');
  assert.deepEqual(
    await store.count!(`${randomNs()}/`, {}),
    { keys: 0, bytes: 0 },
    'count(empty ns)',
  );
  const all = await store.count!('', {});
  assert.ok(
    all.keys >= a.keys.size + b.keys.size && all.bytes >= tally(a).bytes + tally(b).bytes,
    `count(""): ${JSON.stringify(all)} is less than was put`,
  );
}

export async function clearSpaces({ store }: StoreCtx): Promise<void> {
  const a = await fillSpace(store, 12);
  const b = await fillSpace(store, 3);
  assert.deepEqual(await store.clear!(`${a.ns}/`, {}), tally(a), 'clear(ns a) tally');
  for (const key of a.keys.keys()) {
    assert.equal(bytesOf(await store.get(key, {})), null, `get after clear(ns a): ${key}`);
    assert.equal(await store.has(key, {}), false, `has after clear(ns a): ${key}`);
  }
  for (const key of b.keys.keys())
    assert.equal(await store.has(key, {}), true, `clear(ns a) removed ${key} of ns b`);
  const rest = await store.clear!('', {});
  assert.ok(rest.keys >= b.keys.size, `clear(""): tallied ${rest.keys} keys`);
  for (const key of b.keys.keys())
    assert.equal(await store.has(key, {}), false, `has after clear(""): ${key}`);
  const key = [...a.keys.keys()][0]!;
  assert.equal(await store.put(key, new Pattern(5).make(), {}), true, 'put after clear');
}
