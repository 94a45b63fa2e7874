/**
 * Epochs never go back across restarts: a sidecar cleared more times than seconds have passed
 * is followed, on the same epoch file, by one that starts above every epoch it gave out, so a
 * client that saw them keeps taking the new answers as fresh (not stale, not 0 hit tokens).
 */
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { defaultConfig, type KvtierConfig } from '../../src/config/config.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { Sidecar } from '../../src/sidecar.ts';
import { clockEpoch, EpochFile, startEpoch } from '../../src/storage-manager/epoch-file.ts';
import { silentLogger } from '../../src/util/log.ts';
import { freeTcpPort, randomHashes, randomNamespace, randomPayload } from '../support/fixtures.ts';

let dir = '';
before(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kvtier-epoch-'));
});
after(async () => {
  await rm(dir, { recursive: true, force: true });
});

function config(epochFile: string | null, listen: string): KvtierConfig {
  const cfg = defaultConfig();
  cfg.listen = listen;
  cfg.metrics = null;
  cfg.tiers = [{ name: 'cpu', type: 'local-cpu', options: { capacityBytes: 16 * 1024 ** 2 } }];
  cfg.storage.epochFile = epochFile;
  return cfg;
}

describe('epochs across restarts', () => {
  it('a successor starts above every epoch its predecessor gave out, however often it cleared', async () => {
    const file = join(dir, 'state', 'epoch');
    const ns = randomNamespace();
    const endpoint = `tcp://127.0.0.1:${await freeTcpPort()}`;
    const start = () =>
      Sidecar.start({ config: config(file, endpoint), log: silentLogger, processMetrics: false });
    // One client across the restart, as a scheduler's: it drops answers below the highest epoch
    // it has seen.
    const client = new LookupClient({ endpoint, namespaces: [ns], lookupTimeoutMs: 30_000 });
    try {
      const first = await start();
      let last = 0;
      try {
        for (let i = 0; i < 200; i++) last = await client.clear([ns]);
        assert.ok(last >= clockEpoch() + 150, 'cleared more times than seconds passed');
        assert.equal(Number((await readFile(file, 'utf8')).trim()), last, 'the file holds it');
      } finally {
        await first.close();
      }
      const second = await start();
      try {
        assert.ok(second.storage.epoch > last, `${second.storage.epoch} > ${last}`);
        const [h] = randomHashes(1);
        assert.equal(await client.put(ns, h!, 16, randomPayload(64)), 'stored');
        const answer = await client.lookupAsync('fresh', Buffer.from(h!, 'hex'), [16]);
        assert.equal(answer.status, 'ok', 'not taken as stale');
        assert.equal(answer.hitTokens, 16);
      } finally {
        await second.close();
      }
    } finally {
      await client.close();
    }
  });

  it('starts from the clock when the file is older, and never lowers the file', async () => {
    const file = join(dir, 'old', 'epoch');
    const now = Date.UTC(2030, 0, 1);
    assert.equal(startEpoch(undefined, now), clockEpoch(now));
    assert.equal(startEpoch(5, now), clockEpoch(now), 'an old file does not hold the clock back');
    assert.equal(startEpoch(clockEpoch(now) + 9, now), clockEpoch(now) + 10);
    const f = new EpochFile(file);
    assert.equal(await f.read(), undefined, 'no file yet');
    await Promise.all([f.write(12), f.write(30), f.write(20)]);
    assert.equal(await f.read(), 30);
    await writeFile(file, 'twelve\n');
    await assert.rejects(f.read(), /must hold an epoch .* got "twelve"/);
  });
});
