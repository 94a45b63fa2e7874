// StorageManager.lookup answered at once (no promise) when host memory answers alone, and
// otherwise going on below host memory from what it holds, without asking it again. The first
// case runs the same lookup on a twin manager through the walk and expects the same outcome,
// pins, tracking, budget and metrics.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { afterEach, describe, test } from 'node:test';
import type { StorageBackend } from '../../src/backends/core/types.ts';
import { LocalCpuBackend } from '../../src/backends/local-cpu/local-cpu-backend.ts';
import { MemoryBackend } from '../../src/backends/memory/memory-backend.ts';
import type { ChunkHash } from '../../src/hashing/chunk-hash.ts';
import { instrumentHostTier } from '../../src/metrics/instrumented-backend.ts';
import { KvtierMetrics } from '../../src/metrics/metrics.ts';
import { StorageManager } from '../../src/storage-manager/storage-manager.ts';
import type {
  LookupInput,
  LookupOutcome,
  StorageManagerOptions,
} from '../../src/storage-manager/storage-types.ts';
import { taggedHashes } from '../support/fixtures.ts';

const NS = '0123456789abcdef0123456789abcdef';
const NS2 = 'fedcba9876543210fedcba9876543210';
const CHUNK_BYTES = 4096;

const hashes = taggedHashes;

function packed(hs: ChunkHash[]): Buffer {
  return Buffer.from(hs.join(''), 'hex');
}

const open: StorageManager[] = [];

/** Makes `tier` hide its packed index: a lookup then walks the tiers (the reference). */
function walking<T extends object>(tier: T): T {
  Object.defineProperty(tier, 'packedIndex', { value: undefined, configurable: true });
  return tier;
}

/** A lookup host memory answers alone: its outcome, returned at once. */
function now(sm: StorageManager, x: LookupInput): LookupOutcome {
  const out = sm.lookup(x);
  assert.ok(!(out instanceof Promise), `${x.lookupId}: answered at once`);
  return out;
}

function cpuTier(): LocalCpuBackend {
  return new LocalCpuBackend(
    { capacityBytes: 64 * CHUNK_BYTES, pageBytes: CHUNK_BYTES },
    { name: 'cpu' },
  );
}

/** A manager over a fresh CPU tier (and `lower` tiers) holding `stored` in `namespaces`. */
async function setup(
  stored: ChunkHash[],
  opts: { lower?: StorageBackend[]; namespaces?: string[] } & Partial<StorageManagerOptions> = {},
) {
  const { lower = [], namespaces = [NS], ...extra } = opts;
  const cpu = cpuTier();
  for (const ns of namespaces)
    for (const h of stored) await cpu.put(ns, h, { tokens: 16, data: randomBytes(CHUNK_BYTES) });
  const sm = new StorageManager({ tiers: [cpu, ...lower], sweepIntervalMs: 0, ...extra });
  open.push(sm);
  return { cpu, sm };
}

afterEach(async () => {
  await Promise.all(open.splice(0).map((m) => m.close()));
});

function input(id: string, hs: ChunkHash[], extra: Partial<LookupInput> = {}): LookupInput {
  return {
    lookupId: id,
    namespaces: [NS],
    hashes: packed(hs),
    tokenCounts: hs.map(() => 16),
    ...extra,
  };
}

describe('StorageManager.lookup answered at once', () => {
  test('answers a CPU hit at once as lookup does: pins held until cancel, entry done, budget held', async () => {
    const hs = hashes(4);
    const fast = await setup(hs);
    const slow = await setup(hs);
    walking(slow.cpu);
    const answered = now(fast.sm, input('a', hs));
    const walked = slow.sm.lookup(input('a', hs));
    assert.ok(walked instanceof Promise, 'the twin walks');
    const later = await walked;
    assert.deepEqual({ ...answered, epoch: 0 }, { ...later, epoch: 0 });
    assert.equal(later.epoch, slow.sm.epoch);
    assert.deepEqual(answered, {
      status: 'ok',
      epoch: fast.sm.epoch,
      hitTokens: 64,
      hitChunks: 4,
      tiers: [{ tier: 'cpu', tokens: 64 }],
    });
    for (const { cpu, sm } of [fast, slow]) {
      assert.equal(cpu.stats().pinnedChunks, 4);
      assert.equal(sm.events.state('a'), 'done');
    }
    const lookups = (sm: StorageManager) => sm.stats().lookups as Record<string, number>;
    assert.equal(lookups(fast.sm).bytes, lookups(slow.sm).bytes);
    assert.ok(lookups(fast.sm).bytes! > 0);
    assert.equal(fast.sm.cancel('a'), true);
    assert.equal(fast.cpu.stats().pinnedChunks, 0);
    assert.equal(fast.sm.events.state('a'), 'not_found');
    assert.equal(lookups(fast.sm).bytes, 0, 'cancel gives the budget back');
  });

  test('a partial CPU hit with no tier below is answered; pins only the prefix', async () => {
    const hs = hashes(5);
    const { cpu, sm } = await setup(hs.slice(0, 2));
    const out = now(sm, input('p', hs));
    assert.equal(out?.hitChunks, 2);
    assert.equal(out?.hitTokens, 32);
    assert.equal(cpu.stats().pinnedChunks, 2);
    const miss = now(sm, input('m', hashes(3, 'other')));
    assert.deepEqual(miss, {
      status: 'ok',
      epoch: sm.epoch,
      hitTokens: 0,
      hitChunks: 0,
      tiers: [],
    });
  });

  test('a lookup that needs a lower tier goes on below host memory without asking it again', async () => {
    const hs = hashes(3);
    const lower = new MemoryBackend({}, { name: 'mem' });
    for (const h of hs) await lower.put(NS, h, { tokens: 16, data: randomBytes(CHUNK_BYTES) });
    const { cpu, sm } = await setup(hs.slice(0, 1), { lower: [lower] });
    const index = cpu.packedIndex!;
    const contains = index.contains.bind(index);
    const containsPinned = index.containsPinned!.bind(index);
    let asked = 0;
    index.contains = (...args: Parameters<typeof contains>) => {
      asked++;
      return contains(...args);
    };
    index.containsPinned = (...args: Parameters<typeof containsPinned>) => {
      asked++;
      return containsPinned(...args);
    };
    const pending = sm.lookup(input('x', hs));
    assert.ok(pending instanceof Promise, 'a lower tier is asked');
    assert.equal(asked, 1);
    // The host hit is pinned from the start; the lookup is tracked while it runs.
    assert.equal(cpu.stats().pinnedChunks, 1);
    assert.equal(sm.events.state('x'), 'ongoing');
    assert.equal((await pending).hitChunks, 3);
    assert.equal(asked, 1, 'host memory was asked once');
    assert.equal(cpu.stats().pinnedChunks, 3);
    // With prefetch off, host memory alone answers.
    assert.equal(now(sm, input('y', hashes(2, 'no'), { prefetch: false })).hitChunks, 0);
    // A full CPU hit needs nothing below, lower tiers or not.
    assert.equal(now(sm, input('z', hs)).hitChunks, 3);
    assert.equal(asked, 3);
  });

  test('pin: false answers without pins, entry or budget', async () => {
    const hs = hashes(2);
    const { cpu, sm } = await setup(hs);
    assert.equal(now(sm, input('n', hs, { pin: false }))?.hitChunks, 2);
    assert.equal(cpu.stats().pinnedChunks, 0);
    assert.equal(sm.events.state('n'), 'not_found');
    assert.equal((sm.stats().lookups as Record<string, number>).bytes, 0);
  });

  test('several namespaces: a chunk counts only when every one has it', async () => {
    const hs = hashes(3);
    const { cpu, sm } = await setup(hs, { namespaces: [NS, NS2] });
    await cpu.remove(NS2, [hs[2]!]);
    const out = now(sm, input('ns', hs, { namespaces: [NS, NS2] }));
    assert.equal(out?.hitChunks, 2);
    assert.equal(cpu.stats().pinnedChunks, 4, 'two chunks pinned in each namespace');
    sm.cancel('ns');
    assert.equal(cpu.stats().pinnedChunks, 0);
  });

  test('takeLookup and releaseLookup, id reuse, eviction and CLEAR behave as for lookup', async () => {
    const hs = hashes(2);
    const other = hashes(2, 'o');
    const { cpu, sm } = await setup([...hs, ...other], { maxLookups: 2 });
    now(sm, input('t', hs));
    const taken = sm.takeLookup('t');
    assert.ok(taken);
    assert.deepEqual(taken.hashes, hs);
    assert.equal(cpu.stats().pinnedChunks, 2);
    sm.releaseLookup(taken);
    assert.equal(cpu.stats().pinnedChunks, 0);
    // Reusing an id cancels the earlier answer.
    now(sm, input('r', hs));
    now(sm, input('r', other));
    assert.equal(cpu.stats().pinnedChunks, 2);
    const reused = sm.takeLookup('r');
    assert.deepEqual(reused?.hashes, other);
    sm.releaseLookup(reused!);
    assert.equal(cpu.stats().pinnedChunks, 0);
    now(sm, input('r', hs));
    // A full registry evicts the oldest answer, releasing its pins.
    now(sm, input('s', other));
    now(sm, input('u', other));
    assert.equal(sm.events.state('r'), 'not_found');
    assert.equal(cpu.stats().pinnedChunks, 2, 'only the chunks of s and u stay pinned');
    // CLEAR releases the pins of answered lookups.
    await sm.clear([NS]);
    assert.equal(cpu.stats().pinnedChunks, 0);
    assert.equal(sm.events.state('u'), 'not_found');
  });

  test('a full lookup budget is KVT_CAPACITY and takes no pins; bad input and close reject', async () => {
    const hs = hashes(2);
    const { cpu, sm } = await setup(hs, { maxLookupBytes: 100 });
    // Refusals come as a rejected promise, never thrown.
    const refused = (x: LookupInput) => {
      const out = sm.lookup(x);
      assert.ok(out instanceof Promise);
      return out;
    };
    await assert.rejects(refused(input('c', hs)), { code: 'KVT_CAPACITY' });
    assert.equal(cpu.stats().pinnedChunks, 0);
    assert.equal(sm.events.state('c'), 'not_found');
    await assert.rejects(refused(input('i', hs, { tokenCounts: [16] })), {
      code: 'KVT_INVALID_ARGUMENT',
    });
    await assert.rejects(refused(input('i', hs, { namespaces: [] })), {
      code: 'KVT_INVALID_ARGUMENT',
    });
    await sm.close();
    await assert.rejects(refused(input('d', hs)), { code: 'KVT_CLOSED' });
  });

  test('records the lookup metrics as lookup does', async () => {
    const hs = hashes(3);
    const counts: string[] = [];
    for (const run of ['now', 'async'] as const) {
      const cpu = cpuTier();
      for (const h of hs) await cpu.put(NS, h, { tokens: 16, data: randomBytes(CHUNK_BYTES) });
      const metrics = new KvtierMetrics({ defaultMetrics: false });
      const host = instrumentHostTier(cpu, metrics);
      if (run === 'async') walking(host);
      const sm = new StorageManager({
        tiers: [host],
        sweepIntervalMs: 0,
        metrics,
      });
      open.push(sm);
      for (let i = 0; i < 3; i++) {
        const inp = input(`m${i}`, i === 2 ? hashes(1, 'miss') : hs);
        if (run === 'now') assert.ok(now(sm, inp));
        else {
          const walked = sm.lookup(inp);
          assert.ok(walked instanceof Promise);
          await walked;
        }
      }
      const text = await metrics.text();
      const lines = text
        .split('\n')
        .filter((l) =>
          /^kvtier_lookup(s_total|_requested_tokens_total|_hit_tokens_total|_duration_seconds_count)/.test(
            l,
          ),
        );
      assert.ok(lines.length >= 4, text);
      counts.push(lines.join('\n'));
    }
    assert.equal(counts[0], counts[1]);
    assert.match(counts[0]!, /kvtier_lookups_total\{result="hit"\} 2/);
    assert.match(counts[0]!, /kvtier_lookups_total\{result="miss"\} 1/);
  });
});
