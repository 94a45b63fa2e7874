/**
 * Disaggregated prefill's handoff (docs/fleet.md "Disaggregated prefill"): a consumer sidecar's
 * LOOKUP that names `awaitChunks`/`awaitMs` waits for chunks a producer sidecar has not saved
 * yet, and answers once they are there: over a shared fs directory (the producer's write-through)
 * and over the peer tier (the consumer asks the producer's sidecar). Two `kvtier serve` processes
 * per shape. The bound is a miss counted as `timed_out`; a CANCEL ends a wait at once; a plain
 * lookup never waits.
 */
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import type { ChunkHash } from '../../src/hashing/chunk-hash.ts';
import { type LookupAnswer, LookupClient } from '../../src/lookup-client/lookup-client.ts';
import {
  freeTcpPort,
  packHex,
  randomHashes,
  randomNamespace,
  randomPayload,
  withDeadline,
} from '../support/fixtures.ts';
import { type SidecarProcess, startSidecarProcess } from '../support/sidecar-process.ts';

// The sidecars run this checkout's sources, not a build that may predate them.
process.env.KVTIER_FROM_SOURCE = '1';
const dir = mkdtempSync(join(tmpdir(), 'kvtier-handoff-'));
const CHUNK_BYTES = 64 * 1024;
const TOKENS = 256;
/** A wait far longer than any test step: an answer before it came from the chunks arriving. */
const LONG_WAIT_MS = 60_000;

interface Side {
  proc: SidecarProcess;
  client: LookupClient;
  metricsUrl: string;
}
const live: Side[] = [];

async function start(name: string, endpoint: string, tiers: Record<string, unknown>[]) {
  const proc = await startSidecarProcess(join(dir, `${name}.json`), {
    listen: endpoint,
    metrics: { host: '127.0.0.1', port: 0 },
    logLevel: 'warn',
    tiers: [{ name: 'cpu', type: 'local-cpu', capacityBytes: '32MiB' }, ...tiers],
  });
  const m = /metrics at (http:\/\/\S+\/metrics)/.exec(proc.output);
  assert.ok(m, proc.output);
  const client = new LookupClient({
    endpoint,
    requestTimeoutMs: 120_000,
    lookupTimeoutMs: 120_000,
  });
  const side = { proc, client, metricsUrl: m[1]! };
  live.push(side);
  return side;
}

after(async () => {
  for (const s of live) {
    await s.client.close();
    await s.proc.kill();
  }
  rmSync(dir, { recursive: true, force: true });
});

/** Whether `p` is still pending after `ms`. */
async function pendingAfter(p: Promise<unknown>, ms: number): Promise<boolean> {
  let settled = false;
  void p.then(
    () => (settled = true),
    () => (settled = true),
  );
  await new Promise((r) => setTimeout(r, ms));
  return !settled;
}

function awaitLookup(
  side: Side,
  id: string,
  ns: string,
  hashes: ChunkHash[],
  awaitMs = LONG_WAIT_MS,
): Promise<LookupAnswer> {
  return side.client.lookupAsync(
    id,
    packHex(hashes),
    hashes.map(() => TOKENS),
    {
      namespaces: [ns],
      config: { awaitChunks: hashes.length, awaitMs },
      timeoutMs: 120_000,
    },
  );
}

async function awaitStats(side: Side): Promise<Record<string, number>> {
  return (await side.client.stats()).lookupAwaits as Record<string, number>;
}

async function metric(side: Side, outcome: string): Promise<number> {
  const text = await (await fetch(side.metricsUrl)).text();
  const m = new RegExp(`^kvtier_lookup_awaits_total\\{outcome="${outcome}"\\} (\\S+)$`, 'm').exec(
    text,
  );
  return m === null ? 0 : Number(m[1]);
}

/** The producer saves after the consumer asked; the consumer's answer waits for it. */
async function handoff(producer: Side, consumer: Side): Promise<void> {
  const ns = randomNamespace();
  const hashes = randomHashes(4);
  const payloads = hashes.map(() => randomPayload(CHUNK_BYTES));
  const before = await awaitStats(consumer);
  const answer = awaitLookup(consumer, 'decode-1', ns, hashes);
  assert.ok(await pendingAfter(answer, 300), 'the lookup waits for chunks not saved yet');
  for (let i = 0; i < hashes.length; i++) {
    assert.equal(await producer.client.put(ns, hashes[i]!, TOKENS, payloads[i]!), 'stored');
  }
  const got = await withDeadline(answer, 90_000, 'awaited lookup');
  assert.equal(got.status, 'ok');
  assert.equal(got.hitChunks, hashes.length);
  assert.equal(got.hitTokens, hashes.length * TOKENS);
  await consumer.client.cancel('decode-1');
  for (let i = 0; i < hashes.length; i++) {
    const chunk = await consumer.client.get(ns, hashes[i]!);
    assert.ok(chunk !== null, `chunk ${i} on the consumer`);
    assert.ok(Buffer.from(chunk.payload).equals(payloads[i]!), `chunk ${i} byte-exact`);
  }
  const now = await awaitStats(consumer);
  assert.equal(now.arrived, before.arrived! + 1);
  assert.equal(now.total, before.total! + 1);
  assert.ok((await metric(consumer, 'arrived')) >= 1);
}

/** The bound passes: answered with what is there (nothing), counted as timed out. */
async function timesOut(consumer: Side): Promise<void> {
  const ns = randomNamespace();
  const before = await awaitStats(consumer);
  const got = await withDeadline(
    awaitLookup(consumer, 'never-saved', ns, randomHashes(2), 400),
    60_000,
    'bounded lookup',
  );
  assert.equal(got.status, 'ok');
  assert.equal(got.hitTokens, 0);
  const now = await awaitStats(consumer);
  assert.equal(now.timedOut, before.timedOut! + 1);
  assert.equal(now.waiting, 0);
  assert.ok((await metric(consumer, 'timed_out')) >= 1);
}

/** A CANCEL ends a wait: answered canceled long before the bound. */
async function canceled(consumer: Side): Promise<void> {
  const ns = randomNamespace();
  const before = await awaitStats(consumer);
  const answer = awaitLookup(consumer, 'to-cancel', ns, randomHashes(2));
  assert.ok(await pendingAfter(answer, 200));
  assert.equal(await consumer.client.cancel('to-cancel'), true);
  const got = await withDeadline(answer, 30_000, 'canceled lookup');
  assert.equal(got.status, 'canceled');
  assert.equal(got.hitTokens, 0);
  const now = await awaitStats(consumer);
  assert.equal(now.canceled, before.canceled! + 1);
  assert.equal(now.waiting, 0);
}

describe('handoff over a shared fs directory', { timeout: 300_000 }, () => {
  let producer: Side;
  let consumer: Side;
  it('starts two sidecars on one shared directory', async () => {
    const shared = join(dir, 'shared');
    mkdirSync(shared);
    const tier = { name: 'shared', type: 'fs', path: shared };
    producer = await start('fs-producer', `tcp://127.0.0.1:${await freeTcpPort()}`, [tier]);
    consumer = await start('fs-consumer', `tcp://127.0.0.1:${await freeTcpPort()}`, [tier]);
  });
  it("a waiting lookup is answered with the producer's chunks, byte-exact", () =>
    handoff(producer, consumer));
  it('the bound passes: a miss, counted', () => timesOut(consumer));
  it('CANCEL ends the wait', () => canceled(consumer));
  it('a lookup without awaitChunks answers at once', async () => {
    const ns = randomNamespace();
    const h = randomHashes(2);
    const got = await withDeadline(
      consumer.client.lookupAsync('plain', packHex(h), [TOKENS, TOKENS], { namespaces: [ns] }),
      30_000,
      'plain lookup',
    );
    assert.equal(got.hitTokens, 0);
    assert.equal((await awaitStats(consumer)).total, 3);
  });
});

describe('handoff over the peer tier', { timeout: 300_000 }, () => {
  let producer: Side;
  let consumer: Side;
  it('starts two sidecars that are each other’s peers', async () => {
    const eps = {
      p: `tcp://127.0.0.1:${await freeTcpPort()}`,
      c: `tcp://127.0.0.1:${await freeTcpPort()}`,
    };
    const peers = [
      { name: 'p', endpoint: eps.p },
      { name: 'c', endpoint: eps.c },
    ];
    const tier = (self: string) => ({
      name: 'peers',
      type: 'peer',
      self,
      peers,
      timeoutMs: 5000,
      probeIntervalMs: 200,
    });
    producer = await start('peer-producer', eps.p, [tier('p')]);
    consumer = await start('peer-consumer', eps.c, [tier('c')]);
  });
  it("a waiting lookup is answered with the producer's chunks, byte-exact", () =>
    handoff(producer, consumer));
  it('the bound passes: a miss, counted', () => timesOut(consumer));
});
