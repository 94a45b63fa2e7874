/**
 * The store contract's `cancellation` group: every call settles within the suite's bound once its
 * signal fires (already aborted, aborted at several points of a 4 MiB put or get, aborted while
 * the service is stalled), the store is consistent afterwards (each key holds its whole value or
 * none), and the store keeps no reference to a put's value once the call has settled: the
 * buffers are watched with a `FinalizationRegistry` and garbage collection is forced.
 */
import assert from 'node:assert/strict';
import { setTimeout as delay } from 'node:timers/promises';
import type { KvStore, StoreKey } from '../../../src/backends/store/kv-store.ts';
import {
  assertValue,
  attempt,
  bytesOf,
  MiB,
  noneOrWhole,
  Pattern,
  ReleaseWatch,
  randomKey,
  randomNs,
  type Settled,
  type StoreCtx,
  within,
} from './context.ts';

/** Size of the values of the abort tests. */
export const ABORT_VALUE_BYTES = 4 * MiB;

/** When the signal fires after the call starts; `null`: in the same turn, before any await. */
const PHASES: readonly (readonly [string, (() => Promise<unknown>) | null])[] = [
  ['at once', null],
  ['after a microtask', () => Promise.resolve()],
  ['after setImmediate', () => new Promise((r) => setImmediate(r))],
  ['after 1 ms', () => delay(1)],
  ['after 25 ms', () => delay(25)],
];

/** Starts a put of a fresh buffer holding `p`, watched; the caller keeps no reference to it. */
function startPut(
  store: KvStore,
  key: StoreKey,
  p: Pattern,
  watch: ReleaseWatch,
  what: string,
  signal?: AbortSignal,
): Promise<Settled<boolean>> {
  const value = p.make();
  watch.watch(value, what);
  return attempt(() => store.put(key, value, signal === undefined ? {} : { signal }));
}

/** Puts `p` under `key` (no signal) and expects true. */
async function stored(
  store: KvStore,
  key: StoreKey,
  p: Pattern,
  watch: ReleaseWatch,
  what: string,
) {
  const r = await startPut(store, key, p, watch, what);
  if (!r.ok) assert.fail(`${what}: rejected: ${String(r.error)}`);
  assert.equal(r.value, true, `${what}: put of a fresh key answered false`);
}

/** Starts `call` with a signal, fires it after `wait`, and expects a settlement within `ms`. */
async function aborted<T>(
  call: (signal: AbortSignal) => Promise<Settled<T>>,
  wait: (() => Promise<unknown>) | null,
  ms: number,
  what: string,
): Promise<Settled<T>> {
  const ac = new AbortController();
  const outcome = call(ac.signal);
  if (wait !== null) await wait();
  ac.abort();
  return within(outcome, ms, `${what} (aborted)`);
}

/** After an aborted put of a fresh key: resolved true means the value is there, whole. */
async function checkPut(
  store: KvStore,
  key: StoreKey,
  p: Pattern,
  r: Settled<boolean>,
  what: string,
) {
  const now = await store.get(key, {});
  if (r.ok) {
    assert.equal(r.value, true, `${what}: resolved false for a key no one wrote`);
    assertValue(now, p, `${what}: resolved true, then get`);
  } else noneOrWhole(now, [p], `${what}: rejected, then get`);
}

async function assertReleased(watch: ReleaseWatch, ms: number): Promise<void> {
  const held = await watch.held(ms);
  assert.deepEqual(
    held,
    [],
    `the store still holds ${held.length} put value(s) ${ms} ms after their calls settled: ${held.join('; ')}`,
  );
}

export async function abortedBefore({ store, settleMs }: StoreCtx): Promise<void> {
  const watch = new ReleaseWatch();
  const ns = randomNs();
  const key = randomKey(ns);
  const p = new Pattern(MiB + 1);
  await stored(store, key, p, watch, 'the stored value');
  const fresh = randomKey(ns);
  const fp = new Pattern(ABORT_VALUE_BYTES);
  const signal = AbortSignal.abort();
  const ops: [string, () => Promise<Settled<unknown>>][] = [
    ['get', () => attempt(() => store.get(key, { signal }))],
    ['has', () => attempt(() => store.has(key, { signal }))],
    ['put', () => startPut(store, fresh, fp, watch, 'put with an aborted signal', signal)],
    ['delete', () => attempt(() => store.delete(key, { signal }))],
  ];
  const rs = new Map<string, Settled<unknown>>();
  for (const [op, call] of ops)
    rs.set(op, await within(call(), settleMs, `${op} with an aborted signal`));
  const g = rs.get('get')!;
  if (g.ok) assertValue(g.value as Uint8Array | null, p, 'get with an aborted signal resolved');
  await checkPut(store, fresh, fp, rs.get('put') as Settled<boolean>, 'put with an aborted signal');
  noneOrWhole(await store.get(key, {}), [p], 'the stored key after an aborted delete');
  await assertReleased(watch, settleMs);
}

export async function abortedDuring({ store, settleMs }: StoreCtx): Promise<void> {
  const watch = new ReleaseWatch();
  const ns = randomNs();
  const kept = PHASES.map((_, i) => ({
    key: randomKey(ns),
    p: new Pattern(ABORT_VALUE_BYTES + i),
  }));
  for (const [i, k] of kept.entries()) await stored(store, k.key, k.p, watch, `stored value ${i}`);
  for (const [i, [name, wait]] of PHASES.entries()) {
    const key = randomKey(ns);
    const p = new Pattern(ABORT_VALUE_BYTES + 100 + i);
    const what = `a 4 MiB put aborted ${name}`;
    const r = await aborted((s) => startPut(store, key, p, watch, what, s), wait, settleMs, what);
    await checkPut(store, key, p, r, what);
    const k = kept[i]!;
    const gw = `a 4 MiB get aborted ${name}`;
    const g = await aborted(
      (s) => attempt(() => store.get(k.key, { signal: s })),
      wait,
      settleMs,
      gw,
    );
    if (g.ok) assertValue(g.value, k.p, `${gw}: resolved`);
  }
  for (const [i, k] of kept.entries())
    assertValue(await store.get(k.key, {}), k.p, `stored value ${i} after the aborted calls`);
  await assertReleased(watch, settleMs);
}

export async function abortedWhileStalled({ s, store, settleMs }: StoreCtx): Promise<void> {
  const watch = new ReleaseWatch();
  const ns = randomNs();
  const kept = { key: randomKey(ns), p: new Pattern(MiB + 5) };
  const doomed = { key: randomKey(ns), p: new Pattern(MiB + 9) };
  const fresh = { key: randomKey(ns), p: new Pattern(ABORT_VALUE_BYTES) };
  await stored(store, kept.key, kept.p, watch, 'the value read while stalled');
  await stored(store, doomed.key, doomed.p, watch, 'the value deleted while stalled');
  const calls: [string, (signal: AbortSignal) => Promise<Settled<unknown>>][] = [
    ['put', (sg) => startPut(store, fresh.key, fresh.p, watch, 'a put while stalled', sg)],
    ['get', (sg) => attempt(() => store.get(kept.key, { signal: sg }))],
    ['has', (sg) => attempt(() => store.has(kept.key, { signal: sg }))],
    ['delete', (sg) => attempt(() => store.delete(doomed.key, { signal: sg }))],
  ];
  const rs = new Map<string, Settled<unknown>>();
  await s.stall!();
  try {
    const acs = calls.map(() => new AbortController());
    const outcomes = calls.map(([, call], i) => call(acs[i]!.signal));
    // Time for the calls to reach the stalled service; the bound below starts at the abort.
    await delay(50);
    for (const ac of acs) ac.abort();
    for (const [i, [op]] of calls.entries())
      rs.set(op, await within(outcomes[i]!, settleMs, `${op} while the service is stalled`));
  } finally {
    await s.unstall!();
  }
  const g = rs.get('get')!;
  if (g.ok) assertValue(g.value as Uint8Array | null, kept.p, 'the get while stalled resolved');
  assertValue(await store.get(kept.key, {}), kept.p, 'the value read while stalled, afterwards');
  noneOrWhole(await store.get(doomed.key, {}), [doomed.p], 'the key deleted while stalled');
  await checkPut(
    store,
    fresh.key,
    fresh.p,
    rs.get('put') as Settled<boolean>,
    'a put while stalled',
  );
  await assertReleased(watch, settleMs);
  assert.ok(bytesOf(await store.get(kept.key, {})) !== null, 'the store serves after the stall');
}
