/**
 * The store contract's basics: what `info` declares, misses, round trips from 0 bytes to 8 MiB,
 * put-if-absent, delete's answers, keys one byte apart, the optional CRC of a get, and that the
 * store can clear a namespace.
 */
import assert from 'node:assert/strict';
import { CHECKSUM_CRC32C, payloadChecksum } from '../../../src/backends/format/checksum.ts';
import { storeKey } from '../../../src/backends/store/kv-store.ts';
import { chunkHash } from '../../../src/hashing/chunk-hash.ts';
import {
  assertValue,
  bytesOf,
  KiB,
  MiB,
  Pattern,
  randomHash,
  randomKey,
  randomNs,
  removedAnswer,
  type StoreCtx,
} from './context.ts';

/** Value sizes of the round trip: empty, tiny, odd, around a page, past a MiB, several MiB. */
export const ROUND_TRIP_BYTES = [0, 1, 97, 4 * KiB, 64 * KiB + 1, MiB + 3, 8 * MiB + 5] as const;

export async function infoFlags({ store }: StoreCtx): Promise<void> {
  const info = store.info as unknown as Record<string, unknown> | undefined;
  assert.ok(info !== null && typeof info === 'object', 'the store has no info object');
  for (const flag of ['persistent', 'shared', 'evicts', 'ttl'])
    assert.equal(typeof info[flag], 'boolean', `info.${flag} must be a boolean`);
}

export async function canClear({ store }: StoreCtx): Promise<void> {
  assert.ok(
    typeof store.list === 'function' || typeof store.clear === 'function',
    'the store has neither list nor clear: a namespace cannot be cleared',
  );
}

export async function absentKey({ store }: StoreCtx): Promise<void> {
  const key = randomKey();
  assert.equal(bytesOf(await store.get(key, {})), null, 'get of an absent key');
  assert.equal(await store.has(key, {}), false, 'has of an absent key');
  assert.equal(await store.delete(key, {}), false, 'delete of an absent key');
}

export async function roundTrip({ store }: StoreCtx): Promise<void> {
  const ns = randomNs();
  for (const bytes of ROUND_TRIP_BYTES) {
    const key = storeKey(ns, randomHash());
    const p = new Pattern(bytes);
    const value = p.make();
    assert.equal(await store.put(key, value, {}), true, `put of ${bytes} bytes`);
    // The wrapper reuses a put's buffer once the put resolves: the store must not read it again.
    value.fill(0x5a);
    assert.equal(await store.has(key, {}), true, `has after a put of ${bytes} bytes`);
    assertValue(await store.get(key, {}), p, `get of ${bytes} bytes`);
    assertValue(
      await store.get(key, { maxBytes: bytes, crc32cFrom: 0 }),
      p,
      `get of ${bytes} bytes with hints`,
    );
  }
}

export async function putIfAbsent({ store }: StoreCtx): Promise<void> {
  const key = randomKey();
  const first = new Pattern(4 * KiB);
  const second = new Pattern(4 * KiB);
  const shorter = new Pattern(0);
  assert.equal(await store.put(key, first.make(), {}), true, 'first put');
  assert.equal(await store.put(key, second.make(), {}), false, 'put of an existing key');
  assert.equal(await store.put(key, shorter.make(), {}), false, 'empty put of an existing key');
  assertValue(await store.get(key, {}), first, 'the first value is kept');
}

export async function deleteAnswers({ store }: StoreCtx): Promise<void> {
  const ns = randomNs();
  for (const bytes of [0, 97, 64 * KiB + 1]) {
    const key = storeKey(ns, randomHash());
    assert.equal(await store.put(key, new Pattern(bytes).make(), {}), true, `put of ${bytes}`);
    const d = await store.delete(key, {});
    assert.ok(
      removedAnswer(d, bytes),
      `delete of a ${bytes}-byte value answered ${String(d)}; expected ${bytes} or true`,
    );
    assert.equal(bytesOf(await store.get(key, {})), null, `get after delete (${bytes})`);
    assert.equal(await store.has(key, {}), false, `has after delete (${bytes})`);
    assert.equal(await store.delete(key, {}), false, `second delete (${bytes})`);
    const again = new Pattern(bytes + 1);
    assert.equal(await store.put(key, again.make(), {}), true, `put after delete (${bytes})`);
    assertValue(await store.get(key, {}), again, `get of the value put after delete (${bytes})`);
  }
}

/** Hex digit `i` of `hash` changed: a key one byte (one nibble) apart. */
function flip(hash: string, i: number): string {
  const c = hash[i] === '0' ? '1' : '0';
  return hash.slice(0, i) + c + hash.slice(i + 1);
}

export async function oneByteApart({ store }: StoreCtx): Promise<void> {
  const ns = randomNs();
  const other = randomNs();
  const base = randomHash();
  const keys = [
    storeKey(ns, base),
    storeKey(ns, chunkHash(flip(base, 0))),
    storeKey(ns, chunkHash(flip(base, 31))),
    storeKey(ns, chunkHash(flip(base, 63))),
    storeKey(other, base),
  ];
  const values = keys.map(() => new Pattern(KiB + 3));
  for (const [i, key] of keys.entries())
    assert.equal(await store.put(key, values[i]!.make(), {}), true, `put of key ${i}`);
  for (const [i, key] of keys.entries())
    assertValue(await store.get(key, {}), values[i]!, `key ${i} (${key})`);
  assert.notEqual(await store.delete(keys[0]!, {}), false, 'delete of the first key');
  for (const [i, key] of keys.entries())
    assert.equal(await store.has(key, {}), i !== 0, `has of key ${i} after deleting the first`);
}

export async function storedCrc({ store }: StoreCtx): Promise<void> {
  const key = randomKey();
  const p = new Pattern(300 * KiB + 11);
  assert.equal(await store.put(key, p.make(), {}), true, 'put');
  for (const from of [0, 128, p.bytes]) {
    const v = await store.get(key, { crc32cFrom: from });
    assertValue(v, p, `get with crc32cFrom ${from}`);
    if (v instanceof Uint8Array || v === null || v.crc32c === undefined) continue;
    const want = Number(payloadChecksum(CHECKSUM_CRC32C, v.bytes.subarray(from)));
    assert.equal(v.crc32c, want, `crc32c of the bytes from ${from}`);
  }
}
