/**
 * The store contract's `atomicity` group, within one instance: concurrent puts of one key leave
 * one whole value and exactly one `true`, and reads while a 32 MiB put is in flight see nothing
 * or the whole value, never part of it.
 */
import assert from 'node:assert/strict';
import {
  assertValue,
  attempt,
  KiB,
  MiB,
  noneOrWhole,
  Pattern,
  randomKey,
  type StoreCtx,
} from './context.ts';

/** Puts of one key started at once by {@link concurrentPuts}. */
const CONCURRENT_PUTS = 16;
export const LARGE_VALUE_BYTES = 32 * MiB;

export async function concurrentPuts({ store }: StoreCtx): Promise<void> {
  const key = randomKey();
  const values = Array.from({ length: CONCURRENT_PUTS }, (_, i) => new Pattern(128 * KiB + i));
  const rs = await Promise.all(values.map((p) => attempt(() => store.put(key, p.make(), {}))));
  for (const [i, r] of rs.entries())
    if (!r.ok) assert.fail(`put ${i} of ${CONCURRENT_PUTS} rejected: ${String(r.error)}`);
  const winners = rs.flatMap((r, i) => (r.ok && r.value === true ? [i] : []));
  assert.equal(
    winners.length,
    1,
    `${winners.length} of ${CONCURRENT_PUTS} concurrent puts of one key answered true`,
  );
  const got = noneOrWhole(await store.get(key, {}), values, 'the value after the puts');
  assert.equal(got, winners[0], 'the value kept is not the one whose put answered true');
}

export async function readsDuringLargePut({ store }: StoreCtx): Promise<void> {
  const key = randomKey();
  const p = new Pattern(LARGE_VALUE_BYTES);
  let done = false;
  const put = attempt(() => store.put(key, p.make(), {})).finally(() => {
    done = true;
  });
  let reads = 0;
  // Reads start in the turn the put starts and go on until it settles.
  while (!done) {
    const [v, h] = await Promise.all([
      attempt(() => store.get(key, {})),
      attempt(() => store.has(key, {})),
    ]);
    reads++;
    if (!v.ok) assert.fail(`get ${reads} during the put rejected: ${String(v.error)}`);
    if (!h.ok) assert.fail(`has ${reads} during the put rejected: ${String(h.error)}`);
    noneOrWhole(v.value, [p], `get ${reads} during the put`);
  }
  const r = await put;
  if (!r.ok) assert.fail(`the 32 MiB put rejected: ${String(r.error)}`);
  assert.equal(r.value, true, 'the 32 MiB put of a fresh key answered false');
  assert.equal(await store.has(key, {}), true, 'has after the put');
  assertValue(await store.get(key, {}), p, 'get after the put');
}
