/**
 * `kvtier config check` (and so serve, which runs the same checks) on what a first trial got
 * wrong: ports past 65535, endpoints that clash, an `fs` tier whose directory does not exist,
 * sizes beyond the host (with the numbers, and the override), S3 reached, and the check's output
 * fed back to it. Host limits come from a cgroup tree written in a temp dir.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { runConfigCommand } from '../../src/cli/config-command.ts';
import { defaultCpuCapacityBytes, loadConfig } from '../../src/config/config.ts';
import { cgroupMemoryLimitBytes, hostSizeProblems } from '../../src/config/host-limits.ts';
import { generateCurveKeyPair, writeKeyPair } from '../../src/security/curve-keys.ts';
import { freeTcpPort, REPO_ROOT } from '../support/fixtures.ts';
import { type S3Harness, S3RVER_CREDENTIALS, startS3 } from '../support/s3-server.ts';

let tmp = '';
before(() => {
  tmp = mkdtempSync(join(tmpdir(), 'kvtier-config-operator-'));
});
after(() => rmSync(tmp, { recursive: true, force: true }));

let n = 0;
async function check(doc: unknown, args: string[] = [], env: NodeJS.ProcessEnv = {}) {
  const file = join(tmp, `c${n++}.json`);
  writeFileSync(file, typeof doc === 'string' ? doc : JSON.stringify(doc));
  const out: string[] = [];
  const err: string[] = [];
  const code = await runConfigCommand(['check', ...args, file], {
    out: (l) => out.push(l),
    err: (l) => err.push(l),
    env,
  });
  return { code, out: out.join('\n'), err: err.join('\n') };
}

const cpu = { name: 'cpu', type: 'local-cpu', capacityBytes: '64MiB' };

describe('config check refuses what serve cannot do', () => {
  it('a port past 65535, in listen and in the event stream', async () => {
    const r = await check({ listen: 'tcp://127.0.0.1:99999', tiers: [cpu] });
    assert.equal(r.code, 1);
    assert.match(
      r.err,
      /listen: must be a ZMQ endpoint .*PORT 0\.\.65535.*got "tcp:\/\/127\.0\.0\.1:99999"/,
    );
    const e = await check({ tiers: [cpu], events: { endpoint: 'tcp://127.0.0.1:70000' } });
    assert.equal(e.code, 1);
    assert.match(e.err, /events\.endpoint: must be a ZMQ endpoint/);
    assert.equal(
      (await check({ listen: 'tcp://127.0.0.1:65535', metrics: null, tiers: [cpu] })).code,
      0,
    );
  });

  it('listen, metrics and events endpoints on one address', async () => {
    const port = await freeTcpPort();
    const r = await check({
      listen: `tcp://127.0.0.1:${port}`,
      metrics: { host: '0.0.0.0', port },
      events: { endpoint: `tcp://127.0.0.1:${port}`, replayEndpoint: null },
      tiers: [cpu],
    });
    assert.equal(r.code, 1);
    assert.match(r.err, /metrics\.port: http:\/\/0\.0\.0\.0:\d+ would bind the address of listen/);
    assert.match(
      r.err,
      /events\.endpoint: tcp:\/\/127\.0\.0\.1:\d+ would bind the address of listen/,
    );
  });

  it("an fs tier's directory must exist: it is never created", async () => {
    const missing = join(tmp, 'not-mounted', 'kv');
    const r = await check({ tiers: [cpu, { name: 'nfs', type: 'fs', path: missing }] });
    assert.equal(r.code, 1);
    assert.match(r.err, /tiers\[1\]\.path: .*not-mounted\/kv does not exist: .*never created/);
    mkdirSync(missing, { recursive: true });
    assert.equal(
      (await check({ tiers: [cpu, { name: 'nfs', type: 'fs', path: missing }] })).code,
      0,
    );
  });

  it('a tier beyond the host, with the numbers; allowOversizedTiers starts anyway', async () => {
    const big = {
      tiers: [{ name: 'cpu', type: 'local-cpu', capacityBytes: '1TiB' }],
      metrics: null,
    };
    const r = await check(big);
    assert.equal(r.code, 1);
    assert.match(
      r.err,
      /tiers\[0\]\.capacityBytes: 1 TiB of host memory is more than .*GiB.*allowOversizedTiers/,
    );
    const disk = join(tmp, 'disk');
    const d = await check({
      metrics: null,
      tiers: [cpu, { name: 'disk', type: 'local-disk', path: disk, capacityBytes: '100TiB' }],
    });
    assert.equal(d.code, 1);
    assert.match(
      d.err,
      /tiers\[1\]\.capacityBytes: 100 TiB is more than the .* free on the filesystem of/,
    );
    // serve refuses it the same way, before it builds anything.
    const file = join(tmp, 'big.json');
    writeFileSync(file, JSON.stringify(big));
    const served = spawnSync(
      process.execPath,
      [join(REPO_ROOT, 'bin', 'kvtier.js'), 'serve', '--config', file],
      {
        encoding: 'utf8',
        timeout: 120_000,
        env: { PATH: process.env.PATH, HOME: tmp },
      },
    );
    assert.equal(served.status, 2, served.stderr);
    assert.match(served.stderr, /tiers\[0\]\.capacityBytes: 1 TiB of host memory is more than/);
    // The override prints it back (a round trip keeps it).
    assert.equal((await check({ ...big, allowOversizedTiers: true }, ['--offline'])).code, 0);
    assert.equal((await check(big, [], { KVTIER_ALLOW_OVERSIZED_TIERS: '1' })).code, 0);
  });
});

describe('host limits', () => {
  function cgroupTree(kind: 'v1' | 'v2', limit: string) {
    const root = mkdtempSync(join(tmp, `cg-${kind}-`));
    const self = join(root, 'self-cgroup');
    if (kind === 'v2') {
      writeFileSync(join(root, 'cgroup.controllers'), 'memory\n');
      mkdirSync(join(root, 'pod', 'c1'), { recursive: true });
      writeFileSync(join(root, 'memory.max'), 'max\n');
      writeFileSync(join(root, 'pod', 'memory.max'), `${limit}\n`);
      writeFileSync(join(root, 'pod', 'c1', 'memory.max'), 'max\n');
      writeFileSync(self, '0::/pod/c1\n');
    } else {
      mkdirSync(join(root, 'memory', 'docker', 'abc'), { recursive: true });
      writeFileSync(join(root, 'memory', 'memory.limit_in_bytes'), '9223372036854771712\n');
      writeFileSync(join(root, 'memory', 'docker', 'abc', 'memory.limit_in_bytes'), `${limit}\n`);
      writeFileSync(self, '5:cpu:/docker/abc\n4:memory:/docker/abc\n0::/\n');
    }
    return { cgroupRoot: root, procSelfCgroup: self };
  }

  it('reads the cgroup v2 memory.max of its cgroup or any above it, and v1 memory.limit_in_bytes', () => {
    assert.equal(cgroupMemoryLimitBytes(cgroupTree('v2', String(2 * 1024 ** 3))), 2 * 1024 ** 3);
    assert.equal(cgroupMemoryLimitBytes(cgroupTree('v1', String(3 * 1024 ** 3))), 3 * 1024 ** 3);
    assert.equal(cgroupMemoryLimitBytes(cgroupTree('v2', 'max')), undefined);
  });

  it('sizes the default CPU tier from the cgroup limit and refuses more than it', async () => {
    const paths = cgroupTree('v2', String(1024 ** 3));
    assert.equal(defaultCpuCapacityBytes(paths), 256 * 1024 ** 2, 'a quarter of 1 GiB');
    assert.equal(
      defaultCpuCapacityBytes({ ...paths, cgroupRoot: join(tmp, 'none') }),
      Math.max(
        64 * 1024 ** 2,
        Math.floor(Math.min(totalmem() / 4, 8 * 1024 ** 3) / 1024 ** 2) * 1024 ** 2,
      ),
    );
    const cfg = await loadConfig(
      {},
      { XDG_CACHE_HOME: join(tmp, 'cache'), KVTIER_DISK: 'off', KVTIER_CPU_BYTES: '2GiB' },
    );
    const problems = await hostSizeProblems(cfg, paths);
    assert.equal(problems.length, 1);
    assert.match(
      problems[0]!.message,
      /2 GiB of host memory is more than the cgroup memory limit of 1 GiB \(the machine has/,
    );
  });
});

describe('config check output round-trips', () => {
  it('without keys, with keys and clients, and with the event stream', async () => {
    const keys = join(tmp, 'keys');
    await writeKeyPair(keys, 'server', generateCurveKeyPair());
    const client = generateCurveKeyPair();
    const docs = [
      { metrics: null, tiers: [cpu] },
      {
        metrics: null,
        tiers: [cpu],
        security: {
          serverSecretKeyFile: join(keys, 'server.key'),
          clients: [{ name: 'e', publicKey: client.publicKey, role: 'worker' }],
        },
      },
      {
        metrics: null,
        tiers: [cpu],
        events: { endpoint: `tcp://127.0.0.1:${await freeTcpPort()}` },
      },
    ];
    for (const doc of docs) {
      const first = await check(doc);
      assert.equal(first.code, 0, first.err);
      const second = await check(first.out);
      assert.equal(second.code, 0, `the output fed back: ${second.err}`);
      assert.equal(second.out, first.out, 'resolves to itself');
    }
  });
});

describe('config check reaches S3', () => {
  let s3: S3Harness;
  before(async () => {
    s3 = await startS3({ bucket: 'there' });
  });
  after(async () => s3?.close());

  const env = {
    AWS_ACCESS_KEY_ID: S3RVER_CREDENTIALS.accessKeyId,
    AWS_SECRET_ACCESS_KEY: S3RVER_CREDENTIALS.secretAccessKey,
  };
  const s3Tier = (endpoint: string, bucket: string) => ({
    name: 's3',
    type: 's3',
    endpoint,
    bucket,
    accessKeyId: S3RVER_CREDENTIALS.accessKeyId,
    secretAccessKey: S3RVER_CREDENTIALS.secretAccessKey,
    health: { timeoutMs: 3000 },
  });

  it('an endpoint nobody serves is listed as unreachable; --strict fails on it', async () => {
    const dead = `http://127.0.0.1:${await freeTcpPort()}`;
    const doc = { metrics: null, tiers: [cpu, s3Tier(dead, 'there')] };
    const r = await check(doc, [], env);
    assert.equal(r.code, 0);
    assert.match(r.err, /tiers\[1\]: tier "s3" \(s3\) could not be reached/);
    assert.equal((await check(doc, ['--strict'], env)).code, 1);
    const offline = await check(doc, ['--offline'], env);
    assert.equal(offline.err, '', '--offline does not contact S3 (and prints no SDK warning)');
  });

  it('a reachable S3 with its bucket passes', async () => {
    const r = await check(
      { metrics: null, tiers: [cpu, s3Tier(s3.endpoint, 'there')] },
      ['--strict'],
      env,
    );
    assert.equal(r.code, 0, r.err);
  });
});
