/**
 * The acceptance scenario across processes: a lookup server with tiers LocalCPU + GatedBackend
 * runs in a child process (test/support/server-process.ts); the client runs here. After the CPU
 * tier is dropped, the non-blocking lookup answers null while the lower tier is held, then the
 * hit count once it is released.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { hashChunks, hashToHex } from '../../src/hashing/chunk-hasher.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import {
  nextTurn,
  pollUntilNumber,
  randomNamespace,
  randomPayload,
  type ServerProcess,
  startServerProcess,
} from '../support/fixtures.ts';

describe('lookup server in another process', () => {
  let child: ServerProcess | undefined;
  let client: LookupClient | undefined;
  const ns = randomNamespace();

  before(async () => {
    child = await startServerProcess();
    client = new LookupClient({
      endpoint: child.endpoint,
      namespaces: [ns],
      lookupTimeoutMs: 20_000,
    });
  });

  after(async () => {
    await client?.close();
    await child?.kill();
  });

  it('hits in CPU, then null while the lower tier loads, then the number', async () => {
    const c = client!;
    const proc = child!;
    // 1000 tokens in chunks of 256 with the partial tail: 256 + 256 + 256 + 232.
    const tokens = Array.from({ length: 1000 }, (_, i) => (i * 7919) % 50_000);
    const chunks = hashChunks(tokens, { chunkSize: 256, partial: true });
    assert.equal(chunks.length, 4);
    const counts = chunks.map((ch) => ch.end - ch.start);
    const hashes = chunks.map((ch) => ch.hash);
    const stored = 3;
    for (const ch of chunks.slice(0, stored)) {
      const outcome = await c.put(ns, hashToHex(ch.hash), ch.end - ch.start, randomPayload(16384));
      assert.equal(outcome, 'stored');
    }
    await proc.command('flush');

    const first = await c.lookupAsync('x1', hashes, counts);
    assert.equal(first.status, 'ok');
    assert.equal(first.hitTokens, 768);
    assert.equal(first.hitChunks, stored);
    assert.deepEqual(first.tiers, [{ tier: 'cpu', tokens: 768 }]);
    assert.equal(await c.cancel('x1'), true);

    await proc.command('clear-cpu');
    const stats = (await c.stats()) as { tiers: { name: string; chunks: number }[] };
    assert.deepEqual(
      stats.tiers.map((t) => [t.name, t.chunks]),
      [
        ['cpu', 0],
        ['gated', stored],
      ],
    );

    assert.equal(c.lookup('x2', hashes, counts), null);
    await proc.command('waiting 1');
    for (let i = 0; i < 10; i++) {
      assert.equal(c.lookup('x2', hashes, counts), null, `call ${i + 1} while the gate is closed`);
      await nextTurn();
    }
    await proc.command('open');
    assert.equal(await pollUntilNumber(() => c.lookup('x2', hashes, counts)), 768);
    assert.equal(await c.cancel('x2'), true);

    // The prefetch brought the chunks back into the CPU tier: a CPU-only lookup hits.
    const cpuOnly = await c.lookupAsync('x3', hashes, counts, {
      config: { prefetch: false, pin: false },
    });
    assert.equal(cpuOnly.hitTokens, 768);
    assert.deepEqual(cpuOnly.tiers, [{ tier: 'cpu', tokens: 768 }]);
  });
});
