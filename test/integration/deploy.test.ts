/**
 * No Docker engine runs here, so the deployment is checked for consistency instead: every file
 * the compose file references exists, the kvtier config it mounts validates against the real
 * backend option validators, and the hosts and ports it names match the compose services.
 */
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describe, test } from 'node:test';
import { parse } from 'yaml';
import { BackendRegistry } from '../../src/backends/registry.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { REPO_ROOT } from '../support/fixtures.ts';

interface Service {
  build?: string | { context: string };
  image?: string;
  command?: string[];
  volumes?: string[];
  ports?: string[];
  depends_on?: Record<string, { condition: string }>;
  healthcheck?: { test: string[] };
  environment?: Record<string, string>;
}

const compose = parse(readFileSync(join(REPO_ROOT, 'docker-compose.yml'), 'utf8')) as {
  services: Record<string, Service>;
  volumes?: Record<string, unknown>;
};

/** Maps a container path to the host file bind-mounted there, if any. */
function hostFileFor(service: Service, containerPath: string): string | undefined {
  for (const v of service.volumes ?? []) {
    const [src, dst] = v.split(':');
    if (dst === containerPath && src !== undefined && (src.startsWith('.') || src.startsWith('/')))
      return resolve(REPO_ROOT, src);
  }
  return undefined;
}

describe('docker-compose deployment', () => {
  test('every service has a healthcheck or depends on healthy ones, and dependencies exist', () => {
    const names = Object.keys(compose.services);
    assert.deepEqual(names.sort(), [
      'grafana',
      'kvtier',
      'kvtier-gpu',
      'minio',
      'prometheus',
      'redis',
      'vllm',
    ]);
    for (const [name, svc] of Object.entries(compose.services)) {
      for (const dep of Object.keys(svc.depends_on ?? {})) {
        assert.ok(names.includes(dep), `${name} depends on unknown service ${dep}`);
        assert.ok(
          compose.services[dep]!.healthcheck !== undefined,
          `${name} waits for ${dep}, which has no healthcheck`,
        );
      }
      if (name !== 'prometheus')
        assert.ok(svc.healthcheck !== undefined, `${name} has a healthcheck`);
    }
  });

  test('every bind-mounted file and the build context exist; named volumes are declared', () => {
    for (const [name, svc] of Object.entries(compose.services)) {
      for (const v of svc.volumes ?? []) {
        const src = v.split(':')[0]!;
        if (src.startsWith('.') || src.startsWith('/'))
          assert.ok(
            existsSync(resolve(REPO_ROOT, src)),
            `${name} mounts ${src}, which does not exist`,
          );
        else
          assert.ok(
            compose.volumes !== undefined && src in compose.volumes,
            `${name} uses volume ${src}, which is not declared`,
          );
      }
    }
    const kv = compose.services.kvtier!;
    const context = typeof kv.build === 'string' ? kv.build : kv.build?.context;
    assert.ok(
      context !== undefined && existsSync(join(REPO_ROOT, context, 'Dockerfile')),
      'kvtier is built from a Dockerfile',
    );
  });

  test('the mounted kvtier config validates and uses the compose services', () => {
    const kv = compose.services.kvtier!;
    const cmd = kv.command ?? [];
    const configPath = cmd[cmd.indexOf('--config') + 1];
    assert.ok(
      configPath !== undefined && cmd.includes('--config'),
      'kvtier is started with --config',
    );
    const hostFile = hostFileFor(kv, configPath);
    assert.ok(hostFile !== undefined, `the config ${configPath} is mounted from a file`);
    const cfg = resolveConfig(JSON.parse(readFileSync(hostFile, 'utf8')));
    new BackendRegistry().validateTiers(cfg.tiers);
    const types = cfg.tiers.map((t) => t.type);
    assert.deepEqual(
      types,
      ['local-cpu', 'local-disk', 'redis', 's3'],
      'host memory, disk, Redis and S3',
    );

    const redis = cfg.tiers.find((t) => t.type === 'redis')!;
    assert.ok(
      redis.options.host === 'redis' || String(redis.options.url ?? '').includes('//redis:'),
      'Redis tier points at the redis service',
    );
    const s3 = cfg.tiers.find((t) => t.type === 's3')!;
    assert.match(
      String(s3.options.endpoint),
      /^http:\/\/minio:9000$/,
      'S3 tier points at the minio service',
    );
    assert.equal(
      kv.environment?.AWS_ACCESS_KEY_ID,
      compose.services.minio!.environment?.MINIO_ROOT_USER,
      'S3 credentials match MinIO',
    );
    assert.equal(
      kv.environment?.AWS_SECRET_ACCESS_KEY,
      compose.services.minio!.environment?.MINIO_ROOT_PASSWORD,
    );

    const disk = cfg.tiers.find((t) => t.type === 'local-disk')!;
    const diskVolume = (kv.volumes ?? [])
      .map((v) => v.split(':')[1])
      .find((dst) => dst !== undefined && String(disk.options.path).startsWith(dst));
    assert.ok(diskVolume !== undefined, 'the disk tier path is on a mounted volume');

    assert.ok(cfg.metrics !== null, 'metrics are enabled');
    assert.equal(cfg.metrics.host, '0.0.0.0', 'metrics listen beyond the container');
    assert.ok(
      (kv.ports ?? []).some((p) => p.endsWith(`:${cfg.metrics!.port}`)),
      'the metrics port is published',
    );
    assert.ok(
      (kv.ports ?? []).some((p) => p.endsWith(`:${cfg.listen.split(':').pop()}`)),
      'the lookup port is published',
    );
    const health = JSON.stringify(kv.healthcheck?.test);
    assert.ok(
      health.includes(`:${cfg.metrics.port}/readyz`),
      'the healthcheck asks /readyz on the metrics port',
    );

    const prom = readFileSync(
      hostFileFor(compose.services.prometheus!, '/etc/prometheus/prometheus.yml')!,
      'utf8',
    );
    const promCfg = parse(prom) as {
      scrape_configs: { static_configs?: { targets: string[] }[] }[];
    };
    const targets = promCfg.scrape_configs.flatMap((c) =>
      (c.static_configs ?? []).flatMap((s) => s.targets),
    );
    assert.ok(targets.includes(`kvtier:${cfg.metrics.port}`), 'Prometheus scrapes kvtier');
  });
});
