/**
 * The store contract's lifecycle (close settles, with calls in flight too, and every call after
 * it rejects) and its `ttl` group (a value put with `ttlMs` is gone after it; others stay).
 */
import assert from 'node:assert/strict';
import { setTimeout as delay } from 'node:timers/promises';
import type { KvStore } from '../../../src/backends/store/kv-store.ts';
import { scaledMs } from '../suite/context.ts';
import {
  assertValue,
  attempt,
  bytesOf,
  KiB,
  MiB,
  Pattern,
  randomKey,
  randomNs,
  type Settled,
  type StoreCtx,
  within,
} from './context.ts';

/** Every call of `store`, each once, as the suite makes it after close. */
function everyCall(store: KvStore): [string, () => Promise<unknown>][] {
  const key = randomKey();
  const calls: [string, () => Promise<unknown>][] = [
    ['get', () => store.get(key, {})],
    ['has', () => store.has(key, {})],
    ['put', () => store.put(key, new Pattern(KiB).make(), {})],
    ['delete', () => store.delete(key, {})],
  ];
  const list = store.list;
  if (typeof list === 'function')
    calls.push([
      'list',
      async () => {
        for await (const _ of list.call(store, '', {})) return;
      },
    ]);
  if (typeof store.clear === 'function') calls.push(['clear', () => store.clear!('', {})]);
  if (typeof store.count === 'function') calls.push(['count', () => store.count!('', {})]);
  return calls;
}

export async function callsAfterClose({ store, close, settleMs }: StoreCtx): Promise<void> {
  const key = randomKey();
  assert.equal(await store.put(key, new Pattern(100).make(), {}), true, 'put before close');
  await close(store);
  for (const [op, call] of everyCall(store)) {
    const r = await within(attempt(call), settleMs, `${op} after close`);
    assert.ok(!r.ok, `${op} after close resolved; it must reject`);
  }
}

export async function closeInFlight({ store, close, settleMs }: StoreCtx): Promise<void> {
  const ns = randomNs();
  const kept = { key: randomKey(ns), p: new Pattern(4 * MiB) };
  assert.equal(await store.put(kept.key, kept.p.make(), {}), true, 'put before close');
  const fresh = { key: randomKey(ns), p: new Pattern(4 * MiB + 1) };
  const inFlight: [string, Promise<Settled<unknown>>][] = [
    ['get', attempt(() => store.get(kept.key, {}))],
    ['has', attempt(() => store.has(kept.key, {}))],
    ['put', attempt(() => store.put(fresh.key, fresh.p.make(), {}))],
  ];
  await close(store);
  for (const [op, outcome] of inFlight) {
    const r = await within(outcome, settleMs, `a ${op} in flight when close was called`);
    if (r.ok && op === 'get')
      assertValue(r.value as Uint8Array | null, kept.p, 'the get in flight');
  }
}

/** TTLs of the `ttl` group: one that passes during the test, one that does not. */
export const SHORT_TTL_MS = 300;
const LONG_TTL_MS = 600_000;

export async function ttlExpiry({ store, o }: StoreCtx): Promise<void> {
  const ns = randomNs();
  const short = { key: randomKey(ns), p: new Pattern(KiB) };
  const long = { key: randomKey(ns), p: new Pattern(KiB + 1) };
  const none = { key: randomKey(ns), p: new Pattern(KiB + 2) };
  assert.equal(await store.put(short.key, short.p.make(), { ttlMs: SHORT_TTL_MS }), true, 'short');
  assert.equal(await store.put(long.key, long.p.make(), { ttlMs: LONG_TTL_MS }), true, 'long');
  assert.equal(await store.put(none.key, none.p.make(), {}), true, 'put without a TTL');
  const until = Date.now() + SHORT_TTL_MS + scaledMs(o.ttlSlackMs ?? 5000);
  for (;;) {
    const gone =
      bytesOf(await store.get(short.key, {})) === null && !(await store.has(short.key, {}));
    if (gone) break;
    if (Date.now() >= until)
      assert.fail(`a value put with ttlMs ${SHORT_TTL_MS} is still there past its TTL and slack`);
    await delay(50);
  }
  assertValue(await store.get(long.key, {}), long.p, `a value with ttlMs ${LONG_TTL_MS}`);
  assertValue(await store.get(none.key, {}), none.p, 'a value without a TTL');
  const again = new Pattern(KiB + 3);
  assert.equal(await store.put(short.key, again.make(), {}), true, 'put over an expired value');
  assertValue(await store.get(short.key, {}), again, 'the value put over an expired one');
}
