/**
 * Fleet figures (docs/fleet.md):
 * 1. The event stream under a save-heavy run: a `kvtier serve` process (host memory over a disk
 *    tier) takes SAVEs of small chunks (4 KiB, the most events per byte) from 4 pipelined data-plane
 *    clients, once without and once with the event stream; a subscriber counts what the stream
 *    sends. The raw limit is the same run without events: the ratio is the save rate kept.
 * 2. Cross-node loads: sidecar A saves 64 chunks of 1 MiB through to one Redis Cluster (3 real
 *    masters) and one S3 bucket (s3rver); sidecar B (host memory over Redis and S3) and sidecar C
 *    (host memory over S3 only) look them up and load them into their engines' KV files. The raw
 *    limit is a plain client reading the same stored objects (ioredis cluster `getBuffer`, SDK
 *    `GetObject`) in the same run.
 * 3. Cross-node loads through the peer tier, with no shared store (bench/peer.ts): the raw limit is
 *    the same bytes over ZMQ between two processes in the same run.
 *   npm run bench:fleet          (KVTIER_BENCH_QUICK=1: one round of 3 s per save run instead of
 *                                 three interleaved rounds of 10 s)
 * KVTIER_BENCH_FLEET_PARTS picks parts (default `events,cross,peer`). Prints a table per part and
 * writes bench/results/fleet.json.
 */
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { GetObjectCommand } from '@aws-sdk/client-s3';
import { Cluster } from 'ioredis';
import * as zmq from 'zeromq';
import { DataPlaneClient } from '../src/data-plane/data-plane-client.ts';
import { LookupClient } from '../src/lookup-client/lookup-client.ts';
import { KV_FILE_BYTES, testRegistration } from '../test/support/engine-process.ts';
import { freeTcpPort } from '../test/support/fixtures.ts';
import { startRedisCluster } from '../test/support/redis-server.ts';
import { S3RVER_CREDENTIALS, startS3 } from '../test/support/s3-server.ts';
import { type SidecarProcess, startSidecarProcess } from '../test/support/sidecar-process.ts';
import { lastCpu, type PeerLoadRow, peerLoads, printPeerLoads } from './peer.ts';
import { printTable, writeResults } from './support/child.ts';
import { BIG_KV, bigModel, engineOn, loadAll } from './support/cross-node.ts';

const QUICK = process.env.KVTIER_BENCH_QUICK === '1';
const SAVE_SECONDS = QUICK ? 3 : 10;
const ROUNDS = QUICK ? 1 : 3;
/** Cross-node rounds, each with its own 64 chunks; the table shows medians. */
const CROSS_ROUNDS = QUICK ? 3 : 7;
const dir = mkdtempSync(join(tmpdir(), 'kvtier-bench-fleet-'));
/**
 * The loading engines' KV files: in shared memory, as a host-device engine keeps them (a mapped
 * file on disk is written back between rounds, and the next load into it then pays a write fault
 * per page: that, not the tier, was most of a cold LOAD's time).
 */
const engineDir = existsSync('/dev/shm') ? mkdtempSync('/dev/shm/kvtier-bench-fleet-') : dir;
setFlagsFromString('--expose-gc');
const gcNow = runInNewContext('gc') as () => void;
/**
 * Collects this process's garbage before a timed cross-node phase: the raw clients leave tens of
 * MiB of reply buffers behind, and a collection of them landing inside the next phase (the
 * sidecar's lookups and loads wait on this process's event loop) was charged to whoever ran next.
 */
function settled<T>(run: () => Promise<T>): Promise<T> {
  gcNow();
  return run();
}
const MiB = 1024 * 1024;

async function serve(name: string, config: Record<string, unknown>) {
  const listen = `tcp://127.0.0.1:${await freeTcpPort()}`;
  // KVTIER_BENCH_NODE_FLAGS passes flags to the sidecars, e.g. "--cpu-prof --cpu-prof-dir=/tmp/p".
  const flags = (process.env.KVTIER_BENCH_NODE_FLAGS ?? '').split(' ').filter((f) => f !== '');
  const proc = await startSidecarProcess(
    join(dir, `${name}.json`),
    {
      listen,
      metrics: { host: '127.0.0.1', port: 0 },
      logLevel: 'warn',
      ...config,
    },
    120_000,
    flags,
  );
  const metrics = /metrics at (http:\/\/\S+\/metrics)/.exec(proc.output)![1]!;
  const client = new LookupClient({
    endpoint: listen,
    requestTimeoutMs: 60_000,
    lookupTimeoutMs: 60_000,
  });
  return { proc, listen, metrics, client };
}

async function drained(client: LookupClient): Promise<void> {
  for (;;) {
    const s = await client.stats();
    if ((s.writeThrough as { depth: number }).depth === 0) return;
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Waits until the host-memory tier committed its pages (`prefault: true`), as a serving node's has. */
async function prefaulted(client: LookupClient): Promise<void> {
  for (;;) {
    const s = await client.stats();
    const cpu = (s.tiers as Array<{ capacityBytes?: number; prefaultedBytes?: number }>)[0]!;
    if ((cpu.prefaultedBytes ?? 0) >= (cpu.capacityBytes ?? 0)) return;
    await new Promise((r) => setTimeout(r, 20));
  }
}

function metric(text: string, name: string): number {
  const line = text.split('\n').find((l) => l.startsWith(`${name} `));
  return line === undefined ? 0 : Number(line.slice(name.length + 1));
}

interface SaveRow {
  events: boolean;
  chunksPerS: number;
  mibPerS: number;
  batchesPerS: number;
  chunkEventsPerS: number;
  streamKiBPerS: number;
  bufferBytes: number;
  rssMiB: number;
}

/** One save-heavy run (see the module doc). */
async function saveRun(events: boolean): Promise<SaveRow> {
  const side = await serve(`save-${events}`, {
    tiers: [
      { name: 'cpu', type: 'local-cpu', capacityBytes: '64MiB' },
      {
        name: 'disk',
        type: 'local-disk',
        path: join(dir, `disk-${events}`),
        capacityBytes: '256MiB',
        // The stream is measured, not the disk: no fsync per chunk.
        fsync: 'none',
      },
    ],
    ...(events ? { events: { endpoint: 'tcp://127.0.0.1:*' } } : {}),
  });
  let streamBytes = 0;
  let sub: zmq.Subscriber | undefined;
  let reading: Promise<void> | undefined;
  if (events) {
    const info = (await side.client.ping()).events as { endpoint: string };
    sub = new zmq.Subscriber({ linger: 0 });
    sub.connect(info.endpoint);
    sub.subscribe();
    reading = (async () => {
      try {
        for await (const frames of sub!) for (const f of frames) streamBytes += f.length;
      } catch {}
    })();
    await new Promise((r) => setTimeout(r, 300));
  }
  const savers = await Promise.all(
    [0, 1, 2, 3].map(async (i) => {
      const kv = join(dir, `save-${events}-${i}.kv`);
      writeFileSync(kv, randomBytes(KV_FILE_BYTES));
      const dp = new DataPlaneClient({ endpoint: side.listen, requestTimeoutMs: 30_000 });
      await dp.register(testRegistration(kv, `saver-${i}`));
      return dp;
    }),
  );
  const blocks = Array.from({ length: 64 }, (_, i) => i);
  let chunks = 0;
  const t0 = performance.now();
  const until = t0 + SAVE_SECONDS * 1000;
  const m0 = await (await fetch(side.metrics)).text();
  const bytes0 = streamBytes;
  await Promise.all(
    savers.map(async (dp, i) => {
      for (let n = 0; performance.now() < until; n++) {
        const r = await dp.save({
          requestId: `s${i}-${n}`,
          blockIds: blocks,
          chunkHashes: Array.from({ length: 16 }, () => randomBytes(32)),
        });
        chunks += r.saved;
        await dp.requestFinished(`s${i}-${n}`, 'finished');
      }
    }),
  );
  await drained(side.client);
  const secs = (performance.now() - t0) / 1000;
  await new Promise((r) => setTimeout(r, 200));
  const m1 = await (await fetch(side.metrics)).text();
  const rss = side.proc.rssBytes();
  for (const dp of savers) await dp.close();
  sub?.close();
  await reading;
  await side.client.close();
  await side.proc.kill('SIGTERM');
  const d = (name: string) => metric(m1, name) - metric(m0, name);
  return {
    events,
    chunksPerS: chunks / secs,
    mibPerS: (chunks * 4096) / MiB / secs,
    batchesPerS: d('kvtier_events_batches_total') / secs,
    chunkEventsPerS: d('kvtier_events_chunks_total') / secs,
    streamKiBPerS: (streamBytes - bytes0) / 1024 / secs,
    bufferBytes: metric(m1, 'kvtier_events_buffer_bytes'),
    rssMiB: rss / MiB,
  };
}

async function crossNode() {
  const [cluster, s3] = await Promise.all([
    startRedisCluster(),
    startS3({ bucket: 'bench-fleet' }),
  ]);
  // Generous deadlines: on a loaded machine a 1 s timeout would open the tiers' breakers.
  const redis = {
    name: 'redis',
    type: 'redis',
    cluster: { nodes: cluster.nodes },
    keyPrefix: 'b/',
    timeoutMs: 20_000,
  };
  const s3tier = {
    name: 's3',
    type: 's3',
    endpoint: s3.endpoint,
    bucket: s3.bucket,
    region: 'us-east-1',
    forcePathStyle: true,
    ...S3RVER_CREDENTIALS,
    timeoutMs: 30_000,
  };
  // Host memory committed at start, as docs/configuration.md recommends for a serving host: the
  // loads measure the tiers, not first-touch page faults.
  const cpu = { name: 'cpu', type: 'local-cpu', capacityBytes: '256MiB', prefault: true };
  // A keeps every round's chunks in host memory until they are written through.
  const a = await serve('a', { tiers: [{ ...cpu, capacityBytes: '1GiB' }, redis, s3tier] });
  const b = await serve('b', { tiers: [cpu, redis, s3tier] });
  const c = await serve('c', { tiers: [cpu, s3tier] });
  for (const side of [a, b, c]) await prefaulted(side.client);
  const procs: SidecarProcess[] = [a.proc, b.proc, c.proc];
  try {
    const kv = join(dir, 'a.kv');
    writeFileSync(kv, randomBytes(BIG_KV));
    const dp = new DataPlaneClient({ endpoint: a.listen, requestTimeoutMs: 60_000 });
    const reg = await dp.register(bigModel(kv, 'saver'));
    // One prompt of 64 chunks (4 groups of 16) per round: every round loads chunks that are new
    // to B and C.
    const sets = Array.from({ length: CROSS_ROUNDS }, () =>
      Array.from({ length: 4 }, () => Array.from({ length: 16 }, () => randomBytes(32))),
    );
    for (const [r, groups] of sets.entries()) {
      for (const [g, hashes] of groups.entries()) {
        await dp.save({
          requestId: `r${r}g${g}`,
          blockIds: Array.from({ length: 64 }, (_, i) => i),
          chunkHashes: hashes,
        });
        await dp.requestFinished(`r${r}g${g}`, 'finished');
      }
    }
    await dp.close();
    await drained(a.client);
    const ns = reg.namespace;
    const bytes = 64 * MiB;
    const rc = new Cluster(cluster.nodes, { lazyConnect: false });
    const sc = s3.client();
    const rawRedis = async (keys: string[]) => {
      const t0 = performance.now();
      for (const h of keys) await rc.getBuffer(`b/${ns}:${h}`);
      return (performance.now() - t0) / 1000;
    };
    const rawS3 = async (keys: string[]) => {
      const t0 = performance.now();
      for (const h of keys) {
        const got = await sc.send(
          new GetObjectCommand({ Bucket: s3.bucket, Key: `kvtier/${ns}/${h}` }),
        );
        await got.Body!.transformToByteArray();
      }
      return (performance.now() - t0) / 1000;
    };
    // The same objects as the sidecar asks for them: each group of 16 at once.
    const rawRedisGroups = async (groups: Buffer[][]) => {
      const t0 = performance.now();
      for (const g of groups)
        await Promise.all(g.map((h) => rc.getBuffer(`b/${ns}:${h.toString('hex')}`)));
      return (performance.now() - t0) / 1000;
    };
    const rawS3Groups = async (groups: Buffer[][]) => {
      const t0 = performance.now();
      for (const g of groups)
        await Promise.all(
          g.map(async (h) => {
            const got = await sc.send(
              new GetObjectCommand({ Bucket: s3.bucket, Key: `kvtier/${ns}/${h.toString('hex')}` }),
            );
            await got.Body!.transformToByteArray();
          }),
        );
      return (performance.now() - t0) / 1000;
    };
    type Load = Awaited<ReturnType<typeof loadAll>>;
    const runs: Array<{
      b: Load;
      again: Load;
      c: Load;
      redis: number;
      s3: number;
      redisGroups: number;
      s3Groups: number;
      /** CPU ms: sidecar B's and C's processes in their loads, this process in the raw 16-at-once reads. */
      cpu: { b: number; c: number; redisGroups: number; s3Groups: number };
    }> = [];
    const engB = await engineOn(engineDir, b.listen, 'b');
    const engC = await engineOn(engineDir, c.listen, 'c');
    for (const [r, groups] of sets.entries()) {
      const keys = groups.flat().map((h) => h.toString('hex'));
      // Who reads a round's objects first alternates: the first read of an object may be colder.
      const rawFirst = r % 2 === 0;
      const redisRaw = rawFirst ? await settled(() => rawRedis(keys)) : 0;
      const cpuB = processCpuMs(b.proc.pid);
      const onB = await settled(() => loadAll(engB, b.client, `b${r}`, groups));
      const bMs = processCpuMs(b.proc.pid) - cpuB;
      const againB = await settled(() => loadAll(engB, b.client, `b${r}again`, groups));
      const s3Raw = rawFirst ? await settled(() => rawS3(keys)) : 0;
      const cpuC = processCpuMs(c.proc.pid);
      const onC = await settled(() => loadAll(engC, c.client, `c${r}`, groups));
      const cMs = processCpuMs(c.proc.pid) - cpuC;
      const redis = rawFirst ? redisRaw : await settled(() => rawRedis(keys));
      const s3Seq = rawFirst ? s3Raw : await settled(() => rawS3(keys));
      let cpu0 = ownCpuMs();
      const redisGroups = await settled(() => rawRedisGroups(groups));
      const redisGroupsMs = ownCpuMs() - cpu0;
      cpu0 = ownCpuMs();
      const s3Groups = await settled(() => rawS3Groups(groups));
      const s3GroupsMs = ownCpuMs() - cpu0;
      runs.push({
        b: onB,
        again: againB,
        c: onC,
        redis,
        s3: s3Seq,
        redisGroups,
        s3Groups,
        cpu: { b: bMs, c: cMs, redisGroups: redisGroupsMs, s3Groups: s3GroupsMs },
      });
    }
    rc.disconnect();
    await engB.dp.close();
    await engC.dp.close();
    const gbps = (sec: number) => bytes / sec / 1e9;
    const med = (xs: number[]) => [...xs].sort((x, y) => x - y)[xs.length >> 1]!;
    const row = (
      what: string,
      pick: (x: (typeof runs)[number]) => Load,
      raw?: (x: (typeof runs)[number]) => number,
      rawGroups?: (x: (typeof runs)[number]) => number,
      cpu?: (x: (typeof runs)[number]) => { sidecarMs: number; rawGroupsMs: number },
    ) => {
      const seconds = med(runs.map((x) => pick(x).seconds));
      const rawS = raw === undefined ? Number.NaN : med(runs.map(raw));
      const rawG = rawGroups === undefined ? Number.NaN : med(runs.map(rawGroups));
      return {
        what,
        seconds,
        lookupSeconds: med(runs.map((x) => pick(x).lookupSeconds)),
        loadSeconds: med(runs.map((x) => pick(x).loadSeconds)),
        tiers: pick(runs[0]!).tiers,
        ...(cpu === undefined
          ? {}
          : {
              cpuMs: {
                sidecar: med(runs.map((x) => cpu(x).sidecarMs)),
                rawGroups: med(runs.map((x) => cpu(x).rawGroupsMs)),
              },
            }),
        lookupsMs: runs.map((x) => pick(x).lookupSeconds * 1000),
        loadsMs: runs.map((x) => pick(x).loadSeconds * 1000),
        gbps: gbps(seconds),
        raw: gbps(rawS),
        ratio: rawS / seconds,
        ratios: raw === undefined ? [] : runs.map((x) => raw(x) / pick(x).seconds),
        ratiosGroups:
          rawGroups === undefined ? [] : runs.map((x) => rawGroups(x) / pick(x).seconds),
        rawGroups: gbps(rawG),
        ratioGroups: rawG / seconds,
      };
    };
    return [
      row(
        'B: lookup + load (from Redis)',
        (x) => x.b,
        (x) => x.redis,
        (x) => x.redisGroups,
        (x) => ({ sidecarMs: x.cpu.b, rawGroupsMs: x.cpu.redisGroups }),
      ),
      row('B again (host memory)', (x) => x.again),
      row(
        'C: lookup + load (from S3)',
        (x) => x.c,
        (x) => x.s3,
        (x) => x.s3Groups,
        (x) => ({ sidecarMs: x.cpu.c, rawGroupsMs: x.cpu.s3Groups }),
      ),
    ];
  } finally {
    for (const side of [a, b, c]) await side.client.close();
    for (const p of procs) await p.kill('SIGTERM');
    await s3.close();
    await cluster.stop();
  }
}

/** CPU ms that every thread of process `pid` has run so far (/proc schedstat, ns); 0 where unreadable. */
function processCpuMs(pid: number): number {
  try {
    let ns = 0;
    for (const t of readdirSync(`/proc/${pid}/task`))
      ns += Number(readFileSync(`/proc/${pid}/task/${t}/schedstat`, 'utf8').split(' ')[0]);
    return ns / 1e6;
  } catch {
    return 0;
  }
}

/** CPU ms of this process (every thread) so far. */
function ownCpuMs(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
}

/** The run with the median save rate. */
function median(rows: SaveRow[]): SaveRow {
  return [...rows].sort((x, y) => x.chunksPerS - y.chunksPerS)[rows.length >> 1]!;
}

const PARTS = (process.env.KVTIER_BENCH_FLEET_PARTS ?? 'events,cross,peer').split(',');

/** bench/results/fleet.json as the last run left it ({} when absent or unreadable). */
function previousResults(): Record<string, unknown> {
  try {
    return JSON.parse(
      readFileSync(new URL('./results/fleet.json', import.meta.url), 'utf8'),
    ) as Record<string, unknown>;
  } catch {
    return {};
  }
}

try {
  const offs: SaveRow[] = [];
  const ons: SaveRow[] = [];
  if (PARTS.includes('events')) {
    // Interleaved rounds, the median of each kept: a shared machine's noise spreads over both.
    for (let round = 0; round < ROUNDS; round++) {
      offs.push(await saveRun(false));
      ons.push(await saveRun(true));
    }
    const [off, on] = [median(offs), median(ons)];
    const ratios = ons.map((r, i) => (r.chunksPerS / offs[i]!.chunksPerS).toFixed(2)).join(', ');
    console.log(
      `\nEvent stream under a save-heavy run (4 KiB chunks, 4 savers, ${SAVE_SECONDS} s each, median of ${ROUNDS} rounds)`,
    );
    printTable(
      [
        'events',
        'chunks/s',
        'MiB/s',
        'batches/s',
        'chunk events/s',
        'stream KiB/s',
        'window bytes',
        'RSS MiB',
      ],
      [off, on].map((r) => [
        r.events ? 'on' : 'off',
        r.chunksPerS.toFixed(0),
        r.mibPerS.toFixed(1),
        r.batchesPerS.toFixed(0),
        r.chunkEventsPerS.toFixed(0),
        r.streamKiBPerS.toFixed(0),
        r.bufferBytes,
        r.rssMiB.toFixed(0),
      ]),
    );
    console.log(
      `save rate with events / without: ${(on.chunksPerS / off.chunksPerS).toFixed(2)} (per round: ${ratios})`,
    );
  }
  let loads: Awaited<ReturnType<typeof crossNode>> = [];
  if (PARTS.includes('cross')) {
    loads = await crossNode();
    console.log(
      `\nCross-node loads: 64 chunks of 1 MiB saved on A (Redis Cluster + S3), loaded elsewhere (median of ${CROSS_ROUNDS} rounds, each with new chunks; raw: a plain client reading the same objects one after another in the same round)`,
    );
    printTable(
      [
        'where',
        'seconds',
        'lookup s',
        'load s',
        'GB/s',
        'raw GB/s',
        'ratio',
        'per round',
        'raw 16-at-once GB/s',
        'ratio',
        'per round',
        'found in (chunks)',
      ],
      loads.map((l) => [
        l.what,
        l.seconds.toFixed(3),
        l.lookupSeconds.toFixed(3),
        l.loadSeconds.toFixed(3),
        l.gbps.toFixed(3),
        Number.isNaN(l.raw) ? '-' : l.raw.toFixed(3),
        Number.isNaN(l.ratio) ? '-' : l.ratio.toFixed(2),
        l.ratios.map((x) => x.toFixed(2)).join(' '),
        Number.isNaN(l.rawGroups) ? '-' : l.rawGroups.toFixed(3),
        Number.isNaN(l.ratioGroups) ? '-' : l.ratioGroups.toFixed(2),
        l.ratiosGroups.map((x) => x.toFixed(2)).join(' '),
        l.tiers,
      ]),
    );
  }
  for (const l of loads)
    if ('cpuMs' in l && l.cpuMs !== undefined)
      console.log(
        `${l.what}: CPU per 64 MiB, sidecar ${l.cpuMs.sidecar.toFixed(0)} ms; raw 16-at-once client ${l.cpuMs.rawGroups.toFixed(0)} ms (medians)`,
      );
  let peer: PeerLoadRow[] = [];
  if (PARTS.includes('peer')) {
    peer = await peerLoads();
    printPeerLoads(peer);
  }
  // A part not run this time keeps its figures from the file (with the run they came from).
  const before = previousResults();
  const file = await writeResults('fleet.json', {
    quick: QUICK,
    loadAverage: loadavg(),
    parts: PARTS,
    saveRuns: PARTS.includes('events') ? { off: offs, on: ons } : before.saveRuns,
    crossNode: PARTS.includes('cross') ? loads : before.crossNode,
    peer: PARTS.includes('peer') ? { rows: peer, cpuSecondsPerRound: lastCpu } : before.peer,
    ...(PARTS.length < 3 ? { earlierParts: { loadAverage: before.loadAverage } } : {}),
  });
  console.log(`\nwrote ${file}`);
} finally {
  rmSync(dir, { recursive: true, force: true });
  rmSync(engineDir, { recursive: true, force: true });
}
