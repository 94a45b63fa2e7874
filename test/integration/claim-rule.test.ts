/**
 * "Never slower than recomputing" end to end: a real sidecar (local-cpu over an S3 tier served
 * by s3rver) measures the S3 tier's latency and bandwidth live, a lookup client over ZMQ names
 * the engine's prefill rate, and the sidecar declines the short prefix (fetching it would not beat
 * computing it: answered at once, nothing brought in) and loads the long one, reports the rates
 * with each answer and in STATS, and counts its decisions. The engine rate of the last lookups
 * is chosen from the rates the sidecar measured, with wide margins either way, so the test holds
 * on a slow or a busy machine; no time is asserted.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, describe, test } from 'node:test';
import { defaultConfig, type KvtierConfig } from '../../src/config/config.ts';
import type { ChunkHash } from '../../src/hashing/chunk-hash.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { Sidecar } from '../../src/sidecar.ts';
import { silentLogger } from '../../src/util/log.ts';
import { packHex, randomNamespace, taggedHashes } from '../support/fixtures.ts';
import { startS3 } from '../support/s3-server.ts';

const TOKENS = 256;
const CHUNK_BYTES = 16 * 1024;

const cleanups: (() => Promise<void>)[] = [];
after(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => {});
});

async function start(
  cfg: KvtierConfig,
  ns: string,
): Promise<{ sidecar: Sidecar; client: LookupClient }> {
  const sidecar = await Sidecar.start({ config: cfg, processMetrics: false, log: silentLogger });
  const client = new LookupClient({
    endpoint: sidecar.server.endpoint,
    namespaces: [ns],
    lookupTimeoutMs: 20_000,
  });
  cleanups.push(async () => {
    await client.close();
    await sidecar.close();
  });
  return { sidecar, client };
}

function ask(client: LookupClient, id: string, hs: ChunkHash[], computeTokensPerSec: number) {
  return client.lookupAsync(
    id,
    packHex(hs),
    hs.map(() => TOKENS),
    {
      config: { computeTokensPerSec },
      timeoutMs: 20_000,
    },
  );
}

describe('claim rule through a sidecar with a real S3 tier', () => {
  test('a slow S3 tier declines a short prefix and loads a long one, at the rates it measured', async () => {
    const s3 = await startS3();
    cleanups.push(() => s3.close());
    const cfg = defaultConfig();
    cfg.listen = 'tcp://127.0.0.1:*';
    cfg.metrics = null;
    cfg.tiers = [
      { name: 'cpu', type: 'local-cpu', options: { capacityBytes: 64 * 1024 * 1024 } },
      {
        name: 's3',
        type: 's3',
        options: {
          bucket: s3.bucket,
          endpoint: s3.endpoint,
          forcePathStyle: true,
          accessKeyId: 'S3RVER',
          secretAccessKey: 'S3RVER',
        },
      },
    ];
    const ns = randomNamespace();
    const warm = [0, 1, 2].map((i) => taggedHashes(4, `warm-${i}`));
    const short = taggedHashes(1, 'short');
    const long = taggedHashes(16, 'long');
    // Stored through one sidecar (written through to S3), then looked up through a fresh one:
    // its host memory is empty and S3 holds every chunk.
    const first = await start(cfg, ns);
    for (const h of [...warm.flat(), ...short, ...long])
      assert.equal(await first.client.put(ns, h, TOKENS, randomBytes(CHUNK_BYTES)), 'stored');
    await first.sidecar.storage.writeQueue.idle();
    await first.client.close();
    await first.sidecar.close();
    const { sidecar, client } = await start(cfg, ns);

    // Measured first: at one token a second any tier is worth fetching from, and every fetch
    // and probe is a sample of the S3 tier's rate.
    for (const [i, hs] of warm.entries()) {
      const a = await ask(client, `warm-${i}`, hs, 1);
      assert.equal(a.hitTokens, hs.length * TOKENS, `warm-up ${i} loaded`);
      assert.equal(a.tierRates?.find((t) => t.tier === 's3')?.decision, 'load');
    }
    const tiers = (await client.stats()).tiers as {
      name: string;
      readRate?: { bytesPerSec: number | null; latencyMs: number | null; source: string };
    }[];
    const rate = tiers.find((t) => t.name === 's3')?.readRate;
    assert.ok(rate !== undefined && rate.source === 'measured', JSON.stringify(rate));
    const bw = rate.bytesPerSec ?? 0;
    const latency = (rate.latencyMs ?? 0) / 1000;
    assert.ok(bw > 0 && latency > 0, JSON.stringify(rate));

    // An engine whose seconds per token sit between the short and the long prefix's fetch
    // time per token: the short one loses by half the latency, the long one wins by 7 of it.
    const bpt = CHUNK_BYTES / TOKENS;
    const secondsPerToken = bpt / bw + latency / (2 * TOKENS);
    const engine = 1 / secondsPerToken;

    const s = await ask(client, 'short', short, engine);
    assert.equal(s.status, 'ok');
    assert.equal(s.hitTokens, 0, 'the short prefix is recomputed');
    const declined = s.tierRates?.find((t) => t.tier === 's3');
    assert.equal(declined?.decision, 'decline');
    assert.ok((declined?.readBytesPerSec ?? 0) > 0 && (declined?.latencyMs ?? 0) > 0);
    assert.equal(s.bytesPerToken, bpt);
    const inHost = sidecar.storage.cpu.stats().chunks;

    const l = await ask(client, 'long', long, engine);
    assert.equal(l.hitTokens, long.length * TOKENS, 'the long prefix is loaded');
    assert.deepEqual(l.tiers, [{ tier: 's3', tokens: long.length * TOKENS }]);
    assert.equal(l.tierRates?.find((t) => t.tier === 's3')?.decision, 'load');
    assert.equal(
      sidecar.storage.cpu.stats().chunks,
      inHost + long.length,
      'the long prefix was brought in, the short one never was',
    );

    const text = await sidecar.metrics.text();
    assert.match(text, /kvtier_lookup_tier_decisions_total\{tier="s3",decision="decline"\} 1\n/);
    assert.match(text, /kvtier_lookup_tier_decisions_total\{tier="s3",decision="load"\} 4\n/);
    assert.match(text, /kvtier_tier_read_bandwidth_bytes_per_second\{tier="s3"\} \d/);
    assert.match(text, /kvtier_tier_read_latency_seconds\{tier="s3"\} \d/);
  });

  test('a client that does not name the rate gets the reply it always got', async () => {
    const cfg = defaultConfig();
    cfg.listen = 'tcp://127.0.0.1:*';
    cfg.metrics = null;
    cfg.tiers = [{ name: 'cpu', type: 'local-cpu', options: { capacityBytes: 16 * 1024 * 1024 } }];
    const ns = randomNamespace();
    const { client } = await start(cfg, ns);
    const hs = taggedHashes(2, 'old');
    for (const h of hs) await client.put(ns, h, TOKENS, randomBytes(CHUNK_BYTES));
    const a = await client.lookupAsync('old', packHex(hs), [TOKENS, TOKENS]);
    assert.equal(a.hitTokens, 2 * TOKENS);
    assert.equal(a.tierRates, undefined);
    assert.equal(a.bytesPerToken, undefined);
    const b = await ask(client, 'new', hs, 5000);
    assert.equal(b.hitTokens, 2 * TOKENS);
    assert.deepEqual(
      b.tierRates?.map((t) => [t.tier, t.decision]),
      [['cpu', 'none']],
    );
  });
});
