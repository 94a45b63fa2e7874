/**
 * The contract's key and staleness tests: a hash is 32 arbitrary bytes, so a backend must keep
 * every byte of it in its keys (a lossy text conversion maps different hashes to one key), and a
 * chunk removed or cleared must never be read again (a read cache not cleared serves it).
 */
import assert from 'node:assert/strict';
import type { ChunkHash } from '../../../src/backends/core/types.ts';
import { chunkHashFromBytes } from '../../../src/hashing/chunk-hash.ts';
import { assertChunk, type Ctx, KiB, makeChunk, randomHashes, randomNs } from './context.ts';

/**
 * Hashes whose bytes are not valid UTF-8 (lone continuation bytes, 0xfe/0xff, a truncated
 * sequence, overlong forms) and pairs of them that differ in one byte only: decoded as UTF-8 with
 * replacement, each pair collapses into one string.
 */
function awkwardHashes(): ChunkHash[] {
  const base = Buffer.alloc(32);
  for (let i = 0; i < 32; i++) base[i] = 0x80 + ((i * 37) % 0x40);
  const variants: [number, number][] = [
    [0, 0xff],
    [0, 0xfe],
    [31, 0xc0],
    [31, 0xc1],
    [16, 0x80],
    [16, 0x81],
  ];
  const out = variants.map(([at, byte]) => {
    const b = Buffer.from(base);
    b[at] = byte;
    return chunkHashFromBytes(b);
  });
  // A valid multi-byte start cut short at the end, and all-0xff.
  const cut = Buffer.from(base);
  cut[31] = 0xe2;
  out.push(chunkHashFromBytes(cut), chunkHashFromBytes(Buffer.alloc(32, 0xff)));
  return out;
}

export async function invalidUtf8Hashes({ b }: Ctx): Promise<void> {
  const ns = randomNs();
  const hs = awkwardHashes();
  assert.equal(new Set(hs).size, hs.length, 'the test hashes are distinct');
  const chunks = hs.map(() => makeChunk(4 * KiB));
  for (const [i, h] of hs.entries())
    assert.equal(await b.put(ns, h, chunks[i]!), 'stored', `hash ${i} (${h}) is a new key`);
  assert.equal(await b.batchedContains(ns, hs), hs.length);
  const got = await b.batchedGet(ns, hs);
  for (const [i, h] of hs.entries()) assertChunk(got.get(h), chunks[i]!, `hash ${i} (${h})`);
  // Removing one of a pair leaves its twin.
  assert.equal(await b.remove(ns, [hs[0]!]), 1);
  assert.equal((await b.batchedGet(ns, [hs[0]!])).get(hs[0]!), null, 'the removed twin');
  assertChunk((await b.batchedGet(ns, [hs[1]!])).get(hs[1]!), chunks[1]!, 'the kept twin');
}

export async function oneByteApart({ b }: Ctx): Promise<void> {
  const ns = randomNs();
  const [first] = randomHashes(1) as [ChunkHash];
  const bytes = Buffer.from(first, 'hex');
  const hs = [0, 15, 31].map((at) => {
    const x = Buffer.from(bytes);
    x[at]! ^= 0x01;
    return chunkHashFromBytes(x);
  });
  const all = [first, ...hs];
  const chunks = all.map(() => makeChunk(4 * KiB));
  for (const [i, h] of all.entries()) assert.equal(await b.put(ns, h, chunks[i]!), 'stored');
  const got = await b.batchedGet(ns, all);
  for (const [i, h] of all.entries()) assertChunk(got.get(h), chunks[i]!, `hash ${i}`);
}

export async function readAfterRemove({ b }: Ctx): Promise<void> {
  const ns = randomNs();
  const hs = randomHashes(2);
  const chunks = hs.map(() => makeChunk(16 * KiB));
  for (const [i, h] of hs.entries()) assert.equal(await b.put(ns, h, chunks[i]!), 'stored');
  // Read first, so that any read cache holds the chunk, then remove it.
  for (const [i, h] of hs.entries())
    assertChunk((await b.batchedGet(ns, [h])).get(h), chunks[i]!, `chunk ${i} before remove`);
  assert.equal(await b.batchedContains(ns, hs), 2);
  assert.equal(await b.remove(ns, [hs[0]!]), 1);
  assert.equal((await b.batchedGet(ns, [hs[0]!])).get(hs[0]!), null, 'a get after remove');
  assert.equal(await b.batchedContains(ns, [hs[0]!]), 0, 'a contains after remove');
  assertChunk((await b.batchedGet(ns, [hs[1]!])).get(hs[1]!), chunks[1]!, 'the other chunk');
  // A put after the remove stores the new bytes, never the old ones.
  const fresh = makeChunk(16 * KiB);
  assert.equal(await b.put(ns, hs[0]!, fresh), 'stored', 'a put after remove is new');
  assertChunk((await b.batchedGet(ns, [hs[0]!])).get(hs[0]!), fresh, 'the bytes put after');
}

export async function readAfterClear({ b }: Ctx): Promise<void> {
  const [ns, other] = [randomNs(), randomNs()];
  const hs = randomHashes(2);
  const chunks = hs.map(() => makeChunk(16 * KiB));
  for (const [i, h] of hs.entries()) {
    assert.equal(await b.put(ns, h, chunks[i]!), 'stored');
    assert.equal(await b.put(other, h, chunks[i]!), 'stored');
  }
  for (const s of [ns, other]) {
    const got = await b.batchedGet(s, hs);
    for (const [i, h] of hs.entries()) assertChunk(got.get(h), chunks[i]!, `chunk ${i}`);
  }
  await b.clear(ns);
  const afterNs = await b.batchedGet(ns, hs);
  for (const h of hs) assert.equal(afterNs.get(h), null, 'a get after clear(ns)');
  assert.equal(await b.batchedContains(ns, hs), 0, 'a contains after clear(ns)');
  await b.clear();
  const afterAll = await b.batchedGet(other, hs);
  for (const h of hs) assert.equal(afterAll.get(h), null, 'a get after clear()');
  assert.equal(await b.batchedContains(other, hs), 0, 'a contains after clear()');
}
