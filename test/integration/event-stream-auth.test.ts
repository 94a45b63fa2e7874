/**
 * The event stream and CurveZMQ (docs/events.md, Security): with server keys both event sockets
 * are Curve servers on the sidecar's allow-list; without keys, an endpoint beyond loopback is
 * refused at start unless `security.allowUnauthenticated` says otherwise.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import * as zmq from 'zeromq';
import { defaultConfig, loadConfig } from '../../src/config/config.ts';
import { resolveEventsOptions } from '../../src/event-stream/events-options.ts';
import { generateCurveKeyPair, writeKeyPair } from '../../src/security/curve-keys.ts';
import { Sidecar } from '../../src/sidecar.ts';
import { silentLogger } from '../../src/util/log.ts';
import { withDeadline } from '../support/fixtures.ts';

const dir = mkdtempSync(join(tmpdir(), 'kvtier-events-auth-'));
after(() => rmSync(dir, { recursive: true, force: true }));

/** Counts the messages a SUB socket receives until closed. */
function counter(sock: zmq.Subscriber): { n: number; done: Promise<void> } {
  const c = { n: 0, done: Promise.resolve() };
  c.done = (async () => {
    try {
      for await (const _ of sock) c.n++;
    } catch {}
  })();
  return c;
}

describe('the event stream with CurveZMQ', { timeout: 300_000 }, () => {
  it('serves allow-listed keys only', async () => {
    const server = generateCurveKeyPair();
    const client = generateCurveKeyPair();
    const stranger = generateCurveKeyPair();
    await writeKeyPair(dir, 'server', server);
    const configPath = join(dir, 'kvtier.json');
    writeFileSync(
      configPath,
      JSON.stringify({
        listen: 'tcp://127.0.0.1:*',
        metrics: null,
        logLevel: 'silent',
        tiers: [{ name: 'cpu', type: 'local-cpu', capacityBytes: '16MiB' }],
        security: {
          serverSecretKeyFile: 'server.key',
          clients: [{ name: 'router', publicKey: client.publicKey, role: 'lookup' }],
        },
        events: { endpoint: 'tcp://127.0.0.1:*', heartbeatMs: 20 },
      }),
    );
    const config = await loadConfig({ configPath }, {});
    const sidecar = await Sidecar.start({ config, log: silentLogger, processMetrics: false });
    const ep = sidecar.events!.endpoint;
    const sub = (keys?: { publicKey: string; secretKey: string }) => {
      const s = new zmq.Subscriber({
        linger: 0,
        ...(keys !== undefined
          ? {
              curveServerKey: server.publicKey,
              curvePublicKey: keys.publicKey,
              curveSecretKey: keys.secretKey,
            }
          : {}),
      });
      s.connect(ep);
      s.subscribe();
      return s;
    };
    const allowed = sub(client);
    const keyless = sub();
    const unknown = sub(stranger);
    const [a, k, u] = [counter(allowed), counter(keyless), counter(unknown)];
    try {
      await withDeadline(
        (async () => {
          while (a.n < 10) await new Promise((r) => setTimeout(r, 20));
        })(),
        60_000,
        'heartbeats to the allowed key',
      );
      assert.equal(k.n, 0, 'a subscriber without a key hears nothing');
      assert.equal(u.n, 0, 'nor one whose key is not on the allow-list');
      const replay = new zmq.Dealer({
        linger: 0,
        receiveTimeout: 60_000,
        curveServerKey: server.publicKey,
        curvePublicKey: client.publicKey,
        curveSecretKey: client.secretKey,
      });
      replay.connect(sidecar.events!.replayEndpoint!);
      await replay.send([Buffer.from('snapshot')]);
      const [seq] = await replay.receive();
      assert.equal(seq!.toString('hex'), 'ff'.repeat(8), 'the replay socket answers the key');
      replay.close();
    } finally {
      for (const s of [allowed, keyless, unknown]) s.close();
      await Promise.all([a.done, k.done, u.done]);
      await sidecar.close();
    }
  });

  it('refuses an endpoint beyond loopback without keys, unless allowed', async () => {
    const base = {
      ...defaultConfig(),
      listen: 'tcp://127.0.0.1:*',
      metrics: null,
      tiers: [{ name: 'cpu', type: 'local-cpu', options: { capacityBytes: 16 * 1024 * 1024 } }],
      logLevel: 'silent' as const,
      events: resolveEventsOptions({ endpoint: 'tcp://0.0.0.0:*' }),
    };
    await assert.rejects(
      Sidecar.start({ config: base, log: silentLogger, processMetrics: false }),
      {
        code: 'KVT_CONFIG',
        message: /refusing to publish events on tcp:\/\/0\.0\.0\.0:\*/,
      },
    );
    const allowed = await Sidecar.start({
      config: { ...base, security: { ...base.security, allowUnauthenticated: true } },
      log: silentLogger,
      processMetrics: false,
    });
    assert.match(allowed.events!.endpoint, /^tcp:\/\/0\.0\.0\.0:\d+$/);
    await allowed.close();
  });
});
