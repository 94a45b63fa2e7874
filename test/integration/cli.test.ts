/**
 * The `kvtier` command as a user runs it: `bin/kvtier.js serve` with no config at all, the ops
 * endpoints, the client commands against it, `hash`, SIGTERM, and the exit codes of bad input.
 */
import assert from 'node:assert/strict';
import type { ChildProcessWithoutNullStreams } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdtempSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { existingAncestor, filesystemSpace } from '../../src/config/host-limits.ts';
import { unwritableDir } from '../../src/config/preflight.ts';
import { hashChunks, hashToHex } from '../../src/hashing/chunk-hasher.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { spawnGuarded } from '../support/child-guard.ts';
import {
  freeTcpPort,
  REPO_ROOT,
  randomNamespace,
  randomPayload,
  withDeadline,
} from '../support/fixtures.ts';
import { assertValidPromText } from '../support/prom-text.ts';

const BIN = join(REPO_ROOT, 'bin', 'kvtier.js');
/** Upper bound on any one CLI run or wait; exceeding it fails the test. */
const DEADLINE_MS = 120_000;

/** The default disk tier lives under the cache directory: keep the test's in a temp dir. */
const CACHE_HOME = mkdtempSync(join(tmpdir(), 'kvtier-cli-cache-'));

/** The environment without KVTIER_* variables, so only flags configure the CLI. */
function cleanEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { XDG_CACHE_HOME: CACHE_HOME };
  for (const [k, v] of Object.entries(process.env))
    if (!k.startsWith('KVTIER_') && k !== 'XDG_CACHE_HOME') env[k] = v;
  return env;
}

function spawnCli(args: string[]): ChildProcessWithoutNullStreams {
  return spawnGuarded(process.execPath, [BIN, ...args], {
    cwd: REPO_ROOT,
    env: cleanEnv(),
    stdio: ['pipe', 'pipe', 'pipe'],
  });
}

interface CliResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/** Runs `kvtier ...args` to completion, feeding `input` on stdin. */
async function runCli(args: string[], input = ''): Promise<CliResult> {
  const child = spawnCli(args);
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => {
    stdout += d;
  });
  child.stderr.setEncoding('utf8').on('data', (d: string) => {
    stderr += d;
  });
  child.stdin.end(input);
  const done = new Promise<CliResult>((resolve) => {
    child.once('close', (code, signal) => resolve({ code, signal, stdout, stderr }));
  });
  try {
    return await withDeadline(done, DEADLINE_MS, `kvtier ${args.join(' ')}`);
  } finally {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  }
}

function nonEmptyLines(text: string): string[] {
  return text.split('\n').filter((l) => l.trim() !== '');
}

// The tests of this suite run in order against one server: /metrics is read after a lookup has
// been counted, and the last test stops the server.
describe('kvtier serve with no config', () => {
  let server: ChildProcessWithoutNullStreams | undefined;
  let exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }> | undefined;
  let serverStderr = '';
  let endpoint = '';
  let metricsUrl = '';
  let tmp = '';

  before(async () => {
    tmp = await mkdtemp(join(tmpdir(), 'kvtier-cli-'));
    const port = await freeTcpPort();
    endpoint = `tcp://127.0.0.1:${port}`;
    const child = spawnCli(['serve', '--listen', endpoint, '--metrics-port', '0']);
    server = child;
    exited = new Promise((resolve) => {
      child.once('exit', (code, signal) => resolve({ code, signal }));
    });
    child.stdin.end();
    child.stdout.resume();
    const found = new Promise<string>((resolve, reject) => {
      child.stderr.setEncoding('utf8').on('data', (d: string) => {
        serverStderr += d;
        const m = /"metrics":"(http:\/\/[^"]+\/metrics)"[^\n]*"msg":"serving on /.exec(
          serverStderr,
        );
        if (m !== null) resolve(m[1]!);
      });
      exited!.then(({ code }) =>
        reject(new Error(`kvtier serve exited with ${code}:\n${serverStderr}`)),
      );
    });
    metricsUrl = await withDeadline(found, DEADLINE_MS, 'kvtier serve start-up line');
  });

  after(async () => {
    if (server !== undefined && server.exitCode === null && server.signalCode === null) {
      server.kill('SIGKILL');
      await exited;
    }
    if (tmp !== '') await rm(tmp, { recursive: true, force: true });
  });

  it('prints where it serves as a JSON line: the endpoint, the tiers, the config and the metrics URL', () => {
    const line = serverStderr
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as Record<string, unknown>)
      .find((l) => String(l.msg).startsWith(`serving on ${endpoint}, metrics at `));
    assert.ok(line !== undefined, serverStderr);
    assert.equal(line.endpoint, endpoint);
    assert.equal(line.metrics, metricsUrl);
    const tiers = line.tiers as { name: string; capacityBytes?: number }[];
    assert.equal(tiers[0]!.name, 'cpu');
    assert.ok(typeof tiers[0]!.capacityBytes === 'number');
    assert.equal(typeof line.config, 'string');
    assert.match(metricsUrl, /^http:\/\/127\.0\.0\.1:\d+\/metrics$/);
    assert.doesNotMatch(metricsUrl, /:0\/metrics$/, 'the real port, not 0');
  });

  it('ping and stats exit 0 with JSON', async () => {
    const ping = await runCli(['ping', '--endpoint', endpoint]);
    assert.equal(ping.code, 0, ping.stderr);
    const info = JSON.parse(ping.stdout) as Record<string, unknown>;
    assert.equal(info.protocolVersion, 1);
    assert.equal(typeof info.version, 'string');

    const stats = await runCli(['stats', '--endpoint', endpoint]);
    assert.equal(stats.code, 0, stats.stderr);
    const s = JSON.parse(stats.stdout) as { tiers: { name: string; kind: string }[] };
    assert.deepEqual(
      s.tiers.map((t) => [t.name, t.kind]),
      [
        ['cpu', 'local-cpu'],
        ['disk', 'local-disk'],
      ],
    );
  });

  it('lookup reports tokens stored through a LookupClient as cached', async () => {
    const ns = randomNamespace();
    const tokens = Array.from({ length: 600 }, (_, i) => (i * 31 + 7) % 32_000);
    const chunks = hashChunks(tokens, { chunkSize: 256, partial: true });
    assert.equal(chunks.length, 3);
    const c = new LookupClient({ endpoint, namespaces: [ns] });
    try {
      for (const ch of chunks.slice(0, 2)) {
        assert.equal(
          await c.put(ns, hashToHex(ch.hash), ch.end - ch.start, randomPayload(4096)),
          'stored',
        );
      }
    } finally {
      await c.close();
    }
    const file = join(tmp, 'tokens.json');
    await writeFile(file, JSON.stringify(tokens));
    const res = await runCli([
      'lookup',
      '--namespace',
      ns,
      '--tokens',
      file,
      '--partial',
      '--endpoint',
      endpoint,
    ]);
    assert.equal(res.code, 0, res.stderr);
    const lines = nonEmptyLines(res.stdout);
    assert.match(lines[0] ?? '', /^512 of 600 tokens cached \(2 of 3 chunks, epoch \d+\)$/);
    assert.deepEqual(lines.slice(1), ['  cpu: 512 tokens']);

    const other = await runCli([
      'lookup',
      '--namespace',
      randomNamespace(),
      '--tokens',
      file,
      '--endpoint',
      endpoint,
    ]);
    assert.equal(other.code, 0, other.stderr);
    assert.match(
      nonEmptyLines(other.stdout)[0] ?? '',
      /^0 of 512 tokens cached \(0 of 2 chunks, epoch \d+\)$/,
    );
  });

  it('serves valid Prometheus text on /metrics, and 200 on /healthz and /readyz', async () => {
    const res = await fetch(metricsUrl);
    assert.equal(res.status, 200);
    const text = await res.text();
    assertValidPromText(text);
    assert.match(text, /^kvtier_lookups_total(\{[^}]*\})? \d+/m, 'a kvtier_lookups_total sample');
    assert.match(
      text,
      /^kvtier_backend_capacity_bytes\{tier="disk"\} \d+/m,
      'the default has a disk tier',
    );
    assert.ok(
      existsSync(join(CACHE_HOME, 'kvtier', 'chunks')),
      'the disk tier lives in the cache directory',
    );
    const base = metricsUrl.slice(0, -'/metrics'.length);
    for (const path of ['/healthz', '/readyz']) {
      const r = await fetch(`${base}${path}`);
      assert.equal(r.status, 200, path);
      await r.arrayBuffer();
    }
  });

  it('exits 0 on SIGTERM', async () => {
    assert.ok(server !== undefined && exited !== undefined);
    assert.equal(server.kill('SIGTERM'), true);
    const { code, signal } = await withDeadline(exited, DEADLINE_MS, 'exit after SIGTERM');
    assert.equal(signal, null);
    assert.equal(code, 0, serverStderr);
  });
});

describe('kvtier client-side commands and errors', () => {
  it('hash prints one line per chunk for tokens on stdin', async () => {
    const tokens = Array.from({ length: 300 }, (_, i) => i);
    const res = await runCli(['hash', '--chunk-size', '128', '--partial'], JSON.stringify(tokens));
    assert.equal(res.code, 0, res.stderr);
    const expected = hashChunks(tokens, { chunkSize: 128, partial: true }).map(
      (c) => `${c.start} ${c.end} ${hashToHex(c.hash)}`,
    );
    assert.deepEqual(nonEmptyLines(res.stdout), expected);
    assert.equal(expected.length, 3);
  });

  it('serve --config /nonexistent exits 2 with one clear error line', async () => {
    const res = await runCli(['serve', '--config', '/nonexistent', '--metrics-port', '0']);
    assert.equal(res.code, 2);
    const lines = nonEmptyLines(res.stderr);
    assert.equal(lines.length, 1, `expected one line, got:\n${res.stderr}`);
    assert.match(lines[0]!, /^kvtier serve: .*\/nonexistent/);
    assert.equal(res.stdout, '');
  });

  it('config check prints a valid file resolved, credentials redacted, and exits 0', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-cli-config-'));
    try {
      const file = join(dir, 'kvtier.json');
      await writeFile(
        file,
        JSON.stringify({
          $schema: '../schema/kvtier.config.schema.json',
          tiers: [
            { name: 'cpu', type: 'local-cpu', capacityBytes: '256MiB' },
            { name: 'remote', type: 'redis', url: 'redis://app:hunter2@10.0.0.5:6379/0' },
            {
              name: 's3',
              type: 's3',
              bucket: 'kv',
              accessKeyId: 'AKID',
              secretAccessKey: 'sekrit',
            },
          ],
          storage: { writeThrough: { maxBytes: '64MiB' } },
        }),
      );
      // --offline: nothing listens at 10.0.0.5; without it the check connects, as serve does.
      const res = await runCli(['config', 'check', '--offline', file]);
      assert.equal(res.code, 0, res.stderr);
      assert.equal(res.stderr, '');
      assert.doesNotMatch(res.stdout, /hunter2|sekrit/);
      const cfg = JSON.parse(res.stdout) as {
        tiers: Record<string, unknown>[];
        storage: { writeThrough: { maxBytes: number } };
        baseDir?: string;
      };
      assert.equal(cfg.tiers[0]!.capacityBytes, 256 * 1024 ** 2);
      assert.equal(cfg.tiers[1]!.url, 'redis://[redacted]@10.0.0.5:6379/0');
      assert.equal(cfg.tiers[2]!.secretAccessKey, '[redacted]');
      assert.equal(cfg.tiers[2]!.accessKeyId, 'AKID');
      assert.equal(cfg.storage.writeThrough.maxBytes, 64 * 1024 ** 2);
      assert.equal(cfg.baseDir, undefined, 'not a config key');

      // Online, nothing answers there: both tiers are listed as not reached, and serve would start
      // with them down, so the check passes and prints the same resolved config.
      const online = await runCli(['config', 'check', file]);
      assert.equal(online.code, 0, online.stderr);
      assert.equal(online.stdout, res.stdout);
      assert.match(online.stderr, /: tiers\[1\]: tier "remote" \(redis\) could not be reached: /);
      assert.match(online.stderr, /: tiers\[2\]: tier "s3" \(s3\) could not be reached: /);
      assert.doesNotMatch(online.stderr, /hunter2|sekrit/);

      const deployed = await runCli([
        'config',
        'check',
        '--offline',
        join(REPO_ROOT, 'deploy', 'kvtier.json'),
      ]);
      // The deployment's paths are under /var/cache/kvtier (the image's volume): writable as root
      // here, or else the only problems. Its 64 GiB disk tier is sized for the deployment's
      // volume: where this filesystem has less free space, that is refused, with the numbers.
      const undersized =
        filesystemSpace(existingAncestor('/var/cache/kvtier')).freeBytes < 64 * 1024 ** 3;
      const expected = [
        ...((await unwritableDir('/var/cache/kvtier')) === undefined
          ? []
          : [/\/var\/cache\/kvtier.* not writable/]),
        ...(undersized
          ? [
              /tiers\[1\]\.capacityBytes: 64 GiB is more than the .* free on the filesystem of \/var\/cache\/kvtier\/chunks; lower it, or set allowOversizedTiers/,
            ]
          : []),
      ];
      if (expected.length === 0) assert.equal(deployed.code, 0, deployed.stderr);
      else {
        assert.notEqual(deployed.code, 0);
        const lines = nonEmptyLines(deployed.stderr);
        for (const line of lines)
          assert.ok(
            expected.some((re) => re.test(line)),
            `an expected problem: ${line}`,
          );
        for (const re of expected)
          assert.ok(
            lines.some((l) => re.test(l)),
            `${re} reported in ${deployed.stderr}`,
          );
      }
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("process warnings are one line each (the AWS SDK's notice on Node 20 when S3 is built)", async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-cli-config-'));
    try {
      const file = join(dir, 's3.json');
      await writeFile(
        file,
        JSON.stringify({
          listen: 'tcp://127.0.0.1:*',
          metrics: null,
          storage: { epochFile: null },
          tiers: [
            { name: 'cpu', type: 'local-cpu', capacityBytes: '16MiB' },
            {
              name: 's3',
              type: 's3',
              endpoint: 'http://127.0.0.1:9',
              bucket: 'kv',
              region: 'us-east-1',
              accessKeyId: 'AKID',
              secretAccessKey: 'sekrit',
            },
          ],
        }),
      );
      // The check builds the S3 tier and closes it; nothing listens on port 9, so the tier is
      // listed as not reached (one line of its own, not a warning).
      const res = await runCli(['config', 'check', file]);
      assert.equal(res.code, 0, res.stderr);
      const lines = nonEmptyLines(res.stderr).filter(
        (l) => !/: tiers\[1\]: tier "s3" \(s3\) could not be reached: /.test(l),
      );
      assert.equal(nonEmptyLines(res.stderr).length, lines.length + 1, res.stderr);
      for (const line of lines) assert.match(line, /^kvtier: warning: /);
      if (Number(process.versions.node.split('.')[0]) < 22)
        assert.ok(
          lines.some((l) => /^kvtier: warning: NodeVersionSupportWarning: .*node >=22/.test(l)),
          res.stderr,
        );
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('config check lists every problem with its key path and exits 1', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-cli-config-'));
    try {
      const file = join(dir, 'bad.json');
      await writeFile(
        file,
        JSON.stringify({
          listen: 'localhost:5555',
          tiers: [
            { type: 'local-cpu', capacityBytes: '4 parsecs' },
            { type: 'redis', port: 70000, hots: 'x' },
          ],
          storage: { writeThrough: { concurrency: 1000 } },
        }),
      );
      const res = await runCli(['config', 'check', file]);
      assert.equal(res.code, 1);
      assert.equal(res.stdout, '');
      assert.deepEqual(nonEmptyLines(res.stderr), [
        `${file}: listen: must be a ZMQ endpoint like "tcp://127.0.0.1:5555" (tcp://HOST:PORT with PORT 0..65535 or *, ipc://PATH or inproc://NAME), got "localhost:5555"`,
        `${file}: storage.writeThrough.concurrency: must be an integer in [1, 256], got 1000`,
        `${file}: tiers[0].capacityBytes: must be a byte size >= 4096 (an integer, or a string like "512MiB" or "4GiB"), got "4 parsecs"`,
        `${file}: tiers[1].port: must be an integer in [1, 65535], got 70000`,
        `${file}: tiers[1].hots: unknown redis option; allowed: name, type, health, url, host, port, cluster, username, password, db, tls, keyPrefix, ttlMs, timeoutMs, connectTimeoutMs, reconnectMaxDelayMs, maxChunkBytes`,
      ]);

      const order = join(dir, 'order.json');
      await writeFile(order, JSON.stringify({ tiers: [{ type: 'memory' }, { type: 'nope' }] }));
      const res2 = await runCli(['config', 'check', order]);
      assert.equal(res2.code, 1);
      const lines = nonEmptyLines(res2.stderr);
      assert.equal(lines.length, 2, res2.stderr);
      assert.match(lines[0]!, /: tiers\[1\]: .*unknown backend type "nope"/);
      assert.match(lines[1]!, /: tiers\[0\]\.type: the first tier must keep chunks in host memory/);

      const missing = await runCli(['config', 'check', join(dir, 'absent.json')]);
      assert.equal(missing.code, 1);
      assert.match(missing.stderr, /absent\.json: cannot read config file/);
      assert.equal((await runCli(['config', 'check'])).code, 2);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('a bad endpoint, port or key folder gets one line, not a stack trace', async () => {
    const stats = await runCli(['stats', '--endpoint', 'localhost:5601']);
    assert.equal(stats.code, 2);
    assert.deepEqual(nonEmptyLines(stats.stderr), [
      'kvtier stats: --endpoint must be a ZMQ endpoint: tcp://HOST:PORT (port 1..65535), ipc://PATH or inproc://NAME, got "localhost:5601" (did you mean "tcp://localhost:5601"?)',
    ]);
    const serve = await runCli(['serve', '--metrics-port', 'abc']);
    assert.equal(serve.code, 2);
    assert.deepEqual(nonEmptyLines(serve.stderr), [
      'kvtier serve: --metrics-port must be an integer in [0, 65535], got "abc"',
    ]);
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-cli-keys-'));
    try {
      const keygen = await runCli(['keygen', '--out', join(dir, 'etc', 'kvtier', 'keys')]);
      assert.equal(keygen.code, 0, keygen.stderr);
      assert.ok(existsSync(join(dir, 'etc', 'kvtier', 'keys', 'kvtier.key')));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('an unknown command exits 2', async () => {
    const res = await runCli(['frobnicate']);
    assert.equal(res.code, 2);
    assert.match(res.stderr, /unknown command "frobnicate"/);
  });

  it('a reader that goes away (kvtier ... | head) ends the command quietly', async () => {
    for (const args of [['--help'], ['simulate', '--help'], ['version']]) {
      const child = spawnCli(args);
      child.stdout.destroy(); // before the command writes anything: every write fails EPIPE
      let stderr = '';
      child.stderr.setEncoding('utf8').on('data', (d: string) => {
        stderr += d;
      });
      child.stdin.end();
      const [code] = await withDeadline(once(child, 'close'), DEADLINE_MS, args.join(' '));
      assert.equal(stderr, '', `kvtier ${args.join(' ')}`);
      assert.equal(code, 0, `kvtier ${args.join(' ')}`);
    }
  });
});
