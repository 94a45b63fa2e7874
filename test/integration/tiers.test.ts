/**
 * The storage tiers end to end through a real sidecar: a warm restart on the disk tier, a corrupt
 * object met by a lookup, and a Redis tier killed and brought back mid-run.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import type { TierConfig } from '../../src/backends/registry.ts';
import { defaultConfig, type KvtierConfig } from '../../src/config/config.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { Sidecar } from '../../src/sidecar.ts';
import { silentLogger } from '../../src/util/log.ts';
import { packHex, randomHashes, randomNamespace } from '../support/fixtures.ts';
import { startRedis } from '../support/redis-server.ts';

const cleanups: (() => Promise<void>)[] = [];
after(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
});

function config(tiers: TierConfig[]): KvtierConfig {
  const cfg = defaultConfig();
  cfg.listen = 'tcp://127.0.0.1:*';
  cfg.metrics = null;
  cfg.tiers = [
    { name: 'cpu', type: 'local-cpu', options: { capacityBytes: 64 * 1024 * 1024 } },
    ...tiers,
  ];
  return cfg;
}

async function start(
  cfg: KvtierConfig,
): Promise<{ sidecar: Sidecar; client: LookupClient; ns: string }> {
  const sidecar = await Sidecar.start({ config: cfg, processMetrics: false, log: silentLogger });
  const ns = randomNamespace();
  const client = new LookupClient({
    endpoint: sidecar.server.endpoint,
    namespaces: [ns],
    lookupTimeoutMs: 10_000,
  });
  cleanups.push(async () => {
    await client.close();
    await sidecar.close();
  });
  return { sidecar, client, ns };
}

/** Waits (bounded, short awaits) until `predicate` holds; a real server coming back takes real time. */
async function until(
  predicate: () => boolean | Promise<boolean>,
  what: string,
  limitMs = 15_000,
): Promise<void> {
  const deadline = Date.now() + limitMs;
  while (!(await predicate())) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('disk tier through the sidecar', () => {
  test('a restarted sidecar answers hits from a warm disk at once, without re-storing', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-warm-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const cfg = config([
      {
        name: 'disk',
        type: 'local-disk',
        options: { path: dir, capacityBytes: 256 * 1024 * 1024 },
      },
    ]);
    const hashes = randomHashes(4);
    const payloads = hashes.map(() => randomBytes(64 * 1024));
    const first = await start(cfg);
    for (let i = 0; i < 4; i++)
      assert.equal(await first.client.put(first.ns, hashes[i]!, 256, payloads[i]!), 'stored');
    await first.sidecar.storage.writeQueue.idle();
    await first.client.close();
    await first.sidecar.close();

    const second = await start(cfg);
    const client = new LookupClient({
      endpoint: second.sidecar.server.endpoint,
      namespaces: [first.ns],
    });
    cleanups.push(() => client.close());
    const answer = await client.lookupAsync('warm-1', packHex(hashes), [256, 256, 256, 256]);
    assert.equal(answer.hitTokens, 1024);
    assert.deepEqual(
      answer.tiers,
      [{ tier: 'disk', tokens: 1024 }],
      'every ready token came from the disk tier',
    );
    const disk = second.sidecar.storage.tiers[1]!.stats() as { filesWritten?: number };
    assert.equal(disk.filesWritten, 0, 'the restarted sidecar wrote no file');
    const got = await client.get(first.ns, hashes[3]!);
    assert.deepEqual(got?.payload, payloads[3], 'bytes are the ones stored before the restart');

    // A corrupt object met by a lookup is a miss, is removed, and is counted.
    await client.cancel('warm-1');
    await second.sidecar.storage.cpu.clear();
    const files = await findFiles(dir, `${hashes[2]}.kvc`);
    assert.equal(files.length, 1);
    const bytes = await readFile(files[0]!);
    bytes[bytes.length - 100]! ^= 0xff;
    await writeFile(files[0]!, bytes);
    const after = await client.lookupAsync('warm-2', packHex(hashes), [256, 256, 256, 256]);
    assert.equal(after.hitTokens, 512, 'the prefix stops at the corrupt chunk');
    assert.deepEqual(await findFiles(dir, `${hashes[2]}.kvc`), [], 'the corrupt object is gone');
    assert.equal(second.sidecar.storage.tiers[1]!.stats().corruptObjects, 1);
    assert.match(
      await second.sidecar.metrics.text(),
      /kvtier_backend_corrupt_chunks_total\{tier="disk"\} 1/,
    );
  });
});

async function findFiles(dir: string, name: string): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(dir, { recursive: true, withFileTypes: true })) {
    if (e.isFile() && e.name === name)
      out.push(join(e.parentPath ?? (e as unknown as { path: string }).path, e.name));
  }
  return out;
}

describe('Redis tier through the sidecar', () => {
  test('killing Redis turns its hits into misses within the timeout; its return restores them', async () => {
    const redis = await startRedis({ args: ['--appendonly', 'yes', '--appendfsync', 'always'] });
    cleanups.push(() => redis.stop());
    const cfg = config([
      {
        name: 'redis',
        type: 'redis',
        options: { host: '127.0.0.1', port: redis.port, timeoutMs: 300, reconnectMaxDelayMs: 100 },
        health: { timeoutMs: 500, failureThreshold: 2, probeIntervalMs: 100 },
      },
    ]);
    const { sidecar, client, ns } = await start(cfg);
    const hashes = randomHashes(3);
    for (const h of hashes)
      assert.equal(await client.put(ns, h, 256, randomBytes(32 * 1024)), 'stored');
    await sidecar.storage.writeQueue.idle();
    await sidecar.storage.cpu.clear();
    const redisTier = sidecar.storage.tiers[1]!;

    const hit = await client.lookupAsync('r-1', packHex(hashes), [256, 256, 256]);
    assert.deepEqual(hit.tiers, [{ tier: 'redis', tokens: 768 }]);
    await client.cancel('r-1');
    await sidecar.storage.cpu.clear();

    await redis.kill();
    const t0 = Date.now();
    const miss = await client.lookupAsync('r-2', packHex(hashes), [256, 256, 256]);
    assert.equal(miss.status, 'ok');
    assert.equal(miss.hitTokens, 0, 'a dead tier is a miss, not an error');
    assert.ok(
      Date.now() - t0 < 5000,
      `answered within the tier timeout bound (took ${Date.now() - t0} ms)`,
    );
    await until(() => redisTier.health() === 'down', 'the Redis tier to report down');

    await redis.restart();
    await until(() => redisTier.health() === 'up', 'the Redis tier to come back');
    const back = await client.lookupAsync('r-3', packHex(hashes), [256, 256, 256]);
    assert.equal(back.hitTokens, 768, 'hits are served again once Redis is back');
  });
});
