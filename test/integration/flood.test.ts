/**
 * A flood of pinned lookups that nobody releases, against a real sidecar process over real ZMQ:
 * the lookup memory bound (storage.maxLookupBytes) holds, lookups past it are refused with
 * KVT_CAPACITY, nothing admitted loses its pins, the sidecar's RSS stays under a stated ceiling,
 * and another client is still served (PING at once, LOOKUP once some pins are released).
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { KvtierError } from '../../src/errors.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { estimateLookupBytes } from '../../src/storage-manager/lookup-budget.ts';
import { freeTcpPort } from '../support/fixtures.ts';
import { type SidecarProcess, startSidecarProcess } from '../support/sidecar-process.ts';

const MIB = 1024 * 1024;
/** Lookups in the flood, and chunks each names (all of them stored: every chunk is a hit). */
const FLOOD = 20_000;
const CHUNKS = 256;
const MAX_LOOKUP_BYTES = 16 * MIB;
/**
 * Ceiling on the sidecar's RSS growth over the flood. Without the bound, the same flood grew the
 * sidecar's RSS from 102 to 748 MiB (measured); with the 16 MiB bound it grows ~65-80 MiB (the
 * admitted lookups plus the garbage of decoding 20 000 requests).
 */
const RSS_GROWTH_CEILING = 200 * MIB;

describe('flood of pinned lookups', { timeout: 240_000 }, () => {
  let dir: string;
  let sidecar: SidecarProcess;
  let endpoint: string;
  const clients: LookupClient[] = [];
  const ns = randomBytes(16).toString('hex');
  const hashes = Array.from({ length: CHUNKS }, () => randomBytes(32));
  const counts = new Uint32Array(CHUNKS).fill(16);
  const client = () => {
    const c = new LookupClient({
      endpoint,
      namespaces: [ns],
      lookupTimeoutMs: 60_000,
      requestTimeoutMs: 60_000,
    });
    clients.push(c);
    return c;
  };

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'kvtier-flood-'));
    endpoint = `tcp://127.0.0.1:${await freeTcpPort()}`;
    sidecar = await startSidecarProcess(join(dir, 'kvtier.json'), {
      listen: endpoint,
      metrics: null,
      logLevel: 'warn',
      tiers: [{ name: 'cpu', type: 'local-cpu', capacityBytes: '64MiB', pageBytes: 4096 }],
      // The count bound is lifted so that only the byte bound can refuse, and no pin expires.
      storage: { maxLookups: 1_000_000, pinTtlMs: 3_600_000, maxLookupBytes: MAX_LOOKUP_BYTES },
    });
  });

  after(async () => {
    await Promise.all(clients.map((c) => c.close()));
    await sidecar?.kill();
    rmSync(dir, { recursive: true, force: true });
  });

  it('holds the byte bound and the RSS ceiling, refuses with KVT_CAPACITY, and keeps serving', async () => {
    const loader = client();
    for (const h of hashes) await loader.put(ns, h.toString('hex'), 16, randomBytes(4096));
    const rssBefore = sidecar.rssBytes();
    const flooders = [client(), client(), client(), client()];
    const errors: Record<string, number> = {};
    let admitted = 0;
    const admittedIds: { c: LookupClient; id: string }[] = [];
    const BATCH = 1000;
    for (let i = 0; i < FLOOD; i += BATCH) {
      await Promise.all(
        Array.from({ length: Math.min(BATCH, FLOOD - i) }, async (_, j) => {
          const c = flooders[(i + j) % flooders.length]!;
          const id = `flood-${i + j}`;
          try {
            const a = await c.lookupAsync(id, hashes, counts);
            assert.equal(a.status, 'ok');
            assert.equal(a.hitChunks, CHUNKS);
            admitted++;
            admittedIds.push({ c, id });
          } catch (err) {
            const code = err instanceof KvtierError ? err.code : String(err);
            errors[code] = (errors[code] ?? 0) + 1;
          }
        }),
      );
    }
    const rssAfter = sidecar.rssBytes();
    const per = estimateLookupBytes(CHUNKS, 'flood-10000'.length);
    console.log(
      `flood: ${admitted} admitted, errors ${JSON.stringify(errors)}; sidecar RSS ${(rssBefore / MIB).toFixed(1)} -> ${(rssAfter / MIB).toFixed(1)} MiB (ceiling +${RSS_GROWTH_CEILING / MIB} MiB)`,
    );
    // The bound is what refused: admitted lookups fill it, every other one is KVT_CAPACITY.
    assert.deepEqual(Object.keys(errors), ['KVT_CAPACITY']);
    assert.equal(admitted + errors.KVT_CAPACITY!, FLOOD);
    assert.ok(admitted >= Math.floor(MAX_LOOKUP_BYTES / per) - 2, `${admitted} admitted`);
    assert.ok(admitted <= Math.ceil(MAX_LOOKUP_BYTES / per), `${admitted} admitted`);
    assert.ok(
      rssAfter - rssBefore < RSS_GROWTH_CEILING,
      `RSS grew by ${((rssAfter - rssBefore) / MIB).toFixed(1)} MiB`,
    );

    const other = client();
    const stats = (await other.stats()) as {
      lookups: { done: number; bytes: number; maxBytes: number; refusedTotal: number };
      tiers: { pinnedChunks?: number }[];
    };
    assert.equal(stats.lookups.done, admitted, 'every admitted lookup keeps its pins');
    assert.ok(stats.lookups.bytes <= MAX_LOOKUP_BYTES);
    assert.equal(stats.lookups.maxBytes, MAX_LOOKUP_BYTES);
    assert.equal(stats.lookups.refusedTotal, FLOOD - admitted);
    assert.equal(stats.tiers[0]!.pinnedChunks, CHUNKS);

    // Another client: PING is served at once; a LOOKUP is refused until pins are released.
    assert.equal((await other.ping()).protocolVersion, 1);
    await assert.rejects(
      other.lookupAsync('other-1', hashes, counts),
      (e: unknown) => e instanceof KvtierError && e.code === 'KVT_CAPACITY',
    );
    for (const { c, id } of admittedIds.slice(0, 5)) assert.equal(await c.cancel(id), true);
    const a = await other.lookupAsync('other-2', hashes, counts);
    assert.equal(a.hitChunks, CHUNKS);
    assert.equal(await other.cancel('other-2'), true);
  });
});
