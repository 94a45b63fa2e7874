/**
 * A process-level twin of docker-compose.yml, since no Docker engine runs here: the sidecar as
 * the compose file starts it (`kvtier serve --config <deploy/kvtier.json>`, the compose
 * environment and the Dockerfile's KVTIER_* variables) in a child process, a real `redis-server`
 * with the compose file's arguments, the in-process S3 server (s3rver) for MinIO, and, when
 * Debian's `prometheus` is installed, a real Prometheus with deploy/prometheus.yml and the alert
 * rules scraping /metrics. Only what a container network changes is rewritten: service names
 * become loopback addresses, the disk volume a temp dir, MinIO's credentials s3rver's, and
 * Prometheus' intervals 1 s so the test does not wait out 5 s scrapes. Everything binds
 * 127.0.0.1.
 *
 * A chunk goes PUT → LOOKUP → GET through every tier: answered from host memory, then after a
 * restart from the disk, then with the disk emptied from Redis, then with Redis flushed from S3.
 * Each restart is a SIGTERM, which flushes the write-through queue before exit 0, so the lower
 * tiers hold the chunks because the sidecar said so, not because a test waited long enough.
 */
import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { ListObjectsV2Command } from '@aws-sdk/client-s3';
import { parse, stringify } from 'yaml';
import { existingAncestor, filesystemSpace } from '../../src/config/host-limits.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { parseBytes } from '../../src/util/bytes.ts';
import { spawnGuarded } from '../support/child-guard.ts';
import {
  alertExprs,
  alertRules,
  dashboardExprs,
  findPrometheus,
  findPromtool,
  metricNamesIn,
  NO_PROMETHEUS,
  promtoolCheckMetrics,
} from '../support/deploy-observability.ts';
import {
  freeTcpPort,
  packHex,
  REPO_ROOT,
  randomHashes,
  randomNamespace,
  randomPayload,
  withDeadline,
} from '../support/fixtures.ts';
import { assertValidPromText } from '../support/prom-text.ts';
import { type RedisServer, rawCommand, startRedis } from '../support/redis-server.ts';
import { type S3Harness, S3RVER_CREDENTIALS, startS3 } from '../support/s3-server.ts';

/** Upper bound on a sidecar start, a stop, or Prometheus reaching a state; failing, not waiting. */
const DEADLINE_MS = 120_000;
const CHUNK_TOKENS = 256;
const CHUNKS = 3;
const CHUNK_BYTES = 64 * 1024;

interface Service {
  command?: string[];
  volumes?: string[];
  environment?: Record<string, string>;
  healthcheck?: { test: string[] };
}
const compose = parse(readFileSync(join(REPO_ROOT, 'docker-compose.yml'), 'utf8')) as {
  services: Record<string, Service>;
};
const kvSvc = compose.services.kvtier!;

/** The container path bind-mounted from `hostPath` in the kvtier service. */
function mountedAt(hostPath: string): string {
  const v = (kvSvc.volumes ?? []).find((x) => x.split(':')[0] === hostPath);
  assert.ok(v !== undefined, `kvtier mounts ${hostPath}`);
  return v.split(':')[1]!;
}

/** KVTIER_* variables the Dockerfile sets with ENV. */
function dockerfileEnv(): Record<string, string> {
  const text = readFileSync(join(REPO_ROOT, 'Dockerfile'), 'utf8').replace(/\\\n/g, ' ');
  const out: Record<string, string> = {};
  for (const line of text.split('\n')) {
    if (!line.startsWith('ENV ')) continue;
    for (const m of line.slice(4).matchAll(/(\w+)=(\S+)/g)) out[m[1]!] = m[2]!;
  }
  return out;
}

interface TierJson {
  name: string;
  type: string;
  [key: string]: unknown;
}

/**
 * deploy/kvtier.json with what a container network changes rewritten; returns the config and
 * the list of rewrites, which the test checks is all that changed.
 */
function twinConfig(redisPort: number, s3Endpoint: string, diskRoot: string) {
  const original = JSON.parse(readFileSync(join(REPO_ROOT, 'deploy', 'kvtier.json'), 'utf8')) as {
    tiers: TierJson[];
    [key: string]: unknown;
  };
  const cfg = structuredClone(original);
  const rewrites: string[] = [];
  const diskMount = (kvSvc.volumes ?? [])
    .map((v) => v.split(':'))
    .find(([src]) => src !== undefined && !src.startsWith('.') && !src.startsWith('/'))?.[1];
  assert.ok(diskMount !== undefined, 'the kvtier service has a named volume');
  for (const t of cfg.tiers) {
    if (t.type === 'local-disk') {
      const path = String(t.path);
      assert.ok(path.startsWith(diskMount), 'the disk tier is on the volume');
      t.path = join(diskRoot, path.slice(diskMount.length));
      rewrites.push(`${t.name}.path`);
    } else if (t.type === 'redis') {
      assert.equal(t.host, 'redis', 'the redis service');
      t.host = '127.0.0.1';
      t.port = redisPort;
      rewrites.push(`${t.name}.host`, `${t.name}.port`);
    } else if (t.type === 's3') {
      assert.equal(t.endpoint, 'http://minio:9000', 'the minio service');
      t.endpoint = s3Endpoint;
      rewrites.push(`${t.name}.endpoint`);
    }
  }
  // The epoch is kept on the volume too, so that a new container starts above the old epochs.
  const storage = cfg.storage as { epochFile?: string };
  const epochFile = String(storage.epochFile);
  assert.ok(epochFile.startsWith(diskMount), 'the epoch file is on the volume');
  storage.epochFile = join(diskRoot, epochFile.slice(diskMount.length));
  rewrites.push('storage');
  // The deployment sizes its disk tier for the volume it is given; this machine's filesystem may
  // hold less free space than that, which serve rightly refuses (tested in cli.test.ts). Only then
  // is the size let through, as an operator on a smaller volume would.
  const disk = cfg.tiers
    .filter((t) => t.type === 'local-disk')
    .reduce((sum, t) => sum + parseBytes(`${t.name}.capacityBytes`, t.capacityBytes), 0);
  if (disk > filesystemSpace(existingAncestor(diskRoot)).freeBytes) {
    cfg.allowOversizedTiers = true;
    rewrites.push('allowOversizedTiers');
  }
  return { original, cfg, rewrites };
}

/** Paths (`tier.key` or `key`) whose values differ between two configs. */
function differences(a: Record<string, unknown>, b: Record<string, unknown>): string[] {
  const out: string[] = [];
  for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) {
    if (k === 'tiers') {
      const ta = a.tiers as TierJson[];
      const tb = b.tiers as TierJson[];
      assert.equal(ta.length, tb.length);
      ta.forEach((t, i) => {
        for (const key of new Set([...Object.keys(t), ...Object.keys(tb[i]!)]))
          if (JSON.stringify(t[key]) !== JSON.stringify(tb[i]![key])) out.push(`${t.name}.${key}`);
      });
    } else if (JSON.stringify(a[k]) !== JSON.stringify(b[k])) out.push(k);
  }
  return out;
}

/** A sidecar child process started the way the compose file starts it. */
class TwinSidecar {
  readonly child: ChildProcess;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  stderr = '';

  constructor(args: string[], env: NodeJS.ProcessEnv) {
    this.child = spawnGuarded(process.execPath, [join(REPO_ROOT, 'bin', 'kvtier.js'), ...args], {
      cwd: REPO_ROOT,
      env,
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    this.exited = new Promise((resolve) => {
      this.child.once('exit', (code, signal) => resolve({ code, signal }));
    });
    this.child.stderr!.setEncoding('utf8').on('data', (d: string) => {
      this.stderr += d;
    });
  }

  /** Resolves when /readyz answers 200: the lookup server is bound and host memory is up. */
  async ready(readyUrl: string): Promise<void> {
    const started = this.stderr.includes('kvtier started')
      ? Promise.resolve()
      : new Promise<void>((resolve, reject) => {
          const onData = () => {
            if (this.stderr.includes('kvtier started')) resolve();
          };
          this.child.stderr!.on('data', onData);
          void this.exited.then(({ code, signal }) =>
            reject(new Error(`kvtier exited (${code ?? signal}) before starting:\n${this.stderr}`)),
          );
        });
    await withDeadline(started, DEADLINE_MS, 'kvtier start-up');
    const res = await fetch(readyUrl);
    assert.equal(res.status, 200, `${readyUrl}: ${await res.text()}`);
  }

  /** SIGTERM, as `docker compose stop` sends; resolves the exit. */
  async stop(): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGTERM');
    return withDeadline(this.exited, DEADLINE_MS, 'kvtier graceful stop');
  }

  kill(): void {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGKILL');
  }
}

describe('docker-compose twin: the deployed config end to end with processes', () => {
  let redis: RedisServer;
  let s3: S3Harness;
  let tmp = '';
  let configFile = '';
  let env: NodeJS.ProcessEnv = {};
  let args: string[] = [];
  let endpoint = '';
  let opsBase = '';
  let metricsPort = 0;
  let sidecar: TwinSidecar | undefined;
  let diskDir = '';
  let metricsText = '';
  const ns = randomNamespace();
  const hashes = randomHashes(CHUNKS);
  const payloads = hashes.map(() => randomPayload(CHUNK_BYTES));
  const tokenCounts = hashes.map(() => CHUNK_TOKENS);

  const epochs: number[] = [];

  async function startSidecar(): Promise<TwinSidecar> {
    const s = new TwinSidecar(args, env);
    sidecar = s;
    await s.ready(`${opsBase}/readyz`);
    const health = (await (await fetch(`${opsBase}/healthz`)).json()) as { epoch: number };
    epochs.push(health.epoch);
    return s;
  }

  async function stopSidecar(): Promise<void> {
    const s = sidecar!;
    const exit = await s.stop();
    assert.deepEqual(exit, { code: 0, signal: null }, `graceful exit:\n${s.stderr}`);
    sidecar = undefined;
    // Every line is a JSON log line: the S3 client's warnings on Node 20 and the start-up line
    // too. ZeroMQ's native code may add one notice after Node has shut down (its context waited
    // over 500 ms for queued messages at exit), which no JavaScript can write as JSON.
    const logged: Record<string, unknown>[] = [];
    for (const line of s.stderr.split('\n').filter((l) => l.trim() !== '')) {
      if (/^\(node:\d+\) WARNING: Waiting for queued ZeroMQ messages to be delivered\./.test(line))
        continue;
      assert.doesNotThrow(
        () => logged.push(JSON.parse(line)),
        `a log line that is not JSON: ${line}`,
      );
    }
    if (Number(process.versions.node.split('.')[0]) < 22)
      assert.ok(
        logged.some(
          (l) =>
            l.component === 'kvtier.process' && /NodeVersionSupportWarning/.test(String(l.msg)),
        ),
        "the AWS SDK's notice about Node 20 is a log line",
      );
  }

  /** LOOKUP of every chunk (pins released after), then GET of each, byte-exact. */
  async function roundTrip(expectedTier: string): Promise<void> {
    const c = new LookupClient({ endpoint, namespaces: [ns], lookupTimeoutMs: DEADLINE_MS });
    try {
      const id = `twin-${expectedTier}`;
      const a = await c.lookupAsync(id, packHex(hashes), tokenCounts);
      assert.equal(a.status, 'ok');
      assert.equal(a.hitChunks, CHUNKS, `every chunk found (answered from ${expectedTier})`);
      assert.deepEqual(a.tiers, [{ tier: expectedTier, tokens: CHUNKS * CHUNK_TOKENS }]);
      await c.cancel(id);
      for (const [i, h] of hashes.entries()) {
        const got = await c.get(ns, h);
        assert.ok(got !== null, `GET chunk ${i}`);
        assert.equal(got.tokens, CHUNK_TOKENS);
        assert.ok(got.payload.equals(payloads[i]!), `chunk ${i} byte-exact from ${expectedTier}`);
      }
    } finally {
      await c.close();
    }
  }

  before(async () => {
    tmp = mkdtempSync(join(tmpdir(), 'kvtier-compose-twin-'));
    const redisCmd = compose.services.redis!.command ?? [];
    assert.equal(redisCmd[0], 'redis-server');
    redis = await startRedis({ args: redisCmd.slice(1) });
    // A bucket other than the config's, so the sidecar's createBucket makes "kvtier" itself.
    s3 = await startS3({ bucket: 'twin-unused' });

    const { original, cfg, rewrites } = twinConfig(redis.port, s3.endpoint, join(tmp, 'volume'));
    assert.deepEqual(
      differences(original, cfg).sort(),
      rewrites.sort(),
      'only addresses and paths',
    );
    diskDir = String(cfg.tiers.find((t) => t.type === 'local-disk')!.path);
    configFile = join(tmp, 'kvtier.json');
    writeFileSync(configFile, JSON.stringify(cfg, null, 2));

    // The compose command, with the mounted config's container path mapped to the twin's file.
    const containerConfig = mountedAt('./deploy/kvtier.json');
    args = (kvSvc.command ?? []).map((a) => (a === containerConfig ? configFile : a));
    assert.ok(args.includes(configFile), 'the compose command names the mounted config');

    // The Dockerfile's ENV, bound to loopback instead of the container's 0.0.0.0.
    const dockerEnv = dockerfileEnv();
    assert.deepEqual(Object.keys(dockerEnv).sort(), [
      'KVTIER_LISTEN',
      'KVTIER_METRICS_HOST',
      'KVTIER_METRICS_PORT',
      'XDG_CACHE_HOME',
    ]);
    endpoint = `tcp://127.0.0.1:${await freeTcpPort()}`;
    metricsPort = await freeTcpPort();
    opsBase = `http://127.0.0.1:${metricsPort}`;
    const base: NodeJS.ProcessEnv = {};
    for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('KVTIER_')) base[k] = v;
    env = {
      ...base,
      ...kvSvc.environment,
      // MinIO's root credentials in compose; s3rver accepts only its own.
      AWS_ACCESS_KEY_ID: S3RVER_CREDENTIALS.accessKeyId,
      AWS_SECRET_ACCESS_KEY: S3RVER_CREDENTIALS.secretAccessKey,
      KVTIER_LISTEN: endpoint,
      KVTIER_METRICS_HOST: '127.0.0.1',
      KVTIER_METRICS_PORT: String(metricsPort),
    };
    assert.ok(kvSvc.environment?.AWS_ACCESS_KEY_ID !== undefined, 'compose passes S3 credentials');
  });

  after(async () => {
    sidecar?.kill();
    await sidecar?.exited;
    await redis?.stop();
    await s3?.close();
    if (tmp !== '') rmSync(tmp, { recursive: true, force: true });
  });

  it('starts ready with every tier up and answers PING', async () => {
    await startSidecar();
    const c = new LookupClient({ endpoint, namespaces: [ns] });
    try {
      const info = await c.ping();
      assert.equal(info.protocolVersion, 1);
      const stats = (await c.stats()) as { tiers: { name: string; kind: string }[] };
      assert.deepEqual(
        stats.tiers.map((t) => [t.name, t.kind]),
        [
          ['cpu', 'local-cpu'],
          ['disk', 'local-disk'],
          ['redis', 'redis'],
          ['s3', 's3'],
        ],
      );
    } finally {
      await c.close();
    }
    const health = await fetch(`${opsBase}/healthz`);
    assert.equal(health.status, 200);
  });

  it('PUT stores chunks and LOOKUP/GET answer them from host memory', async () => {
    const c = new LookupClient({ endpoint, namespaces: [ns] });
    try {
      for (const [i, h] of hashes.entries())
        assert.equal(await c.put(ns, h, CHUNK_TOKENS, payloads[i]!), 'stored');
    } finally {
      await c.close();
    }
    await roundTrip('cpu');
    const res = await fetch(`${opsBase}/metrics`);
    metricsText = await res.text();
    assertValidPromText(metricsText);
  });

  it('/metrics passes promtool check metrics', {
    skip: findPromtool() === undefined ? NO_PROMETHEUS : false,
  }, () => {
    const r = promtoolCheckMetrics(findPromtool()!, metricsText);
    assert.equal(r.out, '', r.out);
    assert.equal(r.status, 0);
  });

  it('a real Prometheus with deploy/prometheus.yml scrapes /metrics and evaluates every alert rule', {
    skip: findPrometheus() === undefined ? NO_PROMETHEUS : false,
    timeout: 60_000,
  }, async () => {
    await scrapeWithPrometheus(tmp, metricsPort);
  });

  it('SIGTERM flushes write-through: disk, Redis and S3 hold every chunk', async () => {
    await stopSidecar();
    const files = readdirSync(diskDir, { recursive: true, withFileTypes: true }).filter((d) =>
      d.isFile(),
    );
    assert.ok(files.length >= CHUNKS, `disk tier files: ${files.length}`);
    const keys = Number((await rawCommand(redis.port, 'DBSIZE')).replace(/^:/, ''));
    assert.ok(keys >= CHUNKS, `redis keys: ${keys}`);
    const listed = await s3.client().send(new ListObjectsV2Command({ Bucket: 'kvtier' }));
    assert.ok((listed.KeyCount ?? 0) >= CHUNKS, `s3 objects: ${listed.KeyCount}`);
  });

  it('restarted, it answers from the disk', async () => {
    await startSidecar();
    await roundTrip('disk');
    await stopSidecar();
  });

  it('with the disk volume emptied, from Redis', async () => {
    rmSync(diskDir, { recursive: true, force: true });
    await startSidecar();
    await roundTrip('redis');
    await stopSidecar();
  });

  it('with Redis flushed as well, from S3', async () => {
    rmSync(diskDir, { recursive: true, force: true });
    assert.equal(await rawCommand(redis.port, 'FLUSHALL'), '+OK');
    await startSidecar();
    await roundTrip('s3');
    await stopSidecar();
  });

  it("with Redis down it still serves, and compose's healthcheck passes: degraded, not unhealthy", async () => {
    rmSync(diskDir, { recursive: true, force: true });
    await startSidecar();
    await redis.kill();
    const healthz = async () =>
      (await (await fetch(`${opsBase}/healthz`)).json()) as { status: string };
    for (let i = 0; (await healthz()).status !== 'degraded'; i++)
      if (i > 600) assert.fail('/healthz never reported degraded with Redis down');
      else await new Promise((r) => setTimeout(r, 50));
    await roundTrip('s3');
    // The compose healthcheck command, run as compose runs it (the port is the twin's).
    const test = kvSvc.healthcheck?.test ?? [];
    assert.deepEqual(test.slice(0, 2), ['CMD', 'node']);
    const argv = test.slice(2).map((a) => a.replace(':9464/', `:${metricsPort}/`));
    const code = await new Promise<number | null>((resolve) => {
      const p = spawn(process.execPath, argv, { stdio: 'ignore' });
      p.once('exit', (c) => resolve(c));
    });
    assert.equal(code, 0, 'the healthcheck passes while the sidecar serves');
    await stopSidecar();
    await redis.restart();
  });

  it('every start is at a higher epoch than the one before', () => {
    assert.ok(epochs.length >= 5, `epochs seen: ${epochs.join(', ')}`);
    for (let i = 1; i < epochs.length; i++)
      assert.ok(epochs[i]! > epochs[i - 1]!, `epochs seen: ${epochs.join(', ')}`);
  });
});

/**
 * Runs Debian's Prometheus on loopback with deploy/prometheus.yml (target and rule file paths
 * rewritten, intervals 1 s), waits until the kvtier target is up and every rule has been
 * evaluated without error, and checks that every metric the dashboard and the rules name has
 * been scraped. Stops Prometheus before returning.
 */
async function scrapeWithPrometheus(tmp: string, metricsPort: number): Promise<void> {
  const deployed = parse(readFileSync(join(REPO_ROOT, 'deploy', 'prometheus.yml'), 'utf8')) as {
    global: Record<string, string>;
    rule_files: string[];
    scrape_configs: { job_name: string; static_configs: { targets: string[] }[] }[];
  };
  assert.deepEqual(deployed.scrape_configs[0]!.static_configs[0]!.targets, ['kvtier:9464']);
  const cfg = structuredClone(deployed);
  cfg.global.scrape_interval = '1s';
  cfg.global.evaluation_interval = '1s';
  cfg.rule_files = [join(REPO_ROOT, 'deploy', 'prometheus', 'alerts.yml')];
  cfg.scrape_configs[0]!.static_configs[0]!.targets = [`127.0.0.1:${metricsPort}`];
  // The gpu profile's sidecar does not run in this twin.
  cfg.scrape_configs = cfg.scrape_configs.filter((c) => c.job_name === 'kvtier');
  const dir = mkdtempSync(join(tmp, 'prometheus-'));
  writeFileSync(join(dir, 'prometheus.yml'), stringify(cfg));
  const port = await freeTcpPort();
  const api = `http://127.0.0.1:${port}/api/v1`;
  const proc = spawnGuarded(
    findPrometheus()!,
    [
      `--config.file=${join(dir, 'prometheus.yml')}`,
      `--storage.tsdb.path=${join(dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${port}`,
      '--log.level=warn',
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let log = '';
  proc.stderr!.setEncoding('utf8').on('data', (d: string) => {
    log += d;
  });
  const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
  const get = async <T>(path: string): Promise<T | undefined> => {
    try {
      const res = await fetch(`${api}${path}`);
      if (!res.ok) return undefined;
      return ((await res.json()) as { data: T }).data;
    } catch {
      return undefined; // not listening yet
    }
  };
  /** Asks Prometheus until `check` returns a value; fails past the deadline, never sleeps it out. */
  const until = async <T>(what: string, check: () => Promise<T | undefined>): Promise<T> => {
    const deadline = Date.now() + DEADLINE_MS;
    for (;;) {
      if (proc.exitCode !== null) assert.fail(`prometheus exited (${proc.exitCode}):\n${log}`);
      const v = await check();
      if (v !== undefined) return v;
      if (Date.now() > deadline) assert.fail(`${what} within ${DEADLINE_MS} ms:\n${log}`);
      await new Promise((r) => setTimeout(r, 200));
    }
  };
  try {
    const target = await until('the kvtier target up', async () => {
      const t = await get<{
        activeTargets: { health: string; lastError: string; labels: Record<string, string> }[];
      }>('/targets');
      const kv = t?.activeTargets.find((x) => x.labels.job === 'kvtier');
      return kv?.health === 'up' ? kv : undefined;
    });
    assert.equal(target.lastError, '');

    type RuleGroup = {
      rules: { name: string; health: string; lastError?: string; lastEvaluation: string }[];
    };
    const groups = await until('every rule evaluated', async () => {
      const r = await get<{ groups: RuleGroup[] }>('/rules');
      const rules = r?.groups.flatMap((g) => g.rules) ?? [];
      const done = rules.length > 0 && rules.every((x) => !x.lastEvaluation.startsWith('0001-'));
      return done ? rules : undefined;
    });
    assert.deepEqual(
      groups.map((r) => r.name).sort(),
      alertRules()
        .map((r) => r.alert)
        .sort(),
      'Prometheus loaded every rule of deploy/prometheus/alerts.yml',
    );
    for (const r of groups) assert.equal(r.health, 'ok', `${r.name}: ${r.lastError}`);

    // Names with samples, and the families Prometheus read from # TYPE lines (a labeled
    // counter such as kvtier_writethrough_dropped_total has no sample until its first drop).
    const scraped = new Set(
      await until('metric names', () => get<string[]>('/label/__name__/values')),
    );
    const metadata = await until('metric metadata', () =>
      get<Record<string, { type: string }[]>>('/metadata'),
    );
    for (const [name, [m]] of Object.entries(metadata)) {
      scraped.add(name);
      if (m?.type === 'histogram')
        for (const s of ['_bucket', '_sum', '_count']) scraped.add(name + s);
    }
    const missing = [...dashboardExprs(), ...alertExprs()].flatMap(({ where, expr }) =>
      metricNamesIn(expr)
        .filter((n) => !scraped.has(n))
        .map((n) => `${where}: ${n}`),
    );
    assert.deepEqual(
      missing,
      [],
      'metrics the dashboard and rules name, as Prometheus scraped them',
    );
    const q = await get<{ result: { metric: Record<string, string> }[] }>(
      `/query?query=${encodeURIComponent('sum by (tier) (kvtier_backend_health)')}`,
    );
    assert.deepEqual(
      q?.result.map((s) => s.metric.tier).sort(),
      ['cpu', 'disk', 'redis', 's3'],
      'every tier reports its health',
    );
  } finally {
    proc.kill('SIGTERM');
    await withDeadline(exited, DEADLINE_MS, 'prometheus stop').catch(() => proc.kill('SIGKILL'));
  }
}
