/**
 * The lookup server over real ZMQ sockets on ephemeral ports: data round trips, lookup
 * semantics and pins, malformed input from raw sockets, clear/epoch, lookup id reuse, close.
 */
import assert from 'node:assert/strict';
import { afterEach, describe, it } from 'node:test';
import * as zmq from 'zeromq';
import { isKvtierError } from '../../src/errors.ts';
import type { ChunkHash } from '../../src/hashing/chunk-hash.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { decodeReply, encodeRequest } from '../../src/protocol/codec.ts';
import { HEADER_BYTES, MAGIC, type Reply } from '../../src/protocol/messages.ts';
import {
  createTestStack,
  packHex,
  randomHashes,
  randomNamespace,
  randomPayload,
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

function client(s: TestStack, ns: string, opts: { lookupTimeoutMs?: number } = {}): LookupClient {
  const c = new LookupClient({
    endpoint: s.server.endpoint,
    namespaces: [ns],
    lookupTimeoutMs: opts.lookupTimeoutMs ?? 10_000,
  });
  cleanups.push(() => c.close());
  return c;
}

/** Stores chunks in the lower tier only, as if the CPU tier had evicted them. */
async function putLower(s: TestStack, ns: string, hashes: ChunkHash[], counts: number[]) {
  for (let i = 0; i < hashes.length; i++) {
    assert.equal(
      await s.gated.put(ns, hashes[i]!, { tokens: counts[i]!, data: randomPayload(1024) }),
      'stored',
    );
  }
}

describe('lookup server: data plane over ZMQ', () => {
  it('put then get round-trips 64 KiB and 2 MiB payloads byte for byte', async () => {
    const s = await stack({ gated: { open: true } });
    const ns = randomNamespace();
    const c = client(s, ns);
    for (const size of [64 * 1024, 2 * 1024 * 1024]) {
      const [hash] = randomHashes(1);
      const payload = randomPayload(size);
      assert.equal(await c.put(ns, hash!, 256, payload), 'stored');
      const got = await c.get(ns, hash!);
      assert.ok(got !== null, `chunk of ${size} bytes not found`);
      assert.equal(got.tokens, 256);
      assert.equal(got.payload.length, size);
      assert.ok(got.payload.equals(payload), `payload of ${size} bytes differs`);
    }
  });

  it('get of a missing chunk is null; put of an existing chunk is "exists"', async () => {
    const s = await stack({ gated: { open: true } });
    const ns = randomNamespace();
    const c = client(s, ns);
    const [hash, missing] = randomHashes(2);
    assert.equal(await c.get(ns, missing!), null);
    assert.equal(await c.put(ns, hash!, 16, randomPayload(4096)), 'stored');
    assert.equal(await c.put(ns, hash!, 16, randomPayload(4096)), 'exists');
    // Another namespace never sees the chunk.
    assert.equal(await c.get(randomNamespace(), hash!), null);
  });
});

describe('lookup server: lookups', () => {
  it('counts exact hit tokens in the CPU tier and holds pins until cancel', async () => {
    const s = await stack();
    const ns = randomNamespace();
    const c = client(s, ns);
    const hashes = randomHashes(3);
    const counts = [256, 256, 100];
    for (let i = 0; i < 3; i++) {
      assert.equal(await c.put(ns, hashes[i]!, counts[i]!, randomPayload(8192)), 'stored');
    }
    await s.storage.writeQueue.idle();
    assert.equal(s.cpu.stats().pinnedChunks, 0, 'write-through pins are released');

    const missing = randomHashes(1);
    const answer = await c.lookupAsync('L1', packHex([...hashes, ...missing]), [...counts, 256]);
    assert.equal(answer.status, 'ok');
    assert.equal(answer.hitTokens, 612);
    assert.equal(answer.hitChunks, 3);
    assert.deepEqual(answer.tiers, [{ tier: 'cpu', tokens: 612 }]);
    assert.equal(s.cpu.stats().pinnedChunks, 3, 'the server pins the hits');
    assert.equal(s.storage.events.state('L1'), 'done');

    assert.equal(await c.cancel('L1'), true);
    assert.equal(s.cpu.stats().pinnedChunks, 0, 'cancel releases the pins');
    assert.equal(s.storage.events.state('L1'), 'not_found');
    assert.equal(await c.cancel('L1'), false, 'a second cancel finds nothing');
  });

  it('reports per-tier tokens when a prefix is in CPU and the rest below', async () => {
    const s = await stack({ gated: { open: true } });
    const ns = randomNamespace();
    const c = client(s, ns);
    const hashes = randomHashes(4);
    const counts = [64, 64, 64, 10];
    await c.put(ns, hashes[0]!, 64, randomPayload(4096));
    await s.storage.writeQueue.idle();
    await putLower(s, ns, hashes.slice(1), counts.slice(1));
    const answer = await c.lookupAsync('L2', packHex(hashes), counts);
    assert.equal(answer.hitTokens, 202);
    assert.deepEqual(answer.tiers, [
      { tier: 'cpu', tokens: 64 },
      { tier: 'gated', tokens: 138 },
    ]);
    assert.equal(await s.cpu.batchedContains(ns, hashes), 4, 'prefetched into the CPU tier');
    await c.cancel('L2');
    assert.equal(s.cpu.stats().pinnedChunks, 0);
  });

  it('a clear bumps the epoch; a lookup held in prefetch comes back stale with no pins', async () => {
    const s = await stack();
    const ns = randomNamespace();
    const c = client(s, ns);
    const hashes = randomHashes(3);
    const counts = [32, 32, 32];
    await putLower(s, ns, hashes, counts);

    const held = c.lookupAsync('L3', packHex(hashes), counts);
    await s.gated.gate.whenWaiting(1);
    const before = s.storage.epoch;
    const epoch = await c.clear();
    assert.equal(epoch, before + 1);
    assert.equal(s.storage.epoch, before + 1);
    s.gated.gate.open();
    const answer = await held;
    assert.equal(answer.status, 'stale');
    assert.equal(answer.hitTokens, 0);
    assert.equal(answer.hitChunks, 0);
    assert.equal(s.cpu.stats().pinnedChunks, 0, 'stale answers hold no pins');
    assert.equal(s.storage.events.state('L3'), 'not_found');

    const after = await c.lookupAsync('L4', packHex(hashes), counts);
    assert.equal(after.status, 'ok');
    assert.equal(after.hitTokens, 0, 'the cleared chunks are gone');
    assert.equal(after.epoch, before + 1);
    assert.equal(c.epoch, before + 1);
  });

  it('a second lookup with the same id cancels the first, which answers "canceled"', async () => {
    const s = await stack();
    const ns = randomNamespace();
    const c = client(s, ns);
    const hashes = randomHashes(2);
    const counts = [16, 16];
    await putLower(s, ns, hashes, counts);

    const first = c.lookupAsync('same', packHex(hashes), counts);
    await s.gated.gate.whenWaiting(1);
    const second = c.lookupAsync('same', packHex(hashes), counts);
    const firstAnswer = await first;
    assert.equal(firstAnswer.status, 'canceled');
    assert.equal(firstAnswer.hitTokens, 0);
    await s.gated.gate.whenWaiting(1);
    s.gated.gate.open();
    const secondAnswer = await second;
    assert.equal(secondAnswer.status, 'ok');
    assert.equal(secondAnswer.hitTokens, 32);
    assert.equal(s.cpu.stats().pinnedChunks, 2, 'only the second lookup holds pins');
    assert.equal(await c.cancel('same'), true);
    assert.equal(s.cpu.stats().pinnedChunks, 0);
  });
});

describe('lookup server: malformed input from raw sockets', () => {
  const limits = { maxChunksPerLookup: 4, maxPayloadBytes: 4096 };
  const ns = randomNamespace();

  function ping(requestId: number): Buffer {
    return encodeRequest({ type: 'ping', requestId });
  }

  function lookupFrame(requestId: number, chunks: number): Buffer {
    return encodeRequest({
      type: 'lookup',
      requestId,
      lookupId: `raw-${requestId}`,
      namespaces: [ns],
      hashes: packHex(randomHashes(chunks)),
      tokenCounts: Uint32Array.from({ length: chunks }, () => 16),
      config: {},
    });
  }

  async function rawDealer(s: TestStack): Promise<zmq.Dealer> {
    const d = new zmq.Dealer({ linger: 0 });
    d.connect(s.server.endpoint);
    cleanups.push(async () => d.close());
    return d;
  }

  async function roundTrip(d: zmq.Dealer, msg: Buffer | Buffer[]): Promise<Reply> {
    await d.send(msg);
    const frames = await d.receive();
    assert.equal(frames.length, 1, 'a DEALER gets one frame per reply');
    return decodeReply(frames[0]!);
  }

  function withHeader(frame: Buffer, patch: (b: Buffer) => void): Buffer {
    const b = Buffer.from(frame);
    patch(b);
    return b;
  }

  const cases: { name: string; msg: () => Buffer | Buffer[]; code: string; requestId: number }[] = [
    {
      name: 'garbage bytes',
      msg: () => Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'),
      code: 'KVT_PROTOCOL',
      requestId: Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n').readUInt32LE(4),
    },
    { name: 'an empty frame', msg: () => Buffer.alloc(0), code: 'KVT_PROTOCOL', requestId: 0 },
    {
      name: 'a short header',
      msg: () => ping(5).subarray(0, HEADER_BYTES - 3),
      code: 'KVT_PROTOCOL',
      requestId: 0,
    },
    {
      name: 'bad magic',
      msg: () => withHeader(ping(11), (b) => b.writeUInt16LE(MAGIC ^ 0xffff, 0)),
      code: 'KVT_PROTOCOL',
      requestId: 11,
    },
    {
      name: 'a wrong version',
      msg: () => withHeader(ping(12), (b) => b.writeUInt8(2, 2)),
      code: 'KVT_PROTOCOL',
      requestId: 12,
    },
    {
      name: 'an unknown type',
      msg: () => withHeader(ping(13), (b) => b.writeUInt8(0x42, 3)),
      code: 'KVT_PROTOCOL',
      requestId: 13,
    },
    {
      name: 'a truncated lookup',
      msg: () => {
        const f = lookupFrame(14, 2);
        return f.subarray(0, f.length - 10);
      },
      code: 'KVT_PROTOCOL',
      requestId: 14,
    },
    {
      name: 'more chunks than limits.maxChunksPerLookup',
      msg: () => lookupFrame(15, limits.maxChunksPerLookup + 1),
      code: 'KVT_TOO_LARGE',
      requestId: 15,
    },
    {
      name: 'a payload over maxPayloadBytes',
      msg: () =>
        encodeRequest({
          type: 'put',
          requestId: 16,
          namespace: ns,
          hash: randomHashes(1)[0]!,
          tokens: 16,
          payload: randomPayload(limits.maxPayloadBytes + 1),
        }),
      code: 'KVT_TOO_LARGE',
      requestId: 16,
    },
    {
      // The request id is read from the last frame.
      name: 'a multi-frame message',
      msg: () => [ping(17), ping(18)],
      code: 'KVT_PROTOCOL',
      requestId: 18,
    },
  ];

  it('answers each malformed message with an error code and request id, then keeps serving', async () => {
    const s = await stack({ server: { limits } });
    const d = await rawDealer(s);
    for (const c of cases) {
      const rep = await roundTrip(d, c.msg());
      assert.equal(rep.type, 'error', `${c.name}: expected an error reply, got ${rep.type}`);
      assert.ok(rep.type === 'error');
      assert.equal(rep.code, c.code, `${c.name}: ${rep.message}`);
      assert.equal(rep.requestId, c.requestId, `${c.name}: request id`);
      assert.ok(rep.message.length > 0, `${c.name}: the error has a message`);
    }
    const pong = await roundTrip(d, ping(99));
    assert.equal(pong.type, 'pong');
    assert.equal(pong.requestId, 99);
    const within = await roundTrip(d, lookupFrame(100, limits.maxChunksPerLookup));
    assert.equal(within.type, 'lookup-result');
    assert.equal(within.requestId, 100);

    // The regular client on the same server is unaffected.
    const c = client(s, ns);
    const info = await c.ping();
    assert.equal(info.protocolVersion, 1);
    assert.deepEqual(info.limits, { ...limits, maxTokensPerChunk: 65536 });
  });

  it('serves a REQ socket (empty delimiter envelope)', async () => {
    const s = await stack();
    const req = new zmq.Request({ linger: 0 });
    req.connect(s.server.endpoint);
    cleanups.push(async () => req.close());
    await req.send(ping(7));
    const [frame] = await req.receive();
    const rep = decodeReply(frame!);
    assert.equal(rep.type, 'pong');
    assert.equal(rep.requestId, 7);
    await req.send(withHeader(ping(8), (b) => b.writeUInt8(9, 2)));
    const [errFrame] = await req.receive();
    const err = decodeReply(errFrame!);
    assert.ok(err.type === 'error');
    assert.equal(err.code, 'KVT_PROTOCOL');
    assert.equal(err.requestId, 8);
  });
});

describe('lookup server: lifecycle', () => {
  it('close() is idempotent and start() after close rejects with KVT_CLOSED', async () => {
    const s = await stack();
    const p1 = s.server.close();
    const p2 = s.server.close();
    assert.equal(p1, p2, 'one stored promise');
    await p1;
    await s.server.close();
    await assert.rejects(s.server.start(), (e) => isKvtierError(e, 'KVT_CLOSED'));
  });
});
