import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { KvtierError } from '../../src/errors.ts';
import {
  COPY_OP_WIDTH,
  type CopyBuffer,
  loadNative,
  type NativeAddon,
  NativeError,
} from '../../src/native/native-addon.ts';
import { jsCopyBatch } from '../support/js-copy-batch.ts';

const NATIVE_MODULE = new URL('../../src/native/native-addon.ts', import.meta.url).href;
const loadedNative = loadNative();
const addon: NativeAddon | null = loadedNative.addon;
const noAddon = loadedNative.addon === null ? loadedNative.reason : false;

/** mulberry32: a small seeded generator so every run sees the same op lists. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function ops(...tuples: number[][]): Float64Array {
  return new Float64Array(tuples.flat());
}

function fillSeeded(view: Uint8Array, seed: number): void {
  const next = rng(seed);
  for (let i = 0; i < view.length; i++) view[i] = (next() * 256) | 0;
}

/** Both implementations: the addon (when built) and the JS reference in test/support. */
const engines: { name: string; run: typeof jsCopyBatch; skip: string | false }[] = [
  {
    name: 'native',
    run: (b, o, opt) => (addon as NativeAddon).copyBatch(b, o, opt),
    skip: noAddon,
  },
  { name: 'js', run: jsCopyBatch, skip: false },
];

async function rejection(p: Promise<unknown>): Promise<NativeError> {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof NativeError, `expected a NativeError, got ${String(err)}`);
    return err;
  }
  assert.fail('expected a rejection');
}

interface Layout {
  make(): CopyBuffer[];
  dsts: number[];
  ops: Float64Array;
}

/**
 * Buffers of several kinds (ArrayBuffer, offset views, Buffer) and random ops: sources anywhere
 * in the source buffers (overlapping each other is allowed), destinations in disjoint slots of
 * the destination buffers, with runs of contiguous ops so that coalescing happens.
 */
function randomLayout(seed: number): Layout {
  const next = rng(seed);
  const int = (n: number) => Math.floor(next() * n);
  const srcSizes = [70_000, 4096 * 9, 123_457];
  const dstSlot = 512;
  const dstSlots = [160, 96];
  const make = (): CopyBuffer[] => {
    const srcs: CopyBuffer[] = srcSizes.map((n, i) => {
      const backing = new ArrayBuffer(n + 13);
      const view = new Uint8Array(backing, 13, n);
      fillSeeded(view, seed * 31 + i);
      return i === 1 ? backing.slice(13) : view;
    });
    const dsts: CopyBuffer[] = dstSlots.map((slots) => Buffer.alloc(slots * dstSlot + 7, 0xee));
    return [...srcs, ...dsts];
  };
  const free: [number, number][] = [];
  dstSlots.forEach((slots, d) => {
    for (let s = 0; s < slots; s++) free.push([srcSizes.length + d, s]);
  });
  for (let i = free.length - 1; i > 0; i--) {
    const j = int(i + 1);
    [free[i], free[j]] = [free[j]!, free[i]!];
  }
  const tuples: number[][] = [];
  while (free.length > 0) {
    const [dst, slot] = free.pop()!;
    const len = next() < 0.3 ? dstSlot : int(dstSlot + 1);
    const src = int(srcSizes.length);
    const srcOff = int(srcSizes[src]! - len + 1);
    tuples.push([src, srcOff, dst, slot * dstSlot, len]);
    // Sometimes continue in the next slot of the same buffer from the next source byte.
    const nextSlot = free.findIndex(([d, s]) => d === dst && s === slot + 1);
    if (len === dstSlot && next() < 0.5 && nextSlot !== -1 && srcOff + 2 * len <= srcSizes[src]!) {
      free.splice(nextSlot, 1);
      tuples.push([src, srcOff + len, dst, (slot + 1) * dstSlot, len]);
    }
  }
  return { make, dsts: [3, 4], ops: ops(...tuples) };
}

function bytes(b: CopyBuffer): Uint8Array {
  return b instanceof ArrayBuffer
    ? new Uint8Array(b)
    : new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
}

describe('native addon: load and probe', () => {
  it('loads, or says why not', () => {
    if (addon === null) {
      assert.match(loadedNative.addon === null ? loadedNative.reason : '', /native addon/);
      return;
    }
    assert.match(addon.path, /kvtier_native\.node$/);
  });

  it('refuses an addon built from older sources, naming what it lacks', () => {
    // A module with only part of the functions stands in for a stale build: loading it must
    // leave kvtier on its fallbacks with a reason, not fail later inside a checksum or copy.
    const dir = mkdtempSync(join(tmpdir(), 'kvtier-stale-addon-'));
    try {
      const path = join(dir, 'stale.cjs');
      writeFileSync(path, 'module.exports = { probe() { return {}; }, copyBatch() {} };');
      const script = `import { loadNative } from ${JSON.stringify(NATIVE_MODULE)};
        const r = loadNative(); console.log(JSON.stringify({ loaded: r.addon !== null, reason: r.reason }));`;
      const res = spawnSync(
        process.execPath,
        ['--import', 'tsx', '--input-type=module', '-e', script],
        {
          env: { ...process.env, KVTIER_NATIVE_PATH: path },
          encoding: 'utf8',
        },
      );
      assert.equal(res.status, 0, res.stderr);
      const out = JSON.parse(res.stdout.trim()) as { loaded: boolean; reason: string };
      assert.equal(out.loaded, false);
      assert.match(
        out.reason,
        /older than this kvtier \(no allocSlab, mapFile, .*crc32c, crc32cAsync/,
      );
      assert.match(out.reason, /build:native/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('probes the host part and reports CUDA unavailable with a reason', { skip: noAddon }, (t) => {
    const p = (addon as NativeAddon).probe();
    assert.equal(p.host, true);
    assert.equal(p.pageBytes % 4096, 0);
    if (p.cuda.available) {
      t.diagnostic(`CUDA available: ${p.cuda.devices} device(s)`);
      assert.ok(p.cuda.devices > 0, 'an available CUDA reports devices');
      return;
    }
    assert.equal(p.cuda.devices, 0);
    assert.match(
      p.cuda.reason,
      /no CUDA driver|no CUDA device|compiled without CUDA|KVTIER_NO_CUDA/,
    );
    t.diagnostic(`cuda: compiled=${p.cuda.compiled} reason=${p.cuda.reason}`);
  });

  it('refuses CUDA calls without CUDA, with codes', { skip: noAddon }, () => {
    const a = addon as NativeAddon;
    if (a.probe().cuda.available) return;
    assert.throws(
      () => a.cudaIpcOpenMemHandle(new Uint8Array(64)),
      (e: unknown) =>
        e instanceof NativeError && e.nativeCode === 'ERR_NO_CUDA' && e.code === 'KVT_BACKEND',
    );
    assert.throws(
      () => a.cudaMalloc(4096),
      (e: unknown) => e instanceof NativeError && e.nativeCode === 'ERR_NO_CUDA',
    );
    assert.throws(
      () => a.cudaDeviceUuids(),
      (e: unknown) => e instanceof NativeError && e.nativeCode === 'ERR_NO_CUDA',
    );
  });

  it('lists one GPU UUID per visible device where CUDA is available', (t) => {
    const a = addon as NativeAddon | null;
    const cuda = a?.probe().cuda;
    if (a === null || cuda?.available !== true) {
      t.skip(`no GPU: ${cuda?.reason ?? 'addon not loaded'}`);
      return;
    }
    const uuids = a.cudaDeviceUuids();
    assert.equal(uuids.length, cuda.devices);
    for (const u of uuids)
      assert.match(u, /^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
    assert.equal(new Set(uuids).size, uuids.length, 'UUIDs are unique');
    t.diagnostic(`devices: ${uuids.join(', ')}`);
  });
});

describe('native addon: slabs', { skip: noAddon }, () => {
  it('hands out page-aligned, zeroed slabs of the asked size', () => {
    const a = addon as NativeAddon;
    const page = BigInt(a.probe().pageBytes);
    for (const size of [1, 4096, 65_537, 8 * 1024 * 1024]) {
      const slab = a.allocSlab(size);
      assert.equal(slab.byteLength, size);
      assert.equal(a.addressOf(slab) % page, 0n, `slab of ${size} bytes is page aligned`);
      const view = new Uint8Array(slab);
      assert.equal(view.indexOf(1), -1, 'slab starts zeroed');
      view.fill(0xab);
      assert.equal(view[size - 1], 0xab);
    }
  });

  it('addressOf a view is the buffer address plus its offset', () => {
    const a = addon as NativeAddon;
    const slab = a.allocSlab(8192);
    assert.equal(a.addressOf(new Uint8Array(slab, 100, 10)), a.addressOf(slab) + 100n);
  });

  it('refuses slabs above 1 GiB and of 0 bytes', () => {
    const a = addon as NativeAddon;
    assert.throws(
      () => a.allocSlab(1024 * 1024 * 1024 + 1),
      (e: unknown) => e instanceof KvtierError && e.code === 'KVT_INVALID_ARGUMENT',
    );
    assert.throws(
      () => a.allocSlab(0),
      (e: unknown) => e instanceof KvtierError && e.code === 'KVT_INVALID_ARGUMENT',
    );
  });
});

describe('copy batches (native and JS fallback)', () => {
  for (const seed of [1, 2, 3, 4, 5, 6]) {
    it(`native matches the JS fallback byte for byte (seed ${seed})`, {
      skip: noAddon,
    }, async () => {
      const layout = randomLayout(seed);
      const viaNative = layout.make();
      const viaJs = layout.make();
      const nNative = await (addon as NativeAddon).copyBatch(viaNative, layout.ops, {
        maxThreads: 3,
      });
      const nJs = await jsCopyBatch(viaJs, layout.ops);
      assert.equal(nNative, nJs, 'same number of copies after coalescing');
      assert.ok(nJs < layout.ops.length / COPY_OP_WIDTH, 'some ops were coalesced');
      for (const d of layout.dsts) {
        assert.equal(
          Buffer.compare(bytes(viaNative[d]!), bytes(viaJs[d]!)),
          0,
          `destination ${d} differs`,
        );
      }
      // The JS result itself must be right: check each op against its source.
      const srcs = layout.make();
      for (let i = 0; i < layout.ops.length; i += COPY_OP_WIDTH) {
        const [s, so, d, dOff, len] = layout.ops.subarray(
          i,
          i + COPY_OP_WIDTH,
        ) as unknown as number[];
        const want = bytes(srcs[s!]!).subarray(so!, so! + len!);
        const got = bytes(viaJs[d!]!).subarray(dOff!, dOff! + len!);
        assert.equal(
          Buffer.compare(want, got),
          0,
          `op ${i / COPY_OP_WIDTH} copied the wrong bytes`,
        );
      }
    });
  }

  for (const engine of engines) {
    it(`${engine.name}: coalesces only ops contiguous on both sides`, {
      skip: engine.skip,
    }, async () => {
      const src = new Uint8Array(1 << 20);
      fillSeeded(src, 9);
      const dst = new Uint8Array(1 << 20);
      const pieces = Array.from({ length: 256 }, (_, i) => [0, i * 4096, 1, i * 4096, 4096]);
      assert.equal(await engine.run([src, dst], ops(...pieces)), 1);
      assert.equal(Buffer.compare(src, dst), 0);
      dst.fill(0);
      // Source contiguous, destination not; then a gap; then the same buffers again.
      const n = await engine.run(
        [src, dst],
        ops([0, 0, 1, 0, 10], [0, 10, 1, 20, 10], [0, 30, 1, 30, 5], [0, 35, 1, 35, 5]),
      );
      assert.equal(n, 3);
      assert.deepEqual(
        [...dst.subarray(0, 40)],
        [
          ...src.subarray(0, 10),
          ...new Array(10).fill(0),
          ...src.subarray(10, 20),
          ...src.subarray(30, 40),
        ],
      );
      assert.equal(await engine.run([src, dst], new Float64Array(0)), 0);
      assert.equal(
        await engine.run([src, dst], ops([0, 5, 1, 1 << 20, 0])),
        0,
        'zero-length op at the end is fine',
      );
    });

    it(`${engine.name}: a bad op rejects with a code and copies nothing`, {
      skip: engine.skip,
    }, async () => {
      const src = new Uint8Array(4096).fill(7);
      const dst = new Uint8Array(4096);
      const good = [0, 0, 1, 0, 100];
      const cases: [number[][] | Float64Array, string][] = [
        [[good, [0, 4000, 1, 200, 97]], 'ERR_OUT_OF_RANGE'],
        [[good, [0, 0, 1, 4096, 1]], 'ERR_OUT_OF_RANGE'],
        [[good, [0, 0, 2, 200, 1]], 'ERR_BAD_OP'],
        [[good, [0, -1, 1, 200, 1]], 'ERR_BAD_OP'],
        [[good, [0, 0.5, 1, 200, 1]], 'ERR_BAD_OP'],
        [[good, [0, Number.NaN, 1, 200, 1]], 'ERR_BAD_OP'],
        [new Float64Array([...good, 0, 0, 1]), 'ERR_BAD_OP'],
        [[good, [0, 0, 1, 50, 100]], 'ERR_OVERLAP'],
        [[good, [1, 0, 1, 200, 10]], 'ERR_OVERLAP'],
        [[good, [0, 0, 0, 10, 10]], 'ERR_OVERLAP'],
      ];
      for (const [list, code] of cases) {
        const err = await rejection(
          engine.run([src, dst], list instanceof Float64Array ? list : ops(...list)),
        );
        assert.equal(
          err.nativeCode,
          code,
          `${JSON.stringify([...(list instanceof Float64Array ? list : list.flat())])}: ${err.message}`,
        );
        assert.equal(err.code, 'KVT_INVALID_ARGUMENT');
        assert.equal(dst.indexOf(7), -1, `nothing was copied for ${code}`);
      }
      const err = await rejection(engine.run([src, 'nope' as unknown as Uint8Array], ops(good)));
      assert.equal(err.nativeCode, 'ERR_INVALID_ARG');
    });

    it(`${engine.name}: an aborted signal rejects before copying`, {
      skip: engine.skip,
    }, async () => {
      const src = new Uint8Array(16).fill(1);
      const dst = new Uint8Array(16);
      await assert.rejects(
        engine.run([src, dst], ops([0, 0, 1, 0, 16]), { signal: AbortSignal.abort() }),
        (e: unknown) => e instanceof KvtierError && e.code === 'KVT_ABORTED',
      );
      assert.equal(dst.indexOf(1), -1);
    });
  }

  for (const threads of [1, 4]) {
    it(`native: a ${threads}-thread batch of 48 MiB (streaming stores) whose runs straddle the 1 MiB slices is exact`, {
      skip: noAddon,
    }, async () => {
      const a = addon as NativeAddon;
      const next = rng(7);
      const src = Buffer.allocUnsafe(48 * 1024 * 1024);
      fillSeeded(src, 7);
      const dst = Buffer.alloc(src.length + 4096, 0xee);
      // Runs of odd lengths (a few bytes to a few MiB), each moved 4096 bytes up, in shuffled
      // order so that nothing coalesces and slices start and end inside runs.
      const tuples: number[][] = [];
      for (let at = 0; at < src.length; ) {
        const len = Math.min(src.length - at, 1 + Math.floor(next() * 3 * 1024 * 1024));
        tuples.push([0, at, 1, at + 4096, len]);
        at += len;
      }
      for (let i = tuples.length - 1; i > 0; i--) {
        const j = Math.floor(next() * (i + 1));
        [tuples[i], tuples[j]] = [tuples[j]!, tuples[i]!];
      }
      const n = await a.copyBatch([src, dst], ops(...tuples), { maxThreads: threads });
      assert.ok(n > 4 && n <= tuples.length, `${n} runs after coalescing`);
      assert.equal(Buffer.compare(dst.subarray(4096), src), 0, 'every byte copied to its place');
      assert.ok(
        dst.subarray(0, 4096).every((b) => b === 0xee),
        'nothing written before the first run',
      );
    });
  }

  it('native: a 256 MiB batch runs off the event loop', { skip: noAddon }, async () => {
    const a = addon as NativeAddon;
    const mib = 1024 * 1024;
    const total = 256 * mib;
    const src = a.allocSlab(total);
    const dst = a.allocSlab(total);
    const s = new Uint8Array(src);
    for (let i = 0; i < 256; i++) s.fill(i, i * mib, (i + 1) * mib);
    // 4 MiB pieces in reverse order: nothing coalesces, the batch is split across threads.
    const pieces = Array.from({ length: 64 }, (_, i) => {
      const at = (63 - i) * 4 * mib;
      return [0, at, 1, at, 4 * mib];
    });
    let ticks = 0;
    let done = false;
    const tick = () => {
      if (done) return;
      ticks++;
      setImmediate(tick);
    };
    setImmediate(tick);
    const n = await a.copyBatch([src, dst], ops(...pieces), { maxThreads: 4 });
    done = true;
    assert.equal(n, 64);
    assert.ok(ticks > 0, `the event loop turned while the copy ran (ticks=${ticks})`);
    assert.equal(Buffer.compare(new Uint8Array(src), new Uint8Array(dst)), 0, 'copy is byte-exact');
  });
});
