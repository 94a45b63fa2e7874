/**
 * The contract every {@link StorageBackend} passes: one suite, run by a few-line test file per
 * backend against a real directory or server (plug-in authors run it the same way):
 *
 * ```ts
 * describeBackendContract('redis', async () => ({ backend, down, up, cleanup }), {
 *   downTimeoutMs: 2000,
 *   skip: { pins: 'redis does not pin' },
 * });
 * ```
 *
 * Every test builds a fresh subject through the factory, calls `cleanup()` in a `finally`, and
 * uses random namespaces and hashes, so tests never see each other's data. Tests that do not
 * apply (a capability the backend lacks, a hook the subject does not offer, a group in
 * `opts.skip`) are reported as skipped, never as passed.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { describe, it, type TestContext } from 'node:test';
import { setTimeout as delay } from 'node:timers/promises';
import { CircuitBreakerBackend } from '../../src/backends/circuit-breaker.ts';
import type {
  Chunk,
  ChunkHash,
  NamespaceId,
  PutOutcome,
  StorageBackend,
} from '../../src/backends/types.ts';
import { isKvtierError, KvtierError, type KvtierErrorCode } from '../../src/errors.ts';
import { chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';

/** Ways a subject can damage a stored object below the backend's API. */
export type CorruptionKind = 'payload' | 'truncate' | 'magic' | 'foreign-hash';

/** Every {@link CorruptionKind}; the suite runs one test per kind. */
export const CORRUPTION_KINDS: readonly CorruptionKind[] = [
  'payload',
  'truncate',
  'magic',
  'foreign-hash',
];

/** A backend under test plus the hooks that reach below its API. Built fresh per test. */
export interface ContractSubject {
  backend: StorageBackend;
  /**
   * Damages the stored object of (ns, hash) in place, below the backend's API: `payload` flips
   * payload bytes, `truncate` cuts the object short, `magic` breaks the header's magic,
   * `foreign-hash` puts another chunk's valid object under this key.
   */
  corrupt?(ns: string, hash: string, kind: CorruptionKind): Promise<void>;
  /** Makes the backend's service unavailable (kill the server, unmount...), and back. */
  down?(): Promise<void>;
  up?(): Promise<void>;
  /**
   * Freezes the service so that calls hang (connections stay open, nothing answers: SIGSTOP a
   * server), and undoes it; for the `cancellation` group's breaker test.
   */
  stall?(): Promise<void>;
  unstall?(): Promise<void>;
  /** Opens a second, fresh backend instance over the same storage (persistence, sharing). */
  reopen?(): Promise<StorageBackend>;
  /** Removes everything the subject created (dirs, keys, buckets, servers). */
  cleanup(): Promise<void>;
}

/** Test groups that `ContractOptions.skip` can turn off, with a reason. */
export type ContractGroup =
  | 'pins'
  | 'eviction'
  | 'corruption'
  | 'cancellation'
  | 'outage'
  | 'persistence';

/** How the suite runs against one backend configuration. */
export interface ContractOptions {
  /** Backend enforces a byte bound and evicts: the factory was configured with this capacity. */
  capacityBytes?: number;
  /** Run the 32 MiB chunk test (default true). */
  largeChunks?: boolean;
  /** Longest a call may take while the service is down before it must settle, ms (default 5000). */
  downTimeoutMs?: number;
  /** Skip reasons for tests that do not apply, keyed by test group name. */
  skip?: Partial<Record<ContractGroup, string>>;
  /**
   * Chunk size of the eviction and pin-pressure tests in bytes (default `capacityBytes / 8`, at
   * most `maxChunkBytes`). Those tests put `3 × floor(capacityBytes / evictionChunkBytes) + 1`
   * chunks of this size; set it when your bound counts more than payload bytes per chunk (headers,
   * file-system blocks) so that one chunk is a small fraction of the bound, or to keep the tests
   * fast against a large bound.
   */
  evictionChunkBytes?: number;
  /**
   * Longest a call may take to settle once its signal fires, ms (default 1000); the breaker test
   * of the `cancellation` group also allows it past the breaker's deadline.
   */
  abortSettleMs?: number;
  /** Longest the backend may take to serve again after `up()`, ms (default 20000). */
  recoverTimeoutMs?: number;
}

const KiB = 1024;
const MiB = 1024 * KiB;
const SMALL_BYTES = 64 * KiB;
const LARGE_BYTES = 32 * MiB;
const FULL_TOKENS = 256;
const PARTIAL_TOKENS = 37;
/** Above this, the oversized-chunk test would allocate too much to be worth running. */
const OVERSIZE_TEST_MAX_BYTES = 64 * MiB;
const OUTCOMES: readonly PutOutcome[] = ['stored', 'exists', 'dropped'];

/** What one test gets: its fresh subject, the subject's backend, and the suite's options. */
interface Ctx {
  readonly s: ContractSubject;
  readonly b: StorageBackend;
  readonly t: TestContext;
  readonly o: ContractOptions;
}

/** One contract test: `skip` is known when the suite is defined, `need` once a subject exists. */
interface Case {
  readonly title: string;
  readonly skip?: (o: ContractOptions) => string | undefined;
  readonly need?: (c: Ctx) => string | undefined;
  readonly run: (c: Ctx) => Promise<void>;
}

/**
 * Defines a `describe(name)` block with the whole contract for the backend `factory` builds.
 * @param factory builds a fresh subject per test; the suite always calls its `cleanup()`.
 * @throws TypeError at definition time on invalid options.
 */
export function describeBackendContract(
  name: string,
  factory: () => Promise<ContractSubject>,
  opts: ContractOptions = {},
): void {
  for (const key of [
    'capacityBytes',
    'downTimeoutMs',
    'evictionChunkBytes',
    'recoverTimeoutMs',
    'abortSettleMs',
  ]) {
    const v = opts[key as keyof ContractOptions];
    if (v !== undefined && !(Number.isSafeInteger(v) && (v as number) > 0))
      throw new TypeError(`options.${key} must be a positive integer, got ${String(v)}`);
  }
  describe(name, () => {
    for (const [section, cases] of SECTIONS) {
      describe(section, () => {
        for (const c of cases) {
          const skip = opts.skip?.[section as ContractGroup] ?? c.skip?.(opts);
          it(c.title, { skip: skip ?? false }, async (t) => {
            const s = await factory();
            try {
              const ctx: Ctx = { s, b: s.backend, t, o: opts };
              const missing = c.need?.(ctx);
              if (missing !== undefined) t.skip(missing);
              else await c.run(ctx);
            } finally {
              await s.cleanup();
            }
          });
        }
      });
    }
  });
}

// ---- basics ----

async function roundTrip({ b }: Ctx): Promise<void> {
  const ns = randomNs();
  const hs = randomHashes(3);
  const chunks = hs.map(() => makeChunk(SMALL_BYTES));
  const before = b.stats().chunks;
  for (const [i, h] of hs.entries()) assert.equal(await b.put(ns, h, chunks[i]!), 'stored');
  assert.equal(await b.batchedContains(ns, hs), 3);
  const got = await b.batchedGet(ns, hs);
  assert.equal(got.size, 3, 'one entry per requested hash');
  for (const [i, h] of hs.entries()) assertChunk(got.get(h), chunks[i]!, `chunk ${i}`);
  assert.equal(b.stats().chunks, before + 3, 'stats().chunks counts the 3 new chunks');
  assert.equal((await b.batchedGet(ns, [])).size, 0, 'an empty get is an empty Map');
}

async function prefixContains({ b }: Ctx): Promise<void> {
  const ns = randomNs();
  const hs = randomHashes(5);
  for (const i of [0, 1, 2, 4]) assert.equal(await b.put(ns, hs[i]!, makeChunk(4 * KiB)), 'stored');
  assert.equal(await b.batchedContains(ns, hs), 3, 'stops at the first miss');
  assert.equal(await b.batchedContains(ns, [hs[3]!, hs[4]!]), 0, 'a hit after a gap');
  assert.equal(await b.batchedContains(ns, [hs[4]!]), 1);
  assert.equal(await b.batchedContains(ns, [hs[0]!, hs[3]!, hs[1]!]), 1);
  assert.equal(await b.batchedContains(ns, []), 0, 'an empty list');
}

async function keyedGet({ b }: Ctx): Promise<void> {
  const ns = randomNs();
  const hs = randomHashes(4);
  const chunks = hs.map(() => makeChunk(8 * KiB));
  for (const i of [0, 2, 3]) assert.equal(await b.put(ns, hs[i]!, chunks[i]!), 'stored');
  const orders = [hs, [hs[3]!, hs[1]!, hs[0]!, hs[2]!]];
  for (const order of orders) {
    const got = await b.batchedGet(ns, order);
    assert.equal(got.size, 4, 'an entry for every requested hash');
    assert.equal(got.get(hs[1]!), null, 'the missing middle chunk is an explicit null');
    for (const i of [0, 2, 3]) assertChunk(got.get(hs[i]!), chunks[i]!, `chunk ${i}`);
  }
}

async function putExisting({ b }: Ctx): Promise<void> {
  const ns = randomNs();
  const h = randomHash();
  const first = makeChunk(SMALL_BYTES);
  assert.equal(await b.put(ns, h, first), 'stored');
  assert.equal(await b.put(ns, h, first), 'exists');
  assert.equal(await b.put(ns, h, makeChunk(SMALL_BYTES)), 'exists');
  assertChunk((await b.batchedGet(ns, [h])).get(h), first, 'the first copy');
}

async function removeChunks({ b }: Ctx): Promise<void> {
  const ns = randomNs();
  const hs = randomHashes(4);
  const kept = makeChunk(4 * KiB);
  for (const h of hs.slice(0, 2)) await b.put(ns, h, makeChunk(4 * KiB));
  await b.put(ns, hs[2]!, kept);
  const before = b.stats().chunks;
  assert.equal(await b.remove(ns, [hs[0]!, hs[1]!, hs[3]!]), 2, 'two of the three existed');
  assert.equal(b.stats().chunks, before - 2, 'stats().chunks drops by 2');
  assert.equal(await b.batchedContains(ns, [hs[0]!]), 0, 'removed chunk 0 is a miss');
  assert.equal(await b.batchedContains(ns, [hs[1]!]), 0, 'removed chunk 1 is a miss');
  const got = await b.batchedGet(ns, hs.slice(0, 3));
  assert.equal(got.get(hs[0]!), null);
  assert.equal(got.get(hs[1]!), null);
  assertChunk(got.get(hs[2]!), kept, 'the chunk not removed');
  assert.equal(await b.remove(ns, [hs[0]!, hs[1]!]), 0, 'removing twice removes nothing');
}

async function clearSpaces({ b }: Ctx): Promise<void> {
  const spaces = [randomNs(), randomNs(), randomNs()] as const;
  const hs = randomHashes(2);
  for (const ns of spaces) for (const h of hs) await b.put(ns, h, makeChunk(4 * KiB));
  await b.clear(spaces[0]);
  for (const h of hs) assert.equal(await b.batchedContains(spaces[0], [h]), 0, 'cleared');
  assert.equal(await b.batchedContains(spaces[1], hs), 2, 'another namespace is untouched');
  assert.equal(await b.batchedContains(spaces[2], hs), 2, 'another namespace is untouched');
  await b.clear();
  for (const ns of spaces.slice(1))
    for (const h of hs) assert.equal(await b.batchedContains(ns, [h]), 0, 'clear() clears all');
  assert.equal(b.stats().chunks, 0, 'nothing is counted after clear()');
}

async function isolatedSpaces({ b }: Ctx): Promise<void> {
  const [ns1, ns2] = [randomNs(), randomNs()];
  const h = randomHash();
  const [c1, c2] = [makeChunk(SMALL_BYTES), makeChunk(SMALL_BYTES)];
  assert.equal(await b.put(ns1, h, c1), 'stored');
  assert.equal(await b.put(ns2, h, c2), 'stored', 'the same hash in another namespace is new');
  assertChunk((await b.batchedGet(ns1, [h])).get(h), c1, 'ns1 copy');
  assertChunk((await b.batchedGet(ns2, [h])).get(h), c2, 'ns2 copy');
  assert.equal(await b.batchedContains(randomNs(), [h]), 0, 'an unrelated namespace');
  assert.equal(await b.remove(ns1, [h]), 1);
  assertChunk((await b.batchedGet(ns2, [h])).get(h), c2, 'ns2 copy after removal in ns1');
}

async function concurrentPuts({ b }: Ctx): Promise<void> {
  const ns = randomNs();
  const h = randomHash();
  const c = makeChunk(SMALL_BYTES);
  const before = b.stats().chunks;
  const outcomes = await Promise.all(Array.from({ length: 20 }, () => b.put(ns, h, c)));
  for (const o of outcomes) assert.ok(OUTCOMES.includes(o), `unexpected put outcome ${o}`);
  assert.ok(outcomes.includes('stored'), `no put stored the chunk: ${outcomes.join(',')}`);
  assert.equal(b.stats().chunks, before + 1, 'one copy is counted');
  assertChunk((await b.batchedGet(ns, [h])).get(h), c, 'the one copy');
  assert.equal(await b.remove(ns, [h]), 1, 'exactly one copy to remove');
  assert.equal(await b.batchedContains(ns, [h]), 0, 'no second copy remains');
}

async function smallChunk({ b }: Ctx): Promise<void> {
  const ns = randomNs();
  const h = randomHash();
  const src = makeChunk(SMALL_BYTES);
  const expected: Chunk = { tokens: src.tokens, data: Buffer.from(src.data) };
  assert.equal(await b.put(ns, h, src), 'stored');
  // Callers reuse their buffers once put resolves: the backend must have kept its own copy.
  src.data.fill(0);
  assert.equal(await b.batchedContains(ns, [h]), 1);
  assertChunk((await b.batchedGet(ns, [h])).get(h), expected, '64 KiB chunk');
}

async function largeChunk({ b }: Ctx): Promise<void> {
  const max = b.capabilities.maxChunkBytes;
  assert.ok(
    max >= LARGE_BYTES,
    `maxChunkBytes ${max} < 32 MiB: raise it or set largeChunks: false`,
  );
  const ns = randomNs();
  const h = randomHash();
  const c = makeChunk(LARGE_BYTES);
  assert.equal(await b.put(ns, h, c), 'stored');
  assert.equal(await b.batchedContains(ns, [h]), 1);
  assertChunk((await b.batchedGet(ns, [h])).get(h), c, '32 MiB chunk');
}

async function partialChunk({ b }: Ctx): Promise<void> {
  const ns = randomNs();
  const hs = randomHashes(2);
  const full = makeChunk(SMALL_BYTES);
  const partial = makeChunk((SMALL_BYTES / FULL_TOKENS) * PARTIAL_TOKENS, PARTIAL_TOKENS);
  assert.equal(await b.put(ns, hs[0]!, full), 'stored');
  assert.equal(await b.put(ns, hs[1]!, partial), 'stored');
  assert.equal(await b.batchedContains(ns, hs), 2);
  const got = await b.batchedGet(ns, hs);
  assertChunk(got.get(hs[0]!), full, 'full chunk');
  assertChunk(got.get(hs[1]!), partial, 'partial chunk');
}

async function oversizedChunk({ b }: Ctx): Promise<void> {
  const ns = randomNs();
  const h = randomHash();
  const data = new Uint8Array(b.capabilities.maxChunkBytes + 1);
  const r = await settle(() => b.put(ns, h, { tokens: 1, data }), 60_000, 'oversized put');
  if (r.ok) assert.equal(r.value, 'dropped', 'an oversized put is dropped');
  else assertKvtierError(r.error, 'oversized put');
  assert.equal(await b.batchedContains(ns, [h]), 0, 'the oversized chunk is not readable');
}

// ---- pins ----

async function pinRefcount({ b }: Ctx): Promise<void> {
  const ns = randomNs();
  const [a, c, missing] = randomHashes(3) as [ChunkHash, ChunkHash, ChunkHash];
  const ca = makeChunk(4 * KiB);
  assert.equal(await b.put(ns, a, ca), 'stored');
  const base = b.stats().pinnedChunks;
  const pinned = (n: number, what: string) => assert.equal(b.stats().pinnedChunks, base + n, what);
  assert.equal(b.pin(ns, [a, missing]), 1, 'only present chunks are pinned');
  assert.equal(b.pin(ns, [a]), 1);
  pinned(1, 'two pins on one chunk count one pinned chunk');
  b.unpin(ns, [a]);
  pinned(1, 'one pin remains after the first unpin');
  b.unpin(ns, [a]);
  pinned(0, 'the last unpin releases the chunk');
  b.unpin(ns, [a, missing]);
  pinned(0, 'extra and unknown unpins are ignored');
  assert.equal(await b.put(ns, a, ca, { pin: true }), 'exists');
  pinned(1, 'put with pin pins an existing chunk');
  b.unpin(ns, [a]);
  assert.equal(await b.put(ns, c, makeChunk(4 * KiB), { pin: true }), 'stored');
  pinned(1, 'put with pin pins a stored chunk');
  assert.equal(await b.remove(ns, [c]), 1, 'a pinned chunk can be removed');
  assert.equal(await b.batchedContains(ns, [c]), 0, 'a removed pinned chunk is a miss');
  b.unpin(ns, [c]);
  pinned(0, 'the removed chunk is released by its last unpin');
  assertChunk((await b.batchedGet(ns, [a])).get(a), ca, 'chunk a after pin churn');
}

async function containsPins({ b }: Ctx): Promise<void> {
  const ns = randomNs();
  const hs = randomHashes(4);
  for (const i of [0, 1, 3]) assert.equal(await b.put(ns, hs[i]!, makeChunk(4 * KiB)), 'stored');
  const base = b.stats().pinnedChunks;
  assert.equal(await b.batchedContains(ns, hs, { pin: true }), 2);
  assert.equal(b.stats().pinnedChunks, base + 2, 'the two hits are pinned');
  assert.equal(await b.batchedContains(ns, [hs[2]!, hs[3]!], { pin: true }), 0);
  assert.equal(b.stats().pinnedChunks, base + 2, 'nothing after a miss is pinned');
  b.unpin(ns, [hs[0]!, hs[1]!]);
  assert.equal(b.stats().pinnedChunks, base, 'exactly the hits held pins');
}

async function pinnedUnderPressure({ b, o }: Ctx): Promise<void> {
  const bytes = evictionBytes(b, o);
  const rounds = 3 * Math.floor(o.capacityBytes! / bytes) + 1;
  const ns = randomNs();
  const p = randomHash();
  const cp = makeChunk(bytes);
  assert.equal(await b.put(ns, p, cp, { pin: true }), 'stored');
  assert.equal(b.pin(ns, [p]), 1);
  b.unpin(ns, [p]);
  await fill(b, ns, rounds, bytes);
  assertChunk((await b.batchedGet(ns, [p])).get(p), cp, 'the pinned chunk under pressure');
  b.unpin(ns, [p]);
  await fill(b, ns, rounds, bytes);
  assert.equal(await b.batchedContains(ns, [p]), 0, 'once unpinned it is evictable again');
}

// ---- eviction ----

async function boundedEviction({ b, o }: Ctx): Promise<void> {
  const cap = o.capacityBytes!;
  assert.equal(b.capabilities.evicts, true, 'a bounded backend declares evicts');
  const bytes = evictionBytes(b, o);
  const fit = Math.floor(cap / bytes);
  const n = 3 * fit + 1;
  const ns = randomNs();
  const hs = randomHashes(n);
  const evictions = b.stats().evictions;
  let last: Chunk | undefined;
  for (const [i, h] of hs.entries()) {
    last = makeChunk(bytes);
    assert.equal(await b.put(ns, h, last), 'stored', `put ${i + 1} of ${n}`);
    const used = b.stats().bytesUsed;
    assert.ok(used <= cap, `bytesUsed ${used} > capacityBytes ${cap} after put ${i + 1}`);
  }
  assert.ok(b.stats().evictions > evictions, 'stats().evictions grows');
  // Older than two capacities' worth: evicted under any LRU-like policy, headers included.
  for (const [i, h] of hs.slice(0, n - 2 * fit).entries())
    assert.equal(await b.batchedContains(ns, [h]), 0, `old chunk ${i} is evicted`);
  assertChunk((await b.batchedGet(ns, [hs[n - 1]!])).get(hs[n - 1]!), last!, 'newest chunk');
}

// ---- corruption ----

function corruption(kind: CorruptionKind): (c: Ctx) => Promise<void> {
  return async ({ s, b }) => {
    const ns = randomNs();
    const [x, y] = randomHashes(2) as [ChunkHash, ChunkHash];
    const cy = makeChunk(SMALL_BYTES);
    assert.equal(await b.put(ns, x, makeChunk(SMALL_BYTES)), 'stored');
    assert.equal(await b.put(ns, y, cy), 'stored');
    const before = b.stats().chunks;
    await s.corrupt!(ns, x, kind);
    const got = await b.batchedGet(ns, [x, y]);
    assert.equal(got.get(x), null, `get returned data for a ${kind}-corrupted object`);
    assertChunk(got.get(y), cy, 'the intact neighbour');
    assert.equal(await b.batchedContains(ns, [x]), 0, 'contains does not count it');
    assert.equal((await b.batchedGet(ns, [x])).get(x), null, 'a second get is still null');
    assert.equal(b.stats().chunks, before - 1, 'the corrupt object is gone from stats');
  };
}

// ---- cancellation ----

const SIGNALLED = ['batchedContains', 'batchedContains with pin', 'batchedGet', 'put'] as const;

/** Calls `op` of `b` with `signal` on chunks of `ns`; `hs` are stored, `fresh` is not. */
function signalled(
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

function abortedBefore(reason: () => unknown, code: KvtierErrorCode): (c: Ctx) => Promise<void> {
  return async ({ b, o }) => {
    const ns = randomNs();
    const hs = randomHashes(2);
    for (const h of hs) assert.equal(await b.put(ns, h, makeChunk(4 * KiB)), 'stored');
    const pinned = b.stats().pinnedChunks;
    for (const op of SIGNALLED) {
      const fresh = randomHash();
      const r = await settle(
        () => signalled(b, op, ns, hs, fresh, AbortSignal.abort(reason())),
        o.abortSettleMs ?? 1000,
        `${op} with an aborted signal`,
      );
      assert.ok(!r.ok, `${op} with an aborted signal resolved; it must reject with ${code}`);
      assert.ok(isKvtierError(r.error, code), `${op}: expected ${code}, got ${String(r.error)}`);
      assert.equal(await b.batchedContains(ns, [fresh]), 0, `${op}: nothing was stored`);
    }
    assert.equal(b.stats().pinnedChunks, pinned, 'an aborted contains pins nothing');
  };
}

async function abortedDuring({ b, o }: Ctx): Promise<void> {
  const ms = o.abortSettleMs ?? 1000;
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
function spy(b: StorageBackend, log: { op: string; at: number; error?: unknown }[]) {
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

async function stalledUnderBreaker({ s, b, o }: Ctx): Promise<void> {
  const timeoutMs = 300;
  const slack = o.abortSettleMs ?? 1000;
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

// ---- lifecycle ----

async function closeTwice({ b }: Ctx): Promise<void> {
  await assert.doesNotReject(Promise.all([b.close(), b.close()]), 'concurrent closes');
  await assert.doesNotReject(b.close(), 'a later close');
  await expectCode('put', 'KVT_CLOSED', () => b.put(randomNs(), randomHash(), makeChunk(1)));
}

async function callsAfterClose({ b }: Ctx): Promise<void> {
  const ns = randomNs();
  const h = randomHash();
  assert.equal(await b.put(ns, h, makeChunk(4 * KiB)), 'stored');
  await b.close();
  const calls: [string, () => unknown][] = [
    ['batchedContains', () => b.batchedContains(ns, [h])],
    ['batchedGet', () => b.batchedGet(ns, [h])],
    ['put', () => b.put(ns, randomHash(), makeChunk(4 * KiB))],
    ['remove', () => b.remove(ns, [h])],
    ['clear(ns)', () => b.clear(ns)],
    ['clear()', () => b.clear()],
    ['pin', () => b.pin(ns, [h])],
    ['unpin', () => b.unpin(ns, [h])],
    ['stats', () => b.stats()],
    ['health', () => b.health()],
  ];
  for (const [what, call] of calls) await expectCode(what, 'KVT_CLOSED', call);
}

// ---- outage ----

async function outage({ s, b, o }: Ctx): Promise<void> {
  const downMs = o.downTimeoutMs ?? 5000;
  const recoverMs = o.recoverTimeoutMs ?? 20_000;
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

// ---- persistence ----

async function persistence({ s, b }: Ctx): Promise<void> {
  const ns = randomNs();
  const hs = randomHashes(3);
  const chunks = [
    makeChunk(SMALL_BYTES),
    makeChunk(SMALL_BYTES),
    makeChunk(8 * KiB, PARTIAL_TOKENS),
  ];
  for (const [i, h] of hs.entries()) assert.equal(await b.put(ns, h, chunks[i]!), 'stored');
  await b.close();
  const second = await s.reopen!();
  try {
    assert.equal(await second.batchedContains(ns, hs), 3, 'the fresh instance sees every chunk');
    const got = await second.batchedGet(ns, hs);
    for (const [i, h] of hs.entries()) assertChunk(got.get(h), chunks[i]!, `chunk ${i}`);
    assert.equal(await second.put(ns, hs[0]!, chunks[0]!), 'exists', 'no re-store');
  } finally {
    await second.close();
  }
}

async function sharing({ s, b }: Ctx): Promise<void> {
  const second = await s.reopen!();
  try {
    const ns = randomNs();
    const [x, y] = randomHashes(2) as [ChunkHash, ChunkHash];
    const [cx, cy] = [makeChunk(SMALL_BYTES), makeChunk(SMALL_BYTES)];
    assert.equal(await b.put(ns, x, cx), 'stored');
    assertChunk((await second.batchedGet(ns, [x])).get(x), cx, 'written by the first');
    assert.equal(await second.put(ns, y, cy), 'stored');
    assert.equal(await b.batchedContains(ns, [x, y]), 2, 'the first sees both');
    assertChunk((await b.batchedGet(ns, [y])).get(y), cy, 'written by the second');
    assert.equal(await second.put(ns, x, cx), 'exists');
  } finally {
    await second.close();
  }
}

// ---- the table ----

const noLarge = (o: ContractOptions) =>
  o.largeChunks === false ? 'largeChunks: false' : undefined;
const noCap = (o: ContractOptions) =>
  o.capacityBytes === undefined ? 'no capacityBytes given: the backend has no bound' : undefined;
const pinning = ({ b }: Ctx) =>
  b.capabilities.pinning ? undefined : 'capabilities.pinning is false';
const oversizable = ({ b }: Ctx) =>
  b.capabilities.maxChunkBytes > OVERSIZE_TEST_MAX_BYTES
    ? `maxChunkBytes ${b.capabilities.maxChunkBytes} is too large to allocate past`
    : undefined;
const corruptible = ({ s }: Ctx) => (s.corrupt ? undefined : 'the subject has no corrupt hook');
const downable = ({ s }: Ctx) => (s.down && s.up ? undefined : 'the subject has no down/up hooks');
const stallable = ({ s }: Ctx) =>
  s.stall && s.unstall ? undefined : 'the subject has no stall/unstall hooks';
const reopenable =
  (cap: 'persistent' | 'shared') =>
  ({ s, b }: Ctx) => {
    if (s.reopen === undefined) return 'the subject has no reopen hook';
    return b.capabilities[cap] ? undefined : `capabilities.${cap} is false`;
  };

type Need = (c: Ctx) => string | undefined;
type Skip = (o: ContractOptions) => string | undefined;
const k = (title: string, run: Case['run'], need?: Need, skip?: Skip): Case => ({
  title,
  run,
  need,
  skip,
});

/** Sections named after a {@link ContractGroup} are skipped as a whole by `opts.skip[group]`. */
const SECTIONS: readonly (readonly [string, readonly Case[]])[] = [
  [
    'basics',
    [
      k('put, contains and get round-trip byte-exact, keeping tokens', roundTrip),
      k('batchedContains counts the contiguous prefix of hits', prefixContains),
      k('batchedGet is keyed: a missing middle chunk is null', keyedGet),
      k('put of an existing key is exists and keeps the first bytes', putExisting),
      k('remove returns the count; removed chunks are misses', removeChunks),
      k('clear(ns) clears only that namespace; clear() clears all', clearSpaces),
      k('namespaces are isolated: one hash, one chunk per namespace', isolatedSpaces),
      k('20 concurrent puts of one key leave one byte-exact copy', concurrentPuts),
      k('a 64 KiB chunk round-trips as a copy of the caller buffer', smallChunk),
      k('a 32 MiB chunk round-trips byte-exact', largeChunk, undefined, noLarge),
      k('a partial chunk (37 tokens) round-trips next to a full one', partialChunk),
      k('a chunk over maxChunkBytes is never stored', oversizedChunk, oversizable),
    ],
  ],
  [
    'pins',
    [
      k('pin/unpin are refcounted; put with pin pins', pinRefcount, pinning),
      k('batchedContains with pin pins exactly the hits', containsPins, pinning),
      k(
        'a pinned chunk survives eviction until its last unpin',
        pinnedUnderPressure,
        pinning,
        noCap,
      ),
    ],
  ],
  [
    'eviction',
    [
      k(
        'bytesUsed stays within capacityBytes; old chunks are evicted',
        boundedEviction,
        undefined,
        noCap,
      ),
    ],
  ],
  [
    'corruption',
    CORRUPTION_KINDS.map((kind) =>
      k(`${kind}: a miss, never data, then removed`, corruption(kind), corruptible),
    ),
  ],
  [
    'cancellation',
    [
      k(
        'an aborted signal rejects contains, get and put with KVT_ABORTED',
        abortedBefore(() => undefined, 'KVT_ABORTED'),
      ),
      k(
        "the breaker's abort reason (KvtierError KVT_TIMEOUT) rejects them with KVT_TIMEOUT",
        abortedBefore(
          () => new KvtierError('KVT_TIMEOUT', 'tier call took over 1 ms'),
          'KVT_TIMEOUT',
        ),
      ),
      k(
        'a signal that fires during a call settles it promptly; the store stays consistent',
        abortedDuring,
      ),
      k(
        'under a breaker, a stalled service costs a call at most timeoutMs',
        stalledUnderBreaker,
        stallable,
      ),
    ],
  ],
  [
    'lifecycle',
    [
      k('close twice (also concurrently) resolves', closeTwice),
      k('calls after close reject with KVT_CLOSED', callsAfterClose),
    ],
  ],
  ['outage', [k('while down every call settles as a miss; after up it serves', outage, downable)]],
  [
    'persistence',
    [
      k(
        'chunks written by one instance are read by a fresh one',
        persistence,
        reopenable('persistent'),
      ),
      k("a shared store shows each instance the other's writes", sharing, reopenable('shared')),
    ],
  ],
];

// ---- helpers ----

function randomNs(): NamespaceId {
  return randomBytes(16).toString('hex');
}

function randomHash(): ChunkHash {
  return chunkHashFromBytes(randomBytes(32));
}

function randomHashes(n: number): ChunkHash[] {
  return Array.from({ length: n }, randomHash);
}

/**
 * A chunk of `bytes` unique bytes. Past 64 KiB a random block of prime length is repeated
 * (a native fill): cheap for 32 MiB, yet any shift, truncation or swap still shows.
 */
function makeChunk(bytes: number, tokens = FULL_TOKENS): Chunk {
  if (bytes <= SMALL_BYTES) return { tokens, data: randomBytes(bytes) };
  return { tokens, data: Buffer.allocUnsafeSlow(bytes).fill(randomBytes(4099)) };
}

function evictionBytes(b: StorageBackend, o: ContractOptions): number {
  const bytes = o.evictionChunkBytes ?? Math.floor(o.capacityBytes! / 8);
  return Math.min(bytes, b.capabilities.maxChunkBytes);
}

/** Puts `count` fresh chunks of `bytes`; each must be stored (the pressure of eviction tests). */
async function fill(b: StorageBackend, ns: NamespaceId, count: number, bytes: number) {
  for (const [i, h] of randomHashes(count).entries())
    assert.equal(await b.put(ns, h, makeChunk(bytes)), 'stored', `pressure put ${i + 1}`);
}

/** Checks tokens and bytes. Call right after the get: views may be valid only until a yield. */
function assertChunk(actual: Chunk | null | undefined, expected: Chunk, what: string): void {
  assert.ok(actual !== undefined, `${what}: no entry in the result`);
  assert.ok(actual !== null, `${what}: a miss, expected a hit`);
  assert.equal(actual.tokens, expected.tokens, `${what}: tokens`);
  assert.equal(actual.data.byteLength, expected.data.byteLength, `${what}: byte length`);
  const a = Buffer.from(actual.data.buffer, actual.data.byteOffset, actual.data.byteLength);
  const e = Buffer.from(expected.data.buffer, expected.data.byteOffset, expected.data.byteLength);
  if (!a.equals(e))
    assert.fail(`${what}: bytes differ from offset ${a.findIndex((x, i) => x !== e[i])}`);
}

function assertKvtierError(err: unknown, what: string): void {
  assert.ok(isKvtierError(err), `${what} rejected with a non-KvtierError: ${String(err)}`);
}

type Settled<T> = { ok: true; value: T } | { ok: false; error: unknown };

/** Runs `call` (a sync throw counts as a rejection); fails the test if it has not settled in `ms`. */
async function settle<T>(
  call: () => T | Promise<T>,
  ms: number,
  what: string,
): Promise<Settled<T>> {
  let timer: NodeJS.Timeout | undefined;
  const outcome = (async () => call())().then(
    (value): Settled<T> => ({ ok: true, value }),
    (error: unknown): Settled<T> => ({ ok: false, error }),
  );
  const late = new Promise<null>((resolve) => {
    timer = setTimeout(() => resolve(null), ms);
  });
  try {
    const r = await Promise.race([outcome, late]);
    if (r === null) assert.fail(`${what} did not settle within ${ms} ms`);
    return r;
  } finally {
    clearTimeout(timer);
  }
}

/** Expects `call` to throw, or to return a promise that rejects, with a KvtierError of `code`. */
async function expectCode(what: string, code: KvtierErrorCode, call: () => unknown): Promise<void> {
  const r = await settle(call, 5000, what);
  if (r.ok) assert.fail(`${what} after close succeeded; expected ${code}`);
  assert.ok(isKvtierError(r.error, code), `${what}: expected ${code}, got ${String(r.error)}`);
}
