/**
 * The lookup client against real lookup servers over ZMQ: the non-blocking `lookup()` contract
 * (null while loading, then the number; 0 past the deadline with the server work cancelled),
 * several servers, a server restart on the same port, many lookups in flight, close.
 */
import assert from 'node:assert/strict';
import { afterEach, describe, it } from 'node:test';
import { isKvtierError } from '../../src/errors.ts';
import type { ChunkHash } from '../../src/hashing/chunk-hash.ts';
import { LookupClient, type LookupClientOptions } from '../../src/lookup-client/lookup-client.ts';
import { MultiLookupClient } from '../../src/lookup-client/multi-lookup-client.ts';
import type { SidecarServer } from '../../src/lookup-server/sidecar-server.ts';
import {
  createTestStack,
  nextTurn,
  packHex,
  pollUntil,
  pollUntilNumber,
  randomHashes,
  randomNamespace,
  randomPayload,
  startTestServer,
  type TestStack,
} from '../support/fixtures.ts';

const cleanups: (() => Promise<void>)[] = [];

afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

async function stack(opts: Parameters<typeof createTestStack>[0] = {}): Promise<TestStack> {
  const s = await createTestStack(opts);
  cleanups.push(() => s.close());
  return s;
}

function client(opts: LookupClientOptions): LookupClient {
  const c = new LookupClient({ lookupTimeoutMs: 10_000, ...opts });
  cleanups.push(() => c.close());
  return c;
}

async function putCpu(s: TestStack, ns: string, hashes: ChunkHash[], counts: number[]) {
  for (let i = 0; i < hashes.length; i++) {
    const outcome = await s.storage.put(ns, hashes[i]!, {
      tokens: counts[i]!,
      data: randomPayload(2048),
    });
    assert.equal(outcome, 'stored');
  }
  await s.storage.writeQueue.idle();
}

async function putLower(s: TestStack, ns: string, hashes: ChunkHash[], counts: number[]) {
  for (let i = 0; i < hashes.length; i++) {
    const outcome = await s.gated.put(ns, hashes[i]!, {
      tokens: counts[i]!,
      data: randomPayload(2048),
    });
    assert.equal(outcome, 'stored');
  }
}

/** Calls `lookup` on `n` separate event-loop turns and asserts it is null every time. */
async function assertStaysNull(lookup: () => number | null, n: number, what: string) {
  for (let i = 0; i < n; i++) {
    assert.equal(lookup(), null, `${what}: call ${i + 1} of ${n}`);
    await nextTurn();
  }
}

describe('lookup client: non-blocking lookup()', () => {
  it('returns null while the lower tier loads, then the number; the chunks land in CPU', async () => {
    const s = await stack();
    const ns = randomNamespace();
    const hashes = randomHashes(3);
    const counts = [256, 256, 17];
    await putLower(s, ns, hashes, counts);
    const c = client({ endpoint: s.server.endpoint, namespaces: [ns] });
    const packed = packHex(hashes);

    assert.equal(c.lookup('nb', packed, counts), null, 'the first call sends and returns null');
    await s.gated.gate.whenWaiting(1);
    await assertStaysNull(() => c.lookup('nb', packed, counts), 20, 'gate closed');
    assert.equal(await s.cpu.batchedContains(ns, hashes), 0, 'nothing in CPU yet');

    s.gated.gate.open();
    assert.equal(await pollUntilNumber(() => c.lookup('nb', packed, counts)), 529);
    assert.equal(await s.cpu.batchedContains(ns, hashes), 3, 'prefetched into the CPU tier');
    assert.equal(s.cpu.stats().pinnedChunks, 3);
    await c.cancel('nb');
    assert.equal(s.cpu.stats().pinnedChunks, 0);
  });

  it('lookupAsync stays pending while the gate is closed and resolves once it opens', async () => {
    const s = await stack();
    const ns = randomNamespace();
    const hashes = randomHashes(2);
    const counts = [128, 5];
    await putLower(s, ns, hashes, counts);
    const c = client({ endpoint: s.server.endpoint, namespaces: [ns] });

    let settled = false;
    const answer = c.lookupAsync(
      'as',
      hashes.map((h) => Buffer.from(h, 'hex')),
      counts,
    );
    answer.finally(() => {
      settled = true;
    });
    await s.gated.gate.whenWaiting(1);
    for (let i = 0; i < 20; i++) await nextTurn();
    assert.equal(settled, false, 'still loading while the gate is closed');
    s.gated.gate.open();
    const a = await answer;
    assert.equal(a.status, 'ok');
    assert.equal(a.hitTokens, 133);
    assert.equal(a.hitChunks, 2);
    assert.deepEqual(a.tiers, [{ tier: 'gated', tokens: 133 }]);
    await c.cancel('as');
  });

  it('returns 0 past the deadline and cancels the server-side lookup', async () => {
    const s = await stack();
    const ns = randomNamespace();
    const hashes = randomHashes(4);
    const counts = [64, 64, 64, 64];
    await putLower(s, ns, hashes, counts);
    let now = 1_000_000;
    const c = client({
      endpoint: s.server.endpoint,
      namespaces: [ns],
      lookupTimeoutMs: 1000,
      now: () => now,
    });
    const packed = packHex(hashes);

    assert.equal(c.lookup('dl', packed, counts), null);
    await s.gated.gate.whenWaiting(1);
    assert.equal(s.storage.events.state('dl'), 'ongoing');
    now += 999;
    await assertStaysNull(() => c.lookup('dl', packed, counts), 5, 'before the deadline');
    now += 1;
    assert.equal(c.lookup('dl', packed, counts), 0, 'at the deadline the answer is 0');

    await pollUntil(
      () => s.storage.events.state('dl') === 'not_found' && s.gated.gate.waiting === 0,
      'server-side lookup cancelled',
    );
    assert.equal(s.cpu.stats().pinnedChunks, 0);
    await pollUntil(() => c.pendingRequests === 0, 'cancel and lookup replies received');

    s.gated.gate.open();
    await c.ping();
    assert.equal(s.cpu.stats().pinnedChunks, 0, 'opening the gate later leaves no pins');
    assert.equal(s.cpu.stats().chunks, 0, 'the cancelled prefetch stored nothing');
    assert.equal(s.storage.events.sizes().ongoing, 0);
    assert.equal(s.storage.events.sizes().done, 0);

    // The id is free again: a new lookup with it starts afresh.
    assert.equal(c.lookup('dl', packed, counts), null);
    assert.equal(await pollUntilNumber(() => c.lookup('dl', packed, counts)), 256);
    await c.cancel('dl');
  });
});

describe('lookup client: several servers', () => {
  it('MultiLookupClient answers the minimum over servers and waits for the slowest', async () => {
    const a = await stack();
    const b = await stack();
    const ns = randomNamespace();
    const hashes = randomHashes(4);
    const counts = [100, 100, 100, 100];
    await putCpu(a, ns, hashes, counts);
    await putLower(b, ns, hashes.slice(0, 2), counts.slice(0, 2));
    const ca = client({ endpoint: a.server.endpoint, namespaces: [ns] });
    const cb = client({ endpoint: b.server.endpoint, namespaces: [ns] });
    const multi = new MultiLookupClient([ca, cb]);
    const packed = packHex(hashes);

    assert.equal(multi.lookup('m1', packed, counts), null);
    await b.gated.gate.whenWaiting(1);
    // Server a has answered by now (it only reads CPU); b is held at its gate.
    await pollUntil(() => ca.pendingRequests === 0, 'server a answered');
    await assertStaysNull(() => multi.lookup('m1', packed, counts), 10, 'b still loading');
    b.gated.gate.open();
    assert.equal(await pollUntilNumber(() => multi.lookup('m1', packed, counts)), 200);
    assert.equal(a.cpu.stats().pinnedChunks, 4);
    await multi.cancel('m1');
    assert.equal(a.cpu.stats().pinnedChunks, 0);
    assert.equal(b.cpu.stats().pinnedChunks, 0);

    assert.equal(await multi.lookupAsync('m2', packed, counts), 200);
    const onlyA = await ca.lookupAsync('m3', packed, counts);
    assert.equal(onlyA.hitTokens, 400, 'server a alone would have said 400');
    await multi.cancel('m2');
    await ca.cancel('m3');
  });
});

describe('lookup client: server restart', () => {
  it('the same client gets correct answers from a new server on the same port', async () => {
    const s = await stack();
    const ns = randomNamespace();
    const cpuHashes = randomHashes(2);
    const lowHashes = randomHashes(2);
    await putCpu(s, ns, cpuHashes, [50, 50]);
    await putLower(s, ns, lowHashes, [50, 50]);
    let now = 0;
    const c = client({
      endpoint: s.server.endpoint,
      namespaces: [ns],
      lookupTimeoutMs: 1000,
      requestTimeoutMs: 10_000,
      now: () => now,
    });
    const before = await c.lookupAsync('r0', packHex(cpuHashes), [50, 50], {
      config: { pin: false },
    });
    assert.equal(before.hitTokens, 100);

    // Two lookups held at the gate when the server goes away.
    const lowPacked = packHex(lowHashes);
    assert.equal(c.lookup('r-nb', lowPacked, [50, 50]), null);
    const inflight = c.lookupAsync('r-async', lowPacked, [50, 50], { timeoutMs: 300 });
    await s.gated.gate.whenWaiting(2);
    const port = new URL(s.server.endpoint.replace('tcp://', 'http://')).port;
    await s.server.close();

    const restarted: SidecarServer = await startTestServer(s.storage, {
      endpoint: `tcp://127.0.0.1:${port}`,
    });
    cleanups.push(() => restarted.close());
    assert.equal(restarted.endpoint, s.server.endpoint);

    const lost = await inflight;
    assert.equal(lost.status, 'timeout', 'a lookup lost with the old server times out');
    assert.equal(lost.hitTokens, 0);
    now += 1000;
    assert.equal(c.lookup('r-nb', lowPacked, [50, 50]), 0, 'the non-blocking one answers 0');
    // The storage outlives its server; the client's deadline cancels reach the new server and
    // release the lookups still held in prefetch.
    await pollUntil(
      () =>
        s.gated.gate.waiting === 0 &&
        s.storage.events.state('r-nb') === 'not_found' &&
        s.storage.events.state('r-async') === 'not_found',
      'lookups lost with the old server cancelled through the new one',
    );
    assert.equal(s.cpu.stats().pinnedChunks, 0);

    const info = await c.ping();
    assert.equal(info.protocolVersion, 1);
    const after = await c.lookupAsync('r1', packHex(cpuHashes), [50, 50], {
      config: { pin: false },
    });
    assert.equal(after.status, 'ok');
    assert.equal(after.hitTokens, 100);
    s.gated.gate.open();
    assert.equal(c.lookup('r2', lowPacked, [50, 50]), null);
    assert.equal(await pollUntilNumber(() => c.lookup('r2', lowPacked, [50, 50])), 100);
    await c.cancel('r2');
    assert.equal(s.cpu.stats().pinnedChunks, 0);
  });
});

describe('lookup client: concurrency and close', () => {
  it('200 concurrent lookups with distinct ids each get their own answer', async () => {
    const s = await stack();
    const ns = randomNamespace();
    const n = 200;
    const chain = randomHashes(n);
    await putCpu(s, ns, chain, new Array<number>(n).fill(16));
    const c = client({ endpoint: s.server.endpoint, namespaces: [ns] });

    // Lookup i asks for the first i+1 stored chunks then a miss: expected 16 * (i + 1) tokens.
    const answers = Array.from({ length: n }, (_, i) => {
      const hashes = [...chain.slice(0, i + 1), ...randomHashes(1)];
      return c.lookupAsync(`c${i}`, packHex(hashes), new Array<number>(i + 2).fill(16), {
        config: { pin: false },
      });
    });
    assert.equal(c.pendingRequests, n, 'all requests are in flight at once');
    const results = await Promise.all(answers);
    results.forEach((a, i) => {
      assert.equal(a.status, 'ok', `lookup c${i}`);
      assert.equal(a.hitChunks, i + 1, `lookup c${i} chunks`);
      assert.equal(a.hitTokens, 16 * (i + 1), `lookup c${i} tokens`);
    });
    assert.equal(s.cpu.stats().pinnedChunks, 0, 'pin: false holds nothing');
  });

  it('close() rejects pending requests with KVT_CLOSED; later calls too', async () => {
    const s = await stack();
    const ns = randomNamespace();
    const hashes = randomHashes(1);
    await putLower(s, ns, hashes, [8]);
    const c = client({ endpoint: s.server.endpoint, namespaces: [ns] });
    const pending = c.lookupAsync('cl', packHex(hashes), [8]);
    const pending2 = c.lookupAsync('cl2', packHex(hashes), [8]);
    await s.gated.gate.whenWaiting(2);
    assert.equal(c.pendingRequests, 2);
    await c.close();
    await assert.rejects(pending, (e) => isKvtierError(e, 'KVT_CLOSED'));
    await assert.rejects(pending2, (e) => isKvtierError(e, 'KVT_CLOSED'));
    assert.equal(c.pendingRequests, 0);
    await c.close();
    await assert.rejects(c.ping(), (e) => isKvtierError(e, 'KVT_CLOSED'));
    assert.equal(c.lookup('after', packHex(hashes), [8]), 0, 'lookup() after close answers 0');
  });
});
