/** The contract's data-path tests: basics, pins, eviction, corruption, lifecycle, persistence. */
import assert from 'node:assert/strict';
import type { Chunk, ChunkHash } from '../../../src/backends/core/types.ts';
import type { CorruptionKind } from '../backend.contract.ts';
import {
  assertChunk,
  assertKvtierError,
  type Ctx,
  evictionBytes,
  expectCode,
  FULL_TOKENS,
  fill,
  KiB,
  LARGE_BYTES,
  makeChunk,
  OUTCOMES,
  PARTIAL_TOKENS,
  randomHash,
  randomHashes,
  randomNs,
  SMALL_BYTES,
  settle,
} from './context.ts';

// ---- basics ----

export async function roundTrip({ b }: Ctx): Promise<void> {
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

export async function prefixContains({ b }: Ctx): Promise<void> {
  const ns = randomNs();
  const hs = randomHashes(5);
  for (const i of [0, 1, 2, 4]) assert.equal(await b.put(ns, hs[i]!, makeChunk(4 * KiB)), 'stored');
  assert.equal(await b.batchedContains(ns, hs), 3, 'stops at the first miss');
  assert.equal(await b.batchedContains(ns, [hs[3]!, hs[4]!]), 0, 'a hit after a gap');
  assert.equal(await b.batchedContains(ns, [hs[4]!]), 1);
  assert.equal(await b.batchedContains(ns, [hs[0]!, hs[3]!, hs[1]!]), 1);
  assert.equal(await b.batchedContains(ns, []), 0, 'an empty list');
}

export async function keyedGet({ b }: Ctx): Promise<void> {
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

export async function putExisting({ b }: Ctx): Promise<void> {
  const ns = randomNs();
  const h = randomHash();
  const first = makeChunk(SMALL_BYTES);
  assert.equal(await b.put(ns, h, first), 'stored');
  assert.equal(await b.put(ns, h, first), 'exists');
  assert.equal(await b.put(ns, h, makeChunk(SMALL_BYTES)), 'exists');
  assertChunk((await b.batchedGet(ns, [h])).get(h), first, 'the first copy');
}

export async function removeChunks({ b }: Ctx): Promise<void> {
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

export async function clearSpaces({ b }: Ctx): Promise<void> {
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

export async function isolatedSpaces({ b }: Ctx): Promise<void> {
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

export async function concurrentPuts({ b }: Ctx): Promise<void> {
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

export async function smallChunk({ b }: Ctx): Promise<void> {
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

export async function largeChunk({ b }: Ctx): Promise<void> {
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

export async function partialChunk({ b }: Ctx): Promise<void> {
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

export async function oversizedChunk({ b }: Ctx): Promise<void> {
  const ns = randomNs();
  const h = randomHash();
  const data = new Uint8Array(b.capabilities.maxChunkBytes + 1);
  const r = await settle(() => b.put(ns, h, { tokens: 1, data }), 60_000, 'oversized put');
  if (r.ok) assert.equal(r.value, 'dropped', 'an oversized put is dropped');
  else assertKvtierError(r.error, 'oversized put');
  assert.equal(await b.batchedContains(ns, [h]), 0, 'the oversized chunk is not readable');
}

// ---- pins ----

export async function pinRefcount({ b }: Ctx): Promise<void> {
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

export async function containsPins({ b }: Ctx): Promise<void> {
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

export async function pinnedUnderPressure({ b, o }: Ctx): Promise<void> {
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

export async function boundedEviction({ b, o }: Ctx): Promise<void> {
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

export function corruption(kind: CorruptionKind): (c: Ctx) => Promise<void> {
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

// ---- lifecycle ----

export async function closeTwice({ b }: Ctx): Promise<void> {
  await assert.doesNotReject(Promise.all([b.close(), b.close()]), 'concurrent closes');
  await assert.doesNotReject(b.close(), 'a later close');
  await expectCode('put', 'KVT_CLOSED', () => b.put(randomNs(), randomHash(), makeChunk(1)));
}

export async function callsAfterClose({ b }: Ctx): Promise<void> {
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

// ---- persistence ----

export async function persistence({ s, b }: Ctx): Promise<void> {
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

export async function sharing({ s, b }: Ctx): Promise<void> {
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
