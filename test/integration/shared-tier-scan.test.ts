/**
 * A shared tier lists what its store holds with `scanChunks`, whoever wrote it: chunks one
 * instance stored are in another instance's scan (a second sidecar over the same Redis, bucket
 * or directory), by namespace or all, in pages of one namespace; removed chunks and keys that are
 * not chunks are not. Real redis-server, s3rver and directories.
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { PutObjectCommand } from '@aws-sdk/client-s3';
import { Redis } from 'ioredis';
import { SCAN_PAGE_CHUNKS } from '../../src/backends/core/chunk-pages.ts';
import type { ChunkHash, NamespaceId, StorageBackend } from '../../src/backends/core/types.ts';
import { FsBackend } from '../../src/backends/fs/fs-backend.ts';
import { S3Backend } from '../../src/backends/s3/s3-backend.ts';
import { randomHashes, randomNamespace } from '../support/fixtures.ts';
import { type RedisServer, redisContractSubject, startRedis } from '../support/redis-server.ts';
import { S3RVER_CREDENTIALS, startS3 } from '../support/s3-server.ts';

interface Shared {
  a: StorageBackend;
  b: StorageBackend;
  /** Writes a key beside the chunks that is not a chunk key. */
  stray(): Promise<void>;
  cleanup(): Promise<void>;
}

let redis: Promise<RedisServer> | undefined;
after(async () => (await redis)?.stop());

const SUBJECTS: Record<string, () => Promise<Shared>> = {
  redis: async () => {
    redis ??= startRedis();
    const srv = await redis;
    const subject = await redisContractSubject({ kind: 'standalone', server: srv });
    const b = await subject.reopen!();
    return {
      a: subject.backend,
      b,
      stray: async () => {
        const raw = new Redis({ port: srv.port });
        await raw.set('not-a-chunk', 'x');
        raw.disconnect();
      },
      cleanup: async () => {
        await b.close();
        await subject.cleanup();
      },
    };
  },
  s3: async () => {
    const s3 = await startS3();
    const open = async () => {
      const b = new S3Backend(
        { bucket: s3.bucket, endpoint: s3.endpoint, ...S3RVER_CREDENTIALS, timeoutMs: 30_000 },
        { name: 's3' },
      );
      await b.start();
      return b;
    };
    const [a, b] = [await open(), await open()];
    return {
      a,
      b,
      stray: async () => {
        await s3
          .client()
          .send(new PutObjectCommand({ Bucket: s3.bucket, Key: 'kvtier/README', Body: 'x' }));
      },
      cleanup: async () => {
        await Promise.all([a.close(), b.close()]);
        await s3.close();
      },
    };
  },
  fs: async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-scan-'));
    const open = () => FsBackend.open({ path: dir, timeoutMs: 10_000 }, { name: 'fs' });
    const [a, b] = [await open(), await open()];
    return {
      a,
      b,
      stray: () => writeFile(join(dir, 'notes.txt'), 'x'),
      cleanup: async () => {
        await Promise.all([a.close(), b.close()]);
        await rm(dir, { recursive: true, force: true });
      },
    };
  },
};

/** Every (ns, hash) the scan yields, checking each page holds one namespace and ≤ the bound. */
async function scanned(b: StorageBackend, ns?: NamespaceId): Promise<Set<string>> {
  const pages = b.scanChunks?.(ns, {});
  assert.ok(pages, `${b.kind} cannot be scanned`);
  const out = new Set<string>();
  for await (const p of pages) {
    assert.ok(p.hashes.length > 0 && p.hashes.length <= SCAN_PAGE_CHUNKS);
    if (ns !== undefined) assert.equal(p.ns, ns);
    for (const h of p.hashes) out.add(`${p.ns}/${h}`);
  }
  return out;
}

const put = (b: StorageBackend, ns: NamespaceId, hashes: readonly ChunkHash[]) =>
  Promise.all(hashes.map((h) => b.put(ns, h, { tokens: 16, data: Buffer.alloc(512, 7) })));

for (const [kind, make] of Object.entries(SUBJECTS)) {
  describe(`scanChunks on a shared ${kind} tier`, () => {
    it('lists what either instance stored, by namespace or all, and not what was removed', async () => {
      const s = await make();
      try {
        const [ns1, ns2] = [randomNamespace(), randomNamespace()];
        const fromA = randomHashes(20);
        const fromB = randomHashes(15);
        const other = randomHashes(5);
        await put(s.a, ns1, fromA);
        await put(s.b, ns1, fromB);
        await put(s.b, ns2, other);
        await s.stray();
        await s.a.remove(ns1, fromA.slice(0, 3));
        const want1 = [...fromA.slice(3), ...fromB].map((h) => `${ns1}/${h}`).sort();
        const want2 = other.map((h) => `${ns2}/${h}`).sort();
        // Each instance sees the other's writes.
        assert.deepEqual([...(await scanned(s.a, ns1))].sort(), want1);
        assert.deepEqual([...(await scanned(s.b, ns1))].sort(), want1);
        assert.deepEqual([...(await scanned(s.a, ns2))].sort(), want2);
        const all = await scanned(s.a);
        for (const k of [...want1, ...want2]) assert.ok(all.has(k), `${k} missing`);
        assert.equal(all.size, want1.length + want2.length);
      } finally {
        await s.cleanup();
      }
    });
  });
}
