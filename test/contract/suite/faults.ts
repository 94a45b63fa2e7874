/** The contract's fault tests: cancellation (signals, the breaker over a stalled backend) and outage. */
import assert from 'node:assert/strict';
import { setTimeout as delay } from 'node:timers/promises';
import { CircuitBreakerBackend } from '../../../src/backends/core/circuit-breaker.ts';
import type { ChunkHash, NamespaceId, StorageBackend } from '../../../src/backends/core/types.ts';
import { isKvtierError, type KvtierErrorCode } from '../../../src/errors.ts';
import {
  assertChunk,
  assertKvtierError,
  type Ctx,
  KiB,
  makeChunk,
  randomHash,
  randomHashes,
  randomNs,
  SMALL_BYTES,
  scaledMs,
  settle,
} from './context.ts';

// ---- cancellation ----

export const SIGNALLED = [
  'batchedContains',
  'batchedContains with pin',
  'batchedGet',
  'put',
] as const;

/** Calls `op` of `b` with `signal` on chunks of `ns`; `hs` are stored, `fresh` is not. */
export function signalled(
  b: StorageBackend,
  op: (typeof SIGNALLED)[number],
  ns: NamespaceId,
  hs: readonly ChunkHash[],
  fresh: ChunkHash,
  signal: AbortSignal,
): Promise<unknown> {
  switch (op) {
    case 'batchedContains':
      return b.batchedContains(ns, hs, { signal });
    case 'batchedContains with pin':
      return b.batchedContains(ns, hs, { pin: true, signal });
    case 'batchedGet':
      return b.batchedGet(ns, hs, { signal });
    case 'put':
      return b.put(ns, fresh, makeChunk(SMALL_BYTES), { signal });
  }
}

export function abortedBefore(
  reason: () => unknown,
  code: KvtierErrorCode,
): (c: Ctx) => Promise<void> {
  return async ({ b, o }) => {
    const ns = randomNs();
    const hs = randomHashes(2);
    for (const h of hs) assert.equal(await b.put(ns, h, makeChunk(4 * KiB)), 'stored');
    const pinned = b.stats().pinnedChunks;
    for (const op of SIGNALLED) {
      const fresh = randomHash();
      const r = await settle(
        () => signalled(b, op, ns, hs, fresh, AbortSignal.abort(reason())),
        scaledMs(o.abortSettleMs ?? 1000),
        `${op} with an aborted signal`,
      );
      assert.ok(!r.ok, `${op} with an aborted signal resolved; it must reject with ${code}`);
      assert.ok(isKvtierError(r.error, code), `${op}: expected ${code}, got ${String(r.error)}`);
      assert.equal(await b.batchedContains(ns, [fresh]), 0, `${op}: nothing was stored`);
    }
    assert.equal(b.stats().pinnedChunks, pinned, 'an aborted contains pins nothing');
  };
}

export async function abortedDuring({ b, o }: Ctx): Promise<void> {
  const ms = scaledMs(o.abortSettleMs ?? 1000);
  const ns = randomNs();
  const hs = randomHashes(8);
  for (const h of hs) assert.equal(await b.put(ns, h, makeChunk(SMALL_BYTES)), 'stored');
  const pinned = b.stats().pinnedChunks;
  for (const op of SIGNALLED) {
    const fresh = randomHash();
    const ac = new AbortController();
    const call = signalled(b, op, ns, hs, fresh, ac.signal);
    setImmediate(() => ac.abort());
    const r = await settle(() => call, ms + 5000, op);
    if (!r.ok)
      assert.ok(
        isKvtierError(r.error, 'KVT_ABORTED'),
        `${op}: expected KVT_ABORTED, got ${r.error}`,
      );
    else if (op === 'batchedContains with pin') b.unpin(ns, hs.slice(0, r.value as number));
    // Whatever the outcome, the store stays usable and consistent.
    const again = makeChunk(SMALL_BYTES);
    const outcome = await b.put(ns, fresh, again);
    assert.ok(outcome === 'stored' || outcome === 'exists', `${op}: put afterwards is ${outcome}`);
    const got = (await b.batchedGet(ns, [fresh])).get(fresh);
    assert.ok(got !== null && got !== undefined, `${op}: the chunk put afterwards is readable`);
  }
  assert.equal(b.stats().pinnedChunks, pinned, 'aborted contains left no pins behind');
  const signal = AbortSignal.timeout(1);
  await delay(5);
  const t0 = Date.now();
  const r = await settle(() => b.batchedGet(ns, hs, { signal }), ms, 'get after a timeout signal');
  assert.ok(
    !r.ok && isKvtierError(r.error, 'KVT_TIMEOUT'),
    'a fired timeout signal is KVT_TIMEOUT',
  );
  assert.ok(Date.now() - t0 <= ms, 'settled promptly');
}

/** Records when each call of the wrapped backend settles, and how. */
export function spy(b: StorageBackend, log: { op: string; at: number; error?: unknown }[]) {
  const wrap =
    (op: string, fn: (...a: never[]) => Promise<unknown>) =>
    (...args: never[]) =>
      fn.apply(b, args).then(
        (v) => {
          log.push({ op, at: Date.now() });
          return v;
        },
        (error: unknown) => {
          log.push({ op, at: Date.now(), error });
          throw error;
        },
      );
  return new Proxy(b, {
    get(target, prop, recv) {
      const v = Reflect.get(target, prop, recv) as unknown;
      if (prop === 'batchedContains' || prop === 'batchedGet' || prop === 'put')
        return wrap(prop, v as (...a: never[]) => Promise<unknown>);
      return typeof v === 'function' ? v.bind(target) : v;
    },
  });
}

export async function stalledUnderBreaker({ s, b, o }: Ctx): Promise<void> {
  const timeoutMs = 300;
  const slack = scaledMs(o.abortSettleMs ?? 1000);
  const ns = randomNs();
  const h = randomHash();
  assert.equal(await b.put(ns, h, makeChunk(4 * KiB)), 'stored');
  const inner: { op: string; at: number; error?: unknown }[] = [];
  // Not closed here: closing the breaker would close the subject's backend under cleanup().
  const breaker = new CircuitBreakerBackend(spy(b, inner), {
    timeoutMs,
    failureThreshold: 1000,
    probeIntervalMs: 3_600_000,
  });
  await s.stall!();
  try {
    const calls: [string, () => Promise<unknown>, unknown][] = [
      ['batchedContains', () => breaker.batchedContains(ns, [h]), 0],
      ['batchedGet', async () => breaker.batchedGet(ns, [h]).then((m) => m.get(h)), null],
      ['put', () => breaker.put(ns, randomHash(), makeChunk(4 * KiB)), 'dropped'],
    ];
    for (const [op, call, expected] of calls) {
      const t0 = Date.now();
      const r = await settle(call, timeoutMs + slack, `${op} through the breaker while stalled`);
      assert.ok(r.ok, `${op} through the breaker rejected: ${r.ok ? '' : String(r.error)}`);
      assert.equal(r.value, expected, `${op} through the breaker is a miss or a drop`);
      const deadline = t0 + timeoutMs;
      for (;;) {
        const done = inner.find((e) => e.op === op);
        if (done !== undefined) {
          if (done.error !== undefined)
            assert.ok(
              isKvtierError(done.error, 'KVT_TIMEOUT'),
              `the backend's ${op} rejected with ${String(done.error)}, not the breaker's KVT_TIMEOUT`,
            );
          break;
        }
        assert.ok(
          Date.now() <= deadline + slack,
          `the backend's ${op} still runs ${slack} ms after the breaker's signal fired`,
        );
        await delay(10);
      }
    }
  } finally {
    await s.unstall!();
  }
}

// ---- outage ----

export async function outage({ s, b, o }: Ctx): Promise<void> {
  const downMs = scaledMs(o.downTimeoutMs ?? 5000);
  const recoverMs = scaledMs(o.recoverTimeoutMs ?? 20_000);
  const ns = randomNs();
  const [a, c, d] = randomHashes(3) as [ChunkHash, ChunkHash, ChunkHash];
  const ca = makeChunk(SMALL_BYTES);
  assert.equal(await b.put(ns, a, ca), 'stored');
  await s.down!();
  let unhealthy = false;
  const look = () => {
    if (b.health() !== 'up') unhealthy = true;
  };
  const hits = await settle(() => b.batchedContains(ns, [a, c]), downMs, 'contains while down');
  if (hits.ok) assert.equal(hits.value, 0, 'contains while down is a miss');
  else assertKvtierError(hits.error, 'contains while down');
  look();
  const got = await settle(() => b.batchedGet(ns, [a, c]), downMs, 'get while down');
  if (got.ok) for (const [h, v] of got.value) assert.equal(v, null, `get ${h} while down`);
  else assertKvtierError(got.error, 'get while down');
  look();
  const put = await settle(() => b.put(ns, c, makeChunk(SMALL_BYTES)), downMs, 'put while down');
  if (put.ok) assert.equal(put.value, 'dropped', 'put while down is dropped');
  else assertKvtierError(put.error, 'put while down');
  look();
  const others: [string, () => Promise<unknown>][] = [
    ['remove while down', () => b.remove(ns, [d])],
    ['clear(ns) while down', () => b.clear(ns)],
  ];
  for (const [what, call] of others) {
    const r = await settle(call, downMs, what);
    if (!r.ok) assertKvtierError(r.error, what);
    look();
  }
  // A breaker may trip only after several failures or a probe: keep asking, bounded.
  const deadline = Date.now() + downMs;
  while (!unhealthy && Date.now() < deadline) {
    await settle(() => b.batchedContains(ns, [a]), downMs, 'contains while down');
    look();
    if (!unhealthy) await delay(10);
  }
  assert.ok(unhealthy, `health() stayed 'up' for ${downMs} ms while the service was down`);

  await s.up!();
  const cd = makeChunk(SMALL_BYTES);
  const until = Date.now() + recoverMs;
  for (;;) {
    const r = await settle(() => b.put(ns, d, cd), downMs, 'put after up');
    if (!r.ok) assertKvtierError(r.error, 'put after up');
    else if (r.value !== 'dropped') break;
    assert.ok(Date.now() < until, `puts still fail ${recoverMs} ms after up()`);
    await delay(25);
  }
  assertChunk((await b.batchedGet(ns, [d])).get(d), cd, 'a chunk stored after up()');
  while (b.health() !== 'up') {
    assert.ok(Date.now() < until, `health() not 'up' ${recoverMs} ms after up()`);
    await delay(25);
  }
  const old = (await b.batchedGet(ns, [a])).get(a);
  if (old !== null) assertChunk(old, ca, 'a chunk stored before the outage');
}
