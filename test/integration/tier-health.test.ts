/**
 * What an operator sees when a lower tier fails, against a sidecar over a real redis-server:
 * the tier's own log (`kvtier.tier.redis`) says when it goes down and comes back; calls that
 * fail or time out are counted per tier in kvtier_backend_errors_total; the sidecar stays ready
 * (it answers lookups from host memory) and reports itself degraded in /healthz, /readyz and
 * the metrics; STATS counts what Redis holds after a restart, not what it held before.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { defaultConfig } from '../../src/config/config.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { Sidecar } from '../../src/sidecar.ts';
import { createLogger } from '../../src/util/log.ts';
import { pollUntil, randomHashes, randomNamespace, randomPayload } from '../support/fixtures.ts';
import { parsePromText } from '../support/prom-text.ts';
import { type RedisServer, rawCommand, startRedis } from '../support/redis-server.ts';

let redis: RedisServer;
let sidecar: Sidecar;
let client: LookupClient;
const logs: Record<string, unknown>[] = [];
const NS = randomNamespace();

function tierLines(msg: RegExp): Record<string, unknown>[] {
  return logs.filter((l) => l.component === 'kvtier.tier.redis' && msg.test(String(l.msg)));
}

/** The sum of the samples of `name` whose labels include `labels` (0 when there are none). */
async function metric(name: string, labels: Record<string, string> = {}): Promise<number> {
  const text = await (await fetch(`${sidecar.opsUrl}/metrics`)).text();
  let sum = 0;
  for (const [key, value] of parsePromText(text)) {
    if (key !== name && !key.startsWith(`${name}{`)) continue;
    if (Object.entries(labels).every(([k, v]) => key.includes(`${k}="${v}"`))) sum += value;
  }
  return sum;
}

async function ops(path: string): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(`${sidecar.opsUrl}${path}`);
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

async function redisChunks(): Promise<number> {
  const stats = (await client.stats()) as { tiers: { name: string; chunks: number }[] };
  return stats.tiers.find((t) => t.name === 'redis')!.chunks;
}

/** Keys Redis holds (the tier is its only writer here). */
async function redisKeys(): Promise<number> {
  return Number((await rawCommand(redis.port, 'DBSIZE')).replace(/^:/, ''));
}

/** Puts `n` chunks and waits until their write-through to Redis has run. */
async function putChunks(n: number): Promise<string[]> {
  const hashes = randomHashes(n);
  for (const h of hashes) assert.equal(await client.put(NS, h, 16, randomPayload(1024)), 'stored');
  await sidecar.storage.writeQueue.idle();
  return hashes;
}

before(async () => {
  redis = await startRedis();
  const cfg = defaultConfig();
  cfg.listen = 'tcp://127.0.0.1:*';
  cfg.metrics = { host: '127.0.0.1', port: 0 };
  cfg.tiers = [
    { name: 'cpu', type: 'local-cpu', options: { capacityBytes: 16 * 1024 ** 2 } },
    {
      name: 'redis',
      type: 'redis',
      options: { url: redis.url, timeoutMs: 2000, reconnectMaxDelayMs: 100 },
      // Long enough for a busy machine's writes; the hung test waits it out once.
      health: { timeoutMs: 2000, failureThreshold: 3, probeIntervalMs: 100 },
    },
  ];
  const log = createLogger('kvtier', { level: 'info', write: (l) => logs.push(JSON.parse(l)) });
  sidecar = await Sidecar.start({ config: cfg, log, processMetrics: false });
  client = new LookupClient({ endpoint: sidecar.server.endpoint, namespaces: [NS] });
});

after(async () => {
  await client?.close();
  await sidecar?.close();
  await redis?.stop();
});

describe('a Redis tier that fails', () => {
  it('a hung Redis: timeouts counted per tier in kvtier_backend_errors_total', async () => {
    const before = await metric('kvtier_backend_errors_total', {
      tier: 'redis',
      code: 'KVT_TIMEOUT',
    });
    redis.pause();
    try {
      // Not in host memory: the walk asks Redis, and the breaker gives up after 2 s.
      const answer = await client.lookupAsync('hung', Buffer.alloc(32, 7), [16], {
        timeoutMs: 30_000,
      });
      assert.equal(answer.hitTokens, 0);
      assert.ok(
        (await metric('kvtier_backend_errors_total', { tier: 'redis', code: 'KVT_TIMEOUT' })) >
          before,
        'the timeout is counted',
      );
    } finally {
      redis.resume();
    }
    await pollUntil(() => sidecar.storage.tiers[1]!.health() === 'up', 'redis up again');
  });

  it('a killed Redis: logged down and back up under kvtier.tier.redis; ready but degraded meanwhile', async () => {
    const stored = await putChunks(4);
    // STATS counts what Redis holds (a write a busy machine timed out is not there).
    assert.ok((await redisKeys()) > 0);
    assert.equal(await redisChunks(), await redisKeys());
    assert.equal(await metric('kvtier_degraded'), 0);
    assert.equal((await ops('/healthz')).body.status, 'ok');

    await redis.kill();
    await pollUntil(() => tierLines(/^tier is down/).length > 0, 'a "tier is down" line');
    const down = tierLines(/^tier is down/)[0]!;
    assert.equal(down.level, 'warn');
    assert.equal(down.tier, 'redis');

    // Still serving lookups from host memory: ready, degraded.
    const ready = await ops('/readyz');
    assert.equal(ready.status, 200, JSON.stringify(ready.body));
    assert.equal((ready.body.detail as { degraded: boolean }).degraded, true);
    const health = await ops('/healthz');
    assert.equal(health.status, 200);
    assert.equal(health.body.status, 'degraded');
    assert.deepEqual(health.body.tiers, [
      { name: 'cpu', health: 'up' },
      { name: 'redis', health: 'down' },
    ]);
    assert.equal(await metric('kvtier_ready'), 1);
    assert.equal(await metric('kvtier_degraded'), 1);
    assert.equal(await metric('kvtier_backend_health', { tier: 'redis' }), 0);
    const answer = await client.lookupAsync(
      'during-outage',
      Buffer.concat(stored.map((h) => Buffer.from(h, 'hex'))),
      [16, 16, 16, 16],
    );
    assert.equal(answer.hitTokens, 64, 'host memory still answers');

    // What the line says is what writes do: a write during the outage is dropped without
    // trying Redis (no put error), counted as a drop.
    const putErrors = await metric('kvtier_backend_errors_total', { tier: 'redis', op: 'put' });
    const drops = await metric('kvtier_writethrough_dropped_total', { tier: 'redis' });
    await putChunks(1);
    let dropped = drops;
    for (let i = 0; i < 2000 && dropped === drops; i++)
      dropped = await metric('kvtier_writethrough_dropped_total', { tier: 'redis' });
    assert.ok(dropped > drops, 'the write is dropped');
    assert.equal(
      await metric('kvtier_backend_errors_total', { tier: 'redis', op: 'put' }),
      putErrors,
      'and never tried',
    );
    assert.equal(tierLines(/^tier is down/).length, 1, 'one warn line for the outage');

    // Back (empty: nothing persisted): logged at info, healthy, and STATS counts what Redis holds.
    await redis.restart();
    await pollUntil(() => tierLines(/^tier is back up/).length > 0, 'a "tier is back up" line');
    const up = tierLines(/^tier is back up/)[0]!;
    assert.equal(up.level, 'info');
    assert.equal(tierLines(/^tier is back/).length, 1, 'one line back');
    assert.deepEqual(
      logs
        .filter(
          (l) => l.component === 'kvtier.tier.redis' && l.level !== 'debug' && l.level !== 'info',
        )
        .map((l) => l.msg),
      [tierLines(/^tier is down/)[0]!.msg],
      'no other warn or error line about the tier',
    );
    assert.equal(up.was, 'down');
    assert.equal(typeof up.forMs, 'number');
    await pollUntil(
      () => (sidecar.storage.tiers[1]!.stats() as { recounts?: number }).recounts === 2,
      'recounted after the restart',
    );
    assert.equal(await redisKeys(), 0, 'the restarted Redis holds nothing');
    assert.equal(await redisChunks(), 0, 'and STATS says so');
    assert.equal(await metric('kvtier_degraded'), 0);
    assert.equal((await ops('/healthz')).body.status, 'ok');
    await putChunks(2);
    assert.ok((await redisKeys()) > 0);
    assert.equal(await redisChunks(), await redisKeys());
  });
});
