/**
 * The soak run (docs/soak.md): `npm run soak -- --minutes N [--clients K] [--report FILE]`.
 *
 * A sidecar process (CPU, LocalDisk under `fsync: always` on a 64 MiB tmpfs when running as
 * root, Redis) serves K client processes (scripts/soak/client.ts) and a durable writer in this
 * process, while faults repeat in turn: Redis killed and restarted, the disk filled up, the
 * sidecar killed with SIGKILL during writes and restarted, a client killed mid-load and replaced.
 * At the end every client stops, the pins must drain to 0, and a JSON report is written and
 * printed. Exits 1 on a wrong load, a pin left or a lost durably acknowledged write.
 */
import { type ChildProcess, fork, spawnSync } from 'node:child_process';
import { randomInt } from 'node:crypto';
import {
  closeSync,
  createWriteStream,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  unlinkSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { objectPath } from '../../src/backends/files/file-store.ts';
import { decodeChunkObject } from '../../src/backends/format/chunk-format.ts';
import { KvtierError } from '../../src/errors.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { chunkBytes, DurableLedger } from '../../test/support/durability.ts';
import { freeTcpPort } from '../../test/support/fixtures.ts';
import { startRedis } from '../../test/support/redis-server.ts';
import { type SidecarProcess, startSidecarProcess } from '../../test/support/sidecar-process.ts';
import type { ClientTally } from './client.ts';
import { DURABLE_BYTES, DURABLE_KEYS, DURABLE_NAMESPACE, durableHash } from './model.ts';

const { values: flags } = parseArgs({
  options: {
    minutes: { type: 'string', default: '2' },
    clients: { type: 'string', default: '3' },
    report: { type: 'string' },
    'fault-interval-s': { type: 'string', default: '8' },
  },
});
const minutes = Number(flags.minutes);
const clientCount = Number(flags.clients);
const faultIntervalMs = Number(flags['fault-interval-s']) * 1000;
if (!(minutes > 0) || !Number.isInteger(clientCount) || clientCount < 1 || !(faultIntervalMs > 0)) {
  process.stderr.write(
    'usage: npm run soak -- [--minutes N (default 2)] [--clients K (default 3)] [--report FILE] [--fault-interval-s S (default 8)]\n',
  );
  process.exit(2);
}

// The sidecar runs from the TypeScript sources, so the soak never tests a stale build.
process.env.KVTIER_FROM_SOURCE = '1';
const PIN_TTL_MS = 15_000;
/** The sidecar's data plane forgets a silent engine after 30 s and sweeps every 5 s. */
const PIN_DRAIN_LIMIT_MS = PIN_TTL_MS + 30_000 + 15_000;
const dir = mkdtempSync(join(tmpdir(), 'kvtier-soak-'));
const reportPath = resolve(flags.report ?? join(dir, 'soak-report.json'));
const log = (msg: string) => process.stderr.write(`[soak ${new Date().toISOString()}] ${msg}\n`);

// The disk tier on a small real filesystem, so that filling it up is a real ENOSPC.
const diskMount = join(dir, 'disk');
mkdirSync(diskMount);
let tmpfs = false;
let diskFullSkipped: string | null = null;
if (process.getuid?.() === 0) {
  const r = spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=64m', 'tmpfs', diskMount], {
    encoding: 'utf8',
  });
  if (r.status === 0) tmpfs = true;
  else diskFullSkipped = `mount -t tmpfs failed: ${(r.stderr || String(r.error)).trim()}`;
} else diskFullSkipped = 'not running as root: no tmpfs mount for a small disk to fill';
const diskDir = join(diskMount, 'chunks');

const redis = await startRedis();
const endpoint = `tcp://127.0.0.1:${await freeTcpPort()}`;
const config = {
  listen: endpoint,
  metrics: { host: '127.0.0.1', port: 0 },
  logLevel: 'error',
  tiers: [
    // Smaller than what the run stores, so lookups also prefetch from the disk and Redis.
    { name: 'cpu', type: 'local-cpu', capacityBytes: '8MiB' },
    {
      name: 'disk',
      type: 'local-disk',
      path: diskDir,
      capacityBytes: '40MiB',
      fsync: 'always',
      timeoutMs: 5000,
    },
    {
      name: 'redis',
      type: 'redis',
      host: '127.0.0.1',
      port: redis.port,
      timeoutMs: 500,
      connectTimeoutMs: 1000,
      reconnectMaxDelayMs: 500,
    },
  ],
  storage: { pinTtlMs: PIN_TTL_MS },
};

const faults = { redisRestarts: 0, diskFull: 0, sidecarKills: 0, clientKills: 0 };
const errors: Record<string, number> = {};
const countError = (err: unknown) => {
  // Other errors: the metrics fetch of a checkpoint that a sidecar kill interrupted.
  const code = err instanceof KvtierError ? err.code : `other:${(err as Error).name}`;
  errors[code] = (errors[code] ?? 0) + 1;
};
const wrong = { load: 0, get: 0 };
const rss = { min: Number.POSITIVE_INFINITY, max: 0, samples: 0 };
let sidecar!: SidecarProcess;
let metricsUrl = '';

async function startSidecar(): Promise<void> {
  sidecar = await startSidecarProcess(join(dir, 'kvtier.json'), config, 30_000);
  const m = /metrics at (http:\/\/\S+\/metrics)/.exec(sidecar.output);
  if (m === null) throw new Error(`no metrics URL in the sidecar's output:\n${sidecar.output}`);
  metricsUrl = m[1]!;
}
await startSidecar();
const rssTimer = setInterval(() => {
  const b = sidecar.rssBytes();
  if (b === 0) return;
  rss.min = Math.min(rss.min, b);
  rss.max = Math.max(rss.max, b);
  rss.samples++;
}, 500);

// Clients.
interface Client {
  id: string;
  proc: ChildProcess;
  tally: ClientTally | undefined;
  onLoading: (() => void) | undefined;
  exited: Promise<void>;
}
const clients = new Map<string, Client>();
const finished: ClientTally[] = [];
const clientLog = createWriteStream(join(dir, 'clients.log'));
let clientSeq = 0;
function spawnClient(): Client {
  const id = `c${clientSeq++}`;
  const proc = fork(
    new URL('./client.ts', import.meta.url).pathname,
    [JSON.stringify({ endpoint, dir, id })],
    { execArgv: ['--import', 'tsx'], stdio: ['ignore', 'pipe', 'pipe', 'ipc'] },
  );
  proc.stdout!.pipe(clientLog, { end: false });
  proc.stderr!.pipe(clientLog, { end: false });
  const c: Client = {
    id,
    proc,
    tally: undefined,
    onLoading: undefined,
    exited: new Promise((r) => proc.once('exit', () => r())),
  };
  proc.on('message', (m: { t: string; kind?: string; hash?: string }) => {
    if (m.t === 'tally') c.tally = m as unknown as ClientTally;
    else if (m.t === 'loading') c.onLoading?.();
    else if (m.t === 'wrong') log(`WRONG ${m.kind} of ${m.hash} in client ${id}`);
  });
  void c.exited.then(() => {
    clients.delete(id);
    if (c.tally !== undefined) finished.push(c.tally);
  });
  clients.set(id, c);
  return c;
}
for (let i = 0; i < clientCount; i++) spawnClient();

// The durable writer: PUTs of the durable keys, confirmed by checkpoints (durability.ts).
const ledger = new DurableLedger({ tier: 'disk', drainTimeoutMs: 5000 });
const writer = new LookupClient({ endpoint, requestTimeoutMs: 3000 });
const writerOps = { put: 0, putStored: 0, checkpoints: 0, verifiedOnDisk: 0 };
let writing: Promise<unknown> | null = null;
let stopWriter = false;
let sidecarDown = false;
const lost = new Set<string>();

async function writerLoop(): Promise<void> {
  while (!stopWriter) {
    if (sidecarDown) {
      await new Promise((r) => setTimeout(r, 50));
      continue;
    }
    const keys = Array.from({ length: randomInt(4, 16) }, () => randomInt(DURABLE_KEYS));
    const generation = faults.sidecarKills;
    const batch = Promise.allSettled(
      keys.map((k) => {
        const hash = durableHash(k);
        return writer.put(DURABLE_NAMESPACE, hash, 16, chunkBytes(hash, DURABLE_BYTES));
      }),
    );
    writing = batch;
    const outcomes = await batch;
    writing = null;
    for (const [i, o] of outcomes.entries()) {
      writerOps.put++;
      if (o.status === 'rejected') {
        countError(o.reason);
        continue;
      }
      if (o.value !== 'stored') continue;
      writerOps.putStored++;
      // Replies from a sidecar that was killed since are never confirmed.
      if (faults.sidecarKills === generation)
        ledger.answered({
          ns: DURABLE_NAMESPACE,
          hash: durableHash(keys[i]!),
          bytes: DURABLE_BYTES,
        });
    }
    if (faults.sidecarKills !== generation) continue;
    try {
      if (await ledger.checkpoint(writer, metricsUrl)) writerOps.checkpoints++;
    } catch (err) {
      countError(err);
    }
  }
}

/** Every durably acknowledged chunk, read from the disk tier's files: whole, and its bytes. */
function checkDurableOnDisk(): void {
  for (const c of ledger.confirmed.values()) {
    let ok = false;
    try {
      const obj = readFileSync(objectPath(diskDir, c.ns, c.hash, 2));
      const d = decodeChunkObject(c.ns, c.hash, obj);
      ok = d.ok && Buffer.from(d.chunk.data).equals(chunkBytes(c.hash, c.bytes));
    } catch {
      ok = false;
    }
    if (ok) writerOps.verifiedOnDisk++;
    else if (!lost.has(c.hash)) {
      lost.add(c.hash);
      log(`LOST durably acknowledged chunk ${c.hash}`);
    }
  }
}

/** Resolves after `ms`, or at once when the run is over. */
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function redisFault(): Promise<void> {
  await redis.kill();
  await sleep(3000);
  await redis.restart();
  faults.redisRestarts++;
}

async function diskFullFault(): Promise<void> {
  if (!tmpfs) return;
  const filler = join(diskMount, 'filler');
  const fd = openSync(filler, 'w');
  const mib = Buffer.alloc(1024 * 1024, 0x55);
  try {
    for (;;) writeSync(fd, mib);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOSPC') throw err;
  } finally {
    closeSync(fd);
  }
  faults.diskFull++;
  await sleep(4000);
  unlinkSync(filler);
}

async function sidecarFault(): Promise<void> {
  // Mid-write: wait (bounded) for a batch of the durable writer to be in flight.
  for (let i = 0; i < 100 && writing === null; i++) await sleep(20);
  await sleep(randomInt(0, 30));
  sidecarDown = true;
  faults.sidecarKills++;
  await sidecar.kill('SIGKILL');
  ledger.crashed();
  checkDurableOnDisk();
  await sleep(500);
  await startSidecar();
  // Start-up (temp-file cleanup, indexing) must not lose them either.
  checkDurableOnDisk();
  sidecarDown = false;
  try {
    // The first checkpoint after a start sets the baseline of the loss counters.
    await ledger.checkpoint(writer, metricsUrl);
  } catch (err) {
    countError(err);
  }
}

async function clientFault(): Promise<void> {
  const victims = [...clients.values()];
  const c = victims[randomInt(victims.length)];
  if (c === undefined) return;
  await Promise.race([new Promise<void>((r) => (c.onLoading = r)), sleep(5000)]);
  c.proc.kill('SIGKILL');
  await c.exited;
  faults.clientKills++;
  spawnClient();
}

const writerDone = writerLoop();
const startedAt = Date.now();
const deadline = startedAt + minutes * 60_000;
const order = [redisFault, diskFullFault, sidecarFault, clientFault];
log(
  `running ${minutes} min with ${clientCount} clients in ${dir}${diskFullSkipped ? `; disk-full fault skipped: ${diskFullSkipped}` : ''}`,
);
for (let i = 0; Date.now() + faultIntervalMs < deadline; i++) {
  await sleep(faultIntervalMs);
  const fault = order[i % order.length]!;
  log(`fault: ${fault.name}`);
  try {
    await fault();
  } catch (err) {
    log(`fault ${fault.name} failed: ${(err as Error).message}`);
    errors.FAULT_FAILED = (errors.FAULT_FAILED ?? 0) + 1;
  }
}
await sleep(Math.max(0, deadline - Date.now()));

// Wind down: clients stop after their current operation; the writer stops; pins must drain.
log('stopping clients');
for (const c of clients.values()) c.proc.send('stop');
await Promise.race([Promise.all([...clients.values()].map((c) => c.exited)), sleep(20_000)]);
for (const c of clients.values()) c.proc.kill('SIGKILL');
stopWriter = true;
await writerDone;
const probe = new LookupClient({ endpoint, requestTimeoutMs: 5000 });
let pinsLeft = -1;
let lookupsLeft = -1;
let heldLookups = -1;
let tiersAtEnd: unknown[] = [];
const drainStarted = Date.now();
for (;;) {
  try {
    const s = (await probe.stats()) as {
      tiers: { pinnedChunks?: number }[];
      lookups: { ongoing: number; done: number };
      dataPlane?: { heldLookups: number };
      writeThrough: { depth: number };
    };
    pinsLeft = s.tiers.reduce((n, t) => n + (t.pinnedChunks ?? 0), 0);
    lookupsLeft = s.lookups.ongoing + s.lookups.done;
    heldLookups = s.dataPlane?.heldLookups ?? 0;
    tiersAtEnd = (s.tiers as Record<string, unknown>[]).map((t) => ({
      name: t.name,
      health: t.health,
      chunks: t.chunks,
      pinnedChunks: t.pinnedChunks,
    }));
    if (pinsLeft === 0 && lookupsLeft === 0 && heldLookups === 0 && s.writeThrough.depth === 0)
      break;
  } catch (err) {
    countError(err);
  }
  if (Date.now() - drainStarted > PIN_DRAIN_LIMIT_MS) break;
  await sleep(500);
}
const pinsDrainMs = Date.now() - drainStarted;
await probe.close();
await writer.close();
await sidecar.kill('SIGTERM');
clearInterval(rssTimer);
checkDurableOnDisk();
await redis.stop();
clientLog.end();
if (tmpfs) spawnSync('umount', [diskMount]);

const tallies = [...finished, ...[...clients.values()].flatMap((c) => (c.tally ? [c.tally] : []))];
const operations: Record<string, number> = {};
for (const t of tallies) {
  for (const [k, v] of Object.entries(t.ops)) operations[k] = (operations[k] ?? 0) + v;
  for (const [k, v] of Object.entries(t.errors)) errors[k] = (errors[k] ?? 0) + v;
  wrong.load += t.wrong.load;
  wrong.get += t.wrong.get;
}
for (const [k, v] of Object.entries(writerOps)) operations[`durable.${k}`] = v;
const wrongLoads = wrong.load + wrong.get;
const report = {
  minutes,
  clients: clientCount,
  clientProcesses: clientSeq,
  durationMs: Date.now() - startedAt,
  operations,
  wrongLoads,
  wrong,
  lostAckedDurableWrites: lost.size,
  durable: {
    tier: 'disk (local-disk, fsync: always)',
    acknowledged: ledger.confirmed.size,
    unconfirmed: ledger.unconfirmed,
  },
  pinsLeft,
  lookupsLeft,
  heldLookups,
  pinsDrainMs,
  tiersAtEnd,
  rssBytes: { min: rss.samples > 0 ? rss.min : 0, max: rss.max, samples: rss.samples },
  errorsByCode: errors,
  faults: { ...faults, diskFullSkipped },
  workDir: dir,
};
const ok = wrongLoads === 0 && pinsLeft === 0 && lost.size === 0;
writeFileSync(reportPath, `${JSON.stringify({ ...report, ok }, null, 2)}\n`);
process.stdout.write(`${JSON.stringify({ ...report, ok }, null, 2)}\n`);
log(`report written to ${reportPath}`);
if (ok && flags.report !== undefined) rmSync(dir, { recursive: true, force: true });
process.exit(ok ? 0 : 1);
