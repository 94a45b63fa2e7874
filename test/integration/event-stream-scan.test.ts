/**
 * The event stream across a restart over a disk store that changed while the sidecar was down:
 * the local-disk tier's background start-up scan sweeps the journal's entries whose files are
 * gone and indexes files the journal does not name, and both reach the stream (`removed` with
 * `corrupt`, `stored`), so a follower that took its snapshot before the scan ended still ends
 * with the tier's picture. Real sidecar, real files, real ZMQ sockets.
 */
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, readdirSync, rmSync, unlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { defaultConfig, type KvtierConfig } from '../../src/config/config.ts';
import { resolveEventsOptions } from '../../src/event-stream/events-options.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { Sidecar } from '../../src/sidecar.ts';
import { silentLogger } from '../../src/util/log.ts';
import { ReplayClient, StreamFollower } from '../support/event-subscriber.ts';
import { randomHashes, randomNamespace, randomPayload, withDeadline } from '../support/fixtures.ts';

const dir = mkdtempSync(join(tmpdir(), 'kvtier-events-scan-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const config = (path: string): KvtierConfig => ({
  ...defaultConfig(),
  listen: 'tcp://127.0.0.1:*',
  metrics: null,
  tiers: [
    { name: 'cpu', type: 'local-cpu', options: { capacityBytes: 16 * 1024 * 1024 } },
    { name: 'disk', type: 'local-disk', options: { path, capacityBytes: 64 * 1024 * 1024 } },
  ],
  logLevel: 'silent',
  events: resolveEventsOptions({ endpoint: 'tcp://127.0.0.1:*', heartbeatMs: 50 }),
});

/** The object file of `hash` under `root` (any namespace, any shard). */
function objectFile(root: string, hash: string): string {
  for (const e of readdirSync(root, { recursive: true, withFileTypes: true })) {
    if (e.isFile() && e.name === `${hash}.kvc`) return join(e.parentPath, e.name);
  }
  throw new Error(`no object file for ${hash} under ${root}`);
}

async function start(cfg: KvtierConfig) {
  const sidecar = await Sidecar.start({ config: cfg, processMetrics: false, log: silentLogger });
  const client = new LookupClient({ endpoint: sidecar.server.endpoint, requestTimeoutMs: 30_000 });
  return { sidecar, client };
}

describe('the event stream over a restarted disk tier', { timeout: 300_000 }, () => {
  it('reports what the start-up scan sweeps and indexes; a follower ends with the index', async () => {
    const root = join(dir, 'store');
    const ns = randomNamespace();
    const hashes = randomHashes(8);
    let { sidecar, client } = await start(config(root));
    for (const h of hashes)
      assert.equal(await client.put(ns, h, 16, randomPayload(8192)), 'stored');
    await sidecar.storage.writeQueue.idle();
    await client.close();
    await sidecar.close();

    // While it is down: one object goes, one appears under a name the journal never saw (same
    // shard: the scan indexes by name; a read would find it corrupt).
    const gone = hashes[0]!;
    unlinkSync(objectFile(root, gone));
    const src = objectFile(root, hashes[1]!);
    const found = `${hashes[1]!.slice(0, 60)}${hashes[1]!.endsWith('0000') ? 'ffff' : '0000'}`;
    copyFileSync(src, join(src, '..', `${found}.kvc`));

    ({ sidecar, client } = await start(config(root)));
    const events = sidecar.events!;
    const f = new StreamFollower(events.endpoint, events.replayEndpoint!);
    const r = new ReplayClient(events.replayEndpoint!);
    try {
      const onDisk = () =>
        new Set(
          [...(sidecar.storage.tiers[1]!.listChunks?.(ns) ?? [])].map(([, h]) => h as string),
        );
      await withDeadline(
        (async () => {
          for (;;) {
            const tiers = (await client.stats()).tiers as {
              name: string;
              indexComplete?: boolean;
            }[];
            if (tiers.find((t) => t.name === 'disk')?.indexComplete === true) return;
            await new Promise((res) => setTimeout(res, 50));
          }
        })(),
        120_000,
        'the disk scan never finished',
      );
      const truth = onDisk();
      assert.ok(!truth.has(gone), 'the scan swept the entry whose file was gone');
      assert.ok(truth.has(found), 'the scan indexed the file the journal did not name');
      assert.equal(truth.size, hashes.length);

      // The stream says so: stored for the found file, removed (corrupt) for the swept entry.
      events.log.flush();
      const said = (await r.replay(1)).flatMap((m) => m.events);
      const names = (ev: readonly unknown[]) => {
        const packed = ev[4] as Buffer;
        return Array.from({ length: packed.length / 32 }, (_, i) =>
          packed.subarray(i * 32, i * 32 + 32).toString('hex'),
        );
      };
      assert.ok(
        said.some((ev) => ev[0] === 'stored' && ev[2] === 'disk' && names(ev).includes(found)),
        `no stored event for the found file: ${JSON.stringify(said.map((e) => e.slice(0, 3)))}`,
      );
      assert.ok(
        said.some(
          (ev) =>
            ev[0] === 'removed' &&
            ev[2] === 'disk' &&
            ev[5] === 'corrupt' &&
            names(ev).includes(gone),
        ),
        'no removed event for the swept entry',
      );

      await withDeadline(
        (async () => {
          for (;;) {
            await f.next();
            await f.pump();
            const seen = f.inTier(ns, 'disk');
            if (
              f.lastSeq === events.log.lastSeq &&
              seen.size === truth.size &&
              [...truth].every((h) => seen.has(h))
            )
              return;
          }
        })(),
        60_000,
        "the follower's picture of the disk never matched its index",
      );
    } finally {
      r.close();
      await f.close();
      await client.close();
      await sidecar.close();
    }
  });
});
