/**
 * The store contract's two-instance groups. `sharing` (a shared store, two live instances):
 * put-if-absent raced by both instances on many keys at once, and a change through one instance
 * seen by the other at once, round after round, both ways, with the key read on the other
 * instance before the change too (so that a cache there would answer from before it).
 * `persistence`: what one instance wrote, a fresh one reads after the first closed.
 */
import assert from 'node:assert/strict';
import type { KvStore, StoreKey } from '../../../src/backends/store/kv-store.ts';
import {
  assertValue,
  attempt,
  bytesOf,
  KiB,
  listed,
  noneOrWhole,
  Pattern,
  randomKey,
  randomNs,
  removedAnswer,
  type Settled,
  type StoreCtx,
} from './context.ts';

export async function racedPuts({ store, open, o }: StoreCtx): Promise<void> {
  const other = await open();
  const n = o.raceKeys ?? 32;
  const ns = randomNs();
  const keys = Array.from({ length: n }, () => randomKey(ns));
  // Values past one write's worth of bytes, so a put that writes in pieces can tear.
  const values = keys.map(() => [new Pattern(256 * KiB + 7), new Pattern(256 * KiB + 13)] as const);
  // Every put starts in this turn; the first of each pair alternates between the instances.
  const outcomes: Promise<[Settled<boolean>, Settled<boolean>]>[] = keys.map((key, i) => {
    const [a, b] = values[i]!;
    const byA = () => attempt(() => store.put(key, a.make(), {}));
    const byB = () => attempt(() => other.put(key, b.make(), {}));
    if (i % 2 === 0) {
      const pa = byA();
      return Promise.all([pa, byB()]);
    }
    const pb = byB();
    return Promise.all([byA(), pb]);
  });
  const settled = await Promise.all(outcomes);
  for (const [i, key] of keys.entries()) {
    const [ra, rb] = settled[i]!;
    for (const [who, r] of [['A', ra] as const, ['B', rb] as const])
      if (!r.ok) assert.fail(`key ${i}: the put through ${who} rejected: ${String(r.error)}`);
    const wins = [ra, rb].map((r) => r.ok && r.value === true);
    assert.equal(
      wins.filter(Boolean).length,
      1,
      `key ${i}: ${wins[0] && wins[1] ? 'both puts' : 'neither put'} answered true (A ${String(
        (ra as { value?: boolean }).value,
      )}, B ${String((rb as { value?: boolean }).value)}); exactly one must write`,
    );
    const winner = wins[0] ? 0 : 1;
    for (const [who, s] of [['A', store] as const, ['B', other] as const]) {
      const got = noneOrWhole(await s.get(key, {}), values[i]!, `key ${i} read through ${who}`);
      assert.ok(got >= 0, `key ${i} read through ${who}: null after both puts`);
      assert.equal(got, winner, `key ${i} read through ${who}: the value of the put that lost`);
    }
  }
}

/** What `reader` sees of `key`: get, has and (when it lists) the listing of its namespace. */
async function seen(
  reader: KvStore,
  key: StoreKey,
): Promise<{ bytes: Uint8Array | null; has: boolean; listed: boolean | undefined }> {
  const bytes = bytesOf(await reader.get(key, {}));
  const has = await reader.has(key, {});
  let inList: boolean | undefined;
  if (typeof reader.list === 'function') {
    const ns = key.slice(0, key.indexOf('/') + 1);
    inList = (await listed(reader, ns, 'list')).has(key);
  }
  return { bytes, has, listed: inList };
}

async function assertAbsent(reader: KvStore, key: StoreKey, what: string): Promise<void> {
  const s = await seen(reader, key);
  assert.equal(s.bytes, null, `${what}: get answered ${s.bytes?.byteLength} bytes`);
  assert.equal(s.has, false, `${what}: has answered true`);
  if (s.listed !== undefined) assert.equal(s.listed, false, `${what}: list shows the key`);
}

async function assertPresent(reader: KvStore, key: StoreKey, p: Pattern, what: string) {
  const s = await seen(reader, key);
  assertValue(s.bytes, p, `${what}: get`);
  assert.equal(s.has, true, `${what}: has answered false`);
  if (s.listed !== undefined) assert.equal(s.listed, true, `${what}: list misses the key`);
}

export async function visibility({ store, open, o }: StoreCtx): Promise<void> {
  const other = await open();
  const ns = randomNs();
  const rounds = o.visibilityRounds ?? 24;
  for (let r = 0; r < rounds; r++) {
    const [w, rd] = r % 2 === 0 ? [store, other] : [other, store];
    const [wn, rn] = r % 2 === 0 ? ['A', 'B'] : ['B', 'A'];
    const at = `round ${r + 1}, ${wn} writes, ${rn} reads`;
    const key = randomKey(ns);
    const first = new Pattern(KiB + r);
    const second = new Pattern(2 * KiB + r);
    await assertAbsent(rd, key, `${at}: before the put`);
    assert.equal(await w.put(key, first.make(), {}), true, `${at}: put through ${wn}`);
    await assertPresent(rd, key, first, `${at}: after the put`);
    assert.equal(
      await rd.put(key, second.make(), {}),
      false,
      `${at}: put through ${rn} of a key ${wn} wrote`,
    );
    const d = await w.delete(key, {});
    assert.ok(removedAnswer(d, first.bytes), `${at}: delete through ${wn} answered ${String(d)}`);
    await assertAbsent(rd, key, `${at}: after the delete`);
    assert.equal(
      await rd.put(key, second.make(), {}),
      true,
      `${at}: put through ${rn} of a key ${wn} deleted`,
    );
    await assertPresent(w, key, second, `${at}: ${wn} reads the value ${rn} put`);
    assert.notEqual(await rd.delete(key, {}), false, `${at}: delete through ${rn}`);
    await assertAbsent(w, key, `${at}: ${wn} after ${rn}'s delete`);
  }
}

export async function persistence({ store, open, close }: StoreCtx): Promise<void> {
  const keys = Array.from({ length: 4 }, () => randomKey());
  const values = keys.map((_, i) => new Pattern(i * 40 * KiB + 1));
  for (const [i, key] of keys.entries())
    assert.equal(await store.put(key, values[i]!.make(), {}), true, `put ${i}`);
  assert.notEqual(await store.delete(keys[3]!, {}), false, 'delete of the last key');
  await close(store);
  const fresh = await open();
  for (const [i, key] of keys.entries()) {
    if (i === 3) assert.equal(await fresh.has(key, {}), false, 'the deleted key stays deleted');
    else assertValue(await fresh.get(key, {}), values[i]!, `key ${i} read by a fresh instance`);
  }
}
