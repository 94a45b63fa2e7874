import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { pathToFileURL } from 'node:url';
import { KvtierError } from '../../src/errors.ts';
import { loadNative, type NativeAddon, NativeError } from '../../src/native/native-addon.ts';
import { spawnGuarded } from '../support/child-guard.ts';

const loadedNative = loadNative();
const noAddon = loadedNative.addon === null ? loadedNative.reason : false;
const nativeUrl = pathToFileURL(join(import.meta.dirname, '../../src/native/native-addon.ts')).href;

/** Deterministic bytes both processes can compute: byte i of pattern `seed`. */
function patternByte(i: number, seed: number): number {
  return (i * 131 + seed * 7 + (i >> 8)) & 255;
}

function pattern(length: number, seed: number): Uint8Array {
  const out = new Uint8Array(length);
  for (let i = 0; i < length; i++) out[i] = patternByte(i, seed);
  return out;
}

// The child maps the same file range itself, writes pattern `seed` into it through the addon's
// copy engine (slab -> mapping, two ops), then checks the parent's pattern in both a shared
// writable mapping and a private read-only one.
const CHILD = `
const { loadNative } = await import(process.env.KVT_NATIVE_URL);
const { addon } = loadNative();
if (addon === null) { process.send({ type: 'error', message: 'no addon' }); process.exit(1); }
const [path, offset, length, seed] = process.argv.slice(-4);
const off = Number(offset), len = Number(length);
const byteAt = ${patternByte.toString()};
const shared = addon.mapFile(path, { offsetBytes: off, lengthBytes: len, writable: true });
const readOnly = addon.mapFile(path, { offsetBytes: off, lengthBytes: len });
const slab = addon.allocSlab(len);
const s = new Uint8Array(slab);
for (let i = 0; i < len; i++) s[i] = byteAt(i, Number(seed));
const half = len / 2;
await addon.copyBatch([slab, shared], new Float64Array([0, half, 1, half, half, 0, 0, 1, 0, half]));
process.send({ type: 'written' });
process.on('message', (m) => {
  const firstBad = (view) => {
    for (let i = 0; i < len; i++) if (view[i] !== byteAt(i, m.seed)) return i;
    return -1;
  };
  process.send({ type: 'checked', shared: firstBad(new Uint8Array(shared)), readOnly: firstBad(new Uint8Array(readOnly)) });
  process.disconnect();
});
`;

type ChildMessage =
  | { type: 'written' }
  | { type: 'checked'; shared: number; readOnly: number }
  | { type: 'error'; message: string };

function nextMessage(child: ChildProcess): Promise<ChildMessage> {
  return new Promise((resolve, reject) => {
    const onMessage = (m: ChildMessage) => {
      cleanup();
      resolve(m);
    };
    const onExit = (code: number | null) => {
      cleanup();
      reject(new Error(`child exited with ${code} before replying`));
    };
    const cleanup = () => {
      child.off('message', onMessage);
      child.off('exit', onExit);
    };
    child.on('message', onMessage);
    child.on('exit', onExit);
  });
}

describe('native addon: shared-memory files', { skip: noAddon }, () => {
  const addon = loadedNative.addon as NativeAddon;
  let dir = '';
  let page = 4096;

  before(() => {
    dir = mkdtempSync(join(existsSync('/dev/shm') ? '/dev/shm' : tmpdir(), 'kvtier-native-'));
    page = addon.probe().pageBytes;
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('a child process and the parent see each other’s writes byte for byte', async () => {
    const path = join(dir, 'kv-cache');
    writeFileSync(path, Buffer.alloc(4 * page));
    const mine = new Uint8Array(addon.mapFile(path, { writable: true }));
    assert.equal(mine.length, 4 * page);
    const child = spawnGuarded(
      process.execPath,
      [
        '--import',
        'tsx',
        '--input-type=module',
        '-e',
        CHILD,
        '--',
        path,
        String(page),
        String(2 * page),
        '11',
      ],
      {
        stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
        env: { ...process.env, KVT_NATIVE_URL: nativeUrl },
      },
    );
    try {
      const written = await nextMessage(child);
      assert.deepEqual(written, { type: 'written' });
      assert.equal(
        Buffer.compare(mine.subarray(page, 3 * page), pattern(2 * page, 11)),
        0,
        'child bytes seen',
      );
      assert.equal(
        mine.subarray(0, page).every((b) => b === 0),
        true,
        'page before untouched',
      );
      assert.equal(
        mine.subarray(3 * page).every((b) => b === 0),
        true,
        'page after untouched',
      );
      mine.set(pattern(2 * page, 23), page);
      child.send({ seed: 23 });
      const checked = await nextMessage(child);
      assert.deepEqual(checked, { type: 'checked', shared: -1, readOnly: -1 });
    } finally {
      child.kill();
    }
    assert.equal(
      Buffer.compare(readFileSync(path).subarray(page, 3 * page), pattern(2 * page, 23)),
      0,
      'file holds the bytes',
    );
  });

  it('gathers from and scatters to a mapping with copyBatch', async () => {
    const path = join(dir, 'gather');
    writeFileSync(path, pattern(8 * page, 5));
    const kv = addon.mapFile(path, { writable: true });
    const slab = addon.allocSlab(3 * page);
    // Blocks 6, 1, 4 of the "KV cache" into consecutive slab pages, then back to blocks 0, 2, 3.
    const blocks = [6, 1, 4];
    const gather = new Float64Array(blocks.flatMap((b, i) => [0, b * page, 1, i * page, page]));
    assert.equal(await addon.copyBatch([kv, slab], gather), 3);
    const src = pattern(8 * page, 5);
    blocks.forEach((b, i) => {
      const want = src.subarray(b * page, (b + 1) * page);
      assert.equal(
        Buffer.compare(new Uint8Array(slab, i * page, page), want),
        0,
        `gathered block ${b}`,
      );
    });
    const scatter = new Float64Array(
      [0, 2]
        .flatMap((b, i) => [1, i * page, 0, b * page, page])
        .concat([1, 2 * page, 0, 3 * page, page]),
    );
    assert.equal(
      await addon.copyBatch([kv, slab], scatter),
      2,
      'blocks 2 and 3 are contiguous with slab pages 1 and 2',
    );
    const file = readFileSync(path);
    for (const [i, b] of [0, 2, 3].entries()) {
      const want = src.subarray(blocks[i]! * page, (blocks[i]! + 1) * page);
      assert.equal(
        Buffer.compare(file.subarray(b * page, (b + 1) * page), want),
        0,
        `scattered into block ${b}`,
      );
    }
  });

  it('a read-only mapping never writes the file', () => {
    const path = join(dir, 'ro');
    writeFileSync(path, pattern(2 * page, 3));
    const view = new Uint8Array(addon.mapFile(path, { offsetBytes: page }));
    assert.equal(view.length, page);
    view.fill(0);
    assert.equal(Buffer.compare(readFileSync(path), pattern(2 * page, 3)), 0);
  });

  it('refuses bad ranges and missing files with codes', () => {
    const path = join(dir, 'small');
    writeFileSync(path, Buffer.alloc(2 * page));
    writeFileSync(join(dir, 'empty'), Buffer.alloc(0));
    const cases: [() => unknown, string, string][] = [
      [() => addon.mapFile(path, { offsetBytes: 100 }), 'ERR_MISALIGNED', 'KVT_INVALID_ARGUMENT'],
      [
        () => addon.mapFile(path, { offsetBytes: 3 * page }),
        'ERR_OUT_OF_RANGE',
        'KVT_INVALID_ARGUMENT',
      ],
      [
        () => addon.mapFile(path, { offsetBytes: 2 * page }),
        'ERR_OUT_OF_RANGE',
        'KVT_INVALID_ARGUMENT',
      ],
      [
        () => addon.mapFile(path, { offsetBytes: page, lengthBytes: page + 1 }),
        'ERR_OUT_OF_RANGE',
        'KVT_INVALID_ARGUMENT',
      ],
      [() => addon.mapFile(join(dir, 'empty')), 'ERR_OUT_OF_RANGE', 'KVT_INVALID_ARGUMENT'],
      [() => addon.mapFile(join(dir, 'missing')), 'ENOENT', 'KVT_NOT_FOUND'],
      [() => addon.mapFile(dir, { writable: true }), 'EISDIR', 'KVT_BACKEND'],
    ];
    for (const [fn, nativeCode, code] of cases) {
      assert.throws(fn, (e: unknown) => {
        assert.ok(e instanceof NativeError, `expected NativeError, got ${String(e)}`);
        assert.equal(e.nativeCode, nativeCode, e.message);
        assert.equal(e.code, code);
        return true;
      });
    }
    assert.throws(
      () => addon.mapFile(path, { offsetBytes: -1 }),
      (e: unknown) => e instanceof KvtierError && e.code === 'KVT_INVALID_ARGUMENT',
    );
  });
});

describe('native addon: CUDA device', { skip: noAddon }, () => {
  const addon = loadedNative.addon as NativeAddon;
  const cuda = loadedNative.addon?.probe().cuda;
  const noGpu = cuda?.available === true ? false : `no GPU: ${cuda?.reason ?? 'addon not loaded'}`;

  it('copies host -> device -> host byte-exact, ops coalesced', { skip: noGpu }, async () => {
    const bytes = 1 << 20;
    const ptr = addon.cudaMalloc(bytes);
    try {
      const src = addon.allocSlab(bytes);
      new Uint8Array(src).set(pattern(bytes, 17));
      const back = addon.allocSlab(bytes);
      const region = [{ ptr, bytes }];
      // Host halves swapped on the device, then read back contiguous.
      const h2d = new Float64Array([0, 0, 0, bytes / 2, bytes / 2, 0, bytes / 2, 0, 0, bytes / 2]);
      assert.equal(await addon.copyBatchDevice('h2d', [src], region, h2d), 2);
      const pieces = Array.from({ length: 16 }, (_, i) => [
        0,
        (i * bytes) / 16,
        0,
        (i * bytes) / 16,
        bytes / 16,
      ]);
      assert.equal(
        await addon.copyBatchDevice('d2h', [back], region, new Float64Array(pieces.flat())),
        1,
      );
      const want = pattern(bytes, 17);
      const swapped = Buffer.concat([want.subarray(bytes / 2), want.subarray(0, bytes / 2)]);
      assert.equal(Buffer.compare(new Uint8Array(back), swapped), 0);
      await assert.rejects(
        addon.copyBatchDevice('d2h', [back], region, new Float64Array([0, 0, 0, 1, bytes])),
        (e: unknown) => e instanceof NativeError && e.nativeCode === 'ERR_OUT_OF_RANGE',
      );
    } finally {
      addon.cudaFree(ptr);
    }
  });

  it('exports an IPC handle of 64 bytes', { skip: noGpu }, () => {
    const ptr = addon.cudaMalloc(4096);
    try {
      assert.equal(addon.cudaIpcGetMemHandle(ptr).length, 64);
    } finally {
      addon.cudaFree(ptr);
    }
  });
});
