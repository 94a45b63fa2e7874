import assert from 'node:assert/strict';
import { randomFillSync } from 'node:crypto';
import { describe, it } from 'node:test';
import { setImmediate as nextTurn } from 'node:timers/promises';
import { PREFAULT_STEP_BYTES, type SlabPrefault } from '../../src/backends/arena/host-prefault.ts';
import { LocalCpuBackend } from '../../src/backends/local-cpu/local-cpu-backend.ts';
import { localCpuOptionsFromConfig } from '../../src/backends/local-cpu/local-cpu-options.ts';
import { BackendRegistry } from '../../src/backends/registry.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { isKvtierError } from '../../src/errors.ts';
import { type ChunkHash, chunkHash } from '../../src/hashing/chunk-hash.ts';
import { loadNative } from '../../src/native/native-addon.ts';
import { createLogger } from '../../src/util/log.ts';

const MiB = 1024 * 1024;
const NS = 'a'.repeat(32);
const loaded = loadNative();
const addon = loaded.addon;
const noAddon = addon === null ? loaded.reason : false;

function h(i: number): ChunkHash {
  return chunkHash(i.toString(16).padStart(64, '0'));
}

function logSink(): { log: ReturnType<typeof createLogger>; lines: () => string[] } {
  const out: string[] = [];
  return {
    log: createLogger('test', { level: 'debug', write: (l) => out.push(l) }),
    lines: () => out,
  };
}

/** Waits (in event-loop turns, at most `turns`) until `done()` holds. */
async function until(done: () => boolean, what: string, turns = 200_000): Promise<void> {
  for (let i = 0; i < turns; i++) {
    if (done()) return;
    await nextTurn();
  }
  assert.fail(`gave up waiting: ${what}`);
}

/** A prefault whose calls wait until released, and are recorded. */
function gatedPrefault(): { fn: SlabPrefault; calls: Uint8Array[]; release: () => void } {
  const calls: Uint8Array[] = [];
  let open: (() => void) | undefined;
  let gate = new Promise<void>((r) => {
    open = r;
  });
  return {
    calls,
    fn: async (view) => {
      calls.push(view);
      await gate;
      return view.byteLength;
    },
    release: () => {
      open?.();
      gate = Promise.resolve();
    },
  };
}

describe('native prefault', { skip: noAddon }, () => {
  it('commits a slab without changing a byte, and only whole pages inside the view', async () => {
    const a = addon!;
    const slab = new Uint8Array(a.allocSlab(8 * MiB));
    randomFillSync(slab, 0, 3 * MiB);
    const before = Buffer.from(slab);
    assert.equal(await a.prefault(slab), 8 * MiB);
    assert.ok(Buffer.from(slab).equals(before), 'pre-faulting changed the slab');
    const page = a.probe().pageBytes;
    assert.equal(await a.prefault(slab.subarray(1, page)), 0);
    assert.equal(await a.prefault(slab.subarray(1, 3 * page + 5)), 2 * page);
    assert.ok(Buffer.from(slab).equals(before), 'pre-faulting changed the slab');
  });

  it('refuses what is not memory', async () => {
    await assert.rejects(
      addon!.prefault(42 as unknown as Uint8Array),
      (err: unknown) => isKvtierError(err) && err.code === 'KVT_INVALID_ARGUMENT',
    );
  });
});

describe('local-cpu prefault', () => {
  it('is off by default: nothing is reserved and stats carry no prefault figure', async () => {
    const calls: Uint8Array[] = [];
    const cpu = new LocalCpuBackend({
      capacityBytes: 4 * MiB,
      prefaultSlab: async (v) => {
        calls.push(v);
        return v.byteLength;
      },
    });
    for (let i = 0; i < 20; i++) await nextTurn();
    assert.equal(calls.length, 0);
    assert.equal(cpu.stats().prefaultedBytes, undefined);
    await cpu.close();
  });

  it('reserves every slab and pre-faults it in steps, reporting progress', async () => {
    const calls: Uint8Array[] = [];
    const cpu = new LocalCpuBackend({
      capacityBytes: 40 * MiB,
      slabBytes: 32 * MiB,
      prefault: true,
      prefaultSlab: async (v) => {
        calls.push(v);
        return v.byteLength;
      },
    });
    await until(() => cpu.stats().prefaultedBytes === 40 * MiB, 'prefault to finish');
    // The 32 MiB slab, then the last 8 MiB one, each in steps.
    const steps = (n: number) =>
      Array.from({ length: Math.ceil(n / PREFAULT_STEP_BYTES) }, (_, i) =>
        Math.min(PREFAULT_STEP_BYTES, n - i * PREFAULT_STEP_BYTES),
      );
    assert.deepEqual(
      calls.map((v) => v.byteLength),
      [...steps(32 * MiB), ...steps(8 * MiB)],
    );
    // The reserved slabs are the ones chunks then go to: a 32 MiB chunk still fits.
    assert.equal(await cpu.put(NS, h(1), { tokens: 1, data: new Uint8Array(32 * MiB) }), 'stored');
    await cpu.close();
  });

  it('keeps every byte that puts write while slabs are pre-faulted', async () => {
    // The addon's madvise when it is built; otherwise a stand-in that only reads.
    const prefaultSlab: SlabPrefault =
      addon !== null
        ? (v) => addon.prefault(v)
        : async (v) => {
            await nextTurn();
            return v.byteLength;
          };
    const cpu = new LocalCpuBackend({
      capacityBytes: 96 * MiB,
      slabBytes: 32 * MiB,
      pageBytes: 64 * 1024,
      prefault: true,
      prefaultSlab,
      ...(addon !== null
        ? { allocateSlab: (n: number) => new Uint8Array(addon.allocSlab(n)) }
        : {}),
    });
    // Large chunks are copied on the pool (beside the pre-fault), small ones on the loop.
    const sizes = [6 * MiB, 200_000, 5 * MiB + 7, 64 * 1024, 9 * MiB, 1, 4 * MiB + 1, 12_345];
    const chunks = sizes.map((n) => randomFillSync(new Uint8Array(n)));
    const outcomes = await Promise.all(
      chunks.map((data, i) => cpu.put(NS, h(i), { tokens: 1, data })),
    );
    assert.deepEqual(
      outcomes,
      chunks.map(() => 'stored'),
    );
    await until(() => cpu.stats().prefaultedBytes === 96 * MiB, 'prefault to finish');
    const got = await cpu.batchedGet(
      NS,
      chunks.map((_, i) => h(i)),
    );
    chunks.forEach((data, i) => {
      const stored = got.get(h(i))?.data;
      assert.ok(stored !== undefined, `chunk ${i} is missing`);
      assert.ok(Buffer.from(stored).equals(Buffer.from(data)), `chunk ${i} differs`);
    });
    await cpu.close();
  });

  it('close waits for the step in flight, then nothing more runs', async () => {
    const gate = gatedPrefault();
    const cpu = new LocalCpuBackend({
      capacityBytes: 64 * MiB,
      slabBytes: 32 * MiB,
      prefault: true,
      prefaultSlab: gate.fn,
    });
    await until(() => gate.calls.length === 1, 'the first step');
    let closed = false;
    const closing = cpu.close().then(() => {
      closed = true;
    });
    for (let i = 0; i < 10; i++) await nextTurn();
    assert.equal(closed, false, 'close resolved while a step was in flight');
    gate.release();
    await closing;
    for (let i = 0; i < 10; i++) await nextTurn();
    assert.equal(gate.calls.length, 1);
    assert.throws(
      () => cpu.stats(),
      (err: unknown) => isKvtierError(err) && err.code === 'KVT_CLOSED',
    );
  });

  it('without a way to pre-fault, says so once at debug and works as without prefault', async () => {
    const sink = logSink();
    const cpu = new LocalCpuBackend(
      { capacityBytes: 8 * MiB, prefault: true, prefaultSlab: null },
      { name: 'cpu', log: sink.log },
    );
    for (let i = 0; i < 20; i++) await nextTurn();
    assert.equal(cpu.stats().prefaultedBytes, 0);
    const notes = sink.lines().filter((l) => l.includes('not pre-faulted'));
    assert.equal(notes.length, 1, sink.lines().join(''));
    assert.match(notes[0]!, /"level":"debug"|debug/);
    const data = randomFillSync(new Uint8Array(MiB));
    assert.equal(await cpu.put(NS, h(1), { tokens: 1, data }), 'stored');
    const got = (await cpu.batchedGet(NS, [h(1)])).get(h(1))?.data;
    assert.ok(got !== undefined && Buffer.from(got).equals(Buffer.from(data)));
    await cpu.close();
  });

  it('stops at the first step when the kernel cannot, and logs it at debug', async () => {
    const sink = logSink();
    let calls = 0;
    const cpu = new LocalCpuBackend(
      {
        capacityBytes: 64 * MiB,
        slabBytes: 16 * MiB,
        prefault: true,
        prefaultSlab: async () => {
          calls++;
          return 'unsupported';
        },
      },
      { name: 'cpu', log: sink.log },
    );
    for (let i = 0; i < 50; i++) await nextTurn();
    assert.equal(calls, 1);
    assert.equal(cpu.stats().prefaultedBytes, 0);
    assert.equal(sink.lines().filter((l) => l.includes('kernel cannot')).length, 1);
    await cpu.close();
  });

  it('a failing pre-fault is logged at warn and the tier keeps working', async () => {
    const sink = logSink();
    const cpu = new LocalCpuBackend(
      {
        capacityBytes: 8 * MiB,
        prefault: true,
        prefaultSlab: async () => {
          throw new Error('ENOMEM: out of memory');
        },
      },
      { name: 'cpu', log: sink.log },
    );
    await until(
      () => sink.lines().some((l) => l.includes('pre-faulting host memory failed')),
      'warn',
    );
    assert.equal(await cpu.put(NS, h(1), { tokens: 1, data: new Uint8Array(100) }), 'stored');
    assert.equal(cpu.health(), 'up');
    await cpu.close();
  });

  it('the config option: a boolean, refused clearly otherwise', async () => {
    assert.equal(localCpuOptionsFromConfig({ capacityBytes: MiB, prefault: true }).prefault, true);
    assert.throws(
      () => localCpuOptionsFromConfig({ capacityBytes: MiB, prefault: 'yes' }, 'cpu'),
      (err: unknown) =>
        isKvtierError(err) &&
        err.code === 'KVT_CONFIG' &&
        /tier "cpu": prefault must be a boolean \(true or false\), got "yes"/.test(err.message),
    );
    assert.throws(
      () => new LocalCpuBackend({ capacityBytes: MiB, prefault: 1 as unknown as boolean }),
      (err: unknown) => isKvtierError(err) && err.code === 'KVT_INVALID_ARGUMENT',
    );
    assert.throws(
      () =>
        resolveConfig({ tiers: [{ type: 'local-cpu', capacityBytes: '1MiB', prefault: 'yes' }] }),
      (err: unknown) =>
        isKvtierError(err) && /prefault/.test(err.message) && /boolean/.test(err.message),
    );
    const config = resolveConfig({
      tiers: [{ name: 'cpu', type: 'local-cpu', capacityBytes: '1MiB', prefault: true }],
    });
    assert.deepEqual(config.tiers[0]!.options, { capacityBytes: MiB, prefault: true });
  });

  it('a tier built from config pre-faults in the background', { skip: noAddon }, async () => {
    // The sidecar's registry: the addon's page-aligned slabs.
    const registry = new BackendRegistry({
      allocateHostSlab: (n) => new Uint8Array(addon!.allocSlab(n)),
    });
    const [tier] = await registry.createTiers([
      { name: 'cpu', type: 'local-cpu', options: { capacityBytes: 8 * MiB, prefault: true } },
    ]);
    const cpu = tier!;
    await until(() => {
      const bytes = cpu.stats().prefaultedBytes;
      return bytes === 8 * MiB;
    }, 'prefault to finish');
    await cpu.close();
  });
});
