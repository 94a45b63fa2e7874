/**
 * The contract's release tests: `Chunk.release` (a get's buffer given back for reuse) never lets
 * one chunk's bytes show up in another. They hold for a backend without the hook too (its chunks
 * are never reused), and for a host-memory tier, whose views are kept valid by a pin.
 */
import assert from 'node:assert/strict';
import type {
  Chunk,
  ChunkHash,
  NamespaceId,
  StorageBackend,
} from '../../../src/backends/core/types.ts';
import { assertChunk, type Ctx, MiB, makeChunk, randomHashes, randomNs } from './context.ts';

/** Large enough for a pooled read buffer (the file tiers pool objects from 64 KiB). */
const RELEASE_BYTES = MiB;

/** True when two views share memory. */
function overlaps(a: Uint8Array, b: Uint8Array): boolean {
  return (
    a.buffer === b.buffer &&
    a.byteOffset < b.byteOffset + b.byteLength &&
    b.byteOffset < a.byteOffset + a.byteLength
  );
}

async function getOne(b: StorageBackend, ns: NamespaceId, h: ChunkHash): Promise<Chunk> {
  const c = (await b.batchedGet(ns, [h])).get(h);
  assert.ok(c != null, 'a stored chunk was a miss');
  return c;
}

/** Stores `n` distinct chunks of one size; with pinning, pins them (views stay valid while held). */
async function stored(b: StorageBackend, n: number) {
  const ns = randomNs();
  const hs = randomHashes(n);
  const chunks = hs.map(() => makeChunk(Math.min(RELEASE_BYTES, b.capabilities.maxChunkBytes)));
  for (const [i, h] of hs.entries()) assert.equal(await b.put(ns, h, chunks[i]!), 'stored');
  if (b.capabilities.pinning) assert.equal(b.pin(ns, hs), n);
  return { ns, hs, chunks };
}

export async function reuseAfterRelease({ b }: Ctx): Promise<void> {
  const { ns, hs, chunks } = await stored(b, 2);
  for (let round = 0; round < 3; round++) {
    for (const [i, h] of hs.entries()) {
      const c = await getOne(b, ns, h);
      assertChunk(c, chunks[i]!, `round ${round}, chunk ${i}`);
      c.release?.();
    }
  }
  // A second release does nothing: the buffer is not given out twice.
  const first = await getOne(b, ns, hs[0]!);
  first.release?.();
  first.release?.();
  const both = await b.batchedGet(ns, hs);
  const [x, y] = [both.get(hs[0]!), both.get(hs[1]!)];
  assertChunk(x, chunks[0]!, 'after a double release, chunk 0');
  assertChunk(y, chunks[1]!, 'after a double release, chunk 1');
  assert.ok(!overlaps(x!.data, y!.data), 'two chunks held at once share memory');
  x!.release?.();
  y!.release?.();
}

export async function heldIsNeverReused({ b }: Ctx): Promise<void> {
  const { ns, hs, chunks } = await stored(b, 3);
  const held = await getOne(b, ns, hs[0]!);
  assertChunk(held, chunks[0]!, 'the held chunk');
  for (let round = 0; round < 3; round++) {
    for (const i of [1, 2]) {
      const c = await getOne(b, ns, hs[i]!);
      assertChunk(c, chunks[i]!, `round ${round}, chunk ${i}`);
      assert.ok(!overlaps(c.data, held.data), 'a later get shares memory with a held chunk');
      c.release?.();
    }
    const pair = await b.batchedGet(ns, [hs[1]!, hs[2]!]);
    for (const c of pair.values()) {
      assert.ok(c != null && !overlaps(c.data, held.data), 'a batch shares a held chunk memory');
      c.release?.();
    }
  }
  // Still the held chunk's own bytes, after all those gets reused their released buffers.
  assertChunk(held, chunks[0]!, 'the held chunk after later gets');
  held.release?.();
}

export async function corruptNeverServed({ s, b }: Ctx): Promise<void> {
  const { ns, hs, chunks } = await stored(b, 2);
  if (b.capabilities.pinning) b.unpin(ns, hs);
  // Leave a released buffer of this size behind, then read a corrupt object of the same size.
  (await getOne(b, ns, hs[0]!)).release?.();
  await s.corrupt!(ns, hs[1]!, 'payload');
  assert.equal((await b.batchedGet(ns, [hs[1]!])).get(hs[1]!), null, 'corrupt object served');
  for (let round = 0; round < 3; round++) {
    const c = await getOne(b, ns, hs[0]!);
    assertChunk(c, chunks[0]!, `the intact chunk, round ${round}`);
    c.release?.();
  }
}
