import assert from 'node:assert/strict';
import { getEventListeners } from 'node:events';
import { after, before, describe, test } from 'node:test';
import * as zmq from 'zeromq';
import { decodeRequest, encodeReply } from '../../src/protocol/codec.ts';
import { RequestSocket } from '../../src/protocol/request-socket.ts';
import { ManualTimers } from '../support/manual-timers.ts';

/** A ROUTER on an ephemeral port that answers PINGs unless told to stay silent. */
let router: zmq.Router;
let endpoint: string;
let silent = false;
let received = 0;

before(async () => {
  router = new zmq.Router({ linger: 0 });
  await router.bind('tcp://127.0.0.1:*');
  endpoint = router.lastEndpoint!;
  void (async () => {
    for await (const [id, msg] of router) {
      received++;
      if (silent) continue;
      const req = decodeRequest(msg!);
      await router.send([id!, encodeReply({ type: 'pong', requestId: req.requestId, info: {} })]);
    }
  })().catch(() => {});
});

after(() => router.close());

const listeners = (s: AbortSignal) => getEventListeners(s, 'abort').length;

/** Waits (bounded, without timers of the socket) until `cond` holds. */
async function until(cond: () => boolean): Promise<void> {
  for (let i = 0; i < 2000 && !cond(); i++) await new Promise((r) => setImmediate(r));
  assert.ok(cond(), 'condition not reached');
}

describe('RequestSocket deadlines', () => {
  test('a reply resolves the request and leaves nothing pending or listening', async () => {
    silent = false;
    const rs = new RequestSocket({ endpoint, timers: new ManualTimers() });
    const ac = new AbortController();
    for (let i = 0; i < 50; i++) {
      const rep = await rs.request({ type: 'ping', requestId: 0 }, { signal: ac.signal });
      assert.equal(rep.type, 'pong');
    }
    assert.equal(rs.pending, 0);
    assert.equal(listeners(ac.signal), 0);
    await rs.close();
  });

  test('no reply: KVT_TIMEOUT when the injected clock passes the deadline, then nothing pending', async () => {
    silent = true;
    const timers = new ManualTimers();
    const rs = new RequestSocket({ endpoint, requestTimeoutMs: 1000, timers });
    const before = received;
    const p = rs.request({ type: 'ping', requestId: 0 });
    await until(() => received > before);
    assert.equal(rs.pending, 1);
    timers.advance(999);
    await new Promise((r) => setImmediate(r));
    assert.equal(rs.pending, 1, 'not before the deadline');
    timers.advance(1);
    await assert.rejects(p, { code: 'KVT_TIMEOUT' });
    assert.equal(rs.pending, 0);
    assert.equal(timers.armed, 0);
    // A per-call timeoutMs overrides the socket's.
    const q = rs.request({ type: 'ping', requestId: 0 }, { timeoutMs: 5 });
    timers.advance(5);
    await assert.rejects(q, { code: 'KVT_TIMEOUT' });
    await rs.close();
  });

  test("a caller's abort is KVT_ABORTED; an already-aborted signal sends nothing", async () => {
    silent = true;
    const timers = new ManualTimers();
    const rs = new RequestSocket({ endpoint, timers });
    const ac = new AbortController();
    const p = rs.request({ type: 'ping', requestId: 0 }, { signal: ac.signal });
    ac.abort();
    await assert.rejects(p, { code: 'KVT_ABORTED' });
    assert.equal(rs.pending, 0);
    assert.equal(listeners(ac.signal), 0);
    assert.equal(timers.armed, 0, 'the timer was cleared');
    const req = { type: 'ping' as const, requestId: 0 };
    await assert.rejects(rs.request(req, { signal: ac.signal }), { code: 'KVT_ABORTED' });
    assert.equal(req.requestId, 0, 'no request id was taken');
    await rs.close();
  });

  test('close rejects pending requests with KVT_CLOSED and later ones at once', async () => {
    silent = true;
    const timers = new ManualTimers();
    const rs = new RequestSocket({ endpoint, timers });
    const p = rs.request({ type: 'ping', requestId: 0 });
    await rs.close();
    await assert.rejects(p, { code: 'KVT_CLOSED' });
    await assert.rejects(rs.request({ type: 'ping', requestId: 0 }), { code: 'KVT_CLOSED' });
    assert.equal(timers.armed, 0);
  });
});
