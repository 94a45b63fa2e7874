/**
 * Snapshots list the shared tiers from their stores (docs/events.md): a subscriber that joins
 * late learns what a shared tier holds, written by this sidecar or another over the same
 * directory; chunks that landed in a shared tier just before a SIGKILL, whose events a follower
 * never got, are in the snapshot it takes when it sees the restart; a listing bound cuts the
 * snapshot short and its end marker names the tier. Real sidecars (one a `kvtier serve` child),
 * real ZMQ sockets, a real directory.
 */
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { FsBackend } from '../../src/backends/fs/fs-backend.ts';
import type { TierConfig } from '../../src/backends/registry.ts';
import { defaultConfig, type KvtierConfig } from '../../src/config/config.ts';
import { resolveEventsOptions } from '../../src/event-stream/events-options.ts';
import type { ChunkHash } from '../../src/hashing/chunk-hash.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { Sidecar } from '../../src/sidecar.ts';
import { silentLogger } from '../../src/util/log.ts';
import { ReplayClient, StreamFollower } from '../support/event-subscriber.ts';
import {
  freeTcpPort,
  randomHashes,
  randomNamespace,
  randomPayload,
  withDeadline,
} from '../support/fixtures.ts';
import { startSidecarProcess } from '../support/sidecar-process.ts';

const dir = mkdtempSync(join(tmpdir(), 'kvtier-events-shared-'));
after(() => rmSync(dir, { recursive: true, force: true }));

function config(share: string, snapshotScanMaxChunks?: number): KvtierConfig {
  const tiers: TierConfig[] = [
    { name: 'cpu', type: 'local-cpu', options: { capacityBytes: 16 * 1024 * 1024 } },
    { name: 'fs', type: 'fs', options: { path: share } },
  ];
  return {
    ...defaultConfig(),
    listen: 'tcp://127.0.0.1:*',
    metrics: null,
    tiers,
    logLevel: 'silent',
    events: resolveEventsOptions({
      endpoint: 'tcp://127.0.0.1:*',
      heartbeatMs: 50,
      ...(snapshotScanMaxChunks !== undefined ? { snapshotScanMaxChunks } : {}),
    }),
  };
}

async function start(cfg: KvtierConfig) {
  const sidecar = await Sidecar.start({ config: cfg, processMetrics: false, log: silentLogger });
  const client = new LookupClient({ endpoint: sidecar.server.endpoint, requestTimeoutMs: 60_000 });
  return { sidecar, client };
}

/** The hashes a snapshot's `stored` events name for (ns, tier), and its end marker. */
async function snapshotOf(replayEndpoint: string, ns: string, tier: string) {
  const r = new ReplayClient(replayEndpoint);
  try {
    const { messages, end } = await r.snapshot(ns);
    const seen = new Set<string>();
    for (const m of messages)
      for (const ev of m.events) {
        if (ev[0] !== 'stored' || ev[2] !== tier) continue;
        assert.equal(ev[3], 'SHARED');
        const packed = Buffer.from(ev[4] as Uint8Array);
        for (let i = 0; i < packed.length; i += 32)
          seen.add(packed.subarray(i, i + 32).toString('hex'));
      }
    return { seen, end: end as [string, number, string, number, string[]] };
  } finally {
    r.close();
  }
}

/** Resolves once the directory holds every chunk of `hashes` (an instance of its own reads it). */
async function landed(share: string, ns: string, hashes: readonly ChunkHash[]): Promise<void> {
  const fs = await FsBackend.open({ path: share, timeoutMs: 10_000 }, { name: 'probe' });
  try {
    await withDeadline(
      (async () => {
        while ((await fs.batchedContains(ns, hashes)) < hashes.length)
          await new Promise((r) => setTimeout(r, 20));
      })(),
      60_000,
      'the chunks never landed in the shared directory',
    );
  } finally {
    await fs.close();
  }
}

describe('snapshots list the shared tiers', { timeout: 300_000 }, () => {
  it('a late subscriber of one sidecar learns what another wrote to the shared directory', async () => {
    const share = join(dir, 'late');
    mkdirSync(share);
    const a = await start(config(share));
    const b = await start(config(share));
    try {
      const ns = randomNamespace();
      const hashes = randomHashes(30);
      for (const h of hashes) await a.client.put(ns, h, 16, randomPayload(4096));
      await a.sidecar.storage.writeQueue.idle();
      await landed(share, ns, hashes);
      // B never wrote them and its stream never named them; its snapshot lists them anyway.
      const { seen, end } = await snapshotOf(b.sidecar.events!.replayEndpoint!, ns, 'fs');
      assert.deepEqual([...seen].sort(), [...hashes].sort());
      assert.equal(end[0], 'end');
      assert.deepEqual(end[4], [], 'every scanned tier listed whole');
      // A's own snapshot lists them once per tier: host memory from its index, fs from the store.
      const own = await snapshotOf(a.sidecar.events!.replayEndpoint!, ns, 'fs');
      assert.equal(own.seen.size, 30);
    } finally {
      await Promise.all([a.client.close(), b.client.close()]);
      await Promise.all([a.sidecar.close(), b.sidecar.close()]);
    }
  });

  it('a listing bound cuts the snapshot short and the end marker names the tier', async () => {
    const share = join(dir, 'bound');
    mkdirSync(share);
    const a = await start(config(share, 10));
    try {
      const ns = randomNamespace();
      const hashes = randomHashes(25);
      for (const h of hashes) await a.client.put(ns, h, 16, randomPayload(1024));
      await a.sidecar.storage.writeQueue.idle();
      await landed(share, ns, hashes);
      const { seen, end } = await snapshotOf(a.sidecar.events!.replayEndpoint!, ns, 'fs');
      assert.equal(seen.size, 10);
      for (const h of seen) assert.ok(hashes.includes(h as ChunkHash));
      assert.deepEqual(end[4], ['fs']);
    } finally {
      await a.client.close();
      await a.sidecar.close();
    }
  });

  it('chunks that landed in the shared tier before a SIGKILL reach a follower after the restart', async () => {
    const share = join(dir, 'kill');
    mkdirSync(share);
    const [listen, pub, rep] = [await freeTcpPort(), await freeTcpPort(), await freeTcpPort()];
    const file = join(dir, 'kill.json');
    const cfg = {
      listen: `tcp://127.0.0.1:${listen}`,
      metrics: null,
      logLevel: 'info',
      tiers: [
        { name: 'cpu', type: 'local-cpu', capacityBytes: '16MiB' },
        { name: 'fs', type: 'fs', path: share },
      ],
      storage: { epochFile: join(dir, 'kill-epoch') },
      events: {
        endpoint: `tcp://127.0.0.1:${pub}`,
        replayEndpoint: `tcp://127.0.0.1:${rep}`,
        heartbeatMs: 50,
      },
    };
    let proc = await startSidecarProcess(file, cfg);
    const f = new StreamFollower(`tcp://127.0.0.1:${pub}`, `tcp://127.0.0.1:${rep}`);
    const client = new LookupClient({
      endpoint: `tcp://127.0.0.1:${listen}`,
      requestTimeoutMs: 60_000,
    });
    try {
      await f.resync();
      const first = f.instance;
      // The follower reads nothing from here on: every event of these writes is lost to it.
      f.pause();
      const ns = randomNamespace();
      const hashes = randomHashes(20);
      for (const h of hashes) await client.put(ns, h, 16, randomPayload(4096));
      await landed(share, ns, hashes);
      await proc.kill('SIGKILL');
      proc = await startSidecarProcess(file, cfg);
      f.resume();
      await withDeadline(
        (async () => {
          for (;;) {
            await f.next();
            await f.pump();
            if (f.instance !== first && f.inTier(ns, 'fs').size === hashes.length) return;
          }
        })(),
        60_000,
        'the follower never learned the shared chunks after the restart',
      );
      assert.deepEqual([...f.inTier(ns, 'fs')].sort(), [...hashes].sort());
      assert.equal(f.inTier(ns, 'cpu').size, 0, 'host memory did not survive the kill');
    } finally {
      await f.close();
      await client.close();
      await proc.kill('SIGKILL');
    }
  });
});
