/**
 * The peer tier's cross-node load (docs/fleet.md, Peers): sidecar A (host memory and a peer tier)
 * saves 64 chunks of 1 MiB homed on A (by rendezvous over A and B, so A keeps them and sends
 * nothing); sidecar B (host memory and a peer tier) looks them up and loads them into its engine's
 * KV file, in groups of 16: B's peer tier asks A with PEER_CONTAINS and PEER_GET, verifies every
 * chunk's CRC-32C and brings them into its host memory, from where the LOAD copies them. No
 * Redis, S3 or shared filesystem. The raw limit is the same bytes over ZMQ between two processes
 * in the same run: a DEALER asking a ROUTER in another process for 4 frames of 16 MiB, one after
 * another (one per group, as B asks A for each group's 16 chunks in one request).
 *   npm run bench:peer          (KVTIER_BENCH_QUICK=1: 3 rounds instead of 7)
 * Also part `peer` of `npm run bench:fleet`. Prints a table and writes bench/results/peer.json.
 */
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as zmq from 'zeromq';
import { RendezvousPlacement } from '../src/backends/peer/peer-placement.ts';
import { DataPlaneClient } from '../src/data-plane/data-plane-client.ts';
import { chunkHashFromBytes } from '../src/hashing/chunk-hash.ts';
import { LookupClient } from '../src/lookup-client/lookup-client.ts';
import { freeTcpPort } from '../test/support/fixtures.ts';
import { startSidecarProcess } from '../test/support/sidecar-process.ts';
import { printTable, spawnReady, stopChild, writeResults } from './support/child.ts';
import { BIG_KV, bigModel, engineOn, loadAll } from './support/cross-node.ts';

const QUICK = process.env.KVTIER_BENCH_QUICK === '1';
/** Rounds, each with 64 new chunks; the table shows medians. */
const ROUNDS = QUICK ? 3 : 7;
const MiB = 1024 * 1024;
const GROUP = 16;

/** One row of the table. */
export interface PeerLoadRow {
  what: string;
  seconds: number;
  lookupSeconds: number;
  loadSeconds: number;
  gbps: number;
  rawGbps: number;
  ratio: number;
  ratios: number[];
  tiers: string;
}

async function serve(dir: string, name: string, listen: string, tiers: Record<string, unknown>[]) {
  // KVTIER_BENCH_NODE_FLAGS passes flags to the sidecars too, e.g. "--cpu-prof --cpu-prof-dir=/tmp/p".
  const flags = (process.env.KVTIER_BENCH_NODE_FLAGS ?? '').split(' ').filter((f) => f !== '');
  const proc = await startSidecarProcess(
    join(dir, `${name}.json`),
    { listen, metrics: null, logLevel: 'warn', tiers },
    120_000,
    flags,
  );
  const client = new LookupClient({
    endpoint: listen,
    requestTimeoutMs: 60_000,
    lookupTimeoutMs: 60_000,
  });
  return { proc, listen, client };
}

/** Polls `client`'s STATS until `ok`; throws naming `what` after 5 minutes. */
async function until(
  what: string,
  client: LookupClient,
  ok: (s: Record<string, unknown>) => boolean,
) {
  const deadline = Date.now() + 300_000;
  while (!ok(await client.stats())) {
    if (Date.now() > deadline) throw new Error(`bench:peer: ${what} did not happen in 5 minutes`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** CPU seconds (user + system) process `pid` has used so far, from /proc; 0 where unreadable. */
function cpuSeconds(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) / 100;
  } catch {
    return 0;
  }
}

/** CPU seconds of this process so far. */
const ownCpu = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
};

/** Seconds to fetch `groups` frames of `bytes` each, one after another, from the raw source. */
async function rawFetch(endpoint: string, groups: number, bytes: number): Promise<number> {
  const d = new zmq.Dealer({ linger: 0, receiveTimeout: 120_000 });
  d.connect(endpoint);
  const ask = Buffer.alloc(4);
  ask.writeUInt32LE(bytes);
  // A first small exchange: the connection is up before the clock starts, as B's is.
  const one = Buffer.alloc(4);
  one.writeUInt32LE(1);
  await d.send(one);
  await d.receive();
  const t0 = performance.now();
  for (let g = 0; g < groups; g++) {
    await d.send(ask);
    const [frame] = await d.receive();
    if (frame!.length !== bytes) throw new Error(`raw source sent ${frame!.length} bytes`);
  }
  const s = (performance.now() - t0) / 1000;
  d.close();
  return s;
}

/** Runs the benchmark (see the module comment); returns its rows. */
export async function peerLoads(): Promise<PeerLoadRow[]> {
  const dir = mkdtempSync(join(tmpdir(), 'kvtier-bench-peer-'));
  const raw = await spawnReady(
    fileURLToPath(new URL('./support/raw-zmq-source.ts', import.meta.url)),
  );
  const [la, lb] = [
    `tcp://127.0.0.1:${await freeTcpPort()}`,
    `tcp://127.0.0.1:${await freeTcpPort()}`,
  ];
  const peers = [
    { name: 'a', endpoint: la },
    { name: 'b', endpoint: lb },
  ];
  // Host memory committed at start, as on a serving node; A keeps every round's chunks.
  const cpu = (bytes: string) => ({
    name: 'cpu',
    type: 'local-cpu',
    capacityBytes: bytes,
    prefault: true,
  });
  const peer = (self: string) => ({ name: 'peers', type: 'peer', self, peers, timeoutMs: 20_000 });
  const a = await serve(dir, 'a', la, [cpu('1GiB'), peer('a')]);
  const b = await serve(dir, 'b', lb, [cpu('256MiB'), peer('b')]);
  try {
    for (const side of [a, b])
      await until('host memory prefault', side.client, (s) => {
        const t = (s.tiers as { capacityBytes?: number; prefaultedBytes?: number }[])[0]!;
        return (t.prefaultedBytes ?? 0) >= (t.capacityBytes ?? 0);
      });
    const kv = join(dir, 'a.kv');
    writeFileSync(kv, randomBytes(BIG_KV));
    const dp = new DataPlaneClient({ endpoint: a.listen, requestTimeoutMs: 60_000 });
    const reg = await dp.register(bigModel(kv, 'saver'));
    const ns = reg.namespace;
    const placement = new RendezvousPlacement(['a', 'b'], 1);
    const onA = () => {
      for (;;) {
        const h = randomBytes(32);
        if (placement.homes(ns, chunkHashFromBytes(h))[0] === 'a') return h;
      }
    };
    const sets = Array.from({ length: ROUNDS }, () =>
      Array.from({ length: 64 / GROUP }, () => Array.from({ length: GROUP }, onA)),
    );
    for (const [r, groups] of sets.entries())
      for (const [g, hashes] of groups.entries()) {
        await dp.save({
          requestId: `r${r}g${g}`,
          blockIds: Array.from({ length: 64 }, (_, i) => i),
          chunkHashes: hashes,
        });
        await dp.requestFinished(`r${r}g${g}`, 'finished');
      }
    await dp.close();
    await until(
      'write-through drain',
      a.client,
      (s) => (s.writeThrough as { depth: number }).depth === 0,
    );
    const engB = await engineOn(dir, b.listen, 'b');
    type Load = Awaited<ReturnType<typeof loadAll>>;
    type Cpu = { a: number; b: number; bench: number; raw: number };
    const runs: { b: Load; again: Load; raw: number; cpuPeer: Cpu; cpuRaw: Cpu }[] = [];
    const cpuNow = (): Cpu => ({
      a: cpuSeconds(a.proc.pid),
      b: cpuSeconds(b.proc.pid),
      bench: ownCpu(),
      raw: cpuSeconds(raw.child.pid!),
    });
    const spent = (x: Cpu, y: Cpu): Cpu => ({
      a: y.a - x.a,
      b: y.b - x.b,
      bench: y.bench - x.bench,
      raw: y.raw - x.raw,
    });
    const measureRaw = async (groups: number) => {
      const c0 = cpuNow();
      const seconds = await rawFetch(raw.endpoint, groups, GROUP * MiB);
      return { seconds, cpu: spent(c0, cpuNow()) };
    };
    for (const [r, groups] of sets.entries()) {
      // Which goes first alternates: the first touch of a round's bytes may be colder.
      const rawFirst = r % 2 === 0;
      const early = rawFirst ? await measureRaw(groups.length) : undefined;
      const c0 = cpuNow();
      const onB = await loadAll(engB, b.client, `b${r}`, groups);
      const cpuPeer = spent(c0, cpuNow());
      const again = await loadAll(engB, b.client, `b${r}again`, groups);
      const rawRun = early ?? (await measureRaw(groups.length));
      runs.push({ b: onB, again, raw: rawRun.seconds, cpuPeer, cpuRaw: rawRun.cpu });
    }
    await engB.dp.close();
    const bytes = 64 * MiB;
    const med = (xs: number[]) => [...xs].sort((x, y) => x - y)[xs.length >> 1]!;
    const row = (what: string, pick: (x: (typeof runs)[number]) => Load, withRaw: boolean) => {
      const seconds = med(runs.map((x) => pick(x).seconds));
      const rawS = med(runs.map((x) => x.raw));
      return {
        what,
        seconds,
        lookupSeconds: med(runs.map((x) => pick(x).lookupSeconds)),
        loadSeconds: med(runs.map((x) => pick(x).loadSeconds)),
        gbps: bytes / seconds / 1e9,
        rawGbps: withRaw ? bytes / rawS / 1e9 : Number.NaN,
        ratio: withRaw ? rawS / seconds : Number.NaN,
        ratios: withRaw ? runs.map((x) => x.raw / pick(x).seconds) : [],
        tiers: pick(runs[0]!).tiers,
      };
    };
    // CPU seconds per round, medians: the peer path in A, B and the engine's client (this
    // process); the raw transfer in its source and its receiver (this process).
    const cpu = {
      peer: {
        a: med(runs.map((x) => x.cpuPeer.a)),
        b: med(runs.map((x) => x.cpuPeer.b)),
        engine: med(runs.map((x) => x.cpuPeer.bench)),
      },
      raw: {
        source: med(runs.map((x) => x.cpuRaw.raw)),
        receiver: med(runs.map((x) => x.cpuRaw.bench)),
      },
    };
    lastCpu = cpu;
    return [
      row('B: lookup + load (from A, peer tier)', (x) => x.b, true),
      row('B again (host memory)', (x) => x.again, false),
    ];
  } finally {
    for (const side of [a, b]) {
      await side.client.close();
      await side.proc.kill('SIGTERM');
    }
    await stopChild(raw.child);
    rmSync(dir, { recursive: true, force: true });
  }
}

/** CPU seconds per round of the last {@link peerLoads} run (medians), for the report. */
export let lastCpu:
  | { peer: { a: number; b: number; engine: number }; raw: { source: number; receiver: number } }
  | undefined;

/** Prints the rows as the benchmark's table. */
export function printPeerLoads(rows: readonly PeerLoadRow[]): void {
  console.log(
    `\nCross-node loads through the peer tier: 64 chunks of 1 MiB saved on A, loaded on B in groups of ${GROUP} (median of ${ROUNDS} rounds, each with new chunks; raw: the same bytes as 4 frames of 16 MiB over ZMQ between two processes, in the same round)`,
  );
  printTable(
    [
      'where',
      'seconds',
      'lookup s',
      'load s',
      'GB/s',
      'raw ZMQ GB/s',
      'ratio',
      'per round',
      'found in (chunks)',
    ],
    rows.map((l) => [
      l.what,
      l.seconds.toFixed(3),
      l.lookupSeconds.toFixed(3),
      l.loadSeconds.toFixed(3),
      l.gbps.toFixed(3),
      Number.isNaN(l.rawGbps) ? '-' : l.rawGbps.toFixed(3),
      Number.isNaN(l.ratio) ? '-' : l.ratio.toFixed(2),
      l.ratios.map((x) => x.toFixed(2)).join(' '),
      l.tiers,
    ]),
  );
  if (lastCpu !== undefined) {
    const { peer, raw } = lastCpu;
    const ms = (x: number) => `${(x * 1000).toFixed(0)} ms`;
    console.log(
      `CPU per round of 64 MiB (medians): peer path ${ms(peer.a + peer.b + peer.engine)} (A ${ms(peer.a)}, B ${ms(peer.b)}, engine client ${ms(peer.engine)}); raw ${ms(raw.source + raw.receiver)} (source ${ms(raw.source)}, receiver ${ms(raw.receiver)})`,
    );
  }
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) {
  const rows = await peerLoads();
  printPeerLoads(rows);
  const file = await writeResults('peer.json', {
    quick: QUICK,
    loadAverage: loadavg(),
    rows,
    cpuSecondsPerRound: lastCpu,
  });
  console.log(`\nwrote ${file}`);
}
