import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import {
  createRedisBackend,
  RedisBackend,
  type RedisBackendOptions,
  redisOptionsFromConfig,
  resolveRedisBackendOptions,
} from '../../src/backends/redis/redis-backend.ts';
import { isKvtierError } from '../../src/errors.ts';
import type { ChunkHash } from '../../src/hashing/chunk-hash.ts';
import {
  freeTcpPort,
  pollUntil,
  randomHash,
  randomHashes,
  randomNamespace,
  randomPayload,
  withDeadline,
} from '../support/fixtures.ts';
import {
  type RedisServer,
  rawCommand,
  startRedis,
  startRedisCluster,
} from '../support/redis-server.ts';

const silent = { debug() {}, info() {}, warn() {}, error() {}, child: () => silent };
/** Fails a call that hangs rather than one that is late: a busy machine runs timers late. */
const HANG_MS = 15_000;

function backend(port: number, extra: RedisBackendOptions = {}): RedisBackend {
  return new RedisBackend(
    { port, timeoutMs: 300, reconnectMaxDelayMs: 50, log: silent, ...extra },
    { name: 'redis-test' },
  );
}

function codeOf(err: unknown): string {
  return isKvtierError(err) ? err.code : `not a KvtierError: ${String(err)}`;
}

describe('redis options', () => {
  test('defaults', () => {
    const o = resolveRedisBackendOptions({});
    assert.equal(o.host, '127.0.0.1');
    assert.equal(o.port, 6379);
    assert.equal(o.keyPrefix, 'kvtier:');
    assert.equal(o.timeoutMs, 1000);
    assert.equal(o.ttlMs, null);
    assert.equal(o.cluster, null);
  });

  test('rejects conflicting or bad options with the option named', () => {
    const bad: [RedisBackendOptions, RegExp][] = [
      [{ port: 0 }, /port must be an integer in \[1, 65535\]/],
      [{ url: 'http://x' }, /url must start with redis:\/\//],
      [{ url: 'redis://x', port: 1 }, /either url or host\/port/],
      [{ cluster: { nodes: [] } }, /cluster\.nodes must be a non-empty array/],
      [{ cluster: { nodes: [{ host: 'a', port: 1 }] }, db: 2 }, /db must be 0 in cluster mode/],
      [{ timeoutMs: 0 }, /timeoutMs must be an integer/],
      [{ tls: 'yes' as unknown as boolean }, /tls must be a boolean or an object/],
    ];
    for (const [opts, re] of bad) {
      assert.throws(() => resolveRedisBackendOptions(opts), re, JSON.stringify(opts));
    }
  });

  test('config: unknown and bad keys throw KVT_CONFIG naming the tier and key', () => {
    assert.throws(
      () => redisOptionsFromConfig({ hots: 'x' }, 'remote'),
      (err: unknown) =>
        codeOf(err) === 'KVT_CONFIG' && /tier "remote".*unknown redis option "hots"/.test(`${err}`),
    );
    assert.throws(
      () => redisOptionsFromConfig({ ttlMs: -1 }, 'remote'),
      (err: unknown) => codeOf(err) === 'KVT_CONFIG' && /tier "remote": ttlMs/.test(`${err}`),
    );
    assert.deepEqual(redisOptionsFromConfig({ url: 'redis://h:1/2', ttlMs: 5 }), {
      url: 'redis://h:1/2',
      ttlMs: 5,
    });
  });

  test('the factory fails at the first failed connection attempt when nothing listens', async () => {
    const port = await freeTcpPort();
    // A refused connection fails the start at once, long before connectTimeoutMs.
    await assert.rejects(
      createRedisBackend({ port, connectTimeoutMs: 60_000, timeoutMs: 100 }, { name: 'r' }),
      (err: unknown) =>
        codeOf(err) === 'KVT_BACKEND' &&
        new RegExp(`redis at 127\\.0\\.0\\.1:${port} is unreachable .*ECONNREFUSED`).test(`${err}`),
    );
  });
});

describe('redis backend against redis-server', () => {
  let server: RedisServer;
  let raw: Redis;
  before(async () => {
    server = await startRedis();
    raw = new Redis({ port: server.port, lazyConnect: true });
    await raw.connect();
  });
  after(async () => {
    raw.disconnect();
    await server.stop();
  });

  test('binary values survive byte-exact (getBuffer, never get)', async () => {
    const b = backend(server.port);
    await b.start();
    const ns = randomNamespace();
    const h = randomHash();
    // Invalid UTF-8 everywhere: lone continuation bytes, overlong forms, 0xff.
    const data = Buffer.concat([
      Buffer.from([0x80, 0xc0, 0xaf, 0xff, 0xfe, 0xed, 0xa0, 0x80]),
      randomPayload(4096),
    ]);
    assert.equal(await b.put(ns, h, { tokens: 7, data }), 'stored');
    const got = (await b.batchedGet(ns, [h])).get(h);
    assert.equal(got?.tokens, 7);
    assert.equal(Buffer.compare(Buffer.from(got!.data), data), 0);
    assert.equal(b.stats().corruptObjects, 0);
    await b.close();
  });

  test('one key per chunk under the prefix; clear(ns) leaves other namespaces and keys', async () => {
    const b = backend(server.port, { keyPrefix: 'unit-clear:' });
    await b.start();
    const [ns1, ns2] = [randomNamespace(), randomNamespace()];
    const [h1, h2] = randomHashes(2) as [ChunkHash, ChunkHash];
    await b.put(ns1, h1, { tokens: 1, data: randomPayload(10) });
    await b.put(ns2, h2, { tokens: 1, data: randomPayload(10) });
    await raw.set('unit-clear-other', 'x');
    assert.equal(await raw.exists(`unit-clear:${ns1}:${h1}`), 1);
    await b.clear(ns1);
    assert.equal(await b.batchedContains(ns1, [h1]), 0);
    assert.equal(await b.batchedContains(ns2, [h2]), 1);
    await b.clear();
    assert.equal(await b.batchedContains(ns2, [h2]), 0);
    assert.equal(await raw.exists('unit-clear-other'), 1);
    await b.close();
  });

  test('a corrupt value is a miss, deleted, counted and reported', async () => {
    const reasons: string[] = [];
    const b = backend(server.port, {
      keyPrefix: 'unit-corrupt:',
      onCorrupt: (r) => reasons.push(r),
    });
    await b.start();
    const ns = randomNamespace();
    const h = randomHash();
    await b.put(ns, h, { tokens: 1, data: randomPayload(100) });
    const key = `unit-corrupt:${ns}:${h}`;
    const obj = (await raw.getBuffer(key))!;
    obj[obj.length - 1]! ^= 0xff;
    await raw.set(key, obj);
    assert.equal((await b.batchedGet(ns, [h])).get(h), null);
    assert.equal(await raw.exists(key), 0);
    assert.equal(b.stats().corruptObjects, 1);
    assert.deepEqual(reasons, ['checksum']);
    await b.close();
  });

  test('ttlMs expires chunks in Redis', async () => {
    // The TTL the SET carries, read with a TTL long enough that no pause of this process can
    // let it run out before PTTL is asked.
    const long = backend(server.port, { ttlMs: 600_000 });
    await long.start();
    const ns = randomNamespace();
    const kept = randomHash();
    assert.equal(await long.put(ns, kept, { tokens: 1, data: randomPayload(16) }), 'stored');
    const pttl = await raw.pttl(`kvtier:${ns}:${kept}`);
    assert.ok(pttl > 0 && pttl <= 600_000, `PTTL ${pttl} should be in (0, 600000]`);
    await long.close();

    const b = backend(server.port, { ttlMs: 150 });
    await b.start();
    const h = randomHash();
    assert.equal(await b.put(ns, h, { tokens: 1, data: randomPayload(16) }), 'stored');
    // Redis expiry runs on its own clock: poll a bounded number of times.
    let present = 1;
    for (let i = 0; i < 100 && present === 1; i++) {
      await sleep(20);
      present = await b.batchedContains(ns, [h]);
    }
    assert.equal(present, 0);
    assert.equal((await b.batchedGet(ns, [h])).get(h), null);
    await b.close();
  });

  test('pins are not supported: pin returns 0, capabilities say so', async () => {
    const b = backend(server.port);
    await b.start();
    assert.equal(b.capabilities.pinning, false);
    assert.equal(b.capabilities.persistent, true);
    assert.equal(b.capabilities.shared, true);
    assert.equal(b.capabilities.evicts, true);
    const ns = randomNamespace();
    const h = randomHash();
    await b.put(ns, h, { tokens: 1, data: randomPayload(8) }, { pin: true });
    assert.equal(await b.batchedContains(ns, [h], { pin: true }), 1);
    assert.equal(b.pin(ns, [h]), 0);
    assert.equal(b.stats().pinnedChunks, 0);
    await b.close();
  });
});

test('maxmemory eviction by Redis turns into misses', async () => {
  const server = await startRedis({
    args: ['--maxmemory', '4mb', '--maxmemory-policy', 'allkeys-lru'],
  });
  const b = backend(server.port);
  try {
    await b.start();
    const ns = randomNamespace();
    const hashes = randomHashes(160);
    // 160 x 64 KiB = 10 MiB written into a 4 MiB Redis.
    for (const h of hashes) await b.put(ns, h, { tokens: 1, data: randomPayload(64 * 1024) });
    const got = await b.batchedGet(ns, hashes);
    const misses = hashes.filter((h) => got.get(h) === null).length;
    assert.equal(got.size, hashes.length);
    assert.ok(
      misses > 0 && misses < hashes.length,
      `expected some evicted chunks, got ${misses} misses`,
    );
    assert.equal((await b.batchedContains(ns, hashes)) < hashes.length, true);
    assert.equal(b.stats().corruptObjects, 0);
  } finally {
    await b.close();
    await server.stop();
  }
});

test('auth options pass through (requirepass)', async () => {
  const server = await startRedis({ password: 's3cret' });
  try {
    const good = backend(server.port, { password: 's3cret' });
    await good.start();
    const ns = randomNamespace();
    const h = randomHash();
    assert.equal(await good.put(ns, h, { tokens: 1, data: randomPayload(8) }), 'stored');
    await good.close();

    const viaUrl = new RedisBackend(
      { url: `redis://default:s3cret@127.0.0.1:${server.port}/0`, log: silent },
      { name: 'url' },
    );
    await viaUrl.start();
    assert.equal(await viaUrl.batchedContains(ns, [h]), 1);
    await viaUrl.close();

    const acl = backend(server.port, { username: 'default', password: 's3cret' });
    await acl.start();
    assert.equal(await acl.batchedContains(ns, [h]), 1);
    await acl.close();

    const wrong = backend(server.port, { password: 'nope', connectTimeoutMs: 300 });
    await assert.rejects(
      wrong.start(),
      (err: unknown) => codeOf(err) === 'KVT_BACKEND' && /WRONGPASS/.test(`${err}`),
    );
    const urlPass = new RedisBackend(
      {
        url: `redis://default:hunter2@127.0.0.1:${server.port}`,
        connectTimeoutMs: 300,
        log: silent,
      },
      { name: 'url' },
    );
    await assert.rejects(urlPass.start(), (err: unknown) => {
      assert.doesNotMatch(`${err}`, /hunter2/, 'the message never shows the password');
      return codeOf(err) === 'KVT_BACKEND';
    });
    await urlPass.close();
    assert.equal(wrong.health(), 'down');
    await wrong.close();
  } finally {
    await server.stop();
  }
});

test('killed Redis: calls settle within timeoutMs, health goes down, then recovers', async () => {
  const server = await startRedis();
  const timeoutMs = 300;
  const b = backend(server.port, { timeoutMs });
  try {
    await b.start();
    const ns = randomNamespace();
    const h = randomHash();
    await b.put(ns, h, { tokens: 1, data: randomPayload(32) });
    assert.equal(b.health(), 'up');

    await server.kill();
    await pollUntil(() => b.health() === 'down', 'health down after kill');
    const settle = async (p: Promise<unknown>) => {
      try {
        return await p;
      } catch (err) {
        return codeOf(err);
      }
    };
    // Bounded by timeoutMs; the deadline here only fails a call that hangs (a busy machine may
    // take longer than timeoutMs to run the timer).
    const contains = await withDeadline(
      settle(b.batchedContains(ns, [h])),
      timeoutMs + HANG_MS,
      'contains',
    );
    const get = await withDeadline(settle(b.batchedGet(ns, [h])), timeoutMs + HANG_MS, 'get');
    assert.ok(
      ['KVT_BACKEND', 'KVT_TIMEOUT', 0].includes(contains as string),
      `contains: ${contains}`,
    );
    assert.ok(
      get === 'KVT_BACKEND' || get === 'KVT_TIMEOUT' || (get instanceof Map && get.get(h) === null),
      `get: ${String(get)}`,
    );
    // A put fails too, so that the breaker and the metrics see the outage.
    const errors = b.stats().errors;
    const put = await settle(b.put(ns, randomHash(), { tokens: 1, data: randomPayload(8) }));
    assert.equal(put, 'KVT_BACKEND');
    assert.equal(b.stats().errors, errors + 1);

    await server.restart();
    await pollUntil(() => b.health() === 'up', 'health up after restart');
    // The restarted server is empty (no persistence): write again, then hit.
    assert.equal(await b.put(ns, h, { tokens: 1, data: randomPayload(32) }), 'stored');
    assert.equal(await b.batchedContains(ns, [h]), 1);
    assert.notEqual((await b.batchedGet(ns, [h])).get(h), null);
  } finally {
    await b.close();
    await server.stop();
  }
});

test('a hung Redis (SIGSTOP) costs at most timeoutMs: KVT_TIMEOUT, puts too', async () => {
  const server = await startRedis();
  const timeoutMs = 200;
  const b = backend(server.port, { timeoutMs });
  try {
    await b.start();
    const ns = randomNamespace();
    server.pause();
    await assert.rejects(
      withDeadline(b.batchedContains(ns, [randomHash()]), timeoutMs + HANG_MS, 'contains'),
      (err: unknown) => codeOf(err) === 'KVT_TIMEOUT',
    );
    await assert.rejects(
      withDeadline(b.batchedGet(ns, [randomHash()]), timeoutMs + HANG_MS, 'get'),
      (err: unknown) => codeOf(err) === 'KVT_TIMEOUT' || codeOf(err) === 'KVT_BACKEND',
    );
    await assert.rejects(
      withDeadline(
        b.put(ns, randomHash(), { tokens: 1, data: randomPayload(8) }),
        timeoutMs + HANG_MS,
        'put',
      ),
      (err: unknown) => codeOf(err) === 'KVT_TIMEOUT',
    );
    assert.ok(b.stats().errors >= 3, `errors counted: ${b.stats().errors}`);
    server.resume();
  } finally {
    server.resume();
    await b.close();
    await server.stop();
  }
});

test('close is idempotent and later calls reject KVT_CLOSED', async () => {
  const server = await startRedis();
  try {
    const b = backend(server.port);
    await b.start();
    await Promise.all([b.close(), b.close()]);
    await assert.rejects(
      b.batchedContains(randomNamespace(), [randomHash()]),
      (e: unknown) => codeOf(e) === 'KVT_CLOSED',
    );
    assert.throws(
      () => b.health(),
      (e: unknown) => codeOf(e) === 'KVT_CLOSED',
    );
  } finally {
    await server.stop();
  }
});

test('cluster: chunks spread over every master without hash tags; clear empties them all', async () => {
  const cluster = await startRedisCluster();
  const b = new RedisBackend({ cluster: { nodes: cluster.nodes }, log: silent }, { name: 'c' });
  try {
    await b.start();
    const ns = randomNamespace();
    const hashes = randomHashes(60);
    const chunks = hashes.map(() => ({ tokens: 2, data: randomPayload(1024) }));
    const outcomes = await Promise.all(hashes.map((h, i) => b.put(ns, h, chunks[i]!)));
    assert.deepEqual(new Set(outcomes), new Set(['stored']));
    const sizes = await Promise.all(cluster.nodes.map((n) => rawCommand(n.port, 'DBSIZE')));
    for (const s of sizes)
      assert.match(s, /^:[1-9]\d*$/, `every master holds keys: ${sizes.join(' ')}`);
    assert.equal(await b.batchedContains(ns, hashes), 60);
    const got = await b.batchedGet(ns, hashes);
    hashes.forEach((h, i) => {
      assert.equal(Buffer.compare(Buffer.from(got.get(h)!.data), chunks[i]!.data), 0, `chunk ${i}`);
    });
    assert.equal(b.stats().chunks, 60);
    await b.clear(ns);
    const after = await Promise.all(cluster.nodes.map((n) => rawCommand(n.port, 'DBSIZE')));
    assert.deepEqual(after, [':0', ':0', ':0']);
    assert.equal(b.stats().chunks, 0);
  } finally {
    await b.close();
    await cluster.stop();
  }
});
