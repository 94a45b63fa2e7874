/**
 * The Redis tier's bulk GET reader (redis-get-reader.ts) against real redis-servers (standalone,
 * with a password, a 3-master cluster), and a scripted TCP peer for what a real server cannot be
 * made to do on cue: a reply cut into single bytes, a connection that dies in the middle of a
 * value, a reply that never comes.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { createServer, type Server, type Socket } from 'node:net';
import { after, before, describe, test } from 'node:test';
import { Cluster, Redis } from 'ioredis';
import { crc32cUpdateNative } from '../../src/backends/format/checksum.ts';
import { RedisBackend } from '../../src/backends/redis/redis-backend.ts';
import { REDIRECT, RedisGetReader } from '../../src/backends/redis/redis-get-reader.ts';
import { keySlot } from '../../src/backends/redis/redis-slot.ts';
import type { RedisStore } from '../../src/backends/redis/redis-store.ts';
import { isKvtierError } from '../../src/errors.ts';
import { randomHashes, randomNamespace, randomPayload } from '../support/fixtures.ts';
import {
  type RedisCluster,
  type RedisServer,
  startRedis,
  startRedisCluster,
} from '../support/redis-server.ts';

const silent = { debug() {}, info() {}, warn() {}, error() {}, child: () => silent };
const opts = { connectTimeoutMs: 10_000, name: 'redis-test' };
const MAX = Number.MAX_SAFE_INTEGER;

function codeOf(err: unknown): string {
  return isKvtierError(err) ? err.code : `not a KvtierError: ${String(err)}`;
}

/** A TCP peer that answers each connection with `script` (it gets the socket and what was sent). */
async function scripted(
  script: (socket: Socket, received: () => string) => void,
): Promise<{ server: Server; node: string }> {
  const server = createServer((socket) => {
    let got = '';
    socket.on('data', (d) => {
      got += d.toString('latin1');
    });
    script(socket, () => got);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const addr = server.address();
  if (addr === null || typeof addr === 'string') throw new Error('no address');
  return { server, node: `127.0.0.1:${addr.port}` };
}

async function until(cond: () => boolean, ms = 15_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 5));
  }
}

describe('RedisGetReader against redis-server', () => {
  let server: RedisServer;
  let raw: Redis;
  before(async () => {
    server = await startRedis({ password: 'pw' });
    raw = new Redis({ port: server.port, password: 'pw' });
  });
  after(async () => {
    raw.disconnect();
    await server.stop();
  });

  test('values byte-exact, large ones across many socket reads, nil as null, in order', async () => {
    const reader = new RedisGetReader(() => `127.0.0.1:${server.port}`, {
      ...opts,
      password: 'pw',
    });
    try {
      const values = [0, 1, 13, 4096, 1 << 20, (8 << 20) + 3].map((n) => randomBytes(n));
      await Promise.all(values.map((v, i) => raw.set(`v${i}`, v)));
      await raw.set('crlf', Buffer.from('\r\n$5\r\n-ERR\r\n'));
      const got = await Promise.all([
        ...values.map((_, i) => reader.get(`v${i}`, MAX, undefined, undefined)),
        reader.get('missing', MAX, undefined, undefined),
        reader.get('crlf', MAX, undefined, undefined),
      ]);
      values.forEach((v, i) => {
        const g = got[i];
        assert.ok(g !== undefined && g !== null && g !== REDIRECT);
        assert.ok(g.bytes.equals(v), `value ${i} (${v.length} bytes)`);
        g.release();
      });
      assert.equal(got[values.length], null);
      const c = got[values.length + 1];
      assert.ok(c !== undefined && c !== null && c !== REDIRECT);
      assert.equal(c.bytes.toString('latin1'), '\r\n$5\r\n-ERR\r\n');
      assert.equal(reader.connections, 1);
      // The CRC-32C of a value from a given offset, computed as it lands, as a second pass gives it.
      const last = values.length - 1;
      for (const from of [0, 128, values[last]!.length]) {
        const v = await reader.get(`v${last}`, MAX, from, undefined);
        assert.ok(v !== null && v !== REDIRECT);
        assert.equal(v.crc32c, crc32cUpdateNative(0, values[last]!.subarray(from)) ?? undefined);
        v.release();
      }
    } finally {
      reader.close();
    }
  });

  test('a value over maxBytes is read and answered as empty bytes; the next reply is intact', async () => {
    const reader = new RedisGetReader(() => `127.0.0.1:${server.port}`, {
      ...opts,
      password: 'pw',
    });
    try {
      await raw.set('big', randomBytes(100_000));
      await raw.set('small', 'ok');
      const [big, small] = await Promise.all([
        reader.get('big', 1000, undefined, undefined),
        reader.get('small', 1000, undefined, undefined),
      ]);
      assert.ok(big !== null && big !== REDIRECT && big.bytes.length === 0);
      assert.ok(small !== null && small !== REDIRECT && small.bytes.toString() === 'ok');
    } finally {
      reader.close();
    }
  });

  test('an error reply rejects KVT_BACKEND for that key only', async () => {
    const reader = new RedisGetReader(() => `127.0.0.1:${server.port}`, {
      ...opts,
      password: 'pw',
    });
    try {
      await raw.lpush('list', 'x');
      await raw.set('after', 'y');
      const [bad, good] = await Promise.allSettled([
        reader.get('list', MAX, undefined, undefined),
        reader.get('after', MAX, undefined, undefined),
      ]);
      assert.equal(bad.status, 'rejected');
      assert.equal(codeOf((bad as PromiseRejectedResult).reason), 'KVT_BACKEND');
      assert.match(String((bad as PromiseRejectedResult).reason.message), /WRONGTYPE/);
      assert.equal(good.status, 'fulfilled');
    } finally {
      reader.close();
    }
  });

  test('a wrong password fails the connection, not silently', async () => {
    const reader = new RedisGetReader(() => `127.0.0.1:${server.port}`, {
      ...opts,
      password: 'no',
    });
    try {
      await assert.rejects(
        reader.get('v0', MAX, undefined, undefined),
        (e) => codeOf(e) === 'KVT_BACKEND',
      );
    } finally {
      reader.close();
    }
  });

  test('an aborted get settles at once; its reply is dropped and the connection serves on', async () => {
    const reader = new RedisGetReader(() => `127.0.0.1:${server.port}`, {
      ...opts,
      password: 'pw',
    });
    try {
      await raw.set('abort-me', randomBytes(4 << 20));
      const ac = new AbortController();
      const first = reader.get('abort-me', MAX, undefined, ac.signal);
      ac.abort();
      await assert.rejects(first, (e) => codeOf(e) === 'KVT_ABORTED');
      const next = await reader.get('small', MAX, undefined, undefined);
      assert.ok(next !== null && next !== REDIRECT && next.bytes.toString() === 'ok');
      assert.equal(reader.connections, 1);
      await assert.rejects(
        reader.get('small', MAX, undefined, ac.signal),
        (e) => codeOf(e) === 'KVT_ABORTED',
      );
    } finally {
      reader.close();
    }
  });

  test('a standalone tier from a URL (password, database 3) reads through the reader', async () => {
    const b = new RedisBackend(
      { url: `redis://:pw@127.0.0.1:${server.port}/3`, keyPrefix: 'url:', log: silent },
      { name: 'redis-test' },
    );
    await b.start();
    try {
      const ns = randomNamespace();
      const hashes = randomHashes(3);
      const payloads = hashes.map(() => randomPayload(300 * 1024));
      for (const [i, h] of hashes.entries())
        assert.equal(await b.put(ns, h, { tokens: 16, data: payloads[i]! }), 'stored');
      const got = await b.batchedGet(ns, hashes);
      for (const [i, h] of hashes.entries())
        assert.ok(Buffer.from(got.get(h)!.data).equals(payloads[i]!), `chunk ${i}`);
      assert.equal((b.store as RedisStore).stats().readerGets, 3);
      // The values live in database 3, not 0.
      assert.equal(await raw.exists(`url:${ns}:${hashes[0]}`), 0);
    } finally {
      await b.close();
    }
  });

  test('close rejects calls in flight and later ones with KVT_CLOSED', async () => {
    const reader = new RedisGetReader(() => `127.0.0.1:${server.port}`, {
      ...opts,
      password: 'pw',
    });
    const inFlight = reader.get('v4', MAX, undefined, undefined);
    reader.close();
    await assert.rejects(inFlight, (e) => codeOf(e) === 'KVT_CLOSED');
    await assert.rejects(
      reader.get('v4', MAX, undefined, undefined),
      (e) => codeOf(e) === 'KVT_CLOSED',
    );
  });

  test('a killed server fails the calls on it; after a restart a new connection serves', async () => {
    const reader = new RedisGetReader(() => `127.0.0.1:${server.port}`, {
      ...opts,
      password: 'pw',
    });
    try {
      assert.notEqual(await reader.get('small', MAX, undefined, undefined), REDIRECT);
      await server.kill();
      await assert.rejects(
        reader.get('small', MAX, undefined, undefined),
        (e) => codeOf(e) === 'KVT_BACKEND',
      );
      await server.restart();
      raw.disconnect();
      raw = new Redis({ port: server.port, password: 'pw' });
      await raw.set('small', 'again');
      const v = await reader.get('small', MAX, undefined, undefined);
      assert.ok(v !== null && v !== REDIRECT && v.bytes.toString() === 'again');
    } finally {
      reader.close();
    }
  });
});

describe('RedisGetReader on a scripted peer', () => {
  test('a reply cut into single bytes is put back together', async () => {
    const value = randomBytes(3000);
    const reply = Buffer.concat([
      Buffer.from(`$${value.length}\r\n`),
      value,
      Buffer.from('\r\n$-1\r\n-ERR nope\r\n$2\r\nok\r\n'),
    ]);
    const { server, node } = await scripted((socket, received) => {
      const go = async () => {
        await until(() => (received().match(/GET/g) ?? []).length === 4);
        for (const b of reply) {
          socket.write(Buffer.of(b));
          await new Promise((r) => setImmediate(r));
        }
      };
      void go();
    });
    const reader = new RedisGetReader(() => node, opts);
    try {
      const got = await Promise.allSettled(
        ['a', 'b', 'c', 'd'].map((k) => reader.get(k, MAX, undefined, undefined)),
      );
      const a = (got[0] as PromiseFulfilledResult<{ bytes: Buffer }>).value;
      assert.ok(a.bytes.equals(value));
      assert.deepEqual(got[1], { status: 'fulfilled', value: null });
      assert.equal(got[2]!.status, 'rejected');
      const d = (got[3] as PromiseFulfilledResult<{ bytes: Buffer }>).value;
      assert.equal(d.bytes.toString(), 'ok');
    } finally {
      reader.close();
      server.close();
    }
  });

  test('a connection that dies in the middle of a value fails the call: no bytes cut short', async () => {
    const { server, node } = await scripted((socket, received) => {
      void until(() => received().includes('GET')).then(() => {
        socket.write(`$1000\r\n${'x'.repeat(400)}`);
        setTimeout(() => socket.destroy(), 20);
      });
    });
    const reader = new RedisGetReader(() => node, opts);
    try {
      await assert.rejects(
        reader.get('k', MAX, undefined, undefined),
        (e) => codeOf(e) === 'KVT_BACKEND',
      );
      assert.equal(reader.connections, 0);
    } finally {
      reader.close();
      server.close();
    }
  });

  test('a reply that is not a bulk string, nil or error fails the connection (KVT_PROTOCOL)', async () => {
    const { server, node } = await scripted((socket, received) => {
      void until(() => received().includes('GET')).then(() => socket.write(':12\r\n'));
    });
    const reader = new RedisGetReader(() => node, opts);
    try {
      await assert.rejects(
        reader.get('k', MAX, undefined, undefined),
        (e) => codeOf(e) === 'KVT_PROTOCOL',
      );
    } finally {
      reader.close();
      server.close();
    }
  });

  test('a deadline that passes with no reply rejects KVT_TIMEOUT and drops the connection', async () => {
    const { server, node } = await scripted(() => {});
    const reader = new RedisGetReader(() => node, opts);
    try {
      const other = reader.get('other', MAX, undefined, undefined);
      await assert.rejects(
        reader.get('k', MAX, undefined, AbortSignal.timeout(50)),
        (e) => codeOf(e) === 'KVT_TIMEOUT',
      );
      await assert.rejects(other, (e) => codeOf(e) === 'KVT_TIMEOUT');
      assert.equal(reader.connections, 0);
    } finally {
      reader.close();
      server.close();
    }
  });
});

describe('RedisGetReader in a cluster', () => {
  let cluster: RedisCluster;
  let raw: Cluster;
  before(async () => {
    cluster = await startRedisCluster();
    raw = new Cluster(cluster.nodes);
  });
  after(async () => {
    raw.disconnect();
    await cluster.stop();
  });

  test('a key sent to a master that does not own its slot answers REDIRECT (MOVED)', async () => {
    await raw.set('moved-key', 'v');
    const masters = raw.nodes('master').map((n) => `${n.options.host}:${n.options.port}`);
    const owner = raw.slots[keySlot('moved-key')]![0]!;
    const wrong = masters.find((m) => m !== owner)!;
    const reader = new RedisGetReader(() => wrong, opts);
    try {
      assert.equal(await reader.get('moved-key', MAX, undefined, undefined), REDIRECT);
      const right = new RedisGetReader(() => owner, opts);
      const v = await right.get('moved-key', MAX, undefined, undefined);
      right.close();
      assert.ok(v !== null && v !== REDIRECT && v.bytes.toString() === 'v');
    } finally {
      reader.close();
    }
  });

  test('the tier reads through the reader; a slot moved to another master is still found', async () => {
    const b = new RedisBackend(
      { cluster: { nodes: cluster.nodes }, keyPrefix: 'grt:', timeoutMs: 10_000, log: silent },
      { name: 'redis-test' },
    );
    await b.start();
    try {
      const ns = randomNamespace();
      const hashes = randomHashes(12);
      const payloads = hashes.map(() => randomPayload(256 * 1024));
      for (const [i, h] of hashes.entries())
        assert.equal(await b.put(ns, h, { tokens: 16, data: payloads[i]! }), 'stored');
      const got = await b.batchedGet(ns, hashes);
      for (const [i, h] of hashes.entries()) {
        const c = got.get(h);
        assert.ok(c != null && Buffer.from(c.data).equals(payloads[i]!));
        assert.equal(typeof c.release, 'function');
        c.release!();
      }
      const store = b.store as RedisStore;
      assert.equal(store.stats().readerGets, hashes.length);

      // Move the first key's slot to another master (the reader's slot map is now stale).
      const key = `grt:${ns}:${hashes[0]}`;
      const slot = keySlot(key);
      const masters = raw.nodes('master');
      const ids = await Promise.all(
        masters.map(async (n) => [n, String(await n.call('CLUSTER', 'MYID'))] as const),
      );
      const ownerKey = raw.slots[slot]![0]!;
      const [from, fromId] = ids.find(([n]) => `${n.options.host}:${n.options.port}` === ownerKey)!;
      const [to, toId] = ids.find(([n]) => n !== from)!;
      await to.call('CLUSTER', 'SETSLOT', slot, 'IMPORTING', fromId);
      await from.call('CLUSTER', 'SETSLOT', slot, 'MIGRATING', toId);
      const keys = (await from.call('CLUSTER', 'GETKEYSINSLOT', slot, 100)) as string[];
      for (const k of keys)
        await from.call('MIGRATE', to.options.host!, to.options.port!, k, 0, 5000);
      for (const n of masters) await n.call('CLUSTER', 'SETSLOT', slot, 'NODE', toId);
      assert.ok(keys.includes(key));

      const again = await b.batchedGet(ns, hashes);
      for (const [i, h] of hashes.entries()) {
        const c = again.get(h);
        assert.ok(c != null && Buffer.from(c.data).equals(payloads[i]!), `chunk ${i}`);
      }
      assert.ok((store.stats().readerRedirects ?? 0) >= 1);
    } finally {
      await b.close();
    }
  });
});
