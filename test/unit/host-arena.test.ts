import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  type ArenaBlock,
  HostArena,
  resolveHostArenaOptions,
} from '../../src/backends/arena/host-arena.ts';
import { isKvtierError } from '../../src/errors.ts';

const PAGE = 4096;

/** Deterministic PRNG (mulberry32) so failures reproduce. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function sameBuffer(a: Uint8Array, b: Uint8Array): boolean {
  return a.buffer === b.buffer;
}

function overlaps(a: Uint8Array, b: Uint8Array, page: number): boolean {
  if (!sameBuffer(a, b)) return false;
  const aEnd = a.byteOffset + Math.max(1, Math.ceil(a.byteLength / page)) * page;
  const bEnd = b.byteOffset + Math.max(1, Math.ceil(b.byteLength / page)) * page;
  return a.byteOffset < bEnd && b.byteOffset < aEnd;
}

describe('HostArena options', () => {
  it('applies defaults and rounds capacity down to whole pages', () => {
    const o = resolveHostArenaOptions({ capacityBytes: 3 * 65536 + 100 });
    assert.deepEqual(o, { capacityBytes: 3 * 65536, pageBytes: 65536, slabBytes: 3 * 65536 });
    const big = resolveHostArenaOptions({ capacityBytes: 3 * 1024 ** 3 });
    assert.equal(big.slabBytes, 1024 ** 3);
  });

  it('clamps slabBytes to the capacity', () => {
    const o = resolveHostArenaOptions({
      capacityBytes: 2 * PAGE,
      pageBytes: PAGE,
      slabBytes: 8 * PAGE,
    });
    assert.equal(o.slabBytes, 2 * PAGE);
  });

  const bad: [string, object, RegExp][] = [
    ['capacity below one page', { capacityBytes: 100 }, /capacityBytes must be at least one page/],
    ['capacity not a number', { capacityBytes: '1GiB' }, /capacityBytes must be an integer/],
    ['page not a power of two', { capacityBytes: 1e6, pageBytes: 6000 }, /power of two/],
    [
      'page below 4 KiB',
      { capacityBytes: 1e6, pageBytes: 2048 },
      /pageBytes must be an integer in \[4096/,
    ],
    [
      'slab not a multiple of page',
      { capacityBytes: 1e6, pageBytes: PAGE, slabBytes: PAGE + 1 },
      /multiple of pageBytes/,
    ],
    [
      'slab above 1 GiB',
      { capacityBytes: 4e9, slabBytes: 2 * 1024 ** 3 },
      /slabBytes must be an integer in/,
    ],
  ];
  for (const [what, opts, msg] of bad) {
    it(`rejects ${what}`, () => {
      assert.throws(
        () => new HostArena(opts as never),
        (err: unknown) => isKvtierError(err, 'KVT_INVALID_ARGUMENT') && msg.test(err.message),
      );
    });
  }
});

describe('HostArena allocation', () => {
  it('hands out views of exactly the requested length on whole pages', () => {
    const arena = new HostArena({ capacityBytes: 8 * PAGE, pageBytes: PAGE });
    const a = arena.allocate(PAGE + 1)!;
    assert.equal(a.view.byteLength, PAGE + 1);
    assert.equal(a.pages, 2);
    assert.equal(arena.usedBytes, 2 * PAGE);
    const z = arena.allocate(0)!;
    assert.equal(z.view.byteLength, 0);
    assert.equal(z.pages, 1);
    assert.equal(arena.usedBytes, 3 * PAGE);
    assert.equal(arena.blockCount, 2);
  });

  it('allocates slabs lazily and never beyond the capacity', () => {
    const arena = new HostArena({ capacityBytes: 10 * PAGE, pageBytes: PAGE, slabBytes: 4 * PAGE });
    assert.equal(arena.reservedBytes, 0);
    assert.equal(arena.maxBlockBytes, 4 * PAGE);
    arena.allocate(PAGE);
    assert.equal(arena.reservedBytes, 4 * PAGE);
    arena.allocate(3 * PAGE);
    arena.allocate(4 * PAGE);
    assert.equal(arena.reservedBytes, 8 * PAGE);
    // The tail slab is 2 pages: a 3-page block cannot fit there.
    assert.equal(arena.allocate(3 * PAGE), null);
    assert.equal(arena.reservedBytes, 8 * PAGE);
    assert.notEqual(arena.allocate(2 * PAGE), null);
    assert.equal(arena.reservedBytes, 10 * PAGE);
    assert.equal(arena.usedBytes, 10 * PAGE);
    assert.equal(arena.allocate(0), null);
  });

  it('returns null when full and succeeds again after a free', () => {
    const arena = new HostArena({ capacityBytes: 4 * PAGE, pageBytes: PAGE });
    const blocks = [0, 1, 2, 3].map(() => arena.allocate(PAGE)!);
    assert.equal(arena.allocate(1), null);
    arena.free(blocks[2]!);
    const again = arena.allocate(PAGE);
    assert.ok(again, 'a freed page can be allocated again');
    assert.equal(again.view.byteOffset, blocks[2]!.view.byteOffset);
  });

  it('rejects blocks larger than a slab with KVT_TOO_LARGE and bad sizes with KVT_INVALID_ARGUMENT', () => {
    const arena = new HostArena({ capacityBytes: 8 * PAGE, pageBytes: PAGE, slabBytes: 4 * PAGE });
    assert.throws(
      () => arena.allocate(4 * PAGE + 1),
      (e: unknown) => isKvtierError(e, 'KVT_TOO_LARGE'),
    );
    assert.throws(
      () => arena.allocate(-1),
      (e: unknown) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
    );
    assert.throws(
      () => arena.allocate(1.5),
      (e: unknown) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
    );
  });

  it('places a block on contiguous pages of one slab, even after fragmentation', () => {
    const arena = new HostArena({ capacityBytes: 16 * PAGE, pageBytes: PAGE, slabBytes: 8 * PAGE });
    const singles = Array.from({ length: 8 }, () => arena.allocate(PAGE)!);
    // Free every other page: 4 free pages but no 2-page run in slab 0.
    for (let i = 0; i < 8; i += 2) arena.free(singles[i]!);
    const pair = arena.allocate(2 * PAGE)!;
    assert.ok(!sameBuffer(pair.view, singles[1]!.view), 'a 2-page block must go to a fresh slab');
    const four = arena.allocate(4 * PAGE)!;
    assert.equal(sameBuffer(four.view, pair.view), true, 'same slab');
    assert.equal(four.view.byteOffset, pair.view.byteOffset + 2 * PAGE);
    // Writing a whole block touches no neighbour.
    for (const b of singles.filter((_, i) => i % 2 === 1)) b.view.fill(7);
    four.view.fill(9);
    pair.view.fill(5);
    for (const b of singles.filter((_, i) => i % 2 === 1))
      assert.equal(
        b.view.every((x) => x === 7),
        true,
        'neighbour intact',
      );
  });

  it('coalesces freed neighbours into one run', () => {
    const arena = new HostArena({ capacityBytes: 8 * PAGE, pageBytes: PAGE });
    const rand = prng(7);
    const blocks = Array.from({ length: 8 }, () => arena.allocate(PAGE)!);
    const order = blocks.map((b) => ({ b, k: rand() })).sort((x, y) => x.k - y.k);
    for (const { b } of order) arena.free(b);
    assert.equal(arena.usedBytes, 0);
    const whole = arena.allocate(8 * PAGE);
    assert.ok(whole, 'all 8 pages must be one run again');
    assert.equal(whole.view.byteOffset, blocks[0]!.view.byteOffset);
  });

  it('throws KVT_INTERNAL on double free and on a foreign block, leaving state intact', () => {
    const arena = new HostArena({ capacityBytes: 4 * PAGE, pageBytes: PAGE });
    const other = new HostArena({ capacityBytes: 4 * PAGE, pageBytes: PAGE });
    const a = arena.allocate(PAGE)!;
    const b = arena.allocate(PAGE)!;
    arena.free(a);
    assert.throws(
      () => arena.free(a),
      (e: unknown) => isKvtierError(e, 'KVT_INTERNAL'),
    );
    assert.throws(
      () => arena.free(other.allocate(PAGE)!),
      (e: unknown) => isKvtierError(e, 'KVT_INTERNAL'),
    );
    const fake: ArenaBlock = { view: new Uint8Array(PAGE), bytes: PAGE, pages: 1 };
    assert.throws(
      () => arena.free(fake),
      (e: unknown) => isKvtierError(e, 'KVT_INTERNAL'),
    );
    assert.equal(arena.usedBytes, PAGE);
    // Only three pages are free: a double free must not have handed out a fourth.
    for (let i = 0; i < 3; i++) assert.notEqual(arena.allocate(PAGE), null);
    assert.equal(arena.allocate(1), null);
    arena.free(b);
  });

  it('never exceeds its bound and never hands out overlapping blocks (seeded random workload)', () => {
    const arena = new HostArena({
      capacityBytes: 40 * PAGE,
      pageBytes: PAGE,
      slabBytes: 16 * PAGE,
    });
    const rand = prng(12345);
    const live: ArenaBlock[] = [];
    let nulls = 0;
    for (let step = 0; step < 4000; step++) {
      if (live.length > 0 && rand() < 0.45) {
        const i = Math.floor(rand() * live.length);
        arena.free(live.splice(i, 1)[0]!);
      } else {
        const bytes = Math.floor(rand() * 6 * PAGE);
        const b = arena.allocate(bytes);
        if (b === null) nulls++;
        else {
          for (const o of live)
            assert.ok(!overlaps(o.view, b.view, PAGE), `overlap at step ${step}`);
          live.push(b);
        }
      }
      const pages = live.reduce((n, b) => n + b.pages, 0);
      assert.equal(arena.usedBytes, pages * PAGE);
      assert.ok(arena.usedBytes <= arena.capacityBytes, `used over bound at step ${step}`);
      assert.ok(arena.reservedBytes <= arena.capacityBytes, `slabs over bound at step ${step}`);
    }
    assert.ok(nulls > 0, 'the workload should have filled the arena at least once');
    for (const b of live.splice(0)) arena.free(b);
    assert.equal(arena.usedBytes, 0);
    assert.ok(arena.allocate(16 * PAGE), 'everything coalesces back into whole slabs');
  });
});
