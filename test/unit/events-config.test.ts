import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { loadConfig, resolveConfig } from '../../src/config/config.ts';
import { EVENTS_DEFAULTS } from '../../src/event-stream/events-options.ts';

const dir = mkdtempSync(join(tmpdir(), 'kvtier-events-config-'));
after(() => rmSync(dir, { recursive: true, force: true }));

function file(doc: unknown): string {
  const p = join(dir, `${Math.random().toString(36).slice(2)}.json`);
  writeFileSync(p, JSON.stringify(doc));
  return p;
}

describe('the events section', () => {
  it('is off by default; {} turns it on at the default endpoints', async () => {
    assert.equal((await loadConfig({}, { KVTIER_DISK: 'off' })).events, null);
    const cfg = resolveConfig({ events: {} });
    assert.deepEqual(cfg.events, {
      ...EVENTS_DEFAULTS,
      endpoint: 'tcp://127.0.0.1:5560',
      replayEndpoint: 'tcp://127.0.0.1:5561',
    });
    assert.equal(resolveConfig({ events: { replayEndpoint: null } }).events!.replayEndpoint, null);
    assert.equal(resolveConfig({ events: null }).events, null);
  });

  it('refuses bad values with their key path', () => {
    assert.throws(() => resolveConfig({ events: { endpoint: 'localhost:1' } }), /events\.endpoint/);
    assert.throws(() => resolveConfig({ events: { bufferBatches: 0 } }), /events\.bufferBatches/);
    assert.throws(
      () => resolveConfig({ events: { heartbeat: 5 } }),
      /events\.heartbeat: unknown key/,
    );
    assert.throws(
      () => resolveConfig({ events: { bufferBytes: '1KiB', sendHighWaterMark: -1 } }),
      /sendHighWaterMark/,
    );
  });

  it('KVTIER_EVENTS_ENDPOINT and --events turn it on or off over the file', async () => {
    const path = file({ events: { topic: 'mine', bufferBatches: 7 } });
    const env = { KVTIER_DISK: 'off', KVTIER_EVENTS_ENDPOINT: 'tcp://127.0.0.1:7000' };
    const fromEnv = await loadConfig({ configPath: path }, env);
    assert.equal(fromEnv.events!.endpoint, 'tcp://127.0.0.1:7000');
    assert.equal(fromEnv.events!.replayEndpoint, 'tcp://127.0.0.1:7001');
    assert.equal(fromEnv.events!.topic, 'mine', 'the file’s other settings stay');
    assert.equal(fromEnv.events!.bufferBatches, 7);
    const withReplay = await loadConfig(
      { configPath: path },
      { ...env, KVTIER_EVENTS_REPLAY_ENDPOINT: 'off' },
    );
    assert.equal(withReplay.events!.replayEndpoint, null);
    const flag = await loadConfig({ configPath: path, events: 'ipc:///tmp/ev' }, env);
    assert.equal(flag.events!.endpoint, 'ipc:///tmp/ev', 'the flag wins over the variable');
    assert.equal(flag.events!.replayEndpoint, 'ipc:///tmp/ev.replay');
    assert.equal((await loadConfig({ configPath: path, events: 'off' }, env)).events, null);
    await assert.rejects(
      loadConfig({}, { KVTIER_DISK: 'off', KVTIER_EVENTS_ENDPOINT: 'nowhere' }),
      /events\.endpoint \(from KVTIER_EVENTS_ENDPOINT\)/,
    );
  });
});
