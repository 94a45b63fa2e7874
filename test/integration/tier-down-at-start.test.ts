/**
 * A tier below host memory that cannot be reached when the sidecar starts: a real redis-server
 * that is not running yet, an S3 endpoint (s3rver) that refuses, a plug-in whose start throws.
 * The sidecar starts anyway and serves from host memory; one warn line names the tier and why;
 * /readyz is 200 "degraded", /healthz and the metrics say the tier is down; when the service
 * comes up the tier joins without a restart (one info line) and takes writes from then on. Also
 * `kvtier serve` itself, as a child process.
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { GetObjectCommand } from '@aws-sdk/client-s3';
import { Redis } from 'ioredis';
import type { ChunkHash } from '../../src/backends/core/types.ts';
import { CHUNK_HEADER_BYTES } from '../../src/backends/format/chunk-format.ts';
import type { TierConfig } from '../../src/backends/registry.ts';
import { defaultConfig, type KvtierConfig } from '../../src/config/config.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { Sidecar } from '../../src/sidecar.ts';
import { createLogger } from '../../src/util/log.ts';
import {
  packHex,
  pollUntil,
  randomHashes,
  randomNamespace,
  randomPayload,
} from '../support/fixtures.ts';
import { parsePromText } from '../support/prom-text.ts';
import { type RedisServer, startRedis } from '../support/redis-server.ts';
import { type S3Harness, S3RVER_CREDENTIALS, startS3 } from '../support/s3-server.ts';
import { startSidecarProcess } from '../support/sidecar-process.ts';

const memoryUrl = new URL('../../src/backends/memory/memory-backend.ts', import.meta.url).href;
const NS = randomNamespace();
/** Retries of a tier that is down come this often; its calls get generous bounds. */
const HEALTH = { timeoutMs: 30_000, failureThreshold: 3, probeIntervalMs: 100 };

let dir = '';
before(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kvtier-down-at-start-'));
});
after(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** The sum of the samples of `name` whose labels include `labels` (0 when there are none). */
async function metric(base: string, name: string, labels: Record<string, string> = {}) {
  const text = await (await fetch(`${base}/metrics`)).text();
  let sum = 0;
  for (const [key, value] of parsePromText(text)) {
    if (key !== name && !key.startsWith(`${name}{`)) continue;
    if (Object.entries(labels).every(([k, v]) => key.includes(`${k}="${v}"`))) sum += value;
  }
  return sum;
}

async function ops(base: string, path: string) {
  const res = await fetch(`${base}${path}`);
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

/** A sidecar over host memory and `tier`, its log lines kept. */
async function startSidecar(tier: TierConfig) {
  const lines: Record<string, unknown>[] = [];
  const cfg: KvtierConfig = defaultConfig();
  cfg.listen = 'tcp://127.0.0.1:*';
  cfg.metrics = { host: '127.0.0.1', port: 0 };
  cfg.storage.epochFile = null;
  cfg.tiers = [
    { name: 'cpu', type: 'local-cpu', options: { capacityBytes: 16 * 1024 ** 2 } },
    tier,
  ];
  const log = createLogger('kvtier', {
    level: 'info',
    write: (l) => lines.push(JSON.parse(l) as Record<string, unknown>),
  });
  const sidecar = await Sidecar.start({ config: cfg, log, processMetrics: false });
  const client = new LookupClient({ endpoint: sidecar.server.endpoint, namespaces: [NS] });
  const tierLines = (level: string) =>
    lines.filter((l) => l.component === `kvtier.tier.${tier.name}` && l.level === level);
  return {
    sidecar,
    client,
    base: sidecar.opsUrl!,
    tierLines,
    async close() {
      await client.close();
      await sidecar.close();
    },
  };
}

type Running = Awaited<ReturnType<typeof startSidecar>>;

/** Puts chunks through the sidecar and waits until their write-through has run. */
async function put(s: Running, n: number): Promise<{ hashes: ChunkHash[]; payloads: Buffer[] }> {
  const hashes = randomHashes(n);
  const payloads = hashes.map(() => randomPayload(4096));
  for (const [i, h] of hashes.entries())
    assert.equal(await s.client.put(NS, h, 16, payloads[i]!), 'stored');
  await s.sidecar.storage.writeQueue.idle();
  return { hashes, payloads };
}

/**
 * What every tier down at start shows: serving, ready but degraded everywhere, one warn line
 * naming the tier and why, host memory answering.
 */
async function assertDownAtStart(s: Running, name: string, why: RegExp): Promise<void> {
  const [warn, ...more] = s.tierLines('warn');
  assert.deepEqual(more, [], 'one warn line');
  assert.equal(warn?.msg, 'tier is down at start: serving without it until it answers');
  assert.equal(warn?.tier, name);
  assert.match((warn?.err as { message: string }).message, why);

  const ready = await ops(s.base, '/readyz');
  assert.equal(ready.status, 200, JSON.stringify(ready.body));
  assert.equal(ready.body.status, 'degraded');
  const health = await ops(s.base, '/healthz');
  assert.equal(health.body.status, 'degraded');
  assert.deepEqual(health.body.tiers, [
    { name: 'cpu', health: 'up' },
    { name, health: 'down' },
  ]);
  assert.equal(await metric(s.base, 'kvtier_ready'), 1);
  assert.equal(await metric(s.base, 'kvtier_degraded'), 1);
  assert.equal(await metric(s.base, 'kvtier_backend_health', { tier: name }), 0);

  // Host memory serves meanwhile; the tier's writes are dropped, not waited for.
  const { hashes } = await put(s, 2);
  const answer = await s.client.lookupAsync('while-down', packHex(hashes), [16, 16]);
  assert.equal(answer.hitTokens, 32);
  // It keeps trying: each failed try counts as a failed call of the tier.
  await pollMetric(s.base, 'kvtier_backend_errors_total', { tier: name, op: 'contains' });
  assert.equal(s.sidecar.storage.tiers[1]!.health(), 'down');
}

/** Reads `name` until it is above 0; a bound on a broken test, not a delay waited out. */
async function pollMetric(base: string, name: string, labels: Record<string, string>) {
  for (let i = 0; i < 3000; i++) {
    if ((await metric(base, name, labels)) > 0) return;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  assert.fail(`${name} ${JSON.stringify(labels)} stayed 0`);
}

/** The tier has joined: one info line, healthy everywhere, no other warn line. */
async function assertJoined(s: Running, name: string): Promise<void> {
  const joined = () =>
    s.tierLines('info').filter((l) => String(l.msg).startsWith('tier joined')).length;
  await pollUntil(() => joined() > 0, `a "tier joined" line for ${name}`);
  assert.equal(joined(), 1);
  assert.equal(s.tierLines('warn').length, 1, 'no warn line since the one at start');
  assert.equal((await ops(s.base, '/readyz')).body.status, 'ready');
  assert.equal((await ops(s.base, '/healthz')).body.status, 'ok');
  assert.equal(await metric(s.base, 'kvtier_degraded'), 0);
  assert.equal(await metric(s.base, 'kvtier_backend_health', { tier: name }), 1);
}

describe('a tier that cannot be reached when the sidecar starts', () => {
  it('Redis not running yet: serves from host memory, then Redis joins and takes writes', async () => {
    const redis: RedisServer = await startRedis();
    await redis.kill();
    const raw = new Redis({ port: redis.port, lazyConnect: true, maxRetriesPerRequest: 0 });
    let s: Running | undefined;
    try {
      s = await startSidecar({
        name: 'redis',
        type: 'redis',
        // A refused connection fails the start at once: nothing waits for connectTimeoutMs.
        options: { port: redis.port, connectTimeoutMs: 60_000, timeoutMs: 30_000 },
        health: HEALTH,
      });
      await assertDownAtStart(
        s,
        'redis',
        new RegExp(`redis at 127\\.0\\.0\\.1:${redis.port} is unreachable .*ECONNREFUSED`),
      );
      await redis.restart();
      await assertJoined(s, 'redis');
      const { hashes, payloads } = await put(s, 3);
      await raw.connect();
      for (const [i, h] of hashes.entries()) {
        const value = await raw.getBuffer(`kvtier:${NS}:${h}`);
        assert.ok(value !== null, `chunk ${i} is in Redis`);
        assert.deepEqual(value.subarray(CHUNK_HEADER_BYTES), payloads[i]);
      }
    } finally {
      raw.disconnect();
      await s?.close();
      await redis.stop();
    }
  });

  it('an S3 endpoint that refuses: serves from host memory, then S3 joins and takes writes', async () => {
    const s3: S3Harness = await startS3();
    await s3.stop();
    let s: Running | undefined;
    try {
      s = await startSidecar({
        name: 's3',
        type: 's3',
        options: {
          bucket: s3.bucket,
          endpoint: s3.endpoint,
          ...S3RVER_CREDENTIALS,
          timeoutMs: 30_000,
          maxAttempts: 1,
        },
        health: HEALTH,
      });
      await assertDownAtStart(s, 's3', /ECONNREFUSED/);
      await s3.restart();
      await assertJoined(s, 's3');
      const { hashes, payloads } = await put(s, 2);
      const raw = s3.client();
      for (const [i, h] of hashes.entries()) {
        const got = await raw.send(
          new GetObjectCommand({ Bucket: s3.bucket, Key: `kvtier/${NS}/${h}` }),
        );
        const obj = Buffer.from(await got.Body!.transformToByteArray());
        assert.deepEqual(obj.subarray(CHUNK_HEADER_BYTES), payloads[i]);
      }
    } finally {
      await s?.close();
      await s3.close();
    }
  });

  it('a plug-in whose start throws: serves from host memory, then the plug-in joins', async () => {
    const plugin = join(dir, 'store-plugin.ts');
    const store = join(dir, 'store-is-there');
    await writeFile(
      plugin,
      `import { existsSync } from 'node:fs';
import { MemoryBackend } from ${JSON.stringify(memoryUrl)};
export async function createBackend(options: { store: string }, ctx: { name: string }) {
  if (!existsSync(options.store)) throw new Error('store ' + options.store + ' is not reachable');
  return new MemoryBackend({}, ctx);
}
`,
    );
    let s: Running | undefined;
    try {
      s = await startSidecar({
        name: 'plug',
        type: 'module',
        options: { module: plugin, options: { store } },
        health: HEALTH,
      });
      await assertDownAtStart(
        s,
        'plug',
        /plug-in module ".*store-plugin\.ts": store .* is not reachable/,
      );
      await writeFile(store, '');
      await assertJoined(s, 'plug');
      const tier = s.sidecar.storage.tiers[1]!;
      assert.equal(tier.kind, 'memory', 'the plug-in backend is the tier now');
      const { hashes } = await put(s, 2);
      assert.equal(await tier.batchedContains(NS, hashes), 2, 'writes go to it');
    } finally {
      await s?.close();
    }
  });

  it('kvtier serve: listens with Redis down, /readyz 200 degraded, and Redis joins', async () => {
    const redis = await startRedis();
    await redis.kill();
    const child = await startSidecarProcess(join(dir, 'serve.json'), {
      listen: 'tcp://127.0.0.1:*',
      metrics: { host: '127.0.0.1', port: 0 },
      storage: { epochFile: join(dir, 'epoch') },
      tiers: [
        { name: 'cpu', type: 'local-cpu', capacityBytes: '64MiB' },
        { name: 'redis', type: 'redis', port: redis.port, health: HEALTH },
      ],
    });
    try {
      const base = /metrics at (http:\/\/\S+)\/metrics/.exec(child.output)?.[1];
      assert.ok(base !== undefined, child.output);
      const downLines = () =>
        child.output.split('\n').filter((l) => l.includes('"tier is down at start'));
      assert.equal(downLines().length, 1, child.output);
      assert.match(downLines()[0]!, /"component":"kvtier\.tier\.redis".*ECONNREFUSED/);
      const ready = await ops(base, '/readyz');
      assert.equal(ready.status, 200);
      assert.equal(ready.body.status, 'degraded');
      assert.equal(await metric(base, 'kvtier_degraded'), 1);
      assert.equal(await metric(base, 'kvtier_backend_health', { tier: 'redis' }), 0);
      await redis.restart();
      await pollUntil(
        () => child.output.includes('"tier joined'),
        () => child.output,
      );
      assert.equal((await ops(base, '/readyz')).body.status, 'ready');
      await child.kill('SIGTERM');
      assert.deepEqual(await child.exited, { code: 0, signal: null });
    } finally {
      await child.kill();
      await redis.stop();
    }
  });
});
