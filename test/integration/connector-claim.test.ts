/**
 * The scheduler connector with the engine's prefill rate (`computeTokensPerSec`) against real
 * lookup servers over ZMQ: it sends the rate with every lookup (the sidecar declines a slow tier's
 * short run, so less is claimed), it never waits for a lookup longer than computing the tokens
 * it could claim (on an injected clock: the lookup answers 0 and is cancelled on the server), and
 * the lookup clients hand it whole answers (`lookupAnswer`), the minimum over several servers.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { afterEach, describe, it } from 'node:test';
import { admittedTokens, lookupWaitMs } from '../../src/connector/claim-bound.ts';
import { KvtierSchedulerConnector } from '../../src/connector/scheduler-connector.ts';
import type { ConnectorRequest } from '../../src/connector/types.ts';
import { chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';
import { hashChunks } from '../../src/hashing/chunk-hasher.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { MultiLookupClient } from '../../src/lookup-client/multi-lookup-client.ts';
import { KvtierMetrics } from '../../src/metrics/metrics.ts';
import {
  createTestStack,
  nextTurn,
  pollUntil,
  randomNamespace,
  type TestStack,
} from '../support/fixtures.ts';

const BLOCK = 4;
const CHUNK = 16;
const SLOW = { readBytesPerSec: 1e6, latencySeconds: 0.05 };

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

async function stack(metrics?: KvtierMetrics): Promise<TestStack> {
  const s = await createTestStack(metrics === undefined ? {} : { storage: { metrics } });
  cleanups.push(() => s.close());
  return s;
}

function client(s: TestStack, ns: string, now?: () => number): LookupClient {
  const c = new LookupClient({
    endpoint: s.server.endpoint,
    namespaces: [ns],
    lookupTimeoutMs: 10_000,
    ...(now === undefined ? {} : { now }),
  });
  cleanups.push(() => c.close());
  return c;
}

/** A prompt of `chunks` full chunks and one more token (the connector looks up `chunks`). */
function prompt(id: string, chunks: number): ConnectorRequest {
  const seed = [...id].reduce((a, c) => a * 31 + c.charCodeAt(0), 7) % 1000;
  const promptTokenIds = Array.from({ length: chunks * CHUNK + 1 }, (_, i) => seed * 10_000 + i);
  return { requestId: id, promptTokenIds };
}

/** Stores the prompt's chunks `[from, to)` in `tier` ('cpu' through the manager, or 'gated'). */
async function store(
  s: TestStack,
  ns: string,
  req: ConnectorRequest,
  from: number,
  to: number,
  tier: 'cpu' | 'gated',
) {
  const chunks = hashChunks(req.promptTokenIds, { chunkSize: CHUNK });
  for (const c of chunks.slice(from, to)) {
    const hash = chunkHashFromBytes(c.hash);
    const data = { tokens: CHUNK, data: randomBytes(CHUNK * 64) };
    const out =
      tier === 'cpu' ? await s.cpu.put(ns, hash, data) : await s.gated.put(ns, hash, data);
    assert.equal(out, 'stored');
  }
}

/** Asks once per event-loop turn until the connector answers. */
async function matched(sc: KvtierSchedulerConnector, req: ConnectorRequest): Promise<number> {
  let answer: number | null = null;
  await pollUntil(() => {
    answer = sc.getNumNewMatchedTokens(req, 0)[0];
    return answer !== null;
  }, 'the connector answered');
  return answer as unknown as number;
}

describe('scheduler connector: never slower than recomputing', () => {
  it("sends the engine's rate: a slow tier's short run is declined by the sidecar and not claimed", async () => {
    const metrics = new KvtierMetrics({ defaultMetrics: false });
    const s = await stack(metrics);
    const ns = randomNamespace();
    s.storage.tierRates.fix('gated', SLOW);
    // The manager learns the namespace's bytes per token from a stored chunk.
    await s.storage.put(ns, chunkHashFromBytes(Buffer.alloc(32, 9)), {
      tokens: CHUNK,
      data: randomBytes(CHUNK * 64),
    });
    await s.storage.writeQueue.idle();
    const req = prompt('r1', 5);
    await store(s, ns, req, 0, 4, 'cpu');
    await store(s, ns, req, 4, 5, 'gated');
    s.gated.gate.open();
    // A clock that stands still: no lookup runs past its deadline on a busy machine.
    const lookup = client(s, ns, () => 0);
    const sc = new KvtierSchedulerConnector({
      lookup,
      blockSize: BLOCK,
      chunkSize: CHUNK,
      computeTokensPerSec: 1000,
    });
    assert.equal(await matched(sc, req), 4 * CHUNK, 'the host-memory chunks only');
    assert.equal(s.gated.calls.get, 0, 'nothing fetched from the slow tier');
    assert.match(
      await metrics.text(),
      /kvtier_lookup_tier_decisions_total\{tier="gated",decision="decline"\} 1\n/,
    );
    // The same engine without the rate claims the slow tier's chunk as before.
    const plain = new KvtierSchedulerConnector({ lookup, blockSize: BLOCK, chunkSize: CHUNK });
    assert.equal(await matched(plain, prompt('r1', 5)), 5 * CHUNK);
    assert.equal(s.gated.calls.get, 1);
  });

  it('gives a lookup no longer than computing its tokens takes: then 0, and the server work is cancelled', async () => {
    const s = await stack();
    const ns = randomNamespace();
    const req = prompt('slow', 5);
    await store(s, ns, req, 0, 5, 'gated'); // unmeasured: the sidecar fetches, and the gate holds it
    let now = 0;
    const lookup = client(s, ns, () => now);
    const sc = new KvtierSchedulerConnector({
      lookup,
      blockSize: BLOCK,
      chunkSize: CHUNK,
      computeTokensPerSec: 1000, // 80 tokens: 80 ms
    });
    assert.deepEqual(sc.getNumNewMatchedTokens(req, 0), [null, false]);
    await pollUntil(() => s.gated.gate.waiting === 1, 'the sidecar is fetching');
    now = 79;
    assert.deepEqual(sc.getNumNewMatchedTokens(req, 0), [null, false], 'still within 80 ms');
    now = 80;
    assert.deepEqual(sc.getNumNewMatchedTokens(req, 0), [0, false], 'computing is no slower now');
    // The CANCEL aborts the sidecar's fetch: the gate lets go of it.
    await pollUntil(() => s.gated.gate.waiting === 0, 'the fetch was aborted');
    assert.equal(s.storage.events.state('slow#1'), 'not_found');

    // Without the rate the client's own deadline (10 s) applies.
    const other = prompt('plain', 5);
    await store(s, ns, other, 0, 5, 'gated');
    const plain = new KvtierSchedulerConnector({ lookup, blockSize: BLOCK, chunkSize: CHUNK });
    assert.deepEqual(plain.getNumNewMatchedTokens(other, 0), [null, false]);
    now += 5000;
    await nextTurn();
    assert.deepEqual(plain.getNumNewMatchedTokens(other, 0), [null, false]);
    s.gated.gate.open();
    await pollUntil(
      () => plain.getNumNewMatchedTokens(other, 0)[0] !== null,
      'the plain lookup answered',
    );
  });

  it('MultiLookupClient answers the whole answer of the server with the fewest tokens', async () => {
    const [a, b] = [await stack(), await stack()];
    const ns = randomNamespace();
    const req = prompt('m', 4);
    await store(a, ns, req, 0, 4, 'cpu');
    await store(b, ns, req, 0, 2, 'cpu');
    const multi = new MultiLookupClient([client(a, ns), client(b, ns)]);
    const chunks = hashChunks(req.promptTokenIds, { chunkSize: CHUNK }).slice(0, 4);
    const hashes = Buffer.concat(chunks.map((c) => c.hash));
    const counts = chunks.map(() => CHUNK);
    const opts = { config: { computeTokensPerSec: 1000 } };
    let answer = multi.lookupAnswer('m', hashes, counts, opts);
    await pollUntil(() => {
      answer ??= multi.lookupAnswer('m', hashes, counts, opts);
      return answer !== null;
    }, 'both servers answered');
    assert.equal(answer!.hitTokens, 2 * CHUNK);
    assert.deepEqual(answer!.tiers, [{ tier: 'cpu', tokens: 2 * CHUNK }]);
    assert.deepEqual(
      answer!.tierRates?.map((t) => t.tier),
      ['cpu', 'gated'],
    );
  });
});

describe('claim bound', () => {
  it('a lookup may take what computing its tokens takes, at least 1 ms', () => {
    assert.equal(lookupWaitMs(12_577, 12_577), 1000);
    assert.equal(lookupWaitMs(1, 1e9), 1);
    assert.equal(lookupWaitMs(256, 1000), 256);
  });

  it('claims what the sidecar reported loaded, up to the first tier it did not', () => {
    const base = { status: 'ok' as const, hitChunks: 3, epoch: 1 };
    const rate = (tier: string, decision: 'none' | 'load' | 'decline') => ({
      tier,
      decision,
      readBytesPerSec: 1e9,
      latencyMs: 1,
      declinedTokens: 0,
    });
    const tiers = [
      { tier: 'cpu', tokens: 16 },
      { tier: 'disk', tokens: 16 },
      { tier: 's3', tokens: 16 },
    ];
    assert.equal(admittedTokens({ ...base, hitTokens: 48, tiers }), 48, 'no rates: all');
    assert.equal(
      admittedTokens({
        ...base,
        hitTokens: 48,
        tiers,
        tierRates: [rate('cpu', 'none'), rate('disk', 'load'), rate('s3', 'load')],
      }),
      48,
    );
    assert.equal(
      admittedTokens({
        ...base,
        hitTokens: 48,
        tiers,
        tierRates: [rate('cpu', 'none'), rate('disk', 'load'), rate('s3', 'none')],
      }),
      32,
      'a tier the sidecar did not report loaded ends the claim',
    );
  });
});
