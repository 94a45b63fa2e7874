import assert from 'node:assert/strict';
import { once } from 'node:events';
import { connect } from 'node:net';
import { afterEach, describe, it } from 'node:test';
import { Gauge, Registry } from 'prom-client';
import { isKvtierError } from '../../src/errors.ts';
import {
  OpsHttpServer,
  type OpsServerOptions,
  type ReadyState,
} from '../../src/metrics/http-server.ts';
import { KvtierMetrics } from '../../src/metrics/metrics.ts';
import { assertValidPromText, parsePromText, seriesKey } from '../support/prom-text.ts';

describe('OpsHttpServer', () => {
  const servers: OpsHttpServer[] = [];
  afterEach(async () => {
    await Promise.all(servers.splice(0).map((s) => s.close()));
  });

  async function startServer(over: Partial<OpsServerOptions> = {}) {
    const metrics = over.metrics ?? new KvtierMetrics({ defaultMetrics: false });
    const server = new OpsHttpServer({ port: 0, metrics, ready: () => ({ ready: true }), ...over });
    servers.push(server);
    await server.start();
    return { server, metrics };
  }

  it('serves /metrics as Prometheus text with prom-client content type', async () => {
    const { server, metrics } = await startServer({ metrics: new KvtierMetrics() });
    metrics.lookups.inc({ result: 'partial' }, 3);
    metrics.bindSources({ epoch: () => 5 });
    const res = await fetch(`${server.url}/metrics`);
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('content-type'), metrics.contentType);
    const text = await res.text();
    assertValidPromText(text);
    const s = parsePromText(text);
    assert.equal(s.get(seriesKey('kvtier_lookups_total', { result: 'partial' })), 3);
    assert.equal(s.get('kvtier_epoch'), 5);
    const withQuery = await fetch(`${server.url}/metrics?name[]=x`);
    assert.equal(withQuery.status, 200);
    await withQuery.arrayBuffer();
  });

  it('answers /healthz with status ok and the health fields', async () => {
    const { server } = await startServer({ health: () => ({ tiers: 2, uptimeS: 9 }) });
    const res = await fetch(`${server.url}/healthz`);
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /^application\/json/);
    assert.deepEqual(await res.json(), { status: 'ok', tiers: 2, uptimeS: 9 });
  });

  it('answers /readyz 200 or 503 from ready(), with detail', async () => {
    let state: ReadyState = { ready: false, detail: { waiting: ['disk'] } };
    const { server } = await startServer({ ready: () => state });
    let res = await fetch(`${server.url}/readyz`);
    assert.equal(res.status, 503);
    assert.deepEqual(await res.json(), {
      status: 'not_ready',
      ready: false,
      detail: { waiting: ['disk'] },
    });
    state = { ready: true };
    res = await fetch(`${server.url}/readyz`);
    assert.equal(res.status, 200);
    assert.deepEqual(await res.json(), { status: 'ready', ready: true });
    // Ready with a lower tier down: still 200, said in the status.
    state = { ready: true, degraded: true, detail: { degraded: true } };
    res = await fetch(`${server.url}/readyz`);
    assert.equal(res.status, 200);
    assert.deepEqual(await res.json(), {
      status: 'degraded',
      ready: true,
      detail: { degraded: true },
    });
  });

  it('answers 404 for unknown paths and 405 for other methods', async () => {
    const { server } = await startServer();
    let res = await fetch(`${server.url}/nope`);
    assert.equal(res.status, 404);
    assert.equal(((await res.json()) as { status: string }).status, 'error');
    res = await fetch(`${server.url}/metrics`, { method: 'POST', body: 'x' });
    assert.equal(res.status, 405);
    assert.equal(res.headers.get('allow'), 'GET');
    assert.match(((await res.json()) as { error: string }).error, /POST/);
  });

  it('answers 500 when a callback throws and keeps serving', async () => {
    const registry = new Registry();
    const metrics = new KvtierMetrics({ registry, defaultMetrics: false });
    let failMetrics = true;
    new Gauge({
      name: 'test_flaky',
      help: 'fails while failMetrics is set',
      registers: [registry],
      collect() {
        if (failMetrics) throw new Error('collector broke');
      },
    });
    let failReady = true;
    const { server } = await startServer({
      metrics,
      ready: () => {
        if (failReady) throw new Error('ready broke');
        return { ready: true };
      },
      health: () => {
        throw new Error('health broke');
      },
    });
    for (const path of ['/readyz', '/healthz', '/metrics']) {
      const res = await fetch(`${server.url}${path}`);
      assert.equal(res.status, 500, path);
      assert.equal(((await res.json()) as { status: string }).status, 'error');
    }
    failReady = false;
    failMetrics = false;
    assert.equal((await fetch(`${server.url}/readyz`)).status, 200);
    const res = await fetch(`${server.url}/metrics`);
    assert.equal(res.status, 200);
    assertValidPromText(await res.text());
  });

  it('close() is idempotent, stops serving and rejects a later start()', async () => {
    const { server } = await startServer();
    const url = server.url;
    assert.equal((await fetch(`${url}/healthz`)).status, 200);
    const first = server.close();
    assert.equal(server.close(), first);
    await first;
    await assert.rejects(fetch(`${url}/healthz`), TypeError);
    await assert.rejects(server.start(), (err) => isKvtierError(err, 'KVT_CLOSED'));
    assert.throws(
      () => server.port,
      (err) => isKvtierError(err, 'KVT_CLOSED'),
    );
  });

  it('close() drops an idle keep-alive connection', { timeout: 10_000 }, async () => {
    const { server } = await startServer();
    const socket = connect(server.port, '127.0.0.1');
    await once(socket, 'connect');
    const closed = once(socket, 'close');
    let response = '';
    socket.setEncoding('utf8');
    const gotResponse = new Promise<void>((resolve) => {
      socket.on('data', (d: string) => {
        response += d;
        if (response.includes('"status":"ok"')) resolve();
      });
    });
    socket.write('GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n');
    await gotResponse;
    assert.match(response, /^HTTP\/1\.1 200/);
    assert.match(response, /keep-alive/i);
    await server.close();
    await closed;
    assert.equal(socket.destroyed, true);
  });

  it('close() drops a connection stuck mid-request', { timeout: 10_000 }, async () => {
    const { server } = await startServer();
    const socket = connect(server.port, '127.0.0.1');
    await once(socket, 'connect');
    // The server resets the connection; only that it ends matters here.
    socket.on('error', () => {});
    const closed = new Promise((resolve) => socket.once('close', resolve));
    // Headers never finish: without closeAllConnections the server would wait for its timeout.
    socket.write('GET /metrics HTTP/1.1\r\nHost: x\r\n');
    await server.close();
    await closed;
    assert.equal(socket.destroyed, true);
  });

  it('closes cleanly when never started', async () => {
    const server = new OpsHttpServer({
      port: 0,
      metrics: new KvtierMetrics({ defaultMetrics: false }),
      ready: () => ({ ready: true }),
    });
    assert.throws(
      () => server.port,
      (err) => isKvtierError(err, 'KVT_CLOSED'),
    );
    await server.close();
    await assert.rejects(server.start(), (err) => isKvtierError(err, 'KVT_CLOSED'));
  });

  it('rejects start() with KVT_CONFIG when the port is taken', async () => {
    const { server: first } = await startServer();
    const second = new OpsHttpServer({
      port: first.port,
      metrics: new KvtierMetrics({ defaultMetrics: false }),
      ready: () => ({ ready: true }),
    });
    servers.push(second);
    await assert.rejects(
      second.start(),
      (err) => isKvtierError(err, 'KVT_CONFIG') && /EADDRINUSE/.test(err.message),
    );
    await second.close();
  });

  it('validates options with messages naming the option', () => {
    const metrics = new KvtierMetrics({ defaultMetrics: false });
    const ready = () => ({ ready: true });
    const bad: Array<[Partial<OpsServerOptions>, RegExp]> = [
      [{ port: 70000, metrics, ready }, /options\.port must be an integer in \[0, 65535\]/],
      [{ port: 1.5, metrics, ready }, /options\.port/],
      [{ port: 0, host: '', metrics, ready }, /options\.host/],
      [{ port: 0, ready }, /options\.metrics/],
      [{ port: 0, metrics }, /options\.ready/],
      [
        { port: 0, metrics, ready, health: 'x' as unknown as () => Record<string, unknown> },
        /options\.health/,
      ],
    ];
    for (const [opts, re] of bad) {
      assert.throws(
        () => new OpsHttpServer(opts as OpsServerOptions),
        (err) => isKvtierError(err, 'KVT_INVALID_ARGUMENT') && re.test(err.message),
      );
    }
  });
});
