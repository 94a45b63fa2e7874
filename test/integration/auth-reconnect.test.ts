/**
 * Clients with Curve keys recover from a connection the server refuses as unauthenticated (its
 * ZAP reply lost the race for the connection's routing id, docs/security.md): they open a fresh
 * connection and send the refused requests again, a bounded number of times. Real ZMQ, a real
 * lookup server with CurveZMQ; the lost race is forced with the server's test fault
 * (`failFirstHandshakes`: the first handshakes of each key mint no routing id) and invited with
 * `zapReplyDelayMs: 0`.
 */
import assert from 'node:assert/strict';
import { afterEach, describe, it } from 'node:test';
import { isKvtierError } from '../../src/errors.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { ServerAuth } from '../../src/lookup-server/auth.ts';
import { MAX_AUTH_RECONNECTS } from '../../src/protocol/request-socket.ts';
import type { ClientCurveKeys } from '../../src/security/curve-client.ts';
import { type CurveKeyPair, generateCurveKeyPair } from '../../src/security/curve-keys.ts';
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

interface Secured {
  stack: TestStack;
  curve: (i: number) => ClientCurveKeys;
}

/** A lookup server whose allow-list holds `n` admin keys. */
async function secured(
  n: number,
  fault: { failFirstHandshakes?: number; zapReplyDelayMs?: number },
): Promise<Secured> {
  const server = generateCurveKeyPair();
  const clients: CurveKeyPair[] = Array.from({ length: n }, () => generateCurveKeyPair());
  const auth = new ServerAuth({
    secretKey: server.secretKey,
    clients: clients.map((k, i) => ({ name: `c${i}`, publicKey: k.publicKey, role: 'admin' })),
    ...fault,
  });
  const stack = await createTestStack({ gated: { open: true }, server: { auth } });
  cleanups.push(() => stack.close());
  return {
    stack,
    curve: (i) => ({
      serverPublicKey: server.publicKey,
      publicKey: clients[i]!.publicKey,
      secretKey: clients[i]!.secretKey,
    }),
  };
}

function client(s: Secured, i: number, ns: string): LookupClient {
  const c = new LookupClient({
    endpoint: s.stack.server.endpoint,
    namespaces: [ns],
    curve: s.curve(i),
    requestTimeoutMs: 30_000,
    lookupTimeoutMs: 30_000,
  });
  cleanups.push(() => c.close());
  return c;
}

describe('Curve clients refused as unauthenticated', () => {
  it('reconnect and resend the refused requests: all served, each once', async () => {
    const s = await secured(1, { failFirstHandshakes: 2 });
    const ns = randomNamespace();
    const c = client(s, 0, ns);
    const hashes = randomHashes(4);
    const payloads = hashes.map(() => randomPayload(4096));
    // Several requests in flight on the first (refused) connection at once.
    const puts = await Promise.all(hashes.map((h, i) => c.put(ns, h, 16, payloads[i]!)));
    assert.deepEqual(puts, ['stored', 'stored', 'stored', 'stored']);
    // Two faulted handshakes: two fresh connections, the third one named by the server.
    assert.equal(c.authReconnects, 2);
    for (const [i, h] of hashes.entries()) {
      const got = await c.get(ns, h);
      assert.ok(got?.payload.equals(payloads[i]!), `chunk ${i} round-trips`);
    }
    const answer = await c.lookupAsync('lk', packHex(hashes), [16, 16, 16, 16]);
    assert.equal(answer.hitTokens, 64);
    assert.equal(c.authReconnects, 2, 'no reconnect once served');
  });

  it('give up after a bounded number of fresh connections, then start over on the next request', async () => {
    const faulted = MAX_AUTH_RECONNECTS + 2;
    const s = await secured(1, { failFirstHandshakes: faulted });
    const c = client(s, 0, randomNamespace());
    await assert.rejects(c.ping(), (e: unknown) => isKvtierError(e, 'KVT_UNAUTHENTICATED'));
    assert.equal(c.authReconnects, MAX_AUTH_RECONNECTS);
    // Connections 1..MAX+1 were refused; the next request opens the last faulted one and then a
    // good one.
    const info = await c.ping();
    assert.equal(info.protocolVersion, 1);
    assert.equal(c.authReconnects, faulted);
  });

  it('50 clients connecting at once under a busy event loop: every request served correctly', async () => {
    const n = 50;
    const s = await secured(n, { failFirstHandshakes: 1, zapReplyDelayMs: 0 });
    const ns = randomNamespace();
    // Keeps the event loop busy (the ZAP handler and the clients share it) while they connect.
    let busy = true;
    const hog = (async () => {
      while (busy) {
        const until = Date.now() + 15;
        while (Date.now() < until) {}
        await new Promise((r) => setImmediate(r));
      }
    })();
    const clients = Array.from({ length: n }, (_, i) => client(s, i, ns));
    try {
      await Promise.all(
        clients.map(async (c, i) => {
          const hashes = randomHashes(3);
          const payloads = hashes.map(() => randomPayload(1024 + i));
          const stored = await Promise.all(hashes.map((h, j) => c.put(ns, h, 16, payloads[j]!)));
          assert.deepEqual(stored, ['stored', 'stored', 'stored'], `client ${i} stores`);
          const got = await Promise.all(hashes.map((h) => c.get(ns, h)));
          for (const [j, g] of got.entries())
            assert.ok(g?.payload.equals(payloads[j]!), `client ${i} chunk ${j}`);
          const info = await c.ping();
          assert.equal(info.protocolVersion, 1);
        }),
      );
    } finally {
      busy = false;
      await hog;
    }
    // Every key's first handshake minted nothing, so every client reconnected at least once.
    for (const [i, c] of clients.entries())
      assert.ok(c.authReconnects >= 1, `client ${i} reconnected (${c.authReconnects})`);
  });
});
