/**
 * The connector against a real sidecar (lookup server and data plane over ZMQ, LocalCPU tier)
 * and a real KV file on the host device: request A prefills and saves; request B with the same
 * prefix gets a hit and loads into other blocks, byte-exact; a load whose pins are gone comes
 * back as invalid blocks through `getBlockIdsWithLoadErrors`.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { defaultConfig } from '../../src/config/config.ts';
import { KvtierSchedulerConnector } from '../../src/connector/scheduler-connector.ts';
import type { ConnectorMeta, ConnectorRequest } from '../../src/connector/types.ts';
import { KvtierWorkerConnector } from '../../src/connector/worker-connector.ts';
import { DataPlaneClient } from '../../src/data-plane/data-plane-client.ts';
import type { KvRegistration } from '../../src/data-plane/kv-layout.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { Sidecar } from '../../src/sidecar.ts';
import { pollUntil } from '../support/fixtures.ts';

// 4 layers, K and V, 2 heads x 8 dims bf16 = 32 B/token/layer; 4-token blocks of 128 B at a
// 160-byte stride (padding never touched); 16-token chunks of 4 blocks.
const LAYERS = 4;
const NUM_BLOCKS = 96;
const STRIDE = 160;
const BLOCK_BYTES = 128;
const BLOCK = 4;
const CHUNK = 16;
const BPC = CHUNK / BLOCK;
const REGION_BYTES = NUM_BLOCKS * STRIDE;

const dir = mkdtempSync(join(tmpdir(), 'kvtier-connector-'));
const kvPath = join(dir, 'kv.bin');
let sidecar: Sidecar;
let scheduler: KvtierSchedulerConnector;
let worker: KvtierWorkerConnector;
let admin: LookupClient;

function registration(): KvRegistration {
  return {
    engineId: 'engine-0',
    device: 'host',
    modelId: 'test/llama-tiny',
    dtype: 'bf16',
    numKvHeads: 2,
    headDim: 8,
    tpSize: 1,
    tpRank: 0,
    mla: false,
    numBlocks: NUM_BLOCKS,
    blockSize: BLOCK,
    blockStrideBytes: STRIDE,
    chunkSize: CHUNK,
    layers: Array.from({ length: LAYERS }, (_, l) => ({
      k: { path: kvPath, offsetBytes: 2 * l * REGION_BYTES },
      v: { path: kvPath, offsetBytes: (2 * l + 1) * REGION_BYTES },
    })),
  };
}

/** The stored bytes (padding excluded) of every region of a block, read from the file. */
function blockBytes(blockId: number): Buffer {
  const file = readFileSync(kvPath);
  return Buffer.concat(
    Array.from({ length: 2 * LAYERS }, (_, r) => {
      const at = r * REGION_BYTES + blockId * STRIDE;
      return file.subarray(at, at + BLOCK_BYTES);
    }),
  );
}

function request(id: string, tokens: number[]): ConnectorRequest {
  return { requestId: id, promptTokenIds: tokens };
}

/** One engine step's connector traffic: metadata to the worker, completions back. */
async function step(
  meta: ConnectorMeta,
): Promise<{ sending: Set<string>; recving: Set<string>; errors: Set<number> }> {
  worker.startLoadKv(meta);
  worker.waitForSave();
  await worker.whenIdle();
  const { finishedSending, finishedRecving } = worker.getFinished();
  const errors = worker.getBlockIdsWithLoadErrors();
  scheduler.updateConnectorOutput({
    finishedSending,
    finishedRecving,
    invalidBlockIds: errors,
  });
  return { sending: finishedSending, recving: finishedRecving, errors };
}

/** Asks once per event-loop turn, as a scheduler asks once per step, until it is not null. */
async function matched(req: ConnectorRequest, computed: number): Promise<[number, boolean]> {
  let out: [number | null, boolean] = [null, false];
  await pollUntil(() => {
    out = scheduler.getNumNewMatchedTokens(req, computed);
    return out[0] !== null;
  }, `lookup of ${req.requestId}`);
  return out as [number, boolean];
}

const shared = Array.from({ length: 64 }, (_, i) => (i * 31 + 7) % 32_000);
// Block tables: A and B use disjoint, non-contiguous blocks.
const tableA = Array.from({ length: 20 }, (_, i) => 2 * i + 1);
const tableB = Array.from({ length: 20 }, (_, i) => 94 - 2 * i);
const tableC = Array.from({ length: 20 }, (_, i) => 50 + i);

before(async () => {
  writeFileSync(kvPath, randomBytes(2 * LAYERS * REGION_BYTES));
  sidecar = await Sidecar.start({
    config: {
      ...defaultConfig(),
      listen: 'tcp://127.0.0.1:*',
      metrics: null,
      tiers: [{ name: 'cpu', type: 'local-cpu', options: { capacityBytes: 16 * 1024 * 1024 } }],
      logLevel: 'silent',
    },
    processMetrics: false,
  });
  const endpoint = sidecar.server.endpoint;
  worker = new KvtierWorkerConnector({
    client: new DataPlaneClient({ endpoint, heartbeatIntervalMs: 0 }),
  });
  const reg = await worker.registerKvCaches(registration());
  assert.equal(reg.chunkSize, CHUNK);
  scheduler = new KvtierSchedulerConnector({
    lookup: new LookupClient({ endpoint, namespaces: [reg.namespace], lookupTimeoutMs: 10_000 }),
    blockSize: reg.blockSize,
    chunkSize: reg.chunkSize,
  });
  admin = new LookupClient({ endpoint });
});

after(async () => {
  await scheduler?.close();
  await worker?.close();
  await admin?.close();
  await sidecar?.close();
  rmSync(dir, { recursive: true, force: true });
});

describe('connector end to end', () => {
  it('A saves after prefill; B with the same prefix loads into other blocks, byte-exact', async () => {
    const a = request('A', [...shared, 1, 2, 3, 4, 5, 6]);
    assert.deepEqual(await matched(a, 0), [0, false], 'nothing stored yet');
    // Prefill of all 70 tokens: chunks 0..3 are full and get saved.
    const prefill = scheduler.buildConnectorMeta({
      scheduled: [{ request: a, blockIds: tableA, numComputedTokens: 0, numScheduledTokens: 70 }],
    });
    assert.deepEqual(
      prefill.saves.map((s) => [s.firstChunk, s.blockIds.length]),
      [[0, 4 * BPC]],
    );
    await step(prefill);
    assert.equal(worker.stats().chunksSaved, 4);
    assert.deepEqual(scheduler.requestFinished(a, tableA), [true, null]);
    const freed = await step(scheduler.buildConnectorMeta());
    assert.deepEqual(freed.sending, new Set(['A']), 'A may be freed once its saves are over');

    const b = request('B', [...shared, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9]);
    assert.deepEqual(await matched(b, 0), [64, true]);
    scheduler.updateStateAfterAlloc(b, tableB, 64);
    const meta = scheduler.buildConnectorMeta();
    assert.equal(meta.loads.length, 1);
    const done = await step(meta);
    assert.deepEqual(done.recving, new Set(['B']));
    assert.deepEqual(done.errors, new Set());
    for (let j = 0; j < 4 * BPC; j++)
      assert.deepEqual(blockBytes(tableB[j]!), blockBytes(tableA[j]!), `block ${j} of the prefix`);
    // B's own tail (chunk 4) is saved after its prefill; the loaded chunks are skipped.
    const prefillB = scheduler.buildConnectorMeta({
      scheduled: [{ request: b, blockIds: tableB, numComputedTokens: 64, numScheduledTokens: 16 }],
    });
    assert.deepEqual(
      prefillB.saves.map((s) => [s.firstChunk, s.blockIds]),
      [[4, tableB.slice(4 * BPC, 5 * BPC)]],
    );
    await step(prefillB);
    assert.equal(worker.stats().chunksSaved, 5);
    scheduler.requestFinished(b, tableB);
    assert.deepEqual((await step(scheduler.buildConnectorMeta())).sending, new Set(['B']));
  });

  it('a load whose pins are gone surfaces as invalid blocks, and nothing is written', async () => {
    const c = request('C', [...shared, 5, 5, 5, 5, 5]);
    // The engine's prefix cache holds chunk 0: kvtier offers chunks 1..3.
    assert.deepEqual(await matched(c, 16), [48, true]);
    scheduler.updateStateAfterAlloc(c, tableC, 48);
    const meta = scheduler.buildConnectorMeta();
    const load = meta.loads[0]!;
    assert.deepEqual(load.blockIds, tableC.slice(BPC, 4 * BPC));
    const before = load.blockIds.map((id) => blockBytes(id));
    // The pins go away between lookup and load (as when their TTL runs out).
    assert.equal(await admin.cancel(load.lookupId), true);
    const done = await step(meta);
    assert.deepEqual(done.recving, new Set(['C']));
    assert.deepEqual(done.errors, new Set(load.blockIds));
    load.blockIds.forEach((id, i) => {
      assert.deepEqual(blockBytes(id), before[i], `block ${id} untouched`);
    });
    assert.equal(worker.stats().loadsFailed, 1);
    assert.deepEqual(worker.getBlockIdsWithLoadErrors(), new Set(), 'drained once');
    // Recompute of the failed chunks saves nothing new: kvtier still stores them.
    const recompute = scheduler.buildConnectorMeta({
      scheduled: [{ request: c, blockIds: tableC, numComputedTokens: 16, numScheduledTokens: 53 }],
    });
    assert.deepEqual(
      recompute.saves.map((s) => s.firstChunk),
      [1],
    );
    await step(recompute);
    assert.equal(worker.stats().chunksSaved, 5, 'already stored chunks are skipped by the sidecar');
    assert.deepEqual(scheduler.requestFinished(c, tableC), [true, null]);
    await step(scheduler.buildConnectorMeta());
    assert.equal(scheduler.trackedRequests, 0);
  });
});
