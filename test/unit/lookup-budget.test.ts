import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { afterEach, describe, test } from 'node:test';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { LocalCpuBackend } from '../../src/backends/local-cpu/local-cpu-backend.ts';
import { KvtierError } from '../../src/errors.ts';
import { chunkHash } from '../../src/hashing/chunk-hash.ts';
import { SocketSendQueue } from '../../src/protocol/send-queue.ts';
import {
  estimateLookupBytes,
  LOOKUP_COST,
  LookupByteBudget,
} from '../../src/storage-manager/lookup-budget.ts';
import { StorageManager } from '../../src/storage-manager/storage-manager.ts';

const NS = '0123456789abcdef0123456789abcdef';
const PAGE = 4096;
const open: StorageManager[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((m) => m.close()));
});

function setup(maxLookupBytes?: number, chunks = 8) {
  const cpu = new LocalCpuBackend({ capacityBytes: 2048 * PAGE, pageBytes: PAGE }, { name: 'cpu' });
  const sm = new StorageManager({
    tiers: [cpu],
    sweepIntervalMs: 0,
    maxLookups: 1_000_000,
    ...(maxLookupBytes !== undefined ? { maxLookupBytes } : {}),
  });
  open.push(sm);
  const hs = Array.from({ length: chunks }, () => chunkHash(randomBytes(32).toString('hex')));
  return { cpu, sm, hs };
}

const isCapacity = (e: unknown) => e instanceof KvtierError && e.code === 'KVT_CAPACITY';

function lookupBytes(sm: StorageManager): number {
  return (sm.stats().lookups as { bytes: number }).bytes;
}

describe('lookup memory budget', () => {
  test('refuses a lookup past the bound with KVT_CAPACITY, keeps every admitted pin, and frees on release', async () => {
    const per = estimateLookupBytes(4, 2);
    const { cpu, sm, hs } = setup(2 * per);
    const four = hs.slice(0, 4);
    for (const h of four) await cpu.put(NS, h, { tokens: 16, data: randomBytes(PAGE) });
    const look = async (id: string, opts = {}) =>
      sm.lookup({
        lookupId: id,
        namespaces: [NS],
        hashes: four,
        tokenCounts: [16, 16, 16, 16],
        ...opts,
      });
    assert.equal((await look('l1')).hitChunks, 4);
    assert.equal((await look('l2')).hitChunks, 4);
    assert.equal(lookupBytes(sm), 2 * per);
    assert.equal(cpu.stats().pinnedChunks, 4);
    await assert.rejects(look('l3'), isCapacity);
    // Nothing admitted was dropped to make room, and the refused lookup took no pins.
    assert.equal(cpu.stats().pinnedChunks, 4);
    assert.equal(sm.events.state('l1'), 'done');
    assert.equal((sm.stats().lookups as { refusedTotal: number }).refusedTotal, 1);
    // CANCEL frees its share.
    assert.equal(sm.cancel('l1'), true);
    assert.equal(lookupBytes(sm), per);
    assert.equal((await look('l3')).hitChunks, 4);
    // A taken lookup keeps its share until released (a LOAD still reads its chunks).
    const taken = sm.takeLookup('l2');
    assert.ok(taken);
    await assert.rejects(look('l4'), isCapacity);
    sm.releaseLookup(taken);
    sm.releaseLookup(taken);
    assert.equal(lookupBytes(sm), per);
    // pin: false keeps nothing.
    assert.equal((await look('l5', { pin: false })).hitChunks, 4);
    assert.equal(lookupBytes(sm), per);
    sm.cancel('l3');
    assert.equal(lookupBytes(sm), 0);
    assert.equal(cpu.stats().pinnedChunks, 0);
  });

  test('an answered lookup keeps only its hits; a miss keeps the fixed part until taken or expired', async () => {
    const { cpu, sm, hs } = setup();
    await cpu.put(NS, hs[0]!, { tokens: 16, data: randomBytes(PAGE) });
    const counts = hs.map(() => 16);
    await sm.lookup({ lookupId: 'p', namespaces: [NS], hashes: hs, tokenCounts: counts });
    assert.equal(lookupBytes(sm), estimateLookupBytes(1, 1));
    await sm.lookup({
      lookupId: 'm',
      namespaces: [NS],
      hashes: hs.slice(1),
      tokenCounts: counts.slice(1),
    });
    assert.equal(lookupBytes(sm), estimateLookupBytes(1, 1) + estimateLookupBytes(0, 1));
    sm.cancel('m');
    sm.cancel('p');
    assert.equal(lookupBytes(sm), 0);
  });

  test('the estimate is not below the heap a pinned lookup really holds', async () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const H = 256;
    const N = 400;
    const { cpu, sm, hs } = setup(undefined, H);
    for (const h of hs) await cpu.put(NS, h, { tokens: 16, data: randomBytes(PAGE) });
    const counts = new Uint32Array(H).fill(16);
    const heap = () => {
      gc();
      gc();
      return process.memoryUsage().heapUsed;
    };
    const before = heap();
    for (let i = 0; i < N; i++) {
      // Fresh strings per lookup, as the server decodes each request's hashes anew.
      const own = hs.map((h) => chunkHash(Buffer.from(h, 'hex').toString('hex')));
      await sm.lookup({
        lookupId: `lookup-${i}`,
        namespaces: [NS],
        hashes: own,
        tokenCounts: counts,
      });
    }
    const perLookup = (heap() - before) / N;
    const estimate = estimateLookupBytes(H, 'lookup-100'.length);
    assert.equal(sm.events.sizes().done, N);
    assert.ok(
      perLookup <= estimate,
      `a pinned lookup of ${H} hashes holds ~${Math.round(perLookup)} heap bytes, estimate ${estimate} (LOOKUP_COST ${JSON.stringify(LOOKUP_COST)})`,
    );
    assert.ok(
      perLookup > estimate / 4,
      `estimate ${estimate} is far above ~${Math.round(perLookup)}`,
    );
  });

  test('a budget must be an integer >= 1', () => {
    assert.throws(() => new LookupByteBudget(0), /maxLookupBytes/);
  });
});

describe('send queue byte bound', () => {
  test('drops messages past maxBytes, always lets one through, and frees bytes once sent', async () => {
    const sent: number[] = [];
    let release!: () => void;
    let gate = new Promise<void>((r) => (release = r));
    const socket = {
      closed: false,
      async send(m: Buffer | Buffer[]) {
        await gate;
        sent.push((m as Buffer).length);
      },
    };
    const q = new SocketSendQueue(socket, { maxBytes: 100 });
    assert.equal(q.send(Buffer.alloc(150)), true); // alone: goes even above the bound
    assert.equal(q.send(Buffer.alloc(10)), false);
    assert.equal(q.bytes, 150);
    release();
    await new Promise((r) => setImmediate(r));
    assert.equal(q.bytes, 0);
    gate = new Promise<void>((r) => (release = r));
    assert.equal(q.send(Buffer.alloc(60)), true);
    assert.equal(q.send(Buffer.alloc(40)), true);
    assert.equal(q.send(Buffer.alloc(1)), false);
    assert.equal(q.dropped, 2);
    release();
    for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
    assert.deepEqual(sent, [150, 60, 40]);
    assert.equal(q.bytes, 0);
  });
});
