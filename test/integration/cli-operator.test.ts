/**
 * What an operator meets first, on the real command: which modules a command loads (`version`
 * and `--help` nothing of the sidecar, a client command the client only), `--json` and
 * `--human` on stats and ping, `hash` saying why it printed nothing, a `.pub` file named as the
 * mistake it is, and `serve`'s signals: every line JSON with the config source and the disk
 * path, SIGUSR1 refused instead of opening the inspector, SIGHUP reloading the log level and the
 * client keys while host memory keeps its chunks.
 */
import assert from 'node:assert/strict';
import { type ChildProcess, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { generateCurveKeyPair, writeKeyPair } from '../../src/security/curve-keys.ts';
import { spawnGuarded } from '../support/child-guard.ts';
import {
  freeTcpPort,
  REPO_ROOT,
  randomHash,
  randomNamespace,
  randomPayload,
  withDeadline,
} from '../support/fixtures.ts';

const DEADLINE_MS = 120_000;
const BIN = join(REPO_ROOT, 'bin', 'kvtier.js');
const TRACE = join(REPO_ROOT, 'test', 'support', 'module-trace.mjs');

function cleanEnv(extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('KVTIER_')) env[k] = v;
  return { ...env, ...extra };
}

/** `kvtier ...args` as a process; its exit code, output and the modules it resolved. */
function kvtier(args: string[], opts: { input?: string; env?: NodeJS.ProcessEnv } = {}) {
  const dir = mkdtempSync(join(tmpdir(), 'kvtier-trace-'));
  const trace = join(dir, 'modules');
  writeFileSync(trace, '');
  try {
    const r = spawnSync(process.execPath, ['--import', TRACE, BIN, ...args], {
      cwd: REPO_ROOT,
      input: opts.input ?? '',
      encoding: 'utf8',
      env: cleanEnv({ ...opts.env, KVTIER_TRACE_MODULES: trace }),
      timeout: DEADLINE_MS,
    });
    const modules = readFileSync(trace, 'utf8')
      .split('\n')
      .filter((l) => l.startsWith('file:'))
      .map((u) => u.slice(`file://${REPO_ROOT}`.length));
    return { code: r.status, stdout: r.stdout, stderr: r.stderr, modules };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe('what each command loads', () => {
  it('version and --help load the command definitions only, no package and no sidecar code', () => {
    for (const args of [['version'], ['--help'], ['ping', '--help']]) {
      const r = kvtier(args);
      assert.equal(r.code, 0, r.stderr);
      const loaded = r.modules.filter((m) => !m.startsWith('bin/'));
      assert.deepEqual(
        loaded.filter((m) => m.includes('node_modules/')),
        [],
        `${args.join(' ')} loads no package`,
      );
      for (const m of loaded)
        assert.match(
          m,
          /^(dist\/)?src\/(cli\/(main|commands|options)|version|errors|hashing\/|util\/validate)/,
          `${args.join(' ')} loads ${m}`,
        );
    }
  });

  it('a client command loads the client, not the server, the tiers or their SDKs', () => {
    const r = kvtier(['ping', '--endpoint', 'tcp://127.0.0.1:9', '--timeout-ms', '200']);
    assert.equal(r.code, 1, r.stderr);
    assert.ok(r.modules.some((m) => m.includes('lookup-client/lookup-client')));
    for (const m of r.modules)
      assert.doesNotMatch(
        m,
        /sidecar|storage-manager|backends\/|lookup-server|@aws-sdk|ioredis|metrics\//,
        `ping loads ${m}`,
      );
  });
});

describe('client commands against a sidecar', () => {
  let tmp = '';
  let endpoint = '';
  let child: ChildProcess | undefined;
  let stderr = '';
  let exited: Promise<number | null>;
  let configFile = '';
  const ns = randomNamespace();
  const admin = generateCurveKeyPair();
  const server = generateCurveKeyPair();
  const late = generateCurveKeyPair();

  const config = (extra: Record<string, unknown>) => ({
    listen: endpoint,
    metrics: null,
    tiers: [
      { name: 'cpu', type: 'local-cpu', capacityBytes: '64MiB' },
      { name: 'disk', type: 'local-disk', path: join(tmp, 'chunks'), capacityBytes: '256MiB' },
    ],
    storage: { epochFile: join(tmp, 'epoch') },
    security: {
      serverSecretKeyFile: join(tmp, 'keys', 'server.key'),
      clients: [{ name: 'admin', publicKey: admin.publicKey, role: 'admin' }],
    },
    ...extra,
  });
  const keyEnv = (name = 'admin') => ({
    KVTIER_KEY_FILE: join(tmp, 'keys', `${name}.key`),
    KVTIER_SERVER_KEY: server.publicKey,
    KVTIER_ENDPOINT: endpoint,
  });

  /** Resolves once the sidecar's stderr past `from` holds `text` (an upper bound fails it). */
  function logged(text: string, from = 0): Promise<void> {
    return withDeadline(
      new Promise<void>((resolve, reject) => {
        const check = () => {
          if (stderr.indexOf(text, from) >= 0) {
            child!.stderr!.off('data', check);
            resolve();
          }
        };
        child!.stderr!.on('data', check);
        void exited.then((code) => reject(new Error(`serve exited ${code}:\n${stderr}`)));
        check();
      }),
      DEADLINE_MS,
      `"${text}" in the sidecar's log`,
    );
  }

  before(async () => {
    tmp = mkdtempSync(join(tmpdir(), 'kvtier-operator-'));
    await writeKeyPair(join(tmp, 'keys'), 'server', server);
    await writeKeyPair(join(tmp, 'keys'), 'admin', admin);
    await writeKeyPair(join(tmp, 'keys'), 'late', late);
    endpoint = `tcp://127.0.0.1:${await freeTcpPort()}`;
    configFile = join(tmp, 'kvtier.json');
    writeFileSync(configFile, JSON.stringify(config({ logLevel: 'info' })));
    const c = spawnGuarded(process.execPath, [BIN, 'serve', '--config', configFile], {
      cwd: REPO_ROOT,
      env: cleanEnv(),
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    child = c;
    exited = new Promise((resolve) => c.once('exit', (code) => resolve(code)));
    c.stderr!.setEncoding('utf8').on('data', (d: string) => {
      stderr += d;
    });
    await logged('"msg":"serving on ');
  });

  after(async () => {
    child?.kill('SIGKILL');
    await exited;
    rmSync(tmp, { recursive: true, force: true });
  });

  it('the start-up line is JSON and names the config file and the disk path', () => {
    const line = JSON.parse(stderr.split('\n').find((l) => l.includes('"msg":"serving on '))!);
    assert.equal(line.config, `--config ${configFile}`);
    assert.deepEqual(
      (line.tiers as { name: string; path?: string }[]).map((t) => [t.name, t.path]),
      [
        ['cpu', undefined],
        ['disk', join(tmp, 'chunks')],
      ],
    );
    assert.equal(line.epochFile, join(tmp, 'epoch'));
  });

  it('ping --json and stats --json print one JSON line; ping names the config and the disk path', () => {
    const ping = kvtier(['ping', '--json'], { env: keyEnv() });
    assert.equal(ping.code, 0, ping.stderr);
    assert.equal(ping.stdout.trim().split('\n').length, 1);
    const info = JSON.parse(ping.stdout);
    assert.equal(info.config, `--config ${configFile}`);
    assert.equal(info.tiers[1].path, join(tmp, 'chunks'));
    const stats = kvtier(['stats', '--json'], { env: keyEnv() });
    assert.equal(stats.code, 0, stats.stderr);
    assert.equal(stats.stdout.trim().split('\n').length, 1);
    assert.ok(Array.isArray(JSON.parse(stats.stdout).tiers));
  });

  it('stats --human shows each tier and each namespace with its chunks and bytes', async () => {
    const hash = randomHash();
    const put = kvtier(['put', '--namespace', ns, '--hash', hash, '--token-count', '256'], {
      input: randomPayload(10_000).toString('latin1'),
      env: keyEnv(),
    });
    assert.equal(put.code, 0, put.stderr);
    const stats = JSON.parse(kvtier(['stats', '--json'], { env: keyEnv() }).stdout);
    assert.deepEqual(stats.tiers[0].namespaces[ns].chunks, 1, 'STATS counts per namespace');
    const r = kvtier(['stats', '--human'], { env: keyEnv() });
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /^tier +type +health +chunks +bytes +fill +hit rate +evictions$/m);
    assert.match(r.stdout, /^cpu +local-cpu +up +1 /m);
    assert.match(r.stdout, new RegExp(`^${ns} +1 / `, 'm'));
    assert.match(r.stdout, new RegExp(`disk: ${join(tmp, 'chunks')}`));
  });

  it('a .pub file given as --key-file is named as the mistake', () => {
    const r = kvtier(['ping'], {
      env: { ...keyEnv(), KVTIER_KEY_FILE: join(tmp, 'keys', 'admin.pub') },
    });
    assert.equal(r.code, 2);
    assert.match(r.stderr, /admin\.pub is a public key file \(\.pub\)/);
    assert.doesNotMatch(r.stderr, /chmod/);
  });

  it('SIGUSR1 does not open the inspector: one warn line, and it keeps serving', async () => {
    child!.kill('SIGUSR1');
    await logged('SIGUSR1 ignored');
    assert.doesNotMatch(stderr, /Debugger listening/);
    assert.equal(kvtier(['ping'], { env: keyEnv() }).code, 0);
  });

  it('SIGHUP reloads the log level and the client keys; host memory keeps its chunks', async () => {
    const hash = randomHash();
    const payload = randomPayload(8192);
    const c = new LookupClient({
      endpoint,
      namespaces: [ns],
      curve: {
        serverPublicKey: server.publicKey,
        publicKey: admin.publicKey,
        secretKey: admin.secretKey,
      },
    });
    try {
      assert.equal(await c.put(ns, hash, 256, payload), 'stored');
      const before = kvtier(['ping', '--timeout-ms', '1000'], { env: keyEnv('late') });
      assert.equal(before.code, 1, 'a key not on the list yet gets no answer');
      writeFileSync(
        configFile,
        JSON.stringify(
          config({
            logLevel: 'debug',
            security: {
              serverSecretKeyFile: join(tmp, 'keys', 'server.key'),
              clients: [
                { name: 'admin', publicKey: admin.publicKey, role: 'admin' },
                { name: 'late', publicKeyFile: join(tmp, 'keys', 'late.pub'), role: 'lookup' },
              ],
            },
          }),
        ),
      );
      const mark = stderr.length;
      child!.kill('SIGHUP');
      await logged('SIGHUP: config reloaded', mark);
      const after = kvtier(['ping'], { env: keyEnv('late') });
      assert.equal(after.code, 0, `the new key is served: ${after.stderr}`);
      const got = await c.get(ns, hash);
      assert.ok(got?.payload.equals(payload), 'the chunk stored before SIGHUP is still there');
      const stats = (await c.stats()) as { tiers: { chunks: number }[] };
      assert.ok(stats.tiers[0]!.chunks >= 2, 'host memory was not dropped');
      await logged('"level":"debug"', mark);
      assert.equal(child!.exitCode, null, 'still running');
    } finally {
      await c.close();
    }
  });

  it('every line it wrote is a JSON log line', () => {
    for (const line of stderr.split('\n').filter((l) => l.trim() !== ''))
      assert.doesNotThrow(() => JSON.parse(line), line);
  });
});

describe('kvtier hash', () => {
  it('says why it printed nothing for fewer tokens than a chunk', () => {
    const r = kvtier(['hash'], { input: JSON.stringify([1, 2, 3]) });
    assert.equal(r.code, 0);
    assert.equal(r.stdout, '');
    assert.match(r.stderr, /3 tokens make no whole chunk of 256: nothing to hash \(--partial/);
  });
});
