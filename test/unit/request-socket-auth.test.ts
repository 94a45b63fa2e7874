/**
 * RequestSocket's recovery from KVT_UNAUTHENTICATED against a scripted ROUTER over real ZMQ (a
 * CurveZMQ server without a ZAP handler accepts every key, so the script decides which
 * connection is "refused"): with keys, exactly the refused requests are sent again, on a new
 * connection, a bounded number of times; without keys the refusal is surfaced at once. Keys on
 * one side only (a keyless client at a CurveZMQ server, or the other way round) time out with a
 * message that says so, not as a server that is down.
 */
import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import * as zmq from 'zeromq';
import { decodeRequest, encodeReply } from '../../src/protocol/codec.ts';
import {
  KEYS_REQUIRED_MESSAGE,
  KEYS_UNUSED_MESSAGE,
  MAX_AUTH_RECONNECTS,
  RequestSocket,
} from '../../src/protocol/request-socket.ts';
import type { ClientCurveKeys } from '../../src/security/curve-client.ts';
import { generateCurveKeyPair } from '../../src/security/curve-keys.ts';
import { ManualTimers } from '../support/manual-timers.ts';

type Refuse = (connection: number, requestId: number) => boolean;

/** Every request seen: which connection (numbered in order of first message) sent which id. */
interface Script {
  endpoint: string;
  seen: { connection: number; requestId: number }[];
  close(): void;
}

const routers: zmq.Router[] = [];
after(() => {
  for (const r of routers) r.close();
});

async function scriptedRouter(refuse: Refuse, curveSecretKey?: string): Promise<Script> {
  const router = new zmq.Router({
    linger: 0,
    ...(curveSecretKey !== undefined ? { curveServer: true, curveSecretKey } : {}),
  });
  routers.push(router);
  await router.bind('tcp://127.0.0.1:*');
  const ids = new Map<string, number>();
  const seen: Script['seen'] = [];
  void (async () => {
    for await (const [id, msg] of router) {
      const key = id!.toString('hex');
      if (!ids.has(key)) ids.set(key, ids.size);
      const connection = ids.get(key)!;
      const req = decodeRequest(msg!);
      seen.push({ connection, requestId: req.requestId });
      const rep = refuse(connection, req.requestId)
        ? encodeReply({
            type: 'error',
            requestId: req.requestId,
            code: 'KVT_UNAUTHENTICATED',
            message: 'no identity',
          })
        : encodeReply({ type: 'pong', requestId: req.requestId, info: { connection } });
      await router.send([id!, rep]);
    }
  })().catch(() => {});
  return { endpoint: router.lastEndpoint!, seen, close: () => router.close() };
}

function curveKeys(): { server: string; client: ClientCurveKeys } {
  const server = generateCurveKeyPair();
  const client = generateCurveKeyPair();
  return {
    server: server.secretKey,
    client: { serverPublicKey: server.publicKey, ...client },
  };
}

const ping = () => ({ type: 'ping' as const, requestId: 0 });

describe('RequestSocket and KVT_UNAUTHENTICATED', () => {
  test('with keys: only the refused requests are sent again, on a new connection', async () => {
    const k = curveKeys();
    // The first connection refuses odd request ids and serves even ones.
    const s = await scriptedRouter((conn, id) => conn === 0 && id % 2 === 1, k.server);
    const rs = new RequestSocket({ endpoint: s.endpoint, curve: k.client });
    try {
      const reps = await Promise.all([1, 2, 3, 4].map(() => rs.request(ping())));
      assert.deepEqual(
        reps.map((r) => r.type === 'pong' && r.info.connection),
        [1, 0, 1, 0],
        'refused ones served by the new connection, the others by the first',
      );
      const times = (id: number) => s.seen.filter((x) => x.requestId === id).length;
      assert.deepEqual([1, 2, 3, 4].map(times), [2, 1, 2, 1]);
      assert.equal(rs.authReconnects, 1, 'one new connection for both refusals');
      assert.equal(rs.pending, 0);
    } finally {
      await rs.close();
    }
  });

  test('with keys: surfaced after a bounded number of new connections', async () => {
    const k = curveKeys();
    const s = await scriptedRouter(() => true, k.server);
    const rs = new RequestSocket({ endpoint: s.endpoint, curve: k.client });
    try {
      await assert.rejects(rs.request(ping()), { code: 'KVT_UNAUTHENTICATED' });
      assert.equal(rs.authReconnects, MAX_AUTH_RECONNECTS);
      assert.deepEqual(
        s.seen.map((x) => x.connection),
        Array.from({ length: MAX_AUTH_RECONNECTS + 1 }, (_, i) => i),
        'sent once on each connection',
      );
    } finally {
      await rs.close();
    }
  });

  test('without keys: surfaced at once, nothing sent again', async () => {
    const s = await scriptedRouter(() => true);
    const rs = new RequestSocket({ endpoint: s.endpoint });
    try {
      await assert.rejects(rs.request(ping()), { code: 'KVT_UNAUTHENTICATED' });
      assert.equal(rs.authReconnects, 0);
      assert.equal(s.seen.length, 1);
    } finally {
      await rs.close();
    }
  });
});

describe('RequestSocket when keys are on one side only', () => {
  /** Polls (bounded, generous) until `cond` holds: the handshake fails on ZMQ's own schedule. */
  async function until(cond: () => boolean): Promise<void> {
    for (let i = 0; i < 6000 && !cond(); i++) await new Promise((r) => setTimeout(r, 10));
    assert.ok(cond(), 'condition not reached');
  }

  test('a client without keys at a CurveZMQ server: its timeout says keys are required', async () => {
    const { server } = curveKeys();
    const s = await scriptedRouter(() => false, server);
    const timers = new ManualTimers();
    const rs = new RequestSocket({ endpoint: s.endpoint, requestTimeoutMs: 1000, timers });
    try {
      const p = rs.request(ping());
      await until(() => rs.keysMismatched);
      timers.advance(1000);
      await assert.rejects(p, (err: Error & { code?: string }) => {
        assert.equal(err.code, 'KVT_TIMEOUT');
        assert.ok(err.message.startsWith(`${KEYS_REQUIRED_MESSAGE} (${s.endpoint}, `), err.message);
        return true;
      });
      assert.equal(s.seen.length, 0, 'nothing reached the server');
    } finally {
      await rs.close();
    }
  });

  test('a client with keys at a server without CurveZMQ: its timeout says so', async () => {
    const { client } = curveKeys();
    const s = await scriptedRouter(() => false);
    const timers = new ManualTimers();
    const rs = new RequestSocket({
      endpoint: s.endpoint,
      curve: client,
      requestTimeoutMs: 1000,
      timers,
    });
    try {
      const p = rs.request(ping());
      await until(() => rs.keysMismatched);
      timers.advance(1000);
      await assert.rejects(p, (err: Error & { code?: string }) => {
        assert.equal(err.code, 'KVT_TIMEOUT');
        assert.ok(err.message.startsWith(`${KEYS_UNUSED_MESSAGE} (${s.endpoint}, `), err.message);
        return true;
      });
    } finally {
      await rs.close();
    }
  });
});
