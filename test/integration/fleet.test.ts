/**
 * Sidecars sharing one tier, for real (docs/fleet.md): three `kvtier serve` processes, each with
 * its own host-memory tier, over one Redis Cluster (three real `redis-server` masters) and one S3
 * bucket (s3rver). An engine process on sidecar A saves; the engine on sidecar B finds and loads
 * the chunks byte-exact. Eviction and CLEAR behave as docs/fleet.md says (each node evicts its own
 * host memory; CLEAR empties the shared tiers for every node but only the host memory of the node
 * that received it); namespaces and salts keep tenants apart across nodes; and a sidecar killed
 * in the middle of writes loses nothing it acknowledged (both shared tiers are read back by
 * verifying readers in this process). Every server this starts dies with the test process.
 */
import assert from 'node:assert/strict';
import { randomBytes, randomInt } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { ChunkHash, StorageBackend } from '../../src/backends/core/types.ts';
import { RedisBackend } from '../../src/backends/redis/redis-backend.ts';
import { S3Backend } from '../../src/backends/s3/s3-backend.ts';
import { chunkHash } from '../../src/hashing/chunk-hash.ts';
import { hashChunks, hashToHex, packHashes, tokenCounts } from '../../src/hashing/chunk-hasher.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { chunkBytes, DurableLedger, type WrittenChunk } from '../support/durability.ts';
import {
  blockContents,
  CHUNK_TOKENS,
  type EngineResult,
  type LoadJob,
  type SaveJob,
} from '../support/engine-process.ts';
import { runEngineJob } from '../support/engine-runner.ts';
import { freeTcpPort, randomHashes, randomNamespace, withDeadline } from '../support/fixtures.ts';
import { type RedisCluster, startRedisCluster } from '../support/redis-server.ts';
import { type S3Harness, S3RVER_CREDENTIALS, startS3 } from '../support/s3-server.ts';
import { type SidecarProcess, startSidecarProcess } from '../support/sidecar-process.ts';

const KEY_PREFIX = 'fleet/';
const dir = mkdtempSync(join(tmpdir(), 'kvtier-fleet-'));

interface Node {
  name: string;
  proc: SidecarProcess;
  endpoint: string;
  metricsUrl: string;
  client: LookupClient;
}

let cluster: RedisCluster;
let s3: S3Harness;
const nodes: Node[] = [];
/** Verifying readers of the shared tiers, in this process (not a sidecar's). */
let redisReader: StorageBackend;
let s3Reader: StorageBackend;

function sharedTiers(): Record<string, unknown>[] {
  return [
    {
      name: 'redis',
      type: 'redis',
      cluster: { nodes: cluster.nodes },
      keyPrefix: KEY_PREFIX,
      timeoutMs: 3000,
    },
    {
      name: 's3',
      type: 's3',
      endpoint: s3.endpoint,
      bucket: s3.bucket,
      region: 'us-east-1',
      forcePathStyle: true,
      ...S3RVER_CREDENTIALS,
      timeoutMs: 5000,
    },
  ];
}

async function startNode(name: string, cpuBytes = '2MiB'): Promise<Node> {
  const endpoint = `tcp://127.0.0.1:${await freeTcpPort()}`;
  const proc = await startSidecarProcess(join(dir, `${name}.json`), {
    listen: endpoint,
    metrics: { host: '127.0.0.1', port: 0 },
    logLevel: 'warn',
    tiers: [{ name: 'cpu', type: 'local-cpu', capacityBytes: cpuBytes }, ...sharedTiers()],
  });
  const m = /metrics at (http:\/\/\S+\/metrics)/.exec(proc.output);
  assert.ok(m, proc.output);
  const client = new LookupClient({ endpoint, requestTimeoutMs: 60_000, lookupTimeoutMs: 60_000 });
  return { name, proc, endpoint, metricsUrl: m[1]!, client };
}

before(async () => {
  // Each started service is kept for after() even when the other failed to start (an s3rver
  // left open would keep this file's process alive).
  const [c, s] = await Promise.allSettled([
    startRedisCluster(),
    startS3({ bucket: 'kvtier-fleet' }),
  ]);
  if (c.status === 'fulfilled') cluster = c.value;
  if (s.status === 'fulfilled') s3 = s.value;
  if (c.status === 'rejected') throw c.reason;
  if (s.status === 'rejected') throw s.reason;
  for (const name of ['a', 'b', 'c']) nodes.push(await startNode(name));
  redisReader = new RedisBackend(
    { cluster: { nodes: cluster.nodes }, keyPrefix: KEY_PREFIX, timeoutMs: 3000 },
    { name: 'redis-reader' },
  );
  const s3b = new S3Backend(
    { bucket: s3.bucket, endpoint: s3.endpoint, ...S3RVER_CREDENTIALS, timeoutMs: 5000 },
    { name: 's3-reader' },
  );
  await s3b.start();
  s3Reader = s3b;
});

after(async () => {
  for (const n of nodes) {
    await n.client.close();
    await n.proc.kill();
  }
  await redisReader?.close();
  await s3Reader?.close();
  await s3?.close();
  await cluster?.stop();
  rmSync(dir, { recursive: true, force: true });
});

const node = (name: string): Node => nodes.find((n) => n.name === name)!;

/** Waits until the node's write-through queue is empty (its chunks reached the shared tiers). */
async function drained(n: Node): Promise<void> {
  await withDeadline(
    (async () => {
      for (;;) {
        const s = await n.client.stats();
        if ((s.writeThrough as { depth: number }).depth === 0) return;
        await new Promise((r) => setTimeout(r, 20));
      }
    })(),
    120_000,
    `${n.name}: write-through drain`,
  );
}

function engine(job: SaveJob | LoadJob): Promise<EngineResult> {
  return runEngineJob(job, 60_000);
}

/** Tokens of `hashes` (16 each) a node can give back now, and from which tiers. */
async function lookup(n: Node, ns: string, hashes: readonly string[], prefetch = true) {
  return n.client.lookupAsync(
    `probe-${randomBytes(4).toString('hex')}`,
    hashes.map((h) => Buffer.from(h, 'hex')),
    hashes.map(() => CHUNK_TOKENS),
    { namespaces: [ns], config: { pin: false, prefetch } },
  );
}

async function inShared(ns: string, hash: ChunkHash): Promise<[boolean, boolean]> {
  const [r, s] = await Promise.all([
    redisReader.batchedGet(ns, [hash]),
    s3Reader.batchedGet(ns, [hash]),
  ]);
  return [r.get(hash) != null, s.get(hash) != null];
}

describe('sidecars sharing one Redis Cluster and one S3 bucket', { timeout: 300_000 }, () => {
  it('an engine on A saves; the engine on B finds the chunks and loads them byte-exact', async () => {
    const [a, b, c] = [node('a'), node('b'), node('c')];
    const hashes = randomHashes(5);
    const from = Array.from({ length: 20 }, (_, i) => 3 + i * 2);
    const to = Array.from({ length: 20 }, (_, i) => 60 - i * 2);
    const src = join(dir, 'src.kv');
    const saved = await engine({
      mode: 'save',
      endpoint: a.endpoint,
      kvPath: src,
      engineId: 'engine-a',
      requestId: 'save-1',
      blockIds: from,
      hashes,
    });
    assert.equal(saved.saved, 5);
    await drained(a);
    for (const h of hashes)
      assert.deepEqual(await inShared(saved.namespace, h as ChunkHash), [true, true]);
    // C has never seen them: its answer says they come from the first shared tier.
    const probe = await lookup(c, saved.namespace, hashes, false);
    assert.equal(probe.hitTokens, 0, 'prefetch off: nothing in C’s host memory');
    const onC = await lookup(c, saved.namespace, hashes);
    assert.equal(onC.hitTokens, 5 * CHUNK_TOKENS);
    assert.deepEqual(onC.tiers, [{ tier: 'redis', tokens: 5 * CHUNK_TOKENS }]);

    const dst = join(dir, 'dst.kv');
    const loaded = await engine({
      mode: 'load',
      endpoint: b.endpoint,
      kvPath: dst,
      statePath: join(dir, 'dst.state'),
      engineId: 'engine-b',
      requestId: 'load-1',
      blockIds: to,
      hashes,
    });
    assert.equal(loaded.namespace, saved.namespace, 'same model, same namespace on every node');
    assert.equal(loaded.hitTokens, 5 * CHUNK_TOKENS);
    assert.equal(loaded.loadedTokens, 5 * CHUNK_TOKENS);
    assert.deepEqual(loaded.invalidBlockIds, []);
    const s = readFileSync(src);
    const d = readFileSync(dst);
    for (const [j, blk] of from.entries())
      assert.ok(blockContents(d, to[j]!).equals(blockContents(s, blk)), `block ${blk} → ${to[j]}`);
  });

  it('each node evicts its own host memory; the shared tiers keep the chunks for every node', async () => {
    const [a, b] = [node('a'), node('b')];
    const ns = randomNamespace();
    // 32 chunks of 128 KiB: twice A's 2 MiB host tier.
    const chunks = randomHashes(32).map((hash) => ({ ns, hash, bytes: 128 * 1024 }));
    for (const ch of chunks) await a.client.put(ns, ch.hash, 16, chunkBytes(ch.hash, ch.bytes));
    await drained(a);
    const evicted = ((await a.client.stats()).tiers as { name: string; evictions: number }[])[0]!;
    assert.ok(evicted.evictions > 0, 'A evicted from its host memory');
    // At most 16 of the 32 fit; which went first depends on which were still pinned for their
    // write-through when the space ran out.
    const gone = [];
    for (const ch of chunks)
      if ((await lookup(a, ns, [ch.hash], false)).hitTokens === 0) gone.push(ch);
    assert.ok(gone.length >= 16, `${gone.length} of 32 chunks gone from A’s host memory`);
    const first = gone[0]!;
    for (const ch of [first, chunks[31]!]) {
      const got = await b.client.get(ns, ch.hash);
      assert.ok(
        got?.payload.equals(chunkBytes(ch.hash, ch.bytes)),
        'B reads it from a shared tier',
      );
    }
    assert.equal((await lookup(a, ns, [first.hash])).hitTokens, CHUNK_TOKENS, 'and so does A');
  });

  it('CLEAR empties the shared tiers for every node, but only the host memory of the node that got it', async () => {
    const [a, b, c] = [node('a'), node('b'), node('c')];
    const ns = randomNamespace();
    const keep = randomNamespace();
    const [x, y] = randomHashes(2) as [ChunkHash, ChunkHash];
    await a.client.put(ns, x, 16, chunkBytes(x, 4096));
    await a.client.put(keep, y, 16, chunkBytes(y, 4096));
    await drained(a);
    assert.equal((await lookup(b, ns, [x])).hitTokens, CHUNK_TOKENS, 'B prefetched x');
    const epochB = (await b.client.ping()).epoch;

    await a.client.clear([ns]);
    assert.deepEqual(await inShared(ns, x), [false, false], 'gone from Redis and S3');
    assert.deepEqual(await inShared(keep, y), [true, true], 'another namespace is untouched');
    assert.equal((await lookup(a, ns, [x])).hitTokens, 0, 'A cannot load it');
    assert.equal((await lookup(c, ns, [x])).hitTokens, 0, 'C cannot either');
    assert.equal(
      (await lookup(b, ns, [x], false)).hitTokens,
      CHUNK_TOKENS,
      'B still holds its own copy in host memory: CLEAR is not sent to other nodes',
    );
    assert.equal((await b.client.ping()).epoch, epochB, 'B’s epoch did not move');
    await b.client.clear([ns]);
    assert.equal((await lookup(b, ns, [x])).hitTokens, 0, 'a CLEAR on B drops it there');
  });

  it('namespaces and salts keep tenants apart across nodes', async () => {
    const [a, b] = [node('a'), node('b')];
    // Two models (namespaces) store the same hash with different bytes.
    const [ns1, ns2] = [randomNamespace(), randomNamespace()];
    const h = randomHashes(1)[0]!;
    const [p1, p2] = [randomBytes(8192), randomBytes(8192)];
    await a.client.put(ns1, h, 16, p1);
    await a.client.put(ns2, h, 16, p2);
    await drained(a);
    assert.ok((await b.client.get(ns1, h))?.payload.equals(p1));
    assert.ok((await b.client.get(ns2, h))?.payload.equals(p2));
    // Two tenants (salts) send the same tokens: their hashes differ, so neither finds the other's.
    const tokens = Array.from({ length: 64 }, () => randomInt(0, 32_000));
    const tenantA = hashChunks(tokens, { chunkSize: 16, salt: 'tenant-a' });
    const tenantB = hashChunks(tokens, { chunkSize: 16, salt: 'tenant-b' });
    const ns = randomNamespace();
    for (const ch of tenantA) await a.client.put(ns, hashToHex(ch.hash), 16, randomBytes(2048));
    await drained(a);
    const ask = (chunks: typeof tenantA) =>
      b.client.lookupAsync(
        `salt-${randomBytes(4).toString('hex')}`,
        packHashes(chunks),
        tokenCounts(chunks),
        {
          namespaces: [ns],
          config: { pin: false },
        },
      );
    assert.equal((await ask(tenantA)).hitTokens, 64, 'tenant A finds its prefix on node B');
    assert.equal((await ask(tenantB)).hitTokens, 0, 'tenant B finds nothing of it');
  });

  it('a sidecar killed in the middle of writes loses nothing it acknowledged', async () => {
    const victim = await startNode('victim');
    nodes.push(victim);
    const [b, c] = [node('b'), node('c')];
    const ns = randomNamespace();
    // Acknowledged = answered `stored`, then a checkpoint saw the write-through queue empty and
    // the tier lost nothing since the previous one: for Redis and for S3.
    const ledgers = [new DurableLedger({ tier: 'redis' }), new DurableLedger({ tier: 's3' })];
    const sent: WrittenChunk[] = [];
    let killed = false;
    let killer: NodeJS.Timeout | undefined;
    for (const l of ledgers) await l.checkpoint(victim.client, victim.metricsUrl);
    while (!killed) {
      const batch = Array.from({ length: randomInt(4, 16) }, () => ({
        ns,
        hash: chunkHash(randomBytes(32).toString('hex')),
        bytes: randomInt(4096, 64 * 1024),
      }));
      sent.push(...batch);
      const outcomes = await Promise.allSettled(
        batch.map((ch) => victim.client.put(ch.ns, ch.hash, 16, chunkBytes(ch.hash, ch.bytes))),
      );
      outcomes.forEach((o, i) => {
        if (o.status === 'fulfilled' && o.value === 'stored' && !killed)
          for (const l of ledgers) l.answered(batch[i]!);
      });
      if (killed) break;
      for (const l of ledgers)
        await l.checkpoint(victim.client, victim.metricsUrl).catch(() => false);
      if (ledgers[0]!.confirmed.size > 0 && ledgers[1]!.confirmed.size > 0)
        killer ??= setTimeout(
          () => {
            killed = true;
            // Closing the client fails what it still waits for at once.
            void victim.proc.kill('SIGKILL').then(() => victim.client.close());
          },
          randomInt(0, 400),
        );
    }
    clearTimeout(killer);
    await victim.proc.exited;
    for (const l of ledgers) l.crashed();
    const acked = [...ledgers[0]!.confirmed.values()].filter((ch) =>
      ledgers[1]!.confirmed.has(`${ch.ns}/${ch.hash}`),
    );
    assert.ok(acked.length > 0);
    for (const ch of acked) {
      const want = chunkBytes(ch.hash, ch.bytes);
      for (const reader of [redisReader, s3Reader]) {
        const got = (await reader.batchedGet(ch.ns, [ch.hash])).get(ch.hash);
        assert.ok(
          got?.data !== undefined && Buffer.from(got.data).equals(want),
          `${reader.name} ${ch.hash}`,
        );
      }
      assert.ok((await b.client.get(ch.ns, ch.hash))?.payload.equals(want), 'B serves it');
    }
    // Whatever was sent and not acknowledged: its bytes or a miss, never anything else.
    let unconfirmedPresent = 0;
    for (const ch of sent) {
      const got = await c.client.get(ch.ns, ch.hash);
      if (got === null) continue;
      assert.ok(
        got.payload.equals(chunkBytes(ch.hash, ch.bytes)),
        `C served other bytes for ${ch.hash}`,
      );
      unconfirmedPresent++;
    }
    console.log(
      `fleet: killed a sidecar after ${sent.length} PUTs: ${acked.length} acknowledged in both shared tiers, all served byte-exact by the other nodes; ${unconfirmedPresent - acked.length} more present, none torn`,
    );
  });
});
