import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { createServer, type Server, type Socket } from 'node:net';
import { after, before, describe, test } from 'node:test';
import {
  GetObjectCommand,
  HeadObjectCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  type S3Client,
} from '@aws-sdk/client-s3';
import { CircuitBreakerBackend } from '../../src/backends/core/circuit-breaker.ts';
import { CHUNK_HEADER_BYTES } from '../../src/backends/format/chunk-format.ts';
import {
  createS3Backend,
  resolveS3BackendOptions,
  S3Backend,
  type S3BackendOptions,
  s3OptionsFromConfig,
} from '../../src/backends/s3/s3-backend.ts';
import { readBody } from '../../src/backends/s3/s3-requests.ts';
import { isKvtierError, type KvtierError } from '../../src/errors.ts';
import type { ChunkHash } from '../../src/hashing/chunk-hash.ts';
import { crc32c } from '../../src/util/crc32c.ts';
import { randomHash, randomHashes, randomNamespace } from '../support/fixtures.ts';
import { type S3Harness, S3RVER_CREDENTIALS, startS3 } from '../support/s3-server.ts';

const MiB = 1024 * 1024;

let s3: S3Harness;
let raw: S3Client;
const open: S3Backend[] = [];

before(async () => {
  s3 = await startS3();
  raw = s3.client();
});

after(async () => {
  await Promise.all(open.map((b) => b.close()));
  await s3.close();
});

/**
 * A backend on the test server. Requests get 120 s unless a test sets `timeoutMs` (the default
 * 5 s is crossed on a busy machine by puts queued behind `concurrency`, and by 32 MiB).
 */
function backend(extra: Partial<S3BackendOptions> = {}, server: S3Harness = s3): S3Backend {
  const b = new S3Backend(
    {
      bucket: server.bucket,
      endpoint: server.endpoint,
      ...S3RVER_CREDENTIALS,
      timeoutMs: 120_000,
      ...extra,
    },
    { name: 's3-test' },
  );
  open.push(b);
  return b;
}

async function listKeys(prefix = ''): Promise<string[]> {
  const res = await raw.send(new ListObjectsV2Command({ Bucket: s3.bucket, Prefix: prefix }));
  return (res.Contents ?? []).map((c) => c.Key ?? '').sort();
}

async function exists(key: string): Promise<boolean> {
  try {
    await raw.send(new HeadObjectCommand({ Bucket: s3.bucket, Key: key }));
    return true;
  } catch (err) {
    if ((err as { $metadata?: { httpStatusCode?: number } }).$metadata?.httpStatusCode === 404)
      return false;
    throw err;
  }
}

/** Resolves with how `p` settled, or 'pending' if it had not within `boundMs`. */
async function settlesWithin<T>(
  p: Promise<T>,
  boundMs: number,
): Promise<{ value: T } | { error: unknown } | 'pending'> {
  let timer: NodeJS.Timeout | undefined;
  const bound = new Promise<'pending'>((resolve) => {
    timer = setTimeout(() => resolve('pending'), boundMs);
  });
  try {
    return await Promise.race([
      p.then(
        (value) => ({ value }),
        (error: unknown) => ({ error }),
      ),
      bound,
    ]);
  } finally {
    clearTimeout(timer);
  }
}

function codeOf(outcome: { value: unknown } | { error: unknown } | 'pending'): string {
  if (outcome === 'pending') return 'pending';
  if ('value' in outcome) return 'resolved';
  return isKvtierError(outcome.error) ? outcome.error.code : String(outcome.error);
}

describe('S3Backend bodies and keys', () => {
  test('a 32 MiB chunk round-trips byte-exact and is stored as one plain object', async () => {
    const b = backend();
    const putHeaders: Record<string, string>[] = [];
    b.client.middlewareStack.add(
      (next, context) => async (args) => {
        const req = args.request as { headers?: Record<string, string> };
        if (context.commandName === 'PutObjectCommand') putHeaders.push({ ...req.headers });
        return next(args);
      },
      { step: 'finalizeRequest', name: 'capturePutHeaders' },
    );
    const ns = randomNamespace();
    const hash = randomHash();
    const data = randomBytes(32 * MiB);
    assert.equal(await b.put(ns, hash, { tokens: 256, data }), 'stored');
    // The checksum settings: no flexible-checksum or aws-chunked framing on the upload.
    assert.equal(putHeaders.length, 1);
    const names = Object.keys(putHeaders[0] ?? {}).map((n) => n.toLowerCase());
    assert.deepEqual(
      names.filter((n) => n.startsWith('x-amz-checksum') || n === 'x-amz-sdk-checksum-algorithm'),
      [],
    );
    assert.equal(putHeaders[0]?.['content-length'], String(CHUNK_HEADER_BYTES + data.byteLength));
    assert.notEqual(putHeaders[0]?.['content-encoding'], 'aws-chunked');
    const got = (await b.batchedGet(ns, [hash])).get(hash);
    assert.ok(got != null, 'the chunk should be a hit');
    assert.equal(got.tokens, 256);
    assert.equal(Buffer.compare(Buffer.from(got.data), data), 0, 'payload bytes differ');
    // No aws-chunked framing: the stored object is exactly header + payload.
    const obj = await raw.send(
      new GetObjectCommand({ Bucket: s3.bucket, Key: `kvtier/${ns}/${hash}` }),
    );
    const bytes = await obj.Body!.transformToByteArray();
    assert.equal(bytes.byteLength, CHUNK_HEADER_BYTES + data.byteLength);
    assert.equal(Buffer.compare(bytes.subarray(CHUNK_HEADER_BYTES), data), 0);
  });

  test('a partial chunk keeps its token count; a second put of the key is "exists"', async () => {
    const b = backend();
    const ns = randomNamespace();
    const hash = randomHash();
    const data = randomBytes(1000);
    assert.equal(await b.put(ns, hash, { tokens: 7, data }), 'stored');
    assert.equal(await b.put(ns, hash, { tokens: 7, data }), 'exists');
    const got = (await b.batchedGet(ns, [hash])).get(hash);
    assert.equal(got?.tokens, 7);
    assert.deepEqual(Buffer.from(got?.data ?? []), data);
  });

  test('keys are <keyPrefix><ns>/<hash>; clear(ns) and clear() stay inside their prefix', async () => {
    const b = backend({ keyPrefix: 'keys-test/' });
    const nsA = randomNamespace();
    const nsB = randomNamespace();
    const [a1, a2] = randomHashes(2) as [ChunkHash, ChunkHash];
    const b1 = randomHash();
    const chunk = { tokens: 4, data: randomBytes(64) };
    await b.put(nsA, a1, chunk);
    await b.put(nsA, a2, chunk);
    await b.put(nsB, b1, chunk);
    await raw.send(
      new PutObjectCommand({ Bucket: s3.bucket, Key: 'outside/keep', Body: Buffer.from('x') }),
    );
    assert.deepEqual(
      await listKeys('keys-test/'),
      [`keys-test/${nsA}/${a1}`, `keys-test/${nsA}/${a2}`, `keys-test/${nsB}/${b1}`].sort(),
    );
    await b.clear(nsA);
    assert.deepEqual(await listKeys('keys-test/'), [`keys-test/${nsB}/${b1}`]);
    await b.clear();
    assert.deepEqual(await listKeys('keys-test/'), []);
    assert.equal(await exists('outside/keep'), true, 'an object outside keyPrefix was deleted');
  });

  test('batched gets are keyed by hash with explicit misses; contains stops at the first miss', async () => {
    const b = backend();
    const ns = randomNamespace();
    const [h0, h1, h2] = randomHashes(3) as [ChunkHash, ChunkHash, ChunkHash];
    await b.put(ns, h0, { tokens: 1, data: Buffer.from('zero') });
    await b.put(ns, h2, { tokens: 1, data: Buffer.from('two') });
    assert.equal(await b.batchedContains(ns, [h0, h1, h2]), 1);
    const got = await b.batchedGet(ns, [h0, h1, h2]);
    assert.deepEqual([...got.keys()], [h0, h1, h2]);
    assert.equal(got.get(h1), null);
    assert.equal(Buffer.from(got.get(h2)?.data ?? []).toString(), 'two');
    assert.equal(await b.remove(ns, [h0, h1]), 1);
    assert.equal(await b.batchedContains(ns, [h0]), 0);
  });

  test('a corrupt object is a miss, is deleted and counted', async () => {
    const reasons: string[] = [];
    const b = backend({ onCorrupt: (r) => reasons.push(r) });
    const ns = randomNamespace();
    const hash = randomHash();
    const key = `kvtier/${ns}/${hash}`;
    await raw.send(
      new PutObjectCommand({ Bucket: s3.bucket, Key: key, Body: randomBytes(CHUNK_HEADER_BYTES) }),
    );
    assert.equal((await b.batchedGet(ns, [hash])).get(hash), null);
    assert.deepEqual(reasons, ['magic']);
    assert.equal(b.stats().corruptObjects, 1);
    assert.equal(await exists(key), false, 'the corrupt object is still there');
  });
});

describe('S3Backend concurrency', () => {
  test('never has more than `concurrency` requests in flight', async () => {
    const b = backend({ concurrency: 3 });
    let inFlight = 0;
    let maxInFlight = 0;
    b.client.middlewareStack.add(
      (next) => async (args) => {
        inFlight++;
        maxInFlight = Math.max(maxInFlight, inFlight);
        try {
          return await next(args);
        } finally {
          inFlight--;
        }
      },
      { step: 'initialize', name: 'countInFlight' },
    );
    const ns = randomNamespace();
    const hashes = randomHashes(24);
    await Promise.all(hashes.map((h) => b.put(ns, h, { tokens: 1, data: randomBytes(4096) })));
    const [count, got] = await Promise.all([
      b.batchedContains(ns, hashes),
      b.batchedGet(ns, hashes),
    ]);
    assert.equal(count, hashes.length);
    assert.equal([...got.values()].filter((c) => c !== null).length, hashes.length);
    assert.equal(maxInFlight, 3, `max in flight was ${maxInFlight}`);
    assert.equal(inFlight, 0);
  });

  test('object buffers: never shared by two PutObjects in flight, never reused after a failed one', async () => {
    const b = backend({ concurrency: 4 });
    const inFlight = new Set<unknown>();
    const seen = new Set<unknown>();
    let failedBody: unknown;
    let failNext = false;
    const bodies: unknown[] = [];
    b.client.middlewareStack.add(
      (next) => async (args) => {
        const input = args.input as { Body?: unknown };
        if (!(args.input as { Key?: string }).Key || input.Body === undefined) return next(args);
        const body = input.Body;
        assert.ok(!inFlight.has(body), 'a buffer two PutObjects hold at once');
        assert.notEqual(body, failedBody, 'the buffer of a failed PutObject was reused');
        bodies.push(body);
        seen.add(body);
        inFlight.add(body);
        try {
          if (failNext) {
            failNext = false;
            failedBody = body;
            throw new Error('injected PutObject failure');
          }
          return await next(args);
        } finally {
          inFlight.delete(body);
        }
      },
      { step: 'initialize', name: 'watchBodies' },
    );
    const ns = randomNamespace();
    const round = async (n: number) => {
      const chunks = randomHashes(n).map((h) => ({ h, data: randomBytes(64 * 1024) }));
      const outs = await Promise.all(
        chunks.map((c) => b.put(ns, c.h, { tokens: 1, data: c.data })),
      );
      const got = await b.batchedGet(
        ns,
        chunks.map((c) => c.h),
      );
      chunks.forEach((c, i) => {
        if (outs[i] === 'stored') {
          const data = got.get(c.h)?.data;
          assert.ok(data !== undefined && Buffer.compare(data, c.data) === 0, 'own bytes stored');
        }
      });
      return outs;
    };
    await round(12);
    failNext = true;
    await assert.rejects(b.put(ns, randomHash(), { tokens: 1, data: randomBytes(64 * 1024) }));
    assert.ok(failedBody !== undefined);
    await round(12);
    await round(12);
    assert.ok(seen.size < bodies.length, 'buffers are reused across puts');
  });

  test('a caller abort while queued rejects at once with KVT_ABORTED', async () => {
    const b = backend({ concurrency: 1 });
    const ns = randomNamespace();
    const first = b.batchedContains(ns, randomHashes(4));
    const ac = new AbortController();
    const second = b.batchedContains(ns, randomHashes(4), { signal: ac.signal });
    ac.abort();
    await assert.rejects(second, (err: KvtierError) => err.code === 'KVT_ABORTED');
    assert.equal(await first, 0);
  });
});

describe('S3Backend outages', () => {
  test('a stopped server: calls settle within timeoutMs, health degraded, then up after restart; the breaker around it is what goes down', async () => {
    const own = await startS3();
    try {
      const timeoutMs = 1000;
      const b = backend({ timeoutMs, maxAttempts: 1 }, own);
      const breaker = new CircuitBreakerBackend(b, {
        timeoutMs: timeoutMs * 2,
        failureThreshold: 2,
        probeIntervalMs: 3_600_000,
      });
      const ns = randomNamespace();
      const hash = randomHash();
      await b.put(ns, hash, { tokens: 1, data: randomBytes(100) });
      assert.equal(b.health(), 'up');
      await own.stop();
      for (let i = 0; i < 2; i++) {
        const outcome = await settlesWithin(b.batchedContains(ns, [hash]), timeoutMs * 3);
        assert.ok(['KVT_BACKEND', 'KVT_TIMEOUT'].includes(codeOf(outcome)), codeOf(outcome));
      }
      const get = await settlesWithin(b.batchedGet(ns, [hash]), timeoutMs * 3);
      assert.ok(['KVT_BACKEND', 'KVT_TIMEOUT'].includes(codeOf(get)), codeOf(get));
      const put = await settlesWithin(
        b.put(ns, randomHash(), { tokens: 1, data: randomBytes(10) }),
        timeoutMs * 3,
      );
      assert.ok(['KVT_BACKEND', 'KVT_TIMEOUT'].includes(codeOf(put)), codeOf(put));
      assert.equal(b.health(), 'degraded', 'the backend reports failures, not a verdict');
      assert.ok(b.stats().requestFailures >= 4, 'failures were not counted');
      assert.equal(breaker.isOpen, false, 'calls made around the breaker do not count');
      for (let i = 0; i < 2; i++) assert.equal(await breaker.batchedContains(ns, [hash]), 0);
      assert.equal(breaker.health(), 'down', 'the breaker is the one health mechanism');
      await own.restart();
      assert.equal(await b.batchedContains(ns, [hash]), 1);
      assert.equal(b.health(), 'up');
      await breaker.close();
    } finally {
      await own.close();
    }
  });

  test('a server that accepts but never answers: calls reject with KVT_TIMEOUT', async () => {
    const sockets = new Set<Socket>();
    const hole: Server = createServer((s) => {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
    });
    await new Promise<void>((resolve) => hole.listen(0, '127.0.0.1', resolve));
    const { port } = hole.address() as { port: number };
    try {
      const timeoutMs = 300;
      const b = new S3Backend(
        {
          bucket: 'b',
          endpoint: `http://127.0.0.1:${port}`,
          ...S3RVER_CREDENTIALS,
          timeoutMs,
        },
        { name: 'hole' },
      );
      open.push(b);
      const outcome = await settlesWithin(
        b.batchedContains(randomNamespace(), [randomHash()]),
        timeoutMs * 10,
      );
      assert.equal(codeOf(outcome), 'KVT_TIMEOUT');
      assert.equal(b.health(), 'degraded');
      await b.close();
    } finally {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => hole.close(() => resolve()));
    }
  });
});

describe('S3Backend lifecycle and options', () => {
  test('close is idempotent and calls after close reject with KVT_CLOSED', async () => {
    const b = backend();
    const p1 = b.close();
    assert.equal(b.close(), p1);
    await p1;
    await assert.rejects(
      b.batchedContains(randomNamespace(), [randomHash()]),
      (e: KvtierError) => e.code === 'KVT_CLOSED',
    );
    await assert.rejects(
      b.put(randomNamespace(), randomHash(), { tokens: 1, data: Buffer.from('x') }),
      (e: KvtierError) => e.code === 'KVT_CLOSED',
    );
    assert.throws(
      () => b.health(),
      (e: KvtierError) => e.code === 'KVT_CLOSED',
    );
  });

  test('the factory checks the bucket and creates it with createBucket', async () => {
    const base = { endpoint: s3.endpoint, ...S3RVER_CREDENTIALS };
    await assert.rejects(
      createS3Backend({ ...base, bucket: 'no-such-bucket' }, { name: 'tier-x' }),
      (e: KvtierError) => e.code === 'KVT_CONFIG' && e.message.includes('no-such-bucket'),
    );
    const made = await createS3Backend(
      { ...base, bucket: 'made-by-test', createBucket: true },
      { name: 'tier-y' },
    );
    try {
      assert.equal(made.kind, 's3');
      assert.equal(
        await made.put(randomNamespace(), randomHash(), { tokens: 1, data: Buffer.from('y') }),
        'stored',
      );
    } finally {
      await made.close();
    }
  });

  test('options: defaults, and messages naming the bad option', () => {
    const r = resolveS3BackendOptions({ bucket: 'b', endpoint: 'http://127.0.0.1:9000' });
    assert.equal(r.region, 'us-east-1');
    assert.equal(r.forcePathStyle, true);
    assert.equal(r.keyPrefix, 'kvtier/');
    assert.equal(r.concurrency, 32);
    assert.equal(r.timeoutMs, 5000);
    assert.equal(r.credentials, undefined);
    assert.equal(resolveS3BackendOptions({ bucket: 'b' }).forcePathStyle, false);
    assert.throws(
      () => resolveS3BackendOptions({ bucket: 'b', concurrency: 0 }),
      /concurrency must be an integer in \[1, 1024\], got 0/,
    );
    assert.throws(
      () => resolveS3BackendOptions({ bucket: 'b', accessKeyId: 'k' }),
      /accessKeyId and secretAccessKey must be given together/,
    );
    assert.throws(() => resolveS3BackendOptions({ bucket: 'b', endpoint: 'nope' }), /endpoint/);
    assert.throws(
      () => s3OptionsFromConfig({ bucket: 'b', colour: 'red' }, 'remote'),
      (e: KvtierError) =>
        e.code === 'KVT_CONFIG' && e.message.includes('"remote"') && e.message.includes('colour'),
    );
    assert.throws(
      () => s3OptionsFromConfig({ bucket: 'b', timeoutMs: -1 }, 'remote'),
      (e: KvtierError) => e.code === 'KVT_CONFIG' && /tier "remote": timeoutMs/.test(e.message),
    );
  });

  test('capabilities: shared, persistent, no pins, no eviction', () => {
    const b = backend({ maxChunkBytes: 1024 });
    assert.deepEqual(b.capabilities, {
      pinning: false,
      hostMemory: false,
      persistent: true,
      shared: true,
      evicts: false,
      maxChunkBytes: 1024,
    });
  });

  test('a payload over maxChunkBytes is dropped and counted', async () => {
    const b = backend({ maxChunkBytes: 16 });
    const ns = randomNamespace();
    const hash = randomHash();
    assert.equal(await b.put(ns, hash, { tokens: 1, data: randomBytes(17) }), 'dropped');
    assert.equal(b.stats().droppedPuts, 1);
    assert.equal(await exists(`kvtier/${ns}/${hash}`), false);
  });
});

describe('s3 readBody', () => {
  const body = (pieces: Buffer[]) => ({
    async *[Symbol.asyncIterator]() {
      for (const p of pieces) yield p;
    },
    transformToByteArray: async () => new Uint8Array(Buffer.concat(pieces)),
  });
  const bytes = randomBytes(CHUNK_HEADER_BYTES + 5000);
  const pieces = [bytes.subarray(0, 100), bytes.subarray(100, 3000), bytes.subarray(3000)];

  test('fills one buffer of Content-Length and checksums from crcFrom as it reads', async () => {
    const r = await readBody(body(pieces), bytes.length, bytes.length, CHUNK_HEADER_BYTES);
    assert.deepEqual(Buffer.from(r.bytes), bytes);
    if (r.crc32c !== undefined) {
      assert.equal(r.crc32c, crc32c(bytes.subarray(CHUNK_HEADER_BYTES)));
    }
  });

  test('a body short of or past its Content-Length is a transfer error, not an object', async () => {
    for (const length of [bytes.length + 1, bytes.length - 1]) {
      await assert.rejects(
        readBody(body(pieces), length, 2 * bytes.length, CHUNK_HEADER_BYTES),
        (err: unknown) => isKvtierError(err) && err.code === 'KVT_BACKEND',
      );
    }
  });

  test('an unknown or oversized length is collected by the SDK', async () => {
    for (const length of [undefined, bytes.length]) {
      const r = await readBody(body(pieces), length, bytes.length - 1, CHUNK_HEADER_BYTES);
      assert.deepEqual(Buffer.from(r.bytes), bytes);
      assert.equal(r.crc32c, undefined);
    }
  });
});
