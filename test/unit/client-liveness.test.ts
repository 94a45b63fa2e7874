/**
 * A client that finds the sidecar down replaces its connection (nothing queued for the old one
 * reaches the sidecar later), and a SAVE or LOAD that got no reply fails only once its
 * not-after time (on the host's monotonic clock, sent in the request) has passed.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import * as zmq from 'zeromq';
import { DataPlaneClient, LOAD_GRACE_MS } from '../../src/data-plane/data-plane-client.ts';
import { decodeRequest, encodeReply } from '../../src/protocol/codec.ts';
import type { Request } from '../../src/protocol/messages.ts';
import { RequestSocket } from '../../src/protocol/request-socket.ts';
import { ManualTimers } from '../support/manual-timers.ts';

/** A ROUTER that records what it receives, from whom, and answers only when told to. */
let router: zmq.Router;
let endpoint: string;
let answer = true;
const seen: { from: string; req: Request }[] = [];

before(async () => {
  router = new zmq.Router({ linger: 0 });
  await router.bind('tcp://127.0.0.1:*');
  endpoint = router.lastEndpoint!;
  void (async () => {
    for await (const [id, msg] of router) {
      const req = decodeRequest(msg!);
      seen.push({ from: id!.toString('hex'), req });
      if (!answer) continue;
      if (req.type === 'register')
        await router.send([
          id!,
          encodeReply({
            type: 'register-result',
            requestId: req.requestId,
            engineId: 'e',
            namespace: '0'.repeat(32),
            chunkSize: 16,
            blockSize: 4,
          }),
        ]);
      else
        await router.send([id!, encodeReply({ type: 'pong', requestId: req.requestId, info: {} })]);
    }
  })().catch(() => {});
});

after(() => router.close());

async function until(cond: () => boolean): Promise<void> {
  for (let i = 0; i < 30_000 && !cond(); i++) await new Promise((r) => setTimeout(r, 1));
  assert.ok(cond(), 'condition not reached');
}

describe('RequestSocket liveness', () => {
  test('a silent server is probed, found down, every request fails and the connection is new', async () => {
    answer = true;
    const timers = new ManualTimers();
    const rs = new RequestSocket({
      endpoint,
      requestTimeoutMs: 60_000,
      livenessTimeoutMs: 100,
      timers,
    });
    try {
      await rs.request({ type: 'ping', requestId: 0 });
      const first = seen.at(-1)!.from;
      answer = false;
      const n = seen.length;
      const a = rs.request({ type: 'ping', requestId: 0 });
      const b = rs.request({ type: 'ping', requestId: 0 });
      a.catch(() => {});
      b.catch(() => {});
      await until(() => seen.length === n + 2);
      // The check the first request armed heard that request's reply, so its period ends by
      // arming another; silent for that whole period, the client sends the probe. (Two steps of
      // the manual clock, whatever the machine's load: the probe is then awaited, not timed.)
      timers.advance(100);
      timers.advance(100);
      await until(() => seen.length === n + 3);
      assert.equal(seen.at(-1)!.req.type, 'ping');
      assert.equal(rs.outages, 0);
      timers.advance(100); // the probe unanswered: down
      await assert.rejects(a, { code: 'KVT_TIMEOUT', message: /did not answer a PING/ });
      await assert.rejects(b, { code: 'KVT_TIMEOUT' });
      assert.equal(rs.outages, 1);
      assert.equal(rs.pending, 0);
      answer = true;
      await rs.request({ type: 'ping', requestId: 0 });
      assert.notEqual(seen.at(-1)!.from, first, 'the next request came on a fresh connection');
    } finally {
      await rs.close();
    }
    assert.equal(timers.armed, 0, 'no liveness timer left armed');
  });

  test('a server that answers anything within the period is never probed', async () => {
    answer = true;
    const timers = new ManualTimers();
    const rs = new RequestSocket({ endpoint, livenessTimeoutMs: 100, timers });
    try {
      for (let i = 0; i < 5; i++) {
        await rs.request({ type: 'ping', requestId: 0 });
        timers.advance(60);
      }
      assert.equal(rs.outages, 0);
    } finally {
      await rs.close();
    }
  });
});

describe('DataPlaneClient not-after times', () => {
  test('SAVE and LOAD carry their deadlines; without a reply they fail only after them', async () => {
    answer = true;
    const c = new DataPlaneClient({
      endpoint,
      requestTimeoutMs: 300,
      livenessTimeoutMs: 50,
      heartbeatIntervalMs: 0,
      unregisterTimeoutMs: 0,
    });
    try {
      await c.register({} as never);
      answer = false;
      const n = seen.length;
      const sentNs = process.hrtime.bigint();
      const save = c.save({ requestId: 'r', blockIds: [0], chunkHashes: new Uint8Array(32) });
      const load = c.load({
        requestId: 'r',
        lookupId: 'l',
        blockIds: [1],
        chunkHashes: new Uint8Array(32),
        deadlineMs: 200,
      });
      await until(() => seen.length >= n + 2);
      const sent = seen.slice(n).map((s) => s.req);
      const saveReq = sent.find((r) => r.type === 'save');
      const loadReq = sent.find((r) => r.type === 'load');
      assert.ok(saveReq?.type === 'save' && saveReq.notAfterNs !== undefined);
      assert.ok(loadReq?.type === 'load' && loadReq.notAfterNs !== undefined);
      const ms = (ns: bigint) => Number(ns - sentNs) / 1e6;
      assert.ok(ms(saveReq.notAfterNs) >= 300 && ms(saveReq.notAfterNs) < 300 + 10_000);
      assert.ok(ms(loadReq.notAfterNs) >= 200 && ms(loadReq.notAfterNs) < 200 + 10_000);
      await assert.rejects(save, { code: 'KVT_TIMEOUT' });
      assert.ok(
        process.hrtime.bigint() >= saveReq.notAfterNs,
        'the SAVE failed after its not-after time',
      );
      await assert.rejects(load, { code: 'KVT_TIMEOUT' });
      const graceNs = BigInt(LOAD_GRACE_MS) * 1_000_000n;
      assert.ok(
        process.hrtime.bigint() >= loadReq.notAfterNs + graceNs,
        'and the LOAD after its own',
      );
    } finally {
      await c.close();
    }
  });
});
