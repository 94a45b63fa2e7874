/**
 * Data-plane throughput on the host device with Llama-3-8B-shaped KV (32 layers, 8 KV heads,
 * head dim 128, bf16, block 16, chunk 256: 128 KiB per token, 32 MiB per chunk), on two paths in
 * the same run, each against memcpy of the same number of bytes (between two warm buffers of at
 * most 512 MiB, repeated until the load's bytes are moved): the production path (a
 * sidecar built by `Sidecar.start` as `kvtier serve` builds it: decorated tiers, the server,
 * the wire) and the bare path (storage manager and data plane in-process over an undecorated
 * CPU tier); and lookup latency while a load runs, on each. The timed load runs alone, like its
 * memcpy; the latency comes from a second, untimed load of the same chunks with lookups from
 * another process beside it.
 *   npm run bench:dataplane        (KVTIER_BENCH_QUICK=1 moves 256 MiB instead of 4 GiB)
 * KVTIER_BENCH_DATAPLANE_MIB sets the bytes moved each way (a multiple of 32 MiB),
 * KVTIER_BENCH_DATAPLANE_REPEAT the runs per path (best kept), KVTIER_BENCH_DATAPLANE_PATHS
 * `production` to skip the bare path (`layout` alone: only the in-block order rows). The
 * in-block order rows: the copy engine alone gathering and scattering the same chunks with one op
 * per block (NHD, the bytes as they are), and HND blocks reordered to the stored form with one
 * strided op per head of a block (what the data plane sends the native engine) and with one plain
 * op per token and head (what engines without strided ops get), against NHD and memcpy of the
 * same bytes. The production sidecar runs in this process; its event-loop
 * stall is watched while that path runs.
 * The CPU tier runs with `prefault: true`, the choice recommended for a host dedicated to serving
 * (docs/configuration.md): its slabs are reserved at start and their pages committed in the
 * background; the first run starts once the tier reports every byte pre-faulted (as an engine
 * starts saving only after loading its model), and the time that took and the loop stall meanwhile
 * are reported apart. KVTIER_BENCH_DATAPLANE_PREFAULT=0 runs the default (pages committed as the
 * first chunks land in them: the first run then pays the page faults).
 * Prints a table and writes bench/results/dataplane.json.
 */
import { spawn } from 'node:child_process';
import { randomBytes, randomFillSync } from 'node:crypto';
import { open, rm } from 'node:fs/promises';
import { cpus, loadavg } from 'node:os';
import { createInterface } from 'node:readline';
import type { BackendStats } from '../src/backends/core/types.ts';
import { LocalCpuBackend } from '../src/backends/local-cpu/local-cpu-backend.ts';
import { defaultConfig } from '../src/config/config.ts';
import { type CopyEngine, DataPlane } from '../src/data-plane/data-plane.ts';
import { DataPlaneClient } from '../src/data-plane/data-plane-client.ts';
import { createFsCopyEngine } from '../src/data-plane/fs-copy-engine.ts';
import type { KvRegistration } from '../src/data-plane/kv-layout.ts';
import { createNativeCopyEngine } from '../src/data-plane/native-copy-engine.ts';
import { chunkHashFromBytes } from '../src/hashing/chunk-hash.ts';
import { LookupClient } from '../src/lookup-client/lookup-client.ts';
import { SidecarServer } from '../src/lookup-server/sidecar-server.ts';
import { nativeSlabAllocator } from '../src/native/host-slabs.ts';
import { Sidecar } from '../src/sidecar.ts';
import { StorageManager } from '../src/storage-manager/storage-manager.ts';
import { silentLogger } from '../src/util/log.ts';
import { percentile, printTable, writeResults } from './support/child.ts';
import { type LayoutCopyRow, measureLayoutCopy } from './support/layout-copy.ts';
import { type StallMeter, stallMeter } from './support/loop-stall.ts';

const QUICK = process.env.KVTIER_BENCH_QUICK === '1';

/** The larger of two figures a meter may not have (null). */
function maxOrNull(a: number | null, b: number | null): number | null {
  return a === null ? b : b === null ? a : Math.max(a, b);
}
const MiB = 1024 * 1024;
const LAYERS = 32;
const BLOCK_TOKENS = 16;
const CHUNK_TOKENS = 256;
const BYTES_PER_TOKEN_PER_LAYER = 8 * 128 * 2; // K (and V) per token per layer
const BLOCK_BYTES = BLOCK_TOKENS * BYTES_PER_TOKEN_PER_LAYER; // 32 KiB
const CHUNK_BYTES = 2 * LAYERS * CHUNK_TOKENS * BYTES_PER_TOKEN_PER_LAYER; // 32 MiB
const MOVED_MIB = Number(process.env.KVTIER_BENCH_DATAPLANE_MIB ?? (QUICK ? 256 : 4096));
const CHUNKS = Math.max(1, Math.round(MOVED_MIB / 32)); // 256 MiB or 4 GiB moved each way by default
const BLOCKS_PER_CHUNK = CHUNK_TOKENS / BLOCK_TOKENS;
const REQUEST_BLOCKS = CHUNKS * BLOCKS_PER_CHUNK;
const NUM_BLOCKS = 2 * REQUEST_BLOCKS; // saved from the first half, loaded into the second
/** Size of each memcpy baseline buffer; the copy is repeated until the load's bytes are moved. */
const MEMCPY_BUFFER_BYTES = 512 * MiB;
const REPEAT = Number(process.env.KVTIER_BENCH_DATAPLANE_REPEAT ?? (QUICK ? 2 : 3));
const PATHS = process.env.KVTIER_BENCH_DATAPLANE_PATHS ?? 'bare,production,layout';
/** Chunks the in-block order rows copy each way (at most 512 MiB). */
const LAYOUT_CHUNKS = Math.min(CHUNKS, 16);
const ENGINE = 'bench-engine';
const PREFAULT = process.env.KVTIER_BENCH_DATAPLANE_PREFAULT !== '0';
const here = new URL('.', import.meta.url).pathname;
const ext = import.meta.url.endsWith('.ts') ? '.ts' : '.js';

/**
 * The KV cache is one file per layer, K then V (a file is mapped whole, and the addon maps at
 * most 4 GiB at once); `path` is the files' common prefix.
 */
function layerFile(path: string, layer: number): string {
  return `${path}-layer${layer}.kv`;
}

function registration(path: string): KvRegistration {
  const region = NUM_BLOCKS * BLOCK_BYTES;
  return {
    engineId: ENGINE,
    device: 'host',
    modelId: 'meta-llama/Llama-3-8B',
    dtype: 'bfloat16',
    numKvHeads: 8,
    headDim: 128,
    tpSize: 1,
    tpRank: 0,
    mla: false,
    numBlocks: NUM_BLOCKS,
    blockSize: BLOCK_TOKENS,
    blockStrideBytes: BLOCK_BYTES,
    chunkSize: CHUNK_TOKENS,
    layers: Array.from({ length: LAYERS }, (_, l) => ({
      k: { path: layerFile(path, l), offsetBytes: 0 },
      v: { path: layerFile(path, l), offsetBytes: region },
    })),
  };
}

async function timed(fn: () => Promise<void>): Promise<number> {
  const t0 = performance.now();
  await fn();
  return performance.now() - t0;
}

/** Lookup clients in another process: each `probe` measures round trips until collected. */
interface Prober {
  probe(endpoint: string, ns: string, hashes: string[]): Promise<{ collect(): Promise<number[]> }>;
  close(): Promise<void>;
}

/**
 * Starts the prober process once, before this process holds the benchmark's buffers: spawning
 * forks this process, and a fork of a process holding gigabytes holds its event loop for tens
 * of ms (the page tables are copied), which the stall meter would count against the sidecar.
 */
async function startProber(): Promise<Prober> {
  const loader = ext === '.ts' ? ['--import', 'tsx'] : [];
  const child = spawn(process.execPath, [...loader, `${here}support/lookup-prober${ext}`], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const exited = new Promise<number | null>((r) => child.once('exit', r));
  const rl = createInterface({ input: child.stdout! });
  const lines: string[] = [];
  let wake: (() => void) | undefined;
  rl.on('line', (l) => {
    lines.push(l);
    wake?.();
  });
  const next = async (prefix: string) => {
    for (;;) {
      const i = lines.findIndex((l) => l.startsWith(prefix));
      if (i >= 0) return lines.splice(i, 1)[0]!;
      const died = await Promise.race([
        exited.then((code) => code ?? -1),
        new Promise<null>((r) => {
          wake = () => r(null);
        }),
      ]);
      if (died !== null) throw new Error(`lookup prober exited (${died}) before "${prefix}"`);
    }
  };
  return {
    probe: async (endpoint, ns, hashes) => {
      child.stdin!.write(`probe ${endpoint} ${ns} ${hashes.join(' ')}\n`);
      await next('ready');
      return {
        collect: async () => {
          child.stdin!.write('stop\n');
          const line = await next('latencies ');
          return JSON.parse(line.slice('latencies '.length)) as number[];
        },
      };
    },
    close: async () => {
      child.stdin!.end();
      await exited;
    },
  };
}

/** How one path saves, pins (a lookup, untimed) and loads; the rest of a round is shared. */
interface Path {
  readonly label: string;
  save(requestId: string, blockIds: number[], hashes: Buffer[]): Promise<number>;
  lookup(lookupId: string, hashes: Buffer[]): Promise<number>;
  load(requestId: string, lookupId: string, blockIds: number[], hashes: Buffer[]): Promise<number>;
  finish(requestId: string): Promise<void>;
  clear(): Promise<void>;
  readonly endpoint: string;
  readonly ns: string;
  /** The CPU tier's stats (its `prefaultedBytes` while it pre-faults). */
  tierStats(): BackendStats;
  close(): Promise<void>;
}

const CPU_OPTIONS = {
  capacityBytes: (CHUNKS + 4) * CHUNK_BYTES + 64 * MiB,
  pageBytes: 2 * MiB,
  prefault: PREFAULT,
};
const counts = Array<number>(CHUNKS).fill(CHUNK_TOKENS);

/** The bare path: a LocalCpuBackend, storage manager and data plane called in-process. */
async function barePath(path: string, engine: CopyEngine): Promise<Path> {
  // The same aligned slabs as the sidecar's host-memory tier, when the addon is built.
  const allocateSlab = nativeSlabAllocator();
  const cpu = new LocalCpuBackend(
    { ...CPU_OPTIONS, ...(allocateSlab !== undefined ? { allocateSlab } : {}) },
    { name: 'cpu' },
  );
  const storage = new StorageManager({ tiers: [cpu], sweepIntervalMs: 0 });
  const dp = new DataPlane({ storage, copyEngine: engine, sweepIntervalMs: 0 });
  const server = new SidecarServer({ endpoint: 'tcp://127.0.0.1:*', storage });
  await server.start();
  const layout = await dp.register(registration(path));
  const hex = (h: Buffer[]) => h.map((x) => chunkHashFromBytes(x));
  return {
    label: 'bare (in-process, undecorated tier)',
    endpoint: server.endpoint,
    ns: layout.namespace.id,
    tierStats: () => cpu.stats(),
    save: async (requestId, blockIds, hashes) =>
      (await dp.save({ engineId: ENGINE, requestId, blockIds, chunkHashes: hex(hashes) })).saved,
    lookup: async (lookupId, hashes) =>
      (
        await storage.lookup({
          lookupId,
          namespaces: [layout.namespace.id],
          hashes: hex(hashes),
          tokenCounts: counts,
        })
      ).hitChunks,
    load: async (requestId, lookupId, blockIds, hashes) =>
      (await dp.load({ engineId: ENGINE, requestId, lookupId, blockIds, chunkHashes: hex(hashes) }))
        .invalidBlockIds.length,
    finish: async (requestId) => dp.requestFinished(ENGINE, requestId),
    clear: async () => void (await storage.clear()),
    close: async () => {
      await server.close();
      await dp.close();
      await storage.close();
    },
  };
}

/**
 * The production path: a sidecar built by `Sidecar.start` exactly as `kvtier serve` builds it
 * (tiers from config through the registry, decorated with metrics; the server; the native copy
 * engine when built), driven over ZMQ by the data-plane and lookup clients.
 */
async function productionPath(path: string): Promise<Path> {
  const sidecar = await Sidecar.start({
    config: {
      ...defaultConfig(),
      listen: 'tcp://127.0.0.1:*',
      metrics: null,
      tiers: [{ name: 'cpu', type: 'local-cpu', options: CPU_OPTIONS }],
      logLevel: 'silent',
    },
    log: silentLogger,
  });
  const endpoint = sidecar.server.endpoint;
  const dpc = new DataPlaneClient({ endpoint, heartbeatIntervalMs: 0, requestTimeoutMs: 120_000 });
  const lc = new LookupClient({ endpoint, namespaces: ['0'.repeat(32)], lookupTimeoutMs: 60_000 });
  const reg = await dpc.register(registration(path));
  return {
    label: 'production (kvtier serve: Sidecar.start, ZMQ)',
    endpoint,
    ns: reg.namespace,
    tierStats: () => sidecar.storage.tiers[0]!.stats(),
    save: async (requestId, blockIds, hashes) =>
      (await dpc.save({ requestId, blockIds, chunkHashes: hashes })).saved,
    lookup: async (lookupId, hashes) => {
      const a = await lc.lookupAsync(lookupId, hashes, counts, { namespaces: [reg.namespace] });
      return a.hitTokens / CHUNK_TOKENS;
    },
    load: async (requestId, lookupId, blockIds, hashes) =>
      (await dpc.load({ requestId, lookupId, blockIds, chunkHashes: hashes })).invalidBlockIds
        .length,
    finish: async (requestId) => void (await dpc.requestFinished(requestId, 'finished')),
    clear: async () => void (await lc.clear()),
    close: async () => {
      await dpc.close();
      await lc.close();
      await sidecar.close();
    },
  };
}

interface Measured {
  saveMs: number;
  loadMs: number;
  /** The first run's save and load: the CPU tier's pages are touched for the first time. */
  firstSaveMs: number;
  firstLoadMs: number;
  lat: number[];
}

/**
 * Runs the rounds; `stalls[0]` watches the loop during the first round (the CPU tier's pages are
 * touched for the first time), `stalls[1]` during the later ones.
 */
async function measure(
  p: Path,
  path: string,
  prober: Prober,
  stalls: readonly [StallMeter, StallMeter],
): Promise<Measured> {
  const saveBlocks = Array.from({ length: REQUEST_BLOCKS }, (_, i) => i);
  const loadBlocks = Array.from(
    { length: REQUEST_BLOCKS },
    (_, i) => REQUEST_BLOCKS + ((i * 7) % REQUEST_BLOCKS),
  );
  let saveMs = Number.POSITIVE_INFINITY;
  let loadMs = Number.POSITIVE_INFINITY;
  let firstSaveMs = 0;
  let firstLoadMs = 0;
  let lat: number[] = [];
  for (let r = 0; r < REPEAT; r++) {
    if (r === 1) stalls[0].pause();
    if (r <= 1) stalls[Math.min(r, 1)]!.resume();
    const hashes = Array.from({ length: CHUNKS }, () => randomBytes(32));
    const thisSaveMs = await timed(async () => {
      const saved = await p.save(`s${r}`, saveBlocks, hashes);
      if (saved !== CHUNKS) throw new Error(`${p.label}: saved ${saved} of ${CHUNKS} chunks`);
    });
    saveMs = Math.min(saveMs, thisSaveMs);
    const hit = await p.lookup(`l${r}`, hashes);
    if (hit !== CHUNKS) throw new Error(`${p.label}: lookup found ${hit} of ${CHUNKS}`);
    // The timed load runs alone, as its memcpy baseline does: with the prober's back-to-back
    // lookups beside it, two of this machine's two cores would be shared three ways.
    const thisLoadMs = await timed(async () => {
      const invalid = await p.load(`l${r}`, `l${r}`, loadBlocks, hashes);
      if (invalid > 0) throw new Error(`${p.label}: ${invalid} blocks failed to load`);
    });
    loadMs = Math.min(loadMs, thisLoadMs);
    if (r === 0) {
      firstSaveMs = thisSaveMs;
      firstLoadMs = thisLoadMs;
    }
    await verify(path, saveBlocks, loadBlocks);
    await p.finish(`l${r}`);
    // Then the same load again (untimed) while lookups of a small prompt keep coming from
    // another process: their latency is the figure of this pass.
    if ((await p.lookup(`m${r}`, hashes)) !== CHUNKS) throw new Error(`${p.label}: lookup missed`);
    const probe = await prober.probe(
      p.endpoint,
      p.ns,
      hashes.slice(0, 4).map((h) => h.toString('hex')),
    );
    const invalid = await p.load(`m${r}`, `m${r}`, loadBlocks, hashes);
    if (invalid > 0) throw new Error(`${p.label}: ${invalid} blocks failed to load`);
    lat = lat.concat(await probe.collect());
    await verify(path, saveBlocks, loadBlocks);
    await p.finish(`m${r}`);
    await p.clear();
  }
  lat.sort((x, y) => x - y);
  stalls[Math.min(REPEAT - 1, 1)]!.pause();
  return { saveMs, loadMs, firstSaveMs, firstLoadMs, lat };
}

/**
 * Waits until the CPU tier pre-faulted all of its capacity (at most 120 s); returns how long that
 * took in ms, or null when the tier does not pre-fault (`prefault` off, no addon, old kernel).
 */
async function awaitPrefault(p: Path): Promise<number | null> {
  const t0 = performance.now();
  for (;;) {
    const s = p.tierStats();
    if (s.prefaultedBytes === undefined) return null;
    if (s.prefaultedBytes >= (s.capacityBytes ?? 0)) return performance.now() - t0;
    if (performance.now() - t0 > 120_000) return null;
    await new Promise((r) => setTimeout(r, 5));
  }
}

async function main(): Promise<void> {
  const prober = await startProber();
  const path = `/dev/shm/kvtier-bench-${process.pid}`;
  const fileBytes = 2 * NUM_BLOCKS * BLOCK_BYTES;
  // Random bytes, with each block's number in its first 8 bytes so that no two blocks are equal
  // (verify() would miss a block loaded from the wrong place otherwise).
  const fill = randomFillSync(Buffer.allocUnsafe(64 * MiB));
  for (let l = 0; l < LAYERS; l++) {
    const fh = await open(layerFile(path, l), 'w+');
    for (let off = 0; off < fileBytes; off += fill.length) {
      for (let b = 0; b < fill.length; b += BLOCK_BYTES)
        fill.writeDoubleLE((l * fileBytes + off + b) / BLOCK_BYTES, b);
      await fh.write(fill, 0, Math.min(fill.length, fileBytes - off), off);
    }
    await fh.close();
  }

  const native = createNativeCopyEngine();
  const engine = native.engine ?? createFsCopyEngine();
  const engineName =
    native.engine !== null
      ? 'native (mmap + worker-thread memcpy)'
      : `fs fallback (${native.reason})`;
  const moved = CHUNKS * CHUNK_BYTES;
  const rows: Record<string, unknown>[] = [];
  const lookups: Record<string, unknown>[] = [];
  try {
    // Raw limit: memcpy of the same number of bytes between warm buffers, measured right before
    // each path so that both sides of a ratio see the same load on a shared machine. The buffers
    // are MEMCPY_BUFFER_BYTES (copied again until the load's bytes are moved), not the load's
    // size: 512 MiB is far beyond any cache, so the rate is main memory's, as for one copy of the
    // whole load, and a 4 GiB load then fits in RAM beside its KV file and the CPU tier.
    const bufBytes = Math.min(moved, MEMCPY_BUFFER_BYTES);
    const a = Buffer.allocUnsafeSlow(bufBytes);
    const b = Buffer.allocUnsafeSlow(bufBytes);
    a.fill(1);
    b.fill(2);
    const copyMoved = () => {
      for (let done = 0; done < moved; done += bufBytes)
        a.copy(b, 0, 0, Math.min(bufBytes, moved - done));
    };
    const memcpy = async () => {
      let ms = Number.POSITIVE_INFINITY;
      for (let r = 0; r < REPEAT; r++) ms = Math.min(ms, await timed(async () => copyMoved()));
      return ms;
    };
    const gbs = (ms: number) => moved / (ms / 1000) / 1e9;
    // One path at a time, so that their arenas are not held together.
    const makers = [
      { name: 'bare', make: () => barePath(path, engine) },
      { name: 'production', make: () => productionPath(path) },
    ].filter((x) => PATHS.split(',').includes(x.name));
    for (const { make } of makers) {
      const memcpyMs = await memcpy();
      const prefaultStall = stallMeter();
      const p = await make();
      prefaultStall.resume();
      const prefaultMs = await awaitPrefault(p);
      prefaultStall.pause();
      let m: Measured;
      const stalls = [stallMeter(), stallMeter()] as const;
      try {
        m = await measure(p, path, prober, stalls);
      } finally {
        for (const s of stalls) s.pause();
        await p.close();
      }
      for (const [op, ms, firstMs] of [
        ['save (gather blocks → CPU tier)', m.saveMs, m.firstSaveMs],
        ['load (CPU tier → scatter blocks)', m.loadMs, m.firstLoadMs],
      ] as const)
        rows.push({
          path: p.label,
          op,
          bytes: moved,
          gbPerSec: gbs(ms),
          firstRunGbPerSec: gbs(firstMs),
          memcpyGbPerSec: gbs(memcpyMs),
          memcpyBufferBytes: bufBytes,
          prefault: PREFAULT,
          ratio: memcpyMs / ms,
        });
      lookups.push({
        path: p.label,
        samples: m.lat.length,
        p50Ms: percentile(m.lat, 50),
        p99Ms: percentile(m.lat, 99),
        loopStallMs: Math.max(stalls[0].maxMs(), stalls[1].maxMs()),
        loopStallFirstRoundMs: stalls[0].maxMs(),
        loopStallLaterRoundsMs: REPEAT > 1 ? stalls[1].maxMs() : null,
        // The longest stretch the main thread spent on a CPU between two ticks (loop-stall.ts):
        // the part of a stall the process caused itself; null off Linux.
        loopStallOnCpuMs: maxOrNull(stalls[0].maxOnCpuMs(), stalls[1].maxOnCpuMs()),
        prefault: PREFAULT,
        prefaultMs,
        loopStallPrefaultMs: prefaultMs === null ? null : prefaultStall.maxMs(),
        loopStallPrefaultOnCpuMs: prefaultMs === null ? null : prefaultStall.maxOnCpuMs(),
      });
    }
    let layoutRows: Array<LayoutCopyRow & { memcpyMs: number }> = [];
    if (PATHS.split(',').includes('layout')) {
      const bytes = LAYOUT_CHUNKS * CHUNK_BYTES;
      const copyBytes = async () => {
        let ms = Number.POSITIVE_INFINITY;
        for (let r = 0; r < REPEAT; r++)
          ms = Math.min(
            ms,
            await timed(async () => void a.copy(b, 0, 0, Math.min(bufBytes, bytes))),
          );
        return ms * Math.max(1, bytes / bufBytes);
      };
      const memcpyMs = await copyBytes();
      const measured = await measureLayoutCopy(engine, registration(path), LAYOUT_CHUNKS, REPEAT);
      layoutRows = measured.map((r) => ({ ...r, memcpyMs }));
    }
    console.log(
      `\nData plane on the host device, ${moved / MiB} MiB each way, copy engine: ${engineName}; target ratio >= 0.80`,
    );
    console.log(
      `CPU tier prefault: ${PREFAULT ? 'on' : 'off'}${lookups
        .map((l) =>
          l.prefaultMs === null
            ? ''
            : `; ${String(l.path).split(' ')[0]}: ${((l.prefaultMs as number) / 1000).toFixed(2)} s to pre-fault, loop stall ${(l.loopStallPrefaultMs as number).toFixed(2)} ms meanwhile${l.loopStallPrefaultOnCpuMs === null ? '' : ` (${(l.loopStallPrefaultOnCpuMs as number).toFixed(2)} ms of it on a CPU)`}`,
        )
        .join('')}`,
    );
    printTable(
      ['path', 'op', 'GB/s', 'first run GB/s', 'memcpy GB/s', 'ratio'],
      rows.map((r) => [
        String(r.path),
        String(r.op),
        (r.gbPerSec as number).toFixed(2),
        (r.firstRunGbPerSec as number).toFixed(2),
        (r.memcpyGbPerSec as number).toFixed(2),
        (r.ratio as number).toFixed(2),
      ]),
    );
    if (layoutRows.length > 0) {
      const nhd = (op: string) => layoutRows.find((r) => r.op === op && r.order === 'NHD')!;
      console.log(
        `\nIn-block order, copy engine alone (${engineName}), ${(LAYOUT_CHUNKS * CHUNK_BYTES) / MiB} MiB each way; HND blocks reordered to the stored (NHD) form:`,
      );
      printTable(
        [
          'blocks',
          'op form',
          'op',
          'ops per chunk',
          'GB/s',
          'memcpy GB/s',
          'ratio to memcpy',
          'ratio to NHD',
        ],
        layoutRows.map((r) => [
          r.order,
          r.form,
          r.op,
          String(r.opsPerChunk),
          (r.bytes / (r.ms / 1000) / 1e9).toFixed(2),
          (r.bytes / (r.memcpyMs / 1000) / 1e9).toFixed(2),
          (r.memcpyMs / r.ms).toFixed(2),
          (nhd(r.op).ms / r.ms).toFixed(2),
        ]),
      );
    }
    console.log('\nLookup round trips during the loads (target p99 < 5 ms):');
    printTable(
      [
        'path',
        'samples',
        'p50 µs',
        'p99 µs',
        'loop stall ms',
        'first round',
        'later rounds',
        'on a CPU ms',
      ],
      lookups.map((l) => [
        String(l.path),
        String(l.samples),
        ((l.p50Ms as number) * 1000).toFixed(0),
        ((l.p99Ms as number) * 1000).toFixed(0),
        (l.loopStallMs as number).toFixed(2),
        (l.loopStallFirstRoundMs as number).toFixed(2),
        l.loopStallLaterRoundsMs === null ? '—' : (l.loopStallLaterRoundsMs as number).toFixed(2),
        l.loopStallOnCpuMs === null ? '—' : (l.loopStallOnCpuMs as number).toFixed(2),
      ]),
    );
    const file = await writeResults('dataplane.json', {
      bench: 'dataplane',
      date: new Date().toISOString(),
      loadAverage: loadavg()[0],
      machine: { cpus: cpus().length, model: cpus()[0]?.model, node: process.version },
      quick: QUICK,
      copyEngine: engineName,
      movedBytes: moved,
      shape: {
        layers: LAYERS,
        kvHeads: 8,
        headDim: 128,
        dtype: 'bfloat16',
        blockTokens: BLOCK_TOKENS,
        chunkTokens: CHUNK_TOKENS,
        chunkBytes: CHUNK_BYTES,
      },
      rows,
      layoutCopy: layoutRows,
      lookupDuringLoad: lookups,
    });
    console.log(`\nwrote ${file}`);
  } finally {
    await prober.close();
    for (let l = 0; l < LAYERS; l++) await rm(layerFile(path, l), { force: true });
  }
}

/** Every loaded block equals the block it was saved from, in every layer's K and V. */
async function verify(path: string, from: number[], to: number[]): Promise<void> {
  const x = Buffer.allocUnsafe(BLOCK_BYTES);
  const y = Buffer.allocUnsafe(BLOCK_BYTES);
  const region = NUM_BLOCKS * BLOCK_BYTES;
  for (let l = 0; l < LAYERS; l++) {
    const fh = await open(layerFile(path, l), 'r');
    try {
      for (let kv = 0; kv < 2; kv++) {
        for (let i = 0; i < from.length; i += 37) {
          await fh.read(x, 0, BLOCK_BYTES, kv * region + from[i]! * BLOCK_BYTES);
          await fh.read(y, 0, BLOCK_BYTES, kv * region + to[i]! * BLOCK_BYTES);
          if (!x.equals(y))
            throw new Error(
              `layer ${l} ${kv === 0 ? 'K' : 'V'}: block ${to[i]} differs from saved block ${from[i]}`,
            );
        }
      }
    } finally {
      await fh.close();
    }
  }
}

await main();
