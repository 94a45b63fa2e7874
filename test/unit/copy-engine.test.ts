import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import type { CopySurface } from '../../src/data-plane/data-plane.ts';
import {
  CudaAllocation,
  createNativeCopyEngine,
  planDeviceOps,
  splitOpsByDevice,
} from '../../src/data-plane/native-copy-engine.ts';
import { loadNative } from '../../src/native/native-addon.ts';

describe('planDeviceOps', () => {
  const dev = (bytes: number) => new CudaAllocation(0x1000n, bytes, () => {});
  test('splits host, host→device and device→host copies and re-indexes each part', () => {
    const a = new Uint8Array(64);
    const b = new Uint8Array(64);
    const g0 = dev(1024);
    const g1 = dev(1024);
    const surfaces: CopySurface[] = [a, g0, b, g1];
    // host→host, host→device (load), device→host (save), host→device to the second GPU region
    const ops = Float64Array.from([
      0, 0, 2, 8, 16, 0, 16, 1, 512, 32, 1, 256, 2, 0, 8, 2, 4, 3, 100, 4,
    ]);
    const plan = planDeviceOps(surfaces, ops, (s) => s instanceof CudaAllocation);
    assert.deepEqual(plan.host.buffers, [a, b]);
    assert.deepEqual([...plan.host.ops], [0, 0, 1, 8, 16]);
    assert.deepEqual(plan.h2d.buffers, [a, b]);
    assert.deepEqual(plan.h2d.devices, [g0, g1]);
    assert.deepEqual([...plan.h2d.ops], [0, 16, 0, 512, 32, 1, 4, 1, 100, 4]);
    assert.deepEqual(plan.d2h.buffers, [b]);
    assert.deepEqual(plan.d2h.devices, [g0]);
    assert.deepEqual(
      [...plan.d2h.ops],
      [0, 0, 0, 256, 8],
      'd2h ops are [host, hostOff, device, deviceOff, len]',
    );
  });

  test('refuses device-to-device copies and unknown surfaces', () => {
    const g = dev(64);
    assert.throws(
      () =>
        planDeviceOps(
          [g, g],
          Float64Array.from([0, 0, 1, 0, 8]),
          (s) => s instanceof CudaAllocation,
        ),
      { code: 'KVT_INVALID_ARGUMENT' },
    );
    assert.throws(
      () => planDeviceOps([new Uint8Array(8)], Float64Array.from([0, 0, 3, 0, 8]), () => false),
      { code: 'KVT_INVALID_ARGUMENT' },
    );
  });
});

describe('splitOpsByDevice', () => {
  test('groups ops by the device of their device surface; host-only ops form part -1', () => {
    const h = new Uint8Array(64);
    const g0 = new CudaAllocation(0x1000n, 1024, () => {}, 0);
    const g2 = new CudaAllocation(0x2000n, 1024, () => {}, 2);
    const surfaces: CopySurface[] = [h, g0, g2, new Uint8Array(64)];
    const ops = Float64Array.from([
      0, 0, 2, 0, 8, 0, 8, 1, 0, 8, 1, 64, 3, 0, 8, 0, 16, 3, 16, 8, 2, 128, 0, 32, 8,
    ]);
    const parts = splitOpsByDevice(surfaces, ops);
    assert.deepEqual([...parts.keys()].sort(), [-1, 0, 2]);
    assert.deepEqual([...parts.get(2)!], [0, 0, 2, 0, 8, 2, 128, 0, 32, 8]);
    assert.deepEqual([...parts.get(0)!], [0, 8, 1, 0, 8, 1, 64, 3, 0, 8]);
    assert.deepEqual([...parts.get(-1)!], [0, 16, 3, 16, 8]);
  });

  test('an allocation opened without a device is on device 0', () => {
    assert.equal(new CudaAllocation(0x1000n, 8, () => {}).device, 0);
  });
});

describe('native copy engine (host device)', () => {
  const loaded = loadNative();
  test('copies between host memory and a shared KV file byte-exact', {
    skip:
      loaded.addon === null
        ? `native addon not built: ${loaded.addon === null ? loaded.reason : ''}`
        : false,
  }, async () => {
    const { engine } = createNativeCopyEngine();
    assert.ok(engine !== null, 'engine exists when the addon is built');
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-copy-engine-'));
    try {
      const path = join(dir, 'kv.bin');
      const original = randomBytes(256 * 1024);
      await writeFile(path, original);
      const file = await engine.openFile(path);
      assert.equal(file.sizeBytes, original.length);
      const page = new Uint8Array(64 * 1024);
      // Gather two blocks out of the file, then scatter them back swapped.
      await engine.copy(
        [file, page],
        Float64Array.from([0, 4096, 1, 0, 32 * 1024, 0, 128 * 1024, 1, 32 * 1024, 32 * 1024]),
      );
      assert.deepEqual(
        Buffer.from(page.subarray(0, 32 * 1024)),
        original.subarray(4096, 4096 + 32 * 1024),
      );
      await engine.copy(
        [page, file],
        Float64Array.from([0, 0, 1, 128 * 1024, 32 * 1024, 0, 32 * 1024, 1, 4096, 32 * 1024]),
      );
      const after = await readFile(path);
      assert.deepEqual(
        after.subarray(128 * 1024, 160 * 1024),
        original.subarray(4096, 4096 + 32 * 1024),
        'the write reached the file',
      );
      assert.deepEqual(
        after.subarray(4096, 4096 + 32 * 1024),
        original.subarray(128 * 1024, 160 * 1024),
      );
      await file.close();
      const cuda = loaded.addon!.probe().cuda;
      assert.equal(
        engine.openCuda !== undefined,
        cuda.available,
        'GPU KV caches are offered exactly when CUDA is available',
      );
      assert.equal(engine.cudaDevices !== undefined, cuda.available, 'devices are listed with it');
      if (engine.cudaDevices !== undefined) assert.equal(engine.cudaDevices().length, cuda.devices);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
