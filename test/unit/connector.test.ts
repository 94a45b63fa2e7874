/**
 * The connector's bookkeeping without a sidecar. The scheduler side runs over a tiny lookup
 * client whose answers the test releases (it stands in only for timing: "pending, then a
 * number"); the worker side over a data-plane client whose replies the test settles.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { KvtierSchedulerConnector } from '../../src/connector/scheduler-connector.ts';
import type {
  ConnectorLookup,
  ConnectorMeta,
  ConnectorRequest,
} from '../../src/connector/types.ts';
import {
  KvtierWorkerConnector,
  type WorkerDataPlaneClient,
} from '../../src/connector/worker-connector.ts';
import { isKvtierError } from '../../src/errors.ts';
import { hashChunks } from '../../src/hashing/chunk-hasher.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { MultiLookupClient } from '../../src/lookup-client/multi-lookup-client.ts';

const BLOCK = 4;
const CHUNK = 16;
const BPC = CHUNK / BLOCK;

/** Answers lookups only once the test sets `answers[lookupId]`; records every call. */
class FakeLookup implements ConnectorLookup {
  readonly answers = new Map<string, number>();
  readonly calls: { lookupId: string; hashes: Buffer; counts: number[] }[] = [];
  readonly forgotten: string[] = [];
  readonly canceled: string[] = [];
  closed = false;

  lookup(lookupId: string, hashes: Uint8Array, counts: ArrayLike<number>): number | null {
    this.calls.push({ lookupId, hashes: Buffer.from(hashes), counts: Array.from(counts) });
    const a = this.answers.get(lookupId);
    if (a === undefined) return null;
    this.answers.delete(lookupId);
    return a;
  }
  forget(lookupId: string): void {
    this.forgotten.push(lookupId);
  }
  async cancel(lookupId: string): Promise<boolean> {
    this.canceled.push(lookupId);
    return true;
  }
  async close(): Promise<void> {
    this.closed = true;
  }
}

function prompt(id: string, n: number, salt?: string): ConnectorRequest {
  const promptTokenIds = Array.from({ length: n }, (_, i) => (i * 7919 + 13) % 50_000);
  return salt === undefined
    ? { requestId: id, promptTokenIds }
    : { requestId: id, promptTokenIds, cacheSalt: salt };
}

function table(n: number, base = 100): number[] {
  return Array.from({ length: n }, (_, i) => base + i * 3);
}

function setup(opts: boolean | { now?: () => number } = {}): {
  lookup: FakeLookup;
  sc: KvtierSchedulerConnector;
} {
  const lookup = new FakeLookup();
  const extra = typeof opts === 'boolean' ? { partialChunkLoads: opts } : opts;
  return {
    lookup,
    sc: new KvtierSchedulerConnector({ lookup, blockSize: BLOCK, chunkSize: CHUNK, ...extra }),
  };
}

/** Runs getNumNewMatchedTokens until the lookup is asked, answers it, and asks again. */
function matched(
  f: { lookup: FakeLookup; sc: KvtierSchedulerConnector },
  req: ConnectorRequest,
  computed: number,
  hitTokens: number,
): [number | null, boolean] {
  assert.deepEqual(f.sc.getNumNewMatchedTokens(req, computed), [null, false]);
  const last = f.lookup.calls.at(-1);
  assert.notEqual(last, undefined, 'the connector asked the lookup client');
  f.lookup.answers.set(last!.lookupId, hitTokens);
  return f.sc.getNumNewMatchedTokens(req, computed);
}

describe('scheduler connector: getNumNewMatchedTokens', () => {
  it('is null while the lookup is pending, then the claim with loadAsync', () => {
    const f = setup();
    const req = prompt('a', 100);
    assert.deepEqual(f.sc.getNumNewMatchedTokens(req, 0), [null, false]);
    assert.deepEqual(f.sc.getNumNewMatchedTokens(req, 0), [null, false]);
    const id = f.lookup.calls[0]!.lookupId;
    assert.equal(f.lookup.calls[1]!.lookupId, id, 'the same lookup is polled');
    f.lookup.answers.set(id, 64);
    assert.deepEqual(f.sc.getNumNewMatchedTokens(req, 0), [64, true]);
    // The answer is cached: asking again (allocation failed last step) sends nothing new.
    const calls = f.lookup.calls.length;
    assert.deepEqual(f.sc.getNumNewMatchedTokens(req, 0), [64, true]);
    assert.equal(f.lookup.calls.length, calls);
  });

  it('looks up the chained hashes of the full chunks that end before the last token', () => {
    const f = setup();
    const req = prompt('a', 64, 'tenant-1');
    assert.deepEqual(f.sc.getNumNewMatchedTokens(req, 0), [null, false]);
    const call = f.lookup.calls[0]!;
    const expected = hashChunks(req.promptTokenIds as number[], {
      chunkSize: CHUNK,
      salt: 'tenant-1',
    });
    // 64 tokens = 4 chunks, but the 4th ends at the last token, which is always computed.
    assert.deepEqual(call.counts, [16, 16, 16]);
    assert.deepEqual(call.hashes, Buffer.concat(expected.slice(0, 3).map((c) => c.hash)));
  });

  it('never claims the last token and rounds claims down to whole blocks and chunks', () => {
    const f = setup();
    // A server answer beyond promptLength - 1 (e.g. another rank's view) is capped: 64 -> 63 -> 48.
    assert.deepEqual(matched(f, prompt('a', 64), 0, 64), [48, true]);
    // A ragged answer (not whole blocks) is rounded down: 37 -> 36 (blocks) -> 32 (chunks).
    assert.deepEqual(matched(f, prompt('b', 100), 0, 37), [32, true]);
    // Less than a chunk claims nothing.
    assert.deepEqual(matched(f, prompt('c', 100), 0, 12), [0, false]);
  });

  it('counts only tokens beyond the engine prefix cache', () => {
    const f = setup();
    assert.deepEqual(matched(f, prompt('a', 100), 32, 80), [48, true]);
    // The engine already has everything kvtier holds: nothing to load, and the pins are released.
    const g = setup();
    assert.deepEqual(matched(g, prompt('b', 100), 48, 48), [0, false]);
    assert.deepEqual(g.lookup.canceled, [g.lookup.calls[0]!.lookupId]);
    // A local prefix ending inside a block cannot be extended (vLLM's always ends at a block).
    const h = setup();
    assert.deepEqual(h.sc.getNumNewMatchedTokens(prompt('c', 100), 22), [0, false]);
    assert.equal(h.lookup.calls.length, 0, 'no lookup when nothing could be claimed');
    // One ending inside a chunk at a block boundary claims the rest of that chunk and beyond.
    assert.deepEqual(matched(h, prompt('d', 100), 20, 80), [60, true]);
  });

  it('claims nothing for a prompt shorter than one chunk plus the last token', () => {
    const f = setup();
    assert.deepEqual(f.sc.getNumNewMatchedTokens(prompt('a', 16), 0), [0, false]);
    assert.equal(f.lookup.calls.length, 0);
  });
});

describe('scheduler connector: load intents and metadata', () => {
  it('updateStateAfterAlloc maps chunks to blocks; a second call replaces the intent', () => {
    const f = setup();
    const req = prompt('a', 100);
    assert.deepEqual(matched(f, req, 16, 64), [48, true]);
    const lookupId = f.lookup.calls[0]!.lookupId;
    f.sc.updateStateAfterAlloc(req, table(20), 48);
    f.sc.updateStateAfterAlloc(req, table(20, 500), 48);
    const meta = f.sc.buildConnectorMeta();
    assert.equal(meta.loads.length, 1, 'one intent per request');
    const load = meta.loads[0]!;
    const hashes = hashChunks(req.promptTokenIds as number[], { chunkSize: CHUNK });
    assert.deepEqual(
      { ...load, chunkHashes: undefined },
      {
        requestId: 'a',
        lookupId,
        firstChunk: 1,
        numTokens: 48,
        blockIds: table(20, 500).slice(BPC, 4 * BPC),
        chunkHashes: undefined,
      },
    );
    assert.deepEqual(load.chunkHashes, Buffer.concat(hashes.slice(1, 4).map((c) => c.hash)));
  });

  it('updateStateAfterAlloc with 0 tokens clears the intent', () => {
    const f = setup();
    const req = prompt('a', 100);
    matched(f, req, 0, 32);
    f.sc.updateStateAfterAlloc(req, table(8), 32);
    f.sc.updateStateAfterAlloc(req, table(8), 0);
    assert.deepEqual(f.sc.buildConnectorMeta().loads, []);
  });

  it('refuses tokens that were not offered and block tables that are too short', () => {
    const f = setup();
    const req = prompt('a', 100);
    matched(f, req, 0, 32);
    for (const [blocks, tokens] of [
      [table(8), 48],
      [table(8), 20],
      [table(7), 32],
    ] as const)
      assert.throws(
        () => f.sc.updateStateAfterAlloc(req, blocks, tokens),
        (e: unknown) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
        `${blocks.length} blocks, ${tokens} tokens`,
      );
    assert.throws(
      () => f.sc.updateStateAfterAlloc(prompt('unknown', 100), table(8), 16),
      (e: unknown) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
    );
  });

  it('the metadata is consumed once', () => {
    const f = setup();
    const req = prompt('a', 100);
    matched(f, req, 0, 32);
    f.sc.updateStateAfterAlloc(req, table(25), 32);
    f.sc.requestFinished(prompt('gone', 10));
    const first = f.sc.buildConnectorMeta({
      scheduled: [
        {
          request: prompt('b', 40),
          blockIds: table(10),
          numComputedTokens: 0,
          numScheduledTokens: 40,
        },
      ],
    });
    assert.equal(first.loads.length, 1);
    assert.equal(first.saves.length, 1);
    const second = f.sc.buildConnectorMeta();
    assert.deepEqual(second, { loads: [], saves: [], finished: [] });
  });

  it('after prefill the new full chunks are saved, skipping chunks kvtier holds', () => {
    const f = setup();
    const req = prompt('a', 100);
    matched(f, req, 0, 32);
    f.sc.updateStateAfterAlloc(req, table(25), 32);
    assert.equal(f.sc.buildConnectorMeta().loads.length, 1);
    // Chunked prefill: tokens 32..60 this step completes chunk 2 (ends at 48), not chunk 3.
    const blocks = table(25);
    const step1 = f.sc.buildConnectorMeta({
      scheduled: [
        { request: req, blockIds: blocks, numComputedTokens: 32, numScheduledTokens: 28 },
      ],
    });
    const hashes = hashChunks(req.promptTokenIds as number[], { chunkSize: CHUNK });
    assert.equal(step1.saves.length, 1);
    assert.deepEqual(step1.saves[0]!.blockIds, blocks.slice(2 * BPC, 3 * BPC));
    assert.equal(step1.saves[0]!.firstChunk, 2);
    assert.deepEqual(step1.saves[0]!.chunkHashes, hashes[2]!.hash);
    // The rest of the prompt: chunks 3..5 are full (96 tokens); the partial tail is not saved.
    const step2 = f.sc.buildConnectorMeta({
      scheduled: [
        { request: req, blockIds: blocks, numComputedTokens: 60, numScheduledTokens: 40 },
      ],
    });
    assert.deepEqual(
      step2.saves.map((s) => [s.firstChunk, s.blockIds.length]),
      [[3, 3 * BPC]],
    );
    // Decode steps save nothing new.
    const step3 = f.sc.buildConnectorMeta({
      scheduled: [
        { request: req, blockIds: blocks, numComputedTokens: 100, numScheduledTokens: 1 },
      ],
    });
    assert.deepEqual(step3.saves, []);
  });

  it('a failed load un-stores its chunks so they are saved after recompute', () => {
    const f = setup();
    const req = prompt('a', 100);
    matched(f, req, 0, 64);
    const blocks = table(25);
    f.sc.updateStateAfterAlloc(req, blocks, 64);
    f.sc.buildConnectorMeta();
    // Chunk 2's second block failed: chunks 2 and 3 must be recomputed and saved again.
    f.sc.updateConnectorOutput({ finishedRecving: ['a'], invalidBlockIds: [blocks[2 * BPC + 1]!] });
    const meta = f.sc.buildConnectorMeta({
      scheduled: [
        { request: req, blockIds: blocks, numComputedTokens: 32, numScheduledTokens: 68 },
      ],
    });
    assert.deepEqual(
      meta.saves.map((s) => [s.firstChunk, s.blockIds.length / BPC]),
      [[2, 4]],
    );
  });
});

describe('scheduler connector: partial-chunk claims', () => {
  it('a prefix ending inside a chunk loads that chunk from the next block on', () => {
    const f = setup();
    const req = prompt('a', 100);
    // Tokens 0..19 are in the engine's cache: 1 block of chunk 1 (tokens 16..31) is held.
    assert.deepEqual(matched(f, req, 20, 80), [60, true]);
    const lookupId = f.lookup.calls[0]!.lookupId;
    const blocks = table(25);
    f.sc.updateStateAfterAlloc(req, blocks, 60);
    const [load, ...rest] = f.sc.buildConnectorMeta().loads;
    assert.deepEqual(rest, []);
    const hashes = hashChunks(req.promptTokenIds as number[], { chunkSize: CHUNK });
    assert.deepEqual(
      { ...load!, chunkHashes: undefined },
      {
        requestId: 'a',
        lookupId,
        firstChunk: 1,
        numTokens: 60,
        blockIds: blocks.slice(BPC + 1, 5 * BPC),
        chunkHashes: undefined,
        skipBlocks: 1,
      },
    );
    assert.deepEqual(load!.chunkHashes, Buffer.concat(hashes.slice(1, 5).map((c) => c.hash)));
    assert.equal(load!.blockIds.length * BLOCK, load!.numTokens);
  });

  it('the last block of a chunk: skip blocksPerChunk - 1', () => {
    const f = setup();
    const req = prompt('a', 100);
    assert.deepEqual(matched(f, req, 28, 32), [4, true]);
    const blocks = table(25);
    f.sc.updateStateAfterAlloc(req, blocks, 4);
    const load = f.sc.buildConnectorMeta().loads[0]!;
    assert.equal(load.skipBlocks, BPC - 1);
    assert.equal(load.firstChunk, 1);
    assert.deepEqual(load.blockIds, [blocks[2 * BPC - 1]]);
  });

  it('a chunk-aligned prefix sets no skipBlocks', () => {
    const f = setup();
    const req = prompt('a', 100);
    matched(f, req, 16, 48);
    f.sc.updateStateAfterAlloc(req, table(25), 32);
    assert.equal('skipBlocks' in f.sc.buildConnectorMeta().loads[0]!, false);
  });

  it('claims nothing when kvtier misses the chunk the prefix ends in', () => {
    const f = setup();
    assert.deepEqual(matched(f, prompt('a', 100), 20, 16), [0, false]);
    assert.deepEqual(f.lookup.canceled, [f.lookup.calls[0]!.lookupId], 'pins released');
  });

  it('may take fewer tokens, ending at a chunk boundary', () => {
    const f = setup();
    const req = prompt('a', 100);
    assert.deepEqual(matched(f, req, 20, 80), [60, true]);
    for (const tokens of [30, 64, 8])
      assert.throws(
        () => f.sc.updateStateAfterAlloc(req, table(25), tokens),
        (e: unknown) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
        `${tokens} tokens`,
      );
    f.sc.updateStateAfterAlloc(req, table(25), 28);
    const load = f.sc.buildConnectorMeta().loads[0]!;
    assert.deepEqual(
      [
        load.firstChunk,
        load.numTokens,
        load.skipBlocks,
        load.blockIds.length,
        load.chunkHashes.length,
      ],
      [1, 28, 1, 2 * BPC - 1, 2 * 32],
    );
  });

  it('counts the loaded chunks as stored, so saves start after them', () => {
    const f = setup();
    const req = prompt('a', 100);
    matched(f, req, 20, 48);
    const blocks = table(25);
    f.sc.updateStateAfterAlloc(req, blocks, 28);
    f.sc.buildConnectorMeta();
    f.sc.updateConnectorOutput({ finishedRecving: ['a'] });
    const meta = f.sc.buildConnectorMeta({
      scheduled: [
        { request: req, blockIds: blocks, numComputedTokens: 48, numScheduledTokens: 52 },
      ],
    });
    assert.deepEqual(
      meta.saves.map((s) => [s.firstChunk, s.blockIds.length / BPC]),
      [[3, 3]],
    );
  });

  it('a failed block un-stores the chunk it belongs to, counting the skipped blocks', () => {
    for (const [at, firstUnstored] of [
      [0, 1], // block 1 of chunk 1
      [BPC - 2, 1], // last block of chunk 1
      [BPC - 1, 2], // block 0 of chunk 2
    ] as const) {
      const f = setup();
      const req = prompt('a', 100);
      matched(f, req, 20, 48);
      const blocks = table(25);
      f.sc.updateStateAfterAlloc(req, blocks, 28);
      const load = f.sc.buildConnectorMeta().loads[0]!;
      f.sc.updateConnectorOutput({ finishedRecving: ['a'], invalidBlockIds: [load.blockIds[at]!] });
      const meta = f.sc.buildConnectorMeta({
        scheduled: [
          { request: req, blockIds: blocks, numComputedTokens: 20, numScheduledTokens: 80 },
        ],
      });
      assert.deepEqual(
        meta.saves.map((s) => s.firstChunk),
        [firstUnstored],
        `invalid block at ${at}`,
      );
    }
  });

  it('partialChunkLoads: false claims only from chunk boundaries', () => {
    const f = setup(false);
    assert.deepEqual(f.sc.getNumNewMatchedTokens(prompt('a', 100), 20), [0, false]);
    assert.equal(f.lookup.calls.length, 0);
    assert.deepEqual(matched(f, prompt('b', 100), 16, 80), [64, true]);
    assert.throws(
      () =>
        new KvtierSchedulerConnector({
          lookup: new FakeLookup(),
          blockSize: BLOCK,
          partialChunkLoads: 'no' as unknown as boolean,
        }),
      /partialChunkLoads must be a boolean/,
    );
  });
});

describe('scheduler connector: finished vs preempted', () => {
  it('a terminal free releases pins and queues the release; delayFree follows transfers', () => {
    const f = setup();
    const a = prompt('a', 100);
    matched(f, a, 0, 32);
    // Answered but never loaded: the pins are released at once.
    assert.deepEqual(f.sc.requestFinished({ ...a, aborted: true }, []), [false, null]);
    assert.deepEqual(f.lookup.canceled, [f.lookup.calls[0]!.lookupId]);
    // A pending lookup is forgotten.
    const b = prompt('b', 100);
    assert.deepEqual(f.sc.getNumNewMatchedTokens(b, 0), [null, false]);
    assert.deepEqual(f.sc.requestFinished(b, []), [false, null]);
    assert.deepEqual(f.lookup.forgotten, [f.lookup.calls.at(-1)!.lookupId]);
    // A request with a load in flight: vLLM keeps its blocks until finishedRecving names it, so
    // the connector does not delay the free as well (vLLM would meet it in finishedSending after
    // dropping it).
    const c = prompt('c', 100);
    matched(f, c, 0, 32);
    f.sc.updateStateAfterAlloc(c, table(25), 32);
    const first = f.sc.buildConnectorMeta();
    assert.equal(first.loads.length, 1);
    assert.deepEqual(f.sc.requestFinished(c, []), [false, null]);
    assert.deepEqual(
      [...first.finished, ...f.sc.buildConnectorMeta().finished],
      [
        { requestId: 'a', kind: 'aborted', delayFree: false },
        { requestId: 'b', kind: 'finished', delayFree: false },
        { requestId: 'c', kind: 'finished', delayFree: false },
      ],
    );
    assert.equal(f.sc.trackedRequests, 0);
  });

  it('a request that saved delays its free', () => {
    const f = setup();
    const req = prompt('a', 40);
    f.sc.buildConnectorMeta({
      scheduled: [
        { request: req, blockIds: table(10), numComputedTokens: 0, numScheduledTokens: 40 },
      ],
    });
    assert.deepEqual(f.sc.requestFinished(req, table(10)), [true, null]);
  });

  it('preemption: the request looks up afresh; the old pins go once the new answer is in', () => {
    const f = setup();
    const req = prompt('a', 100);
    matched(f, req, 0, 32);
    f.sc.updateStateAfterAlloc(req, table(25), 32);
    f.sc.requestPreempted(req);
    assert.deepEqual(f.lookup.canceled, [], 'no pin released on preemption');
    assert.deepEqual(f.lookup.forgotten, []);
    const meta = f.sc.buildConnectorMeta();
    assert.deepEqual(meta.loads, [], 'the unsent load died with the freed blocks');
    assert.deepEqual(meta.finished, [{ requestId: 'a', kind: 'preempted', delayFree: false }]);
    // Asking again looks up afresh (the request's own saved chunks count too).
    assert.deepEqual(f.sc.getNumNewMatchedTokens(req, 0), [null, false]);
    const [old, fresh] = [...new Set(f.lookup.calls.map((c) => c.lookupId))];
    assert.notEqual(fresh, old);
    assert.deepEqual(f.lookup.canceled, [], 'the old pins stay while the new lookup runs');
    f.lookup.answers.set(fresh!, 48);
    assert.deepEqual(f.sc.getNumNewMatchedTokens(req, 0), [48, true]);
    assert.deepEqual(f.lookup.canceled, [old]);
    assert.equal(f.sc.trackedRequests, 1);
  });

  it('asked again after an admission (vLLM asks before buildConnectorMeta), it looks up afresh', () => {
    const f = setup();
    const req = prompt('a', 100);
    matched(f, req, 0, 0);
    f.sc.updateStateAfterAlloc(req, table(25), 0);
    assert.deepEqual(f.sc.getNumNewMatchedTokens(req, 0), [null, false]);
    assert.equal(new Set(f.lookup.calls.map((c) => c.lookupId)).size, 2);
  });

  it('a failed load is never offered again; failed loads in a row pause offers', () => {
    const now = { ms: 0 };
    const f = setup({ now: () => now.ms });
    const fail = (id: string, hit: number) => {
      const r = prompt(id, 100);
      matched(f, r, 0, hit);
      const t = table(25, 1000 + 100 * f.lookup.calls.length);
      f.sc.updateStateAfterAlloc(r, t, hit);
      f.sc.buildConnectorMeta();
      f.sc.updateConnectorOutput({ finishedRecving: [id], invalidBlockIds: t.slice(BPC) });
      return r;
    };
    const x = fail('x', 48);
    assert.equal(f.sc.offersPaused, false, 'one failure does not pause');
    assert.deepEqual(f.sc.getNumNewMatchedTokens(x, 0), [null, false]);
    f.lookup.answers.set(f.lookup.calls.at(-1)!.lookupId, 48);
    assert.deepEqual(f.sc.getNumNewMatchedTokens(x, 0), [16, true], 'only up to the failed chunk');
    fail('y', 32);
    assert.equal(f.sc.offersPaused, true);
    assert.deepEqual(f.sc.getNumNewMatchedTokens(prompt('z', 100), 0), [0, false]);
    now.ms += 1500;
    assert.equal(f.sc.offersPaused, false);
  });

  it('after a load consumed the pins, a preempted request looks up afresh', () => {
    const f = setup();
    const req = prompt('a', 100);
    matched(f, req, 0, 32);
    f.sc.updateStateAfterAlloc(req, table(25), 32);
    f.sc.buildConnectorMeta();
    f.sc.updateConnectorOutput({ finishedRecving: ['a'] });
    f.sc.requestPreempted(req);
    assert.deepEqual(f.sc.getNumNewMatchedTokens(req, 0), [null, false]);
    const ids = new Set(f.lookup.calls.map((c) => c.lookupId));
    assert.equal(ids.size, 2, 'a second lookup id');
  });

  it('resetPrefixCache drops cached answers but keeps recorded loads', () => {
    const f = setup();
    const a = prompt('a', 100);
    const b = prompt('b', 100);
    matched(f, a, 0, 32);
    matched(f, b, 0, 32);
    f.sc.updateStateAfterAlloc(b, table(25), 32);
    assert.equal(f.sc.resetPrefixCache(), true);
    assert.deepEqual(f.lookup.canceled, [f.lookup.calls[0]!.lookupId]);
    assert.deepEqual(f.sc.getNumNewMatchedTokens(a, 0), [null, false]);
    assert.equal(f.sc.buildConnectorMeta().loads.length, 1);
  });

  it('close closes the lookup client; later calls reject with KVT_CLOSED', async () => {
    const f = setup();
    await f.sc.close();
    await f.sc.close();
    assert.equal(f.lookup.closed, true);
    assert.throws(
      () => f.sc.getNumNewMatchedTokens(prompt('a', 100), 0),
      (e: unknown) => isKvtierError(e, 'KVT_CLOSED'),
    );
  });

  it('takes a MultiLookupClient: null until every server answers', async () => {
    // Nothing listens on these endpoints: the lookups stay pending.
    const clients = [1, 2].map(
      (port) =>
        new LookupClient({ endpoint: `tcp://127.0.0.1:${port}`, namespaces: ['0'.repeat(32)] }),
    );
    try {
      const sc = new KvtierSchedulerConnector({
        lookup: new MultiLookupClient(clients),
        blockSize: BLOCK,
        chunkSize: CHUNK,
      });
      assert.deepEqual(sc.getNumNewMatchedTokens(prompt('a', 100), 0), [null, false]);
      assert.deepEqual(sc.getNumNewMatchedTokens(prompt('a', 100), 0), [null, false]);
      assert.equal(clients[0]!.pendingRequests, 1, 'one lookup in flight per server');
      assert.deepEqual(sc.requestFinished(prompt('a', 100)), [false, null]);
      await sc.close();
    } finally {
      await Promise.all(clients.map((c) => c.close()));
    }
  });

  it('validates options', () => {
    const lookup = new FakeLookup();
    assert.throws(
      () => new KvtierSchedulerConnector({ lookup, blockSize: 16, chunkSize: 40 }),
      (e: unknown) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
    );
    assert.throws(
      () => new KvtierSchedulerConnector({ lookup, blockSize: 0 }),
      (e: unknown) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
    );
  });
});

/** A data-plane client whose replies the test settles by hand. */
class FakeDataPlane implements WorkerDataPlaneClient {
  readonly loads: {
    requestId: string;
    settle(r: { loadedTokens: number; invalidBlockIds: number[] } | Error): void;
  }[] = [];
  readonly saves: { requestId: string; settle(e?: Error): void }[] = [];
  readonly finished: [string, string][] = [];
  closed = false;

  async register() {
    return { engineId: 'e', namespace: '0'.repeat(32), chunkSize: CHUNK, blockSize: BLOCK };
  }
  save(a: { requestId: string }) {
    return new Promise<{ saved: number; skipped: number; dropped: number }>((resolve, reject) => {
      this.saves.push({
        requestId: a.requestId,
        settle: (e) =>
          e === undefined ? resolve({ saved: 1, skipped: 0, dropped: 0 }) : reject(e),
      });
    });
  }
  load(a: { requestId: string }) {
    return new Promise<{ loadedTokens: number; invalidBlockIds: number[] }>((resolve, reject) => {
      this.loads.push({
        requestId: a.requestId,
        settle: (r) => (r instanceof Error ? reject(r) : resolve(r)),
      });
    });
  }
  async requestFinished(requestId: string, kind: string) {
    this.finished.push([requestId, kind]);
    return true;
  }
  async close() {
    this.closed = true;
  }
}

function load(requestId: string, blockIds: number[]): ConnectorMeta['loads'][number] {
  return {
    requestId,
    lookupId: `${requestId}#1`,
    firstChunk: 0,
    numTokens: CHUNK,
    blockIds,
    chunkHashes: Buffer.alloc(32),
  };
}

describe('worker connector', () => {
  async function worker() {
    const dp = new FakeDataPlane();
    const w = new KvtierWorkerConnector({ client: dp });
    await w.registerKvCaches({} as never);
    return { dp, w };
  }

  it('startLoadKv returns before the load settles; outcomes and errors are drained once', async () => {
    const { dp, w } = await worker();
    w.startLoadKv({
      loads: [load('a', [1, 2, 3, 4]), load('b', [5, 6, 7, 8])],
      saves: [],
      finished: [],
    });
    assert.equal(dp.loads.length, 2);
    assert.deepEqual(w.getFinished(), { finishedSending: new Set(), finishedRecving: new Set() });
    dp.loads[0]!.settle({ loadedTokens: 0, invalidBlockIds: [3, 4] });
    dp.loads[1]!.settle(new Error('sidecar gone'));
    await w.whenIdle();
    assert.deepEqual(w.getFinished().finishedRecving, new Set(['a', 'b']));
    assert.deepEqual(w.getBlockIdsWithLoadErrors(), new Set([3, 4, 5, 6, 7, 8]));
    assert.deepEqual(w.getFinished().finishedRecving, new Set());
    assert.deepEqual(w.getBlockIdsWithLoadErrors(), new Set());
  });

  it('saves start at waitForSave; a delayed free is reported once the saves are over', async () => {
    const { dp, w } = await worker();
    const save = {
      requestId: 'a',
      firstChunk: 0,
      blockIds: [1, 2, 3, 4],
      chunkHashes: Buffer.alloc(32),
    };
    w.startLoadKv({ loads: [], saves: [save], finished: [] });
    assert.equal(dp.saves.length, 0, 'the KV is not computed before the forward pass');
    w.waitForSave();
    assert.equal(dp.saves.length, 1);
    w.startLoadKv({
      loads: [],
      saves: [],
      finished: [{ requestId: 'a', kind: 'finished', delayFree: true }],
    });
    assert.deepEqual(dp.finished, [['a', 'finished']]);
    assert.deepEqual(w.getFinished().finishedSending, new Set(), 'save still in flight');
    dp.saves[0]!.settle();
    await w.whenIdle();
    assert.deepEqual(w.getFinished().finishedSending, new Set(['a']));
    assert.deepEqual(w.getFinished().finishedSending, new Set());
  });

  it('preemption sends no release and handlePreemptions waits for the saves', async () => {
    const { dp, w } = await worker();
    const save = {
      requestId: 'p',
      firstChunk: 0,
      blockIds: [1, 2, 3, 4],
      chunkHashes: Buffer.alloc(32),
    };
    w.startLoadKv({ loads: [], saves: [save], finished: [] });
    w.waitForSave();
    w.startLoadKv({
      loads: [],
      saves: [],
      finished: [{ requestId: 'p', kind: 'preempted', delayFree: false }],
    });
    assert.deepEqual(dp.finished, []);
    let done = false;
    const waiting = w.handlePreemptions(['p']).then(() => {
      done = true;
    });
    await new Promise((r) => setImmediate(r));
    assert.equal(done, false, 'still waiting for the save');
    dp.saves[0]!.settle(new Error('dropped'));
    await waiting;
    assert.equal(w.stats().savesFailed, 1);
    assert.deepEqual(w.getFinished().finishedSending, new Set(), 'not a delayed free');
  });

  it('refuses loads before registration and work after close', async () => {
    const dp = new FakeDataPlane();
    const w = new KvtierWorkerConnector({ client: dp });
    assert.throws(
      () => w.startLoadKv({ loads: [], saves: [], finished: [] }),
      (e: unknown) => isKvtierError(e, 'KVT_INVALID_ARGUMENT'),
    );
    await w.close();
    await w.close();
    assert.equal(dp.closed, true);
    await assert.rejects(w.registerKvCaches({} as never), (e: unknown) =>
      isKvtierError(e, 'KVT_CLOSED'),
    );
  });
});

describe('scheduler connector: lookups that cannot help cost no step', () => {
  it('keeps an answer whose hits the engine holds already: no new lookup while the request waits', () => {
    const f = setup();
    const req = prompt('covered', 100);
    assert.deepEqual(matched(f, req, 48, 48), [0, false]);
    assert.deepEqual(f.lookup.canceled, [f.lookup.calls[0]!.lookupId], 'its pins released');
    const calls = f.lookup.calls.length;
    // Not admitted (no room): asked again each step, answered at once from what it knows.
    for (let i = 0; i < 3; i++) assert.deepEqual(f.sc.getNumNewMatchedTokens(req, 48), [0, false]);
    assert.equal(f.lookup.calls.length, calls, 'no lookup sent');
    // The engine's prefix shrank (its blocks were evicted): worth a fresh lookup now.
    assert.deepEqual(f.sc.getNumNewMatchedTokens(req, 16), [null, false]);
    assert.equal(f.lookup.calls.length, calls + 1);
  });

  it('does not make a request wait a step for a lookup whose tokens the step would compute', () => {
    let stepMs = 50;
    const lookup = new FakeLookup();
    const extended = Object.assign(lookup, {
      lookupAnswer: (id: string, h: Uint8Array, c: ArrayLike<number>) => {
        const n = lookup.lookup(id, h, c);
        return n === null
          ? null
          : { status: 'ok' as const, hitTokens: n, hitChunks: 0, epoch: 1, tiers: [] };
      },
    });
    const sc = new KvtierSchedulerConnector({
      lookup: extended,
      blockSize: BLOCK,
      chunkSize: CHUNK,
      computeTokensPerSec: 1000, // 96 claimable tokens: 96 ms to compute
      stepMs: () => stepMs,
    });
    const req = prompt('short', 100);
    assert.deepEqual(sc.getNumNewMatchedTokens(req, 0), [null, false], 'a 50 ms step: worth it');
    stepMs = 100;
    const other = prompt('later', 100);
    assert.deepEqual(sc.getNumNewMatchedTokens(other, 0), [0, false], 'a 100 ms step: computed');
    const id = lookup.calls.at(-1)!.lookupId;
    assert.equal(lookup.forgotten.length, 0, 'the lookup goes on');
    // Not admitted after all (it waited anyway): its answer counts.
    lookup.answers.set(id, 64);
    assert.deepEqual(sc.getNumNewMatchedTokens(other, 0), [64, true]);
    // Admitted with nothing to load while a lookup is in flight: the lookup is dropped.
    const third = prompt('third', 100);
    assert.deepEqual(sc.getNumNewMatchedTokens(third, 0), [0, false]);
    sc.updateStateAfterAlloc(third, table(25), 0);
    assert.deepEqual(lookup.forgotten, [lookup.calls.at(-1)!.lookupId]);
  });
});
