/**
 * Disaggregated prefill's handoff latency (docs/fleet.md "Disaggregated prefill"): a producer
 * engine on sidecar P saves 16 chunks of 1 MiB; a consumer engine on sidecar C has already asked
 * for them (a LOOKUP with `awaitChunks: 16`, as a decode request that arrives while the prefill's
 * save is in flight), and loads them once its lookup answers. Handoff latency: from the producer's
 * SAVE acknowledged to the consumer's LOAD complete. Two shapes: P and C share an fs directory (P's
 * write-through puts the chunks there, C's lookup finds them there), and P and C are each other's
 * peer tier (the chunks are homed on P; C's peer tier fetches them from P). The raw limit, in the
 * same round: the same bytes' plain lookup and load on C from its host memory once they are there.
 *   npm run bench:handoff          (KVTIER_BENCH_QUICK=1: 3 rounds instead of 7)
 * Prints a table and writes bench/results/handoff.json.
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { RendezvousPlacement } from '../src/backends/peer/peer-placement.ts';
import { DataPlaneClient } from '../src/data-plane/data-plane-client.ts';
import { chunkHashFromBytes } from '../src/hashing/chunk-hash.ts';
import { LookupClient } from '../src/lookup-client/lookup-client.ts';
import { freeTcpPort } from '../test/support/fixtures.ts';
import { startSidecarProcess } from '../test/support/sidecar-process.ts';
import { printTable, writeResults } from './support/child.ts';
import { BIG_KV, bigModel, engineOn } from './support/cross-node.ts';

const QUICK = process.env.KVTIER_BENCH_QUICK === '1';
const ROUNDS = QUICK ? 3 : 7;
const CHUNKS = 16;
const BLOCKS = Array.from({ length: CHUNKS * 4 }, (_, i) => i);

/** One row of the table. */
export interface HandoffRow {
  shape: string;
  /** Median seconds from the producer's SAVE acknowledged to the consumer's LOAD complete. */
  handoffSeconds: number;
  /** Of which: from the SAVE acknowledged to the consumer's lookup answered. */
  answerSeconds: number;
  /** The same bytes' lookup + LOAD on the consumer from its host memory (the raw limit). */
  rawSeconds: number;
  /**
   * Other chunks of the same size, saved by the producer and already in the shared tier (or on
   * P): a plain lookup + LOAD on the consumer, no wait (the transfer without the handoff).
   */
  coldSeconds: number;
  coldRatio: number;
  ratio: number;
  ratios: number[];
  tiers: string;
}

async function serve(dir: string, name: string, listen: string, tiers: Record<string, unknown>[]) {
  const proc = await startSidecarProcess(join(dir, `${name}.json`), {
    listen,
    metrics: null,
    logLevel: 'warn',
    tiers: [{ name: 'cpu', type: 'local-cpu', capacityBytes: '512MiB' }, ...tiers],
  });
  const client = new LookupClient({
    endpoint: listen,
    requestTimeoutMs: 60_000,
    lookupTimeoutMs: 120_000,
  });
  return { proc, listen, client };
}

async function shape(name: string, dir: string): Promise<HandoffRow> {
  const [lp, lc] = [
    `tcp://127.0.0.1:${await freeTcpPort()}`,
    `tcp://127.0.0.1:${await freeTcpPort()}`,
  ];
  let tiers: (self: string) => Record<string, unknown>[];
  if (name === 'fs') {
    const shared = join(dir, 'shared');
    mkdirSync(shared);
    tiers = () => [{ name: 'shared', type: 'fs', path: shared }];
  } else {
    const peers = [
      { name: 'p', endpoint: lp },
      { name: 'c', endpoint: lc },
    ];
    tiers = (self) => [{ name: 'peers', type: 'peer', self, peers, timeoutMs: 20_000 }];
  }
  const p = await serve(dir, `${name}-p`, lp, tiers('p'));
  const c = await serve(dir, `${name}-c`, lc, tiers('c'));
  try {
    const kv = join(dir, `${name}-p.kv`);
    writeFileSync(kv, randomBytes(BIG_KV));
    const producer = new DataPlaneClient({ endpoint: lp, requestTimeoutMs: 60_000 });
    const ns = (await producer.register(bigModel(kv, 'producer'))).namespace;
    const consumer = await engineOn(dir, lc, `${name}-c`);
    const placement = new RendezvousPlacement(['p', 'c'], 1);
    const homedOnP = () => {
      for (;;) {
        const h = randomBytes(32);
        if (name === 'fs' || placement.homes(ns, chunkHashFromBytes(h))[0] === 'p') return h;
      }
    };
    const counts = Array.from({ length: CHUNKS }, () => 64);
    const runs: { handoff: number; answer: number; raw: number; cold: number; tiers: string }[] =
      [];
    for (let r = 0; r < ROUNDS + 1; r++) {
      const hashes = Array.from({ length: CHUNKS }, homedOnP);
      const id = `${name}-r${r}`;
      // The decode request is there first: its lookup waits for the producer's save.
      const waiting = c.client.lookupAsync(id, hashes, counts, {
        namespaces: [ns],
        config: { awaitChunks: CHUNKS, awaitMs: 60_000 },
        timeoutMs: 120_000,
      });
      await new Promise((res) => setTimeout(res, 50));
      await producer.save({ requestId: id, blockIds: BLOCKS, chunkHashes: hashes });
      const acked = performance.now();
      const answer = await waiting;
      const answered = performance.now();
      if (answer.hitTokens !== 64 * CHUNKS)
        throw new Error(`${id}: lookup found ${answer.hitTokens}`);
      const loaded = await consumer.dp.load({
        requestId: id,
        lookupId: id,
        blockIds: BLOCKS,
        chunkHashes: hashes,
      });
      const done = performance.now();
      if (loaded.invalidBlockIds.length > 0) throw new Error(`${id}: load failed`);
      await consumer.dp.requestFinished(id, 'finished');
      await producer.requestFinished(id, 'finished');
      // The raw limit: the same bytes, now in C's host memory, looked up and loaded plainly.
      const t0 = performance.now();
      const again = await c.client.lookupAsync(`${id}-raw`, hashes, counts, { namespaces: [ns] });
      if (again.hitTokens !== 64 * CHUNKS)
        throw new Error(`${id}: host-memory lookup found ${again.hitTokens}`);
      const rawLoad = await consumer.dp.load({
        requestId: `${id}-raw`,
        lookupId: `${id}-raw`,
        blockIds: BLOCKS,
        chunkHashes: hashes,
      });
      const raw = performance.now() - t0;
      if (rawLoad.invalidBlockIds.length > 0) throw new Error(`${id}: host-memory load failed`);
      await consumer.dp.requestFinished(`${id}-raw`, 'finished');
      // The same path without a wait: chunks saved and written through before the lookup.
      const other = Array.from({ length: CHUNKS }, homedOnP);
      await producer.save({ requestId: `${id}-cold`, blockIds: BLOCKS, chunkHashes: other });
      await producer.requestFinished(`${id}-cold`, 'finished');
      while (((await p.client.stats()).writeThrough as { depth: number }).depth > 0)
        await new Promise((res) => setTimeout(res, 5));
      const t1 = performance.now();
      const cold = await c.client.lookupAsync(`${id}-cold`, other, counts, { namespaces: [ns] });
      if (cold.hitTokens !== 64 * CHUNKS)
        throw new Error(`${id}: cold lookup found ${cold.hitTokens}`);
      const coldLoad = await consumer.dp.load({
        requestId: `${id}-cold`,
        lookupId: `${id}-cold`,
        blockIds: BLOCKS,
        chunkHashes: other,
      });
      const coldMs = performance.now() - t1;
      if (coldLoad.invalidBlockIds.length > 0) throw new Error(`${id}: cold load failed`);
      await consumer.dp.requestFinished(`${id}-cold`, 'finished');
      if (r === 0) continue; // a warm-up round: connections and first touches
      runs.push({
        handoff: (done - acked) / 1000,
        answer: (answered - acked) / 1000,
        raw: raw / 1000,
        cold: coldMs / 1000,
        tiers: answer.tiers.map((t) => `${t.tier} ${(t.tokens / 64) | 0}`).join(', '),
      });
    }
    await producer.close();
    await consumer.dp.close();
    const med = (xs: number[]) => [...xs].sort((x, y) => x - y)[xs.length >> 1]!;
    const handoff = med(runs.map((x) => x.handoff));
    const raw = med(runs.map((x) => x.raw));
    const cold = med(runs.map((x) => x.cold));
    return {
      shape: name === 'fs' ? 'shared fs directory' : 'peer tier (from P)',
      handoffSeconds: handoff,
      answerSeconds: med(runs.map((x) => x.answer)),
      rawSeconds: raw,
      coldSeconds: cold,
      coldRatio: cold / handoff,
      ratio: raw / handoff,
      ratios: runs.map((x) => x.raw / x.handoff),
      tiers: runs[0]!.tiers,
    };
  } finally {
    for (const side of [p, c]) {
      await side.client.close();
      await side.proc.kill('SIGTERM');
    }
  }
}

/** Runs both shapes; returns their rows. */
export async function handoffRows(): Promise<HandoffRow[]> {
  const dir = mkdtempSync(join(tmpdir(), 'kvtier-bench-handoff-'));
  try {
    return [await shape('fs', dir), await shape('peers', dir)];
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Prints the rows as the benchmark's table. */
export function printHandoff(rows: readonly HandoffRow[]): void {
  const ms = (s: number) => (s * 1000).toFixed(1);
  console.log(
    `\nHandoff: ${CHUNKS} chunks of 1 MiB saved by a producer engine on P while a consumer's lookup on C waits for them; from P's SAVE acknowledged to C's LOAD complete (median of ${ROUNDS} rounds; raw: the same bytes looked up and loaded on C from its host memory, same round; no-wait: other chunks already in the shared tier or on P, looked up and loaded on C plainly, same round)`,
  );
  printTable(
    [
      'shape',
      'handoff ms',
      'to answer ms',
      'raw ms',
      'ratio',
      'per round',
      'no-wait ms',
      'ratio',
      `found in (of ${CHUNKS} chunks)`,
    ],
    rows.map((r) => [
      r.shape,
      ms(r.handoffSeconds),
      ms(r.answerSeconds),
      ms(r.rawSeconds),
      r.ratio.toFixed(2),
      r.ratios.map((x) => x.toFixed(2)).join(' '),
      ms(r.coldSeconds),
      r.coldRatio.toFixed(2),
      r.tiers,
    ]),
  );
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) {
  const before = loadavg();
  const rows = await handoffRows();
  printHandoff(rows);
  const file = await writeResults('handoff.json', {
    quick: QUICK,
    loadAverage: [before, loadavg()],
    rows,
  });
  console.log(
    `\nload average before/after: ${before.map((x) => x.toFixed(2)).join(' ')} / ${loadavg()
      .map((x) => x.toFixed(2))
      .join(' ')}`,
  );
  console.log(`wrote ${file}`);
}
