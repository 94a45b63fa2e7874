/**
 * Crash safety of the durable tiers: a sidecar process with a LocalDisk and an fs tier, both
 * under `fsync: always`, takes PUTs of chunks of 4 KiB to 256 KiB and is killed with SIGKILL at
 * random moments, several times, and restarted on the same directories. After every restart:
 * every chunk durably acknowledged before any kill (test/support/durability.ts) is served
 * byte-exact, no temp file is left, and GET never returns bytes other than the chunk's. Objects
 * torn by hand (truncated, a flipped payload byte, cut inside the header) are misses, and removed.
 */
import assert from 'node:assert/strict';
import { randomBytes, randomInt } from 'node:crypto';
import {
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  truncateSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { objectPath, TEMP_SUFFIX } from '../../src/backends/files/file-store.ts';
import { CHUNK_HEADER_BYTES } from '../../src/backends/format/chunk-format.ts';
import { chunkHash } from '../../src/hashing/chunk-hash.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { chunkBytes, DurableLedger, type WrittenChunk } from '../support/durability.ts';
import { freeTcpPort } from '../support/fixtures.ts';
import { type SidecarProcess, startSidecarProcess } from '../support/sidecar-process.ts';

const ROUNDS = 4;
const SHARD = 2;

function files(dir: string): string[] {
  try {
    return readdirSync(dir, { recursive: true, encoding: 'utf8' }).map((f) => join(dir, f));
  } catch {
    return [];
  }
}

const temps = (dir: string) => files(dir).filter((f) => f.endsWith(TEMP_SUFFIX));

describe('crash safety under fsync: always', { timeout: 300_000 }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'kvtier-crash-'));
  const diskDir = join(dir, 'disk');
  const fsDir = join(dir, 'fs');
  // An fs tier's directory is shared storage that serve never creates.
  mkdirSync(fsDir);
  const ns = randomBytes(16).toString('hex');
  let sidecar: SidecarProcess | undefined;
  after(async () => {
    await sidecar?.kill();
    rmSync(dir, { recursive: true, force: true });
  });

  async function start(): Promise<{ client: LookupClient; metricsUrl: string }> {
    const endpoint = `tcp://127.0.0.1:${await freeTcpPort()}`;
    sidecar = await startSidecarProcess(join(dir, 'kvtier.json'), {
      listen: endpoint,
      metrics: { host: '127.0.0.1', port: 0 },
      logLevel: 'warn',
      tiers: [
        { name: 'cpu', type: 'local-cpu', capacityBytes: '16MiB' },
        {
          name: 'disk',
          type: 'local-disk',
          path: diskDir,
          capacityBytes: '1GiB',
          fsync: 'always',
          shardChars: SHARD,
          health: false,
        },
        // One writer owns this directory, so its temp files may be swept at once.
        { name: 'fs', type: 'fs', path: fsDir, fsync: 'always', staleTempMs: 1, health: false },
      ],
    });
    const m = /metrics at (http:\/\/\S+\/metrics)/.exec(sidecar.output);
    assert.ok(m, sidecar.output);
    const client = new LookupClient({ endpoint, requestTimeoutMs: 10_000 });
    await untilIndexed(client);
    return { client, metricsUrl: m[1]! };
  }

  /**
   * LocalDisk serves at once and indexes its directory in the background, removing temp files on
   * the way; the checks after a restart are about what the tier holds once that scan is over.
   */
  async function untilIndexed(client: LookupClient): Promise<void> {
    const deadline = Date.now() + 120_000;
    for (;;) {
      const tiers = (await client.stats()).tiers as { name: string; indexComplete?: boolean }[];
      const disk = tiers.find((t) => t.name === 'disk');
      assert.ok(disk, JSON.stringify(tiers));
      if (disk.indexComplete === true) return;
      assert.ok(Date.now() < deadline, `the disk scan is not over: ${JSON.stringify(disk)}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  async function expectServed(client: LookupClient, c: WrittenChunk): Promise<void> {
    const got = await client.get(c.ns, c.hash);
    assert.ok(got !== null, `acknowledged chunk ${c.hash} (${c.bytes} bytes) is gone`);
    assert.ok(got.payload.equals(chunkBytes(c.hash, c.bytes)), `chunk ${c.hash} came back changed`);
  }

  it('keeps every acknowledged chunk byte-exact across SIGKILLs, cleans temp files, serves nothing torn', async () => {
    const ledger = new DurableLedger({ tier: 'disk' });
    const sent: WrittenChunk[] = [];
    let tempsSeenAfterKill = 0;
    for (let round = 0; round < ROUNDS; round++) {
      const { client, metricsUrl } = await start();
      try {
        assert.deepEqual(temps(diskDir), [], 'LocalDisk removes temp files at start');
        assert.deepEqual(temps(fsDir), [], 'fs removes stale temp files at start');
        for (const c of ledger.confirmed.values()) await expectServed(client, c);
        // Whatever was sent and not confirmed: its bytes or a miss, never anything else.
        for (const c of sent.slice(-50)) {
          const got = await client.get(c.ns, c.hash);
          if (got !== null) assert.ok(got.payload.equals(chunkBytes(c.hash, c.bytes)));
        }
        assert.equal(await ledger.checkpoint(client, metricsUrl), true);

        // The kill comes at a random moment once this round has had a chunk acknowledged.
        let killed = false;
        let killer: NodeJS.Timeout | undefined;
        const confirmedBefore = ledger.confirmed.size;
        const armKiller = () => {
          killer ??= setTimeout(
            () => {
              killed = true;
              void sidecar!.kill('SIGKILL').then(() => client.close());
            },
            randomInt(0, 700),
          );
        };
        while (!killed) {
          const batch = Array.from({ length: randomInt(4, 24) }, () => ({
            ns,
            hash: chunkHash(randomBytes(32).toString('hex')),
            bytes: randomInt(4096, 256 * 1024),
          }));
          sent.push(...batch);
          const outcomes = await Promise.allSettled(
            batch.map((c) => client.put(c.ns, c.hash, 16, chunkBytes(c.hash, c.bytes))),
          );
          outcomes.forEach((o, i) => {
            if (o.status === 'fulfilled' && o.value === 'stored' && !killed)
              ledger.answered(batch[i]!);
          });
          if (killed) break;
          await ledger.checkpoint(client, metricsUrl).catch(() => false);
          if (ledger.confirmed.size > confirmedBefore) armKiller();
        }
        clearTimeout(killer);
        await sidecar!.exited;
        ledger.crashed();
        tempsSeenAfterKill += temps(diskDir).length + temps(fsDir).length;
      } finally {
        await client.close();
      }
    }
    assert.ok(ledger.confirmed.size >= ROUNDS, 'every round acknowledged chunks before its kill');
    console.log(
      `crash-safety: ${ROUNDS} SIGKILLs, ${sent.length} PUTs sent, ${ledger.confirmed.size} durably acknowledged, ${ledger.unconfirmed} unconfirmed, ${tempsSeenAfterKill} temp files left by the kills`,
    );

    // Tear three acknowledged objects by hand, in both durable tiers, and leave a stray temp file.
    const [a, b, c] = [...ledger.confirmed.values()];
    assert.ok(a && b && c);
    for (const root of [diskDir, fsDir]) {
      const shard = root === diskDir ? SHARD : 2;
      const pa = objectPath(root, ns, a.hash, shard);
      truncateSync(pa, CHUNK_HEADER_BYTES + Math.floor(a.bytes / 2));
      const pb = objectPath(root, ns, b.hash, shard);
      const buf = readFileSync(pb);
      buf[buf.length - 1 - randomInt(0, b.bytes)]! ^= 0x5a;
      writeFileSync(pb, buf);
      truncateSync(objectPath(root, ns, c.hash, shard), 10);
      writeFileSync(`${pa}.4242.abcdef012345${TEMP_SUFFIX}`, randomBytes(1000));
    }
    const { client } = await start();
    try {
      assert.deepEqual(temps(diskDir), []);
      assert.deepEqual(temps(fsDir), []);
      for (const torn of [a, b, c]) {
        assert.equal(await client.get(torn.ns, torn.hash), null, `torn ${torn.hash} is a miss`);
        ledger.confirmed.delete(`${torn.ns}/${torn.hash}`);
      }
      for (const ch of ledger.confirmed.values()) await expectServed(client, ch);
      const stats = await client.stats();
      const tiers = stats.tiers as { name: string; corruptObjects?: number }[];
      assert.ok(
        (tiers.find((t) => t.name === 'disk')?.corruptObjects ?? 0) >= 2,
        JSON.stringify(tiers),
      );
      // The corrupt objects were removed: still misses, and gone from the directories.
      for (const torn of [a, b, c]) assert.equal(await client.get(torn.ns, torn.hash), null);
    } finally {
      await client.close();
    }
  });
});
