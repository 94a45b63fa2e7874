/**
 * The sidecar's event stream (docs/events.md) against a real sidecar: real ZMQ sockets, a real
 * disk tier. A follower (test/support/event-subscriber.ts) must end with the picture the tiers'
 * own indexes hold after stores, evictions, removals and CLEAR; a subscriber that stops reading
 * never holds the sidecar up and repairs its gaps from the replay window; a restarted sidecar is
 * seen (new instance, sequence from 1) and followed again from a snapshot.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import * as zmq from 'zeromq';
import type { TierConfig } from '../../src/backends/registry.ts';
import { defaultConfig, type KvtierConfig } from '../../src/config/config.ts';
import {
  type EventsDocument,
  resolveEventsOptions,
} from '../../src/event-stream/events-options.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { Sidecar } from '../../src/sidecar.ts';
import { silentLogger } from '../../src/util/log.ts';
import { ReplayClient, StreamFollower } from '../support/event-subscriber.ts';
import {
  freeTcpPort,
  nextTurn,
  randomHashes,
  randomNamespace,
  randomPayload,
  withDeadline,
} from '../support/fixtures.ts';

const dir = mkdtempSync(join(tmpdir(), 'kvtier-events-'));
after(() => rmSync(dir, { recursive: true, force: true }));

function config(tiers: TierConfig[], events: EventsDocument): KvtierConfig {
  return {
    ...defaultConfig(),
    listen: 'tcp://127.0.0.1:*',
    metrics: null,
    tiers,
    logLevel: 'silent',
    events: resolveEventsOptions({ endpoint: 'tcp://127.0.0.1:*', heartbeatMs: 50, ...events }),
  };
}

const cpu = (capacityBytes: number): TierConfig => ({
  name: 'cpu',
  type: 'local-cpu',
  options: { capacityBytes },
});
const disk = (path: string, capacityBytes = 64 * 1024 * 1024): TierConfig => ({
  name: 'disk',
  type: 'local-disk',
  options: { path, capacityBytes },
});

async function start(cfg: KvtierConfig) {
  const sidecar = await Sidecar.start({ config: cfg, processMetrics: false, log: silentLogger });
  const client = new LookupClient({ endpoint: sidecar.server.endpoint, requestTimeoutMs: 60_000 });
  return { sidecar, client };
}

/** The chunks each tier's own index lists for `ns`. */
function truth(sidecar: Sidecar, ns: string): Map<string, Set<string>> {
  const out = new Map<string, Set<string>>();
  for (const t of sidecar.storage.tiers)
    out.set(t.name, new Set([...(t.listChunks?.(ns) ?? [])].map(([, h]) => h as string)));
  return out;
}

/** Pumps the follower until its picture of `ns` equals the tiers' indexes (or fails after 60 s). */
async function converge(f: StreamFollower, sidecar: Sidecar, ns: string, what: string) {
  const same = () => {
    for (const [tier, set] of truth(sidecar, ns)) {
      const seen = f.inTier(ns, tier);
      if (seen.size !== set.size || [...set].some((h) => !seen.has(h))) return false;
    }
    return true;
  };
  await withDeadline(
    (async () => {
      for (;;) {
        await f.next();
        await f.pump();
        if (same() && f.lastSeq === sidecar.events!.log.lastSeq) return;
      }
    })(),
    60_000,
    `${what}: the follower's picture never matched the tiers`,
  );
}

describe('the event stream', { timeout: 300_000 }, () => {
  it('reports stores, evictions, removals and CLEAR per tier; a follower ends with the tiers’ picture', async () => {
    // The disk holds 20 chunks of 64 KiB (and their headers): it evicts too.
    const { sidecar, client } = await start(
      config([cpu(1024 * 1024), disk(join(dir, 'd1'), 20 * 65_600)], {}),
    );
    const events = sidecar.events!;
    const f = new StreamFollower(events.endpoint, events.replayEndpoint!);
    try {
      const info = (await client.ping()).events as Record<string, unknown>;
      assert.equal(info.endpoint, events.endpoint);
      assert.equal(info.replayEndpoint, events.replayEndpoint);
      assert.equal(info.instance, events.log.instance);
      const ns = randomNamespace();
      // 64 KiB chunks: the 1 MiB CPU tier holds 16, so the later ones evict the earlier ones.
      const hashes = randomHashes(30);
      for (const h of hashes)
        assert.equal(await client.put(ns, h, 16, randomPayload(65536)), 'stored');
      await sidecar.storage.writeQueue.idle();
      await converge(f, sidecar, ns, 'after 30 puts');
      assert.ok(f.inTier(ns, 'cpu').size < 30, 'the CPU tier evicted some');
      assert.ok(f.inTier(ns, 'disk').size < 30, 'the disk tier evicted some');
      const onDisk = f.inTier(ns, 'disk').size;
      // What some tier holds: the union of the tiers' own indexes (which chunks each kept
      // depends on the write-through's pace, which a busy machine changes).
      const held = new Set([...truth(sidecar, ns).values()].flatMap((set) => [...set]));
      assert.deepEqual(f.reachable(ns), held);
      assert.ok(held.size >= onDisk);

      const other = randomNamespace();
      await client.put(other, randomHashes(1)[0]!, 16, randomPayload(4096));
      await sidecar.storage.writeQueue.idle();
      await sidecar.storage.tiers[1]!.remove(ns, hashes.slice(-5));
      await converge(f, sidecar, ns, 'after a removal from the disk');
      assert.equal(f.inTier(ns, 'disk').size, onDisk - 5);

      await client.clear([ns]);
      await converge(f, sidecar, ns, 'after CLEAR of one namespace');
      assert.equal(f.reachable(ns).size, 0);
      assert.equal(f.reachable(other).size, 1, 'the other namespace was not cleared');
      await client.clear();
      await converge(f, sidecar, other, 'after CLEAR of every namespace');
      assert.equal(f.reachable(other).size, 0);
      assert.equal(events.sendDropped, 0);
    } finally {
      await f.close();
      await client.close();
      await sidecar.close();
    }
  });

  it('a subscriber that stops reading never holds the sidecar up; it repairs its gaps from the window', async () => {
    // ipc: small socket buffers, so a subscriber that reads nothing overflows soon.
    const endpoint = `ipc://${join(dir, 'slow.sock')}`;
    const { sidecar, client } = await start(
      config(
        [{ ...cpu(8 * 1024 * 1024), options: { capacityBytes: 8 * 1024 * 1024, pageBytes: 4096 } }],
        {
          endpoint,
          sendHighWaterMark: 16,
          bufferBatches: 100_000,
          bufferBytes: 256 * 1024 * 1024,
        },
      ),
    );
    const events = sidecar.events!;
    const fast = new StreamFollower(events.endpoint, events.replayEndpoint!);
    const slow = new StreamFollower(events.endpoint, events.replayEndpoint!, {
      receiveHighWaterMark: 16,
    });
    try {
      const ns = randomNamespace();
      for (const f of [fast, slow])
        await withDeadline(
          f.next().then(() => f.pump()),
          60_000,
          'first heartbeat',
        );
      // In step with the stream; from now on it reads nothing.
      slow.pause();
      const payload = Buffer.alloc(4096, 7);
      const before = events.log.lastSeq;
      // 150 turns of 200 stores each (and as many evictions, past the first 2048): one batch
      // of ~13 KiB per turn, ~2 MiB in all, while the slow subscriber reads nothing.
      for (let turn = 0; turn < 150; turn++) {
        const outcomes = await Promise.all(
          randomHashes(200).map((h) => sidecar.storage.put(ns, h, { tokens: 16, data: payload })),
        );
        assert.ok(outcomes.every((o) => o === 'stored'));
        await nextTurn();
        await fast.pump();
      }
      assert.ok(events.log.lastSeq - before >= 150, `${events.log.lastSeq - before} batches`);
      await converge(fast, sidecar, ns, 'fast subscriber');
      assert.equal(events.sendDropped, 0, 'the sidecar never refused a batch');
      // Now the slow one reads what reached it, sees the gaps and replays them.
      slow.resume();
      await converge(slow, sidecar, ns, 'slow subscriber');
      assert.equal(slow.reachable(ns).size, sidecar.storage.cpu.stats().chunks);
      console.log(
        `event stream: slow subscriber ${JSON.stringify(slow.counts)}, fast ${JSON.stringify(fast.counts)}`,
      );
      assert.ok(
        slow.counts.messages < fast.counts.messages && slow.counts.gapsRepaired > 0,
        `the slow subscriber lost messages and recovered them: slow ${JSON.stringify(slow.counts)}, fast ${JSON.stringify(fast.counts)}`,
      );
    } finally {
      await fast.close();
      await slow.close();
      await client.close();
      await sidecar.close();
    }
  });

  it('answers replays from the window and says when a gap is older; refuses bad requests', async () => {
    const { sidecar, client } = await start(config([cpu(16 * 1024 * 1024)], { bufferBatches: 3 }));
    const events = sidecar.events!;
    const r = new ReplayClient(events.replayEndpoint!);
    try {
      const ns = randomNamespace();
      for (const h of randomHashes(10)) {
        await client.put(ns, h, 16, randomPayload(1024));
        events.log.flush();
      }
      const last = events.log.lastSeq;
      const got = await r.replay(1);
      assert.deepEqual(
        got.map((m) => m.seq),
        [last - 2, last - 1, last],
        'only the window comes back: the subscriber sees the first is later than it asked',
      );
      assert.ok(got.every((m) => m.instance === events.log.instance));
      assert.deepEqual(await r.replay(last + 1), []);
      const snap = await r.snapshot(ns);
      assert.deepEqual(snap.end, ['end', 1, events.log.instance, last, []]);
      assert.equal(snap.messages[0]!.events.length, 1);
      const bad = (await r.raw([Buffer.from('not a request')])) as unknown[];
      assert.equal(bad[0], 'error');
      // vLLM's replay clients put an empty delimiter frame first: every message of the answer
      // mirrors it, the end marker too (docs/events.md: a DEALER, since a REQ socket would
      // take only the first message of the answer).
      const dealer = new zmq.Dealer({ linger: 0, receiveTimeout: 60_000 });
      try {
        dealer.connect(events.replayEndpoint!);
        const from = Buffer.alloc(8);
        from.writeBigUInt64BE(BigInt(last - 1));
        await dealer.send([Buffer.alloc(0), from]);
        const answer: Buffer[][] = [];
        do answer.push(await dealer.receive());
        while (answer.at(-1)![1]!.readBigUInt64BE(0) !== 0xffff_ffff_ffff_ffffn);
        assert.deepEqual(
          answer.map((m) => [m.length, m[0]!.length, m[1]!.readBigUInt64BE(0)]),
          [
            [3, 0, BigInt(last - 1)],
            [3, 0, BigInt(last)],
            [3, 0, 0xffff_ffff_ffff_ffffn],
          ],
        );
        assert.equal(answer.at(-1)![2]!.length, 0, 'a replay ends with an empty payload');
      } finally {
        dealer.close();
      }
    } finally {
      r.close();
      await client.close();
      await sidecar.close();
    }
  });

  it('a restarted sidecar is seen (new instance, sequence from 1) and followed from a snapshot', async () => {
    const [pub, rep] = [await freeTcpPort(), await freeTcpPort()];
    const cfg = config([cpu(16 * 1024 * 1024), disk(join(dir, 'd2'))], {
      endpoint: `tcp://127.0.0.1:${pub}`,
      replayEndpoint: `tcp://127.0.0.1:${rep}`,
    });
    let { sidecar, client } = await start(cfg);
    const f = new StreamFollower(sidecar.events!.endpoint, sidecar.events!.replayEndpoint!);
    try {
      const ns = randomNamespace();
      for (const h of randomHashes(12)) await client.put(ns, h, 16, randomPayload(8192));
      await sidecar.storage.writeQueue.idle();
      await converge(f, sidecar, ns, 'before the restart');
      const firstInstance = f.instance;
      const seqBefore = f.lastSeq;
      assert.ok(seqBefore > 1);
      await client.close();
      await sidecar.close();

      ({ sidecar, client } = await start(cfg));
      assert.notEqual(sidecar.events!.log.instance, firstInstance);
      await converge(f, sidecar, ns, 'after the restart');
      assert.equal(f.instance, sidecar.events!.log.instance, 'the follower saw the new instance');
      assert.ok(f.lastSeq < seqBefore, 'the sequence started again');
      // A replay from where the follower stood is empty, as "nothing new" would be
      // (docs/events.md): only the instance, on the stream, tells the two apart.
      const r = new ReplayClient(sidecar.events!.replayEndpoint!);
      try {
        assert.deepEqual(await r.replay(seqBefore + 1), []);
      } finally {
        r.close();
      }
      assert.equal(f.inTier(ns, 'cpu').size, 0, 'host memory did not survive');
      assert.equal(f.inTier(ns, 'disk').size, 12, 'the disk tier did, and the snapshot says so');
      assert.ok(f.counts.snapshots >= 2);
    } finally {
      await f.close();
      await client.close();
      await sidecar.close();
    }
  });

  it('a follower resumes from its checkpoint: replays the batches it missed, or takes a snapshot when the checkpoint is stale', async () => {
    const [pub, rep] = [await freeTcpPort(), await freeTcpPort()];
    const cfg = config([cpu(16 * 1024 * 1024), disk(join(dir, 'd3'))], {
      endpoint: `tcp://127.0.0.1:${pub}`,
      replayEndpoint: `tcp://127.0.0.1:${rep}`,
      bufferBatches: 8,
    });
    let { sidecar, client } = await start(cfg);
    const follower = () =>
      new StreamFollower(sidecar.events!.endpoint, sidecar.events!.replayEndpoint!);
    const ns = randomNamespace();
    /** Puts `n` chunks, each sealed as a batch of its own. */
    const puts = async (n: number) => {
      for (const h of randomHashes(n)) {
        await client.put(ns, h, 16, randomPayload(4096));
        await sidecar.storage.writeQueue.idle();
        sidecar.events!.log.flush();
      }
    };
    let f = follower();
    try {
      await puts(3);
      await converge(f, sidecar, ns, 'first follower');
      // Within the window: the resumed follower replays what it missed, no snapshot.
      let saved = f.checkpoint();
      await f.close();
      await puts(2);
      f = follower();
      f.resumeFrom(saved);
      await converge(f, sidecar, ns, 'resumed within the window');
      assert.equal(f.counts.snapshots, 0, 'a checkpoint within the window needs no snapshot');
      assert.ok(f.counts.gapsRepaired >= 1, 'the missed batches came from a replay');
      // Past the window (8 batches kept, 12 sealed since): the checkpoint is stale, a snapshot.
      saved = f.checkpoint();
      await f.close();
      await puts(12);
      f = follower();
      f.resumeFrom(saved);
      await converge(f, sidecar, ns, 'resumed past the window');
      assert.equal(f.counts.snapshots, 1, 'the window moved on: one snapshot');
      // Across a restart of the sidecar: another instance, a snapshot.
      saved = f.checkpoint();
      await f.close();
      await client.close();
      await sidecar.close();
      ({ sidecar, client } = await start(cfg));
      f = follower();
      f.resumeFrom(saved);
      await converge(f, sidecar, ns, 'resumed across a restart');
      assert.equal(f.counts.snapshots, 1, 'another instance: one snapshot');
      assert.equal(f.instance, sidecar.events!.log.instance);
      assert.equal(f.inTier(ns, 'disk').size, 17, 'every chunk put is on disk');
    } finally {
      await f.close();
      await client.close();
      await sidecar.close();
    }
  });
});
