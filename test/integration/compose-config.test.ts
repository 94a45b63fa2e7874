/**
 * The compose file as Docker Compose reads it (`docker-compose config`, Debian's 1.29, which
 * needs no engine), with and without its gpu profile, and a process-level twin of the gpu
 * profile's sidecar: `kvtier serve` with the environment of Dockerfile.cuda and the kvtier-gpu
 * service, the volume a temp directory. Only what a container changes is rewritten: the
 * volume's path, the ports (free ones on loopback) and HOME (a directory that must stay empty).
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { parse } from 'yaml';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
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

interface Device {
  driver?: string;
  count?: string | number;
  capabilities?: string[];
}
interface Service {
  image?: string;
  build?: { context: string; dockerfile?: string };
  command?: string[];
  environment?: Record<string, string>;
  volumes?: (string | { source?: string; target: string; type?: string })[];
  depends_on?: Record<string, { condition: string }>;
  healthcheck?: { test: string[]; start_period?: string };
  restart?: string;
  ipc?: string;
  pid?: string;
  network_mode?: string;
  ulimits?: Record<string, number | { soft: number; hard: number }>;
  profiles?: string[];
  deploy?: { resources?: { reservations?: { devices?: Device[] } } };
}
type Compose = { services: Record<string, Service> };

const dockerCompose = ['/usr/bin/docker-compose', '/usr/local/bin/docker-compose'].find(
  (p) => spawnSync(p, ['version', '--short']).status === 0,
);
const NO_COMPOSE =
  "Debian's docker-compose package is not installed (apt-get install docker-compose; npm test does as root)";

/** `docker-compose [--profile P] config`, parsed. */
function composeConfig(profile?: string): Compose {
  const args = [...(profile !== undefined ? ['--profile', profile] : []), 'config'];
  const r = spawnSync(dockerCompose!, args, { cwd: REPO_ROOT, encoding: 'utf8', env: {} });
  assert.equal(r.status, 0, `docker-compose ${args.join(' ')}: ${r.stderr}`);
  return parse(r.stdout) as Compose;
}

/** The ENV of a Dockerfile's last stage, as `NAME=value` pairs. */
function dockerfileEnv(file: string): Record<string, string> {
  const text = readFileSync(join(REPO_ROOT, file), 'utf8').replace(/\\\n/g, ' ');
  const stages = text.split(/^FROM /m);
  const out: Record<string, string> = {};
  for (const line of stages.at(-1)!.split('\n'))
    if (line.startsWith('ENV '))
      for (const m of line.slice(4).matchAll(/(\w+)=(\S+)/g)) out[m[1]!] = m[2]!;
  return out;
}

function fromLines(file: string): string[] {
  return readFileSync(join(REPO_ROOT, file), 'utf8')
    .split('\n')
    .filter((l) => l.startsWith('FROM '));
}

function volumeTarget(v: NonNullable<Service['volumes']>[number]): string {
  return typeof v === 'string' ? v.split(':')[1]! : v.target;
}

const gpuDevice = (svc: Service) =>
  svc.deploy?.resources?.reservations?.devices?.find(
    (d) => d.driver === 'nvidia' && (d.capabilities ?? []).includes('gpu'),
  );

describe('docker-compose config', {
  skip: dockerCompose === undefined ? NO_COMPOSE : false,
}, () => {
  it('every service restarts, every healthcheck has a start period, every image is pinned', () => {
    const { services } = composeConfig('gpu');
    for (const [name, svc] of Object.entries(services)) {
      assert.ok(svc.restart === 'unless-stopped' || svc.restart === 'always', `${name} restarts`);
      assert.ok(svc.healthcheck?.start_period !== undefined, `${name} has a start_period`);
      if (svc.build !== undefined) {
        const file = svc.build.dockerfile ?? 'Dockerfile';
        for (const from of fromLines(file))
          assert.match(from, /^FROM \S+@sha256:[0-9a-f]{64}( AS \w+)?$/, `${file}: ${from}`);
      } else assert.match(svc.image ?? '', /@sha256:[0-9a-f]{64}$/, `${name}'s image is pinned`);
    }
  });

  it('Prometheus starts whatever kvtier does, so that KvtierDown can fire', () => {
    const { services } = composeConfig();
    const deps = Object.keys(services.prometheus!.depends_on ?? {});
    assert.ok(!deps.some((d) => d.startsWith('kvtier')), `prometheus waits for ${deps}`);
  });

  it('the default profile runs the host-memory image only; the gpu profile adds the CUDA one', () => {
    const cpu = composeConfig().services.kvtier!;
    assert.equal(cpu.build?.dockerfile ?? 'Dockerfile', 'Dockerfile');
    assert.equal(cpu.profiles, undefined, 'kvtier runs without a profile');
    assert.equal(gpuDevice(cpu), undefined);
    const { services } = composeConfig('gpu');
    const gpu = services['kvtier-gpu']!;
    assert.deepEqual(gpu.profiles, ['gpu']);
    assert.equal(gpu.build?.dockerfile, 'Dockerfile.cuda');
    assert.ok(gpuDevice(gpu) !== undefined, 'kvtier-gpu reserves the GPUs');
    assert.equal(gpu.ipc, 'shareable', 'its IPC namespace can be joined');
    assert.deepEqual(gpu.ulimits?.memlock, { soft: -1, hard: -1 }, 'no locked-memory limit');
    assert.ok((gpu.volumes ?? []).some((v) => volumeTarget(v) === '/var/cache/kvtier'));
    assert.match(gpu.environment?.KVTIER_LISTEN ?? '', /^tcp:\/\/127\.0\.0\.1:5555$/);
  });

  it('the engine joins the sidecar: GPUs, IPC, PID and network namespaces, memlock', () => {
    const { services } = composeConfig('gpu');
    const engine = services.vllm!;
    assert.deepEqual(engine.profiles, ['gpu']);
    assert.equal(engine.ipc, 'service:kvtier-gpu', 'CUDA IPC needs the IPC namespace');
    assert.equal(engine.pid, 'service:kvtier-gpu', 'and the PID namespace');
    assert.equal(engine.network_mode, 'service:kvtier-gpu', 'the sidecar on its loopback');
    assert.ok(gpuDevice(engine) !== undefined, 'the same GPUs');
    assert.deepEqual(engine.ulimits?.memlock, { soft: -1, hard: -1 });
    assert.equal(engine.depends_on?.['kvtier-gpu']?.condition, 'service_healthy');
    const config = JSON.parse(
      engine.command![engine.command!.indexOf('--kv-transfer-config') + 1]!,
    );
    assert.equal(config.kv_connector_extra_config.endpoint, 'tcp://127.0.0.1:5555');
    assert.equal(config.kv_load_failure_policy, 'recompute');
  });

  it('Dockerfile.cuda builds the addon with CUDA and runs it on the same Ubuntu', () => {
    const froms = fromLines('Dockerfile.cuda');
    const build = froms.find((f) => / AS build$/.test(f))!;
    assert.match(build, /^FROM nvidia\/cuda:[\d.]+-devel-ubuntu([\d.]+)@/);
    const ubuntu = /ubuntu([\d.]+)@/.exec(build)![1];
    assert.match(froms.at(-1)!, new RegExp(`^FROM nvidia/cuda:[\\d.]+-base-ubuntu${ubuntu}@`));
    const text = readFileSync(join(REPO_ROOT, 'Dockerfile.cuda'), 'utf8');
    assert.match(text, /probe\(\);? if \(p\.cuda\.compiled !== true\)/, 'fails without CUDA');
    for (const file of ['Dockerfile', 'Dockerfile.cuda']) {
      const env = dockerfileEnv(file);
      assert.equal(env.KVTIER_ALLOW_UNAUTHENTICATED, undefined, `${file}: no open default`);
      assert.equal(env.XDG_CACHE_HOME, '/var/cache', `${file}: chunks and epoch on the volume`);
    }
  });
});

describe('scripts/gpu-check.sh runs the sidecar as the CUDA image does', () => {
  it("with the image's and the kvtier-gpu service's environment, no config", () => {
    const script = readFileSync(join(REPO_ROOT, 'scripts', 'gpu-check.sh'), 'utf8');
    const run = script.slice(script.indexOf('image_run() {'), script.indexOf('image_run ||'));
    const svc = (parse(readFileSync(join(REPO_ROOT, 'docker-compose.yml'), 'utf8')) as Compose)
      .services['kvtier-gpu']!;
    const image = dockerfileEnv('Dockerfile.cuda');
    assert.deepEqual(svc.command, ['serve'], 'the service gives no config');
    assert.match(run, /kvtier\.mjs" serve >/, 'nor does the check');
    assert.match(run, /XDG_CACHE_HOME="\$vol"/, "the image's XDG_CACHE_HOME, on a volume");
    assert.equal(image.XDG_CACHE_HOME, '/var/cache');
    assert.equal(
      image.CUDA_CACHE_PATH,
      '/var/cache/kvtier/cuda',
      "the driver's cache on the volume",
    );
    assert.match(run, /CUDA_CACHE_PATH="\$vol\/kvtier\/cuda"/, "the image's CUDA_CACHE_PATH");
    assert.match(run, new RegExp(`NVIDIA_DRIVER_CAPABILITIES=${image.NVIDIA_DRIVER_CAPABILITIES}`));
    assert.match(run, new RegExp(`KVTIER_LOG_LEVEL=${svc.environment!.KVTIER_LOG_LEVEL}`));
    const host = /^tcp:\/\/([^:]+):/.exec(svc.environment!.KVTIER_LISTEN!)![1];
    assert.match(run, new RegExp(`KVTIER_LISTEN='tcp://${host!.replace(/\./g, '\\.')}:\\*'`));
  });
});

describe('the gpu profile sidecar, as processes', () => {
  let tmp = '';
  const svc = (parse(readFileSync(join(REPO_ROOT, 'docker-compose.yml'), 'utf8')) as Compose)
    .services['kvtier-gpu']!;

  before(() => {
    tmp = mkdtempSync(join(tmpdir(), 'kvtier-gpu-twin-'));
  });
  after(() => rmSync(tmp, { recursive: true, force: true }));

  /** `kvtier <service command>` with the image's and the service's environment, rewritten. */
  function start(env: NodeJS.ProcessEnv) {
    const base: NodeJS.ProcessEnv = {};
    for (const [k, v] of Object.entries(process.env))
      if (!k.startsWith('KVTIER_') && k !== 'XDG_CACHE_HOME') base[k] = v;
    const child = spawnGuarded(
      process.execPath,
      [join(REPO_ROOT, 'bin', 'kvtier.js'), ...(svc.command ?? [])],
      { cwd: REPO_ROOT, env: { ...base, ...env }, stdio: ['ignore', 'ignore', 'pipe'] },
    );
    let stderr = '';
    child.stderr!.setEncoding('utf8').on('data', (d: string) => {
      stderr += d;
    });
    const exited = new Promise<number | null>((resolve) => child.once('exit', resolve));
    return { child, exited, stderr: () => stderr };
  }

  it('the image alone does not serve its 0.0.0.0 endpoint without keys', async () => {
    const image = dockerfileEnv('Dockerfile.cuda');
    const port = await freeTcpPort();
    const p = start({
      ...image,
      KVTIER_LISTEN: image.KVTIER_LISTEN!.replace(/:5555$/, `:${port}`),
      KVTIER_METRICS_PORT: '0',
      XDG_CACHE_HOME: join(tmp, 'refused'),
      HOME: join(tmp, 'home'),
    });
    assert.equal(await withDeadline(p.exited, DEADLINE_MS, 'refusal'), 2, p.stderr());
    assert.match(p.stderr(), /0\.0\.0\.0.*(key|allowUnauthenticated)/);
  });

  it('writes its chunks and epoch on the volume, and nothing in HOME', async () => {
    const volumeTarget = '/var/cache/kvtier';
    const image = dockerfileEnv('Dockerfile.cuda');
    assert.ok(volumeTarget.startsWith(`${image.XDG_CACHE_HOME}/`));
    // The volume is mounted at $XDG_CACHE_HOME/kvtier: here tmp/cache/kvtier.
    const cache = join(tmp, 'cache');
    const home = join(tmp, 'home');
    mkdirSync(home, { recursive: true });
    const port = await freeTcpPort();
    const endpoint = `tcp://127.0.0.1:${port}`;
    const env = svc.environment ?? {};
    assert.equal(env.KVTIER_LISTEN, 'tcp://127.0.0.1:5555');
    const p = start({
      ...image,
      ...env,
      KVTIER_LISTEN: endpoint,
      KVTIER_METRICS_HOST: '127.0.0.1',
      KVTIER_METRICS_PORT: '0',
      XDG_CACHE_HOME: cache,
      HOME: home,
    });
    try {
      await withDeadline(
        new Promise<void>((resolve, reject) => {
          const check = () => p.stderr().includes('serving on') && resolve();
          p.child.stderr!.on('data', check);
          check();
          void p.exited.then((c) => reject(new Error(`exited ${c}:\n${p.stderr()}`)));
        }),
        DEADLINE_MS,
        'kvtier-gpu start',
      );
      const ns = randomNamespace();
      const c = new LookupClient({ endpoint, namespaces: [ns] });
      try {
        assert.equal(await c.put(ns, randomHash(), 256, randomPayload(4096)), 'stored');
      } finally {
        await c.close();
      }
      p.child.kill('SIGTERM');
      assert.equal(await withDeadline(p.exited, DEADLINE_MS, 'stop'), 0, p.stderr());
    } finally {
      p.child.kill('SIGKILL');
    }
    const onVolume = readdirSync(join(cache, 'kvtier'), { recursive: true }).map(String);
    assert.ok(
      onVolume.some((f) => f.startsWith('chunks/') && f.endsWith('.kvc')),
      onVolume.join(' '),
    );
    assert.ok(
      onVolume.some((f) => f.startsWith('epochs/')),
      onVolume.join(' '),
    );
    assert.deepEqual(readdirSync(home, { recursive: true }), [], 'nothing in HOME');
  });
});
