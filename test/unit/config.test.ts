import assert from 'node:assert/strict';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import type { StorageBackend } from '../../src/backends/core/types.ts';
import { BackendRegistry } from '../../src/backends/registry.ts';
import { ConfigError, defaultConfig, loadConfig, resolveConfig } from '../../src/config/config.ts';
import { KvtierError } from '../../src/errors.ts';
import { formatBytes, parseBytes } from '../../src/util/bytes.ts';

const isConfigError = (e: unknown) => e instanceof KvtierError && e.code === 'KVT_CONFIG';

describe('byte sizes', () => {
  test('parses integers and unit strings', () => {
    assert.equal(parseBytes('x', 4096), 4096);
    assert.equal(parseBytes('x', '512MiB'), 512 * 1024 ** 2);
    assert.equal(parseBytes('x', '4 GiB'), 4 * 1024 ** 3);
    assert.equal(parseBytes('x', '1.5G'), 1_500_000_000);
    assert.equal(parseBytes('x', '10kb'), 10_000);
  });
  test('refuses what is not a size, naming the option', () => {
    for (const bad of [-1, 1.5, '4 parsecs', '', 'GiB', {}, null]) {
      assert.throws(
        () => parseBytes('tiers[0].capacityBytes', bad),
        (e: unknown) => isConfigError(e) && (e as Error).message.includes('tiers[0].capacityBytes'),
      );
    }
  });
  test('formats for people', () => {
    assert.equal(formatBytes(6 * 1024 ** 3), '6 GiB');
    assert.equal(formatBytes(1536), '1.5 KiB');
  });
});

describe('config', () => {
  test('the embedded default is LocalCPU over LocalDisk in the cache directory, on loopback', () => {
    const cfg = defaultConfig({ XDG_CACHE_HOME: '/var/tmp/kvt-cache' });
    assert.deepEqual(
      cfg.tiers.map((t) => t.type),
      ['local-cpu', 'local-disk'],
    );
    const cpu = cfg.tiers[0]!.options.capacityBytes as number;
    assert.ok(
      cpu >= 64 * 1024 ** 2 && cpu <= 8 * 1024 ** 3,
      `cpu tier between 64 MiB and 8 GiB, got ${cpu}`,
    );
    assert.equal(cfg.tiers[1]!.options.path, '/var/tmp/kvt-cache/kvtier/chunks');
    const disk = cfg.tiers[1]!.options.capacityBytes as number;
    assert.ok(
      disk >= 256 * 1024 ** 2 && disk <= 32 * 1024 ** 3,
      `disk tier between 256 MiB and 32 GiB, got ${disk}`,
    );
    assert.match(cfg.listen, /^tcp:\/\/127\.0\.0\.1:/);
    assert.equal(cfg.metrics?.host, '127.0.0.1');
    new BackendRegistry().validateTiers(cfg.tiers);
  });

  test('the epoch is kept per endpoint in the cache directory, unless the file says where', async () => {
    const env = { XDG_CACHE_HOME: '/c' };
    assert.equal(
      (await loadConfig({}, env)).storage.epochFile,
      '/c/kvtier/epochs/tcp-127.0.0.1-5555',
    );
    assert.equal(
      (await loadConfig({ listen: 'tcp://127.0.0.1:6001' }, env)).storage.epochFile,
      '/c/kvtier/epochs/tcp-127.0.0.1-6001',
    );
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-config-epoch-'));
    const given = join(dir, 'given.json');
    await writeFile(given, JSON.stringify({ storage: { epochFile: null } }));
    assert.equal((await loadConfig({ configPath: given }, env)).storage.epochFile, null);
    const other = join(dir, 'other.json');
    await writeFile(other, JSON.stringify({ listen: 'ipc:///run/kvtier.sock' }));
    assert.equal(
      (await loadConfig({ configPath: other }, env)).storage.epochFile,
      '/c/kvtier/epochs/ipc-run-kvtier.sock',
    );
    assert.equal(defaultConfig().storage.epochFile, null, 'programmatic configs opt in');
  });

  test('KVTIER_DISK* move, resize or drop the default disk tier', async () => {
    const moved = await loadConfig({}, { KVTIER_DISK_PATH: '/srv/kv', KVTIER_DISK_BYTES: '1GiB' });
    assert.equal(moved.tiers[1]!.options.path, '/srv/kv');
    assert.equal(moved.tiers[1]!.options.capacityBytes, 1024 ** 3);
    const off = await loadConfig({}, { KVTIER_DISK: 'off' });
    assert.deepEqual(
      off.tiers.map((t) => t.type),
      ['local-cpu'],
    );
    await assert.rejects(loadConfig({}, { KVTIER_DISK: 'maybe' }), isConfigError);
  });

  test('a file merges over the defaults; sizes in tier options become numbers', () => {
    const cfg = resolveConfig({
      listen: 'tcp://127.0.0.1:6000',
      tiers: [
        { name: 'hot', type: 'local-cpu', capacityBytes: '1GiB' },
        { type: 'memory', capacityBytes: 1000 },
      ],
      storage: { pinTtlMs: 5000, writeThrough: { maxBytes: '64MiB' } },
      metrics: null,
    });
    assert.equal(cfg.listen, 'tcp://127.0.0.1:6000');
    assert.deepEqual(cfg.tiers, [
      { name: 'hot', type: 'local-cpu', options: { capacityBytes: 1024 ** 3 } },
      { name: 'memory', type: 'memory', options: { capacityBytes: 1000 } },
    ]);
    assert.equal(cfg.storage.pinTtlMs, 5000);
    assert.equal(cfg.storage.prefetchBudgetChunks, 1024, 'untouched defaults stay');
    assert.equal(cfg.storage.writeThrough.maxBytes, 64 * 1024 ** 2);
    assert.equal(cfg.metrics, null);
  });

  test('refuses bad values with a message naming the key', () => {
    const cases: [unknown, string][] = [
      [[], '(root)'],
      [{ bogus: 1 }, 'bogus'],
      [{ listen: 'localhost:5555' }, 'listen'],
      [{ tiers: [] }, 'tiers'],
      [{ tiers: [{ name: 'a' }] }, 'tiers[0].type'],
      [{ tiers: [{ type: 'local-cpu' }, { type: 'local-cpu' }] }, 'used twice'],
      [{ tiers: [{ name: 'bad name!', type: 'memory' }] }, 'tiers[0].name'],
      [{ storage: { pinTtlMs: 0 } }, 'storage.pinTtlMs'],
      [{ storage: { writeThrough: { concurrency: 1000 } } }, 'storage.writeThrough.concurrency'],
      [{ metrics: { port: 70000 } }, 'metrics.port'],
      [{ limits: { maxChunksPerLookup: 0 } }, 'limits.maxChunksPerLookup'],
      [{ logLevel: 'loud' }, 'logLevel'],
    ];
    for (const [raw, mention] of cases) {
      assert.throws(
        () => resolveConfig(raw),
        (e: unknown) => isConfigError(e) && (e as Error).message.includes(mention),
        `expected a KVT_CONFIG error mentioning ${mention} for ${JSON.stringify(raw)}`,
      );
    }
  });

  test('reports every problem at once, each with its key path, what is allowed and what was given', () => {
    let err: unknown;
    try {
      resolveConfig({
        metrics: { port: 'x' },
        tiers: [
          { type: 'local-cpu', capacityBytes: '1GiB', pageBytes: 5000 },
          { name: 'r', type: 'redis', url: 'redis://h', port: 6379 },
          { name: 'r', type: 's3', bucket: 'b', accessKeyId: 'AK' },
          { type: 'module', module: './p.js', options: [] },
        ],
        limits: { maxPayloadBytes: '8GiB' },
      });
    } catch (e) {
      err = e;
    }
    assert.ok(err instanceof ConfigError && err.code === 'KVT_CONFIG');
    assert.deepEqual(
      err.problems.map((p) => `${p.path}: ${p.message}`),
      [
        'metrics.port: must be an integer in [0, 65535], got "x"',
        'limits.maxPayloadBytes: must be a byte size in [1, 4294967295] (an integer, or a string like "512MiB" or "4GiB"), got "8GiB"',
        'tiers[0].pageBytes: must be a power of two >= 4096, got 5000',
        'tiers[1].url: give either url or host/port, not both',
        'tiers[2].secretAccessKey: accessKeyId and secretAccessKey must be given together (or neither, for the default chain)',
        'tiers[2].name: "r" is used twice (also by tiers[1]); tier names must be unique',
        'tiers[3].options: must be an object of plug-in settings, got an array of length 0',
      ],
    );
    assert.equal(err.message.split('; config ').length, 7, 'one message naming them all');
    assert.ok(!err.message.includes('\n'), 'on one line');
  });

  test('a problem set by the environment or a flag names it', async () => {
    await assert.rejects(
      loadConfig({ metricsPort: 70000 }, { KVTIER_LOG_LEVEL: 'loud' }),
      (e: unknown) =>
        e instanceof ConfigError &&
        e.message ===
          'config metrics.port (from --metrics-port): must be an integer in [0, 65535], got 70000; ' +
            'config logLevel (from KVTIER_LOG_LEVEL): must be one of "debug", "info", "warn", "error", "silent", got "loud"',
    );
  });

  test('plug-in options pass through unchanged; an unknown type keeps its options, sizes as numbers', () => {
    const cfg = resolveConfig({
      tiers: [
        { type: 'local-cpu', capacityBytes: 1 << 20 },
        { name: 'p', type: 'module', module: './p.js', options: { segmentBytes: '1MiB' } },
        { name: 'e', type: 'embedded', blockBytes: '4KiB', depth: 3 },
      ],
    });
    assert.deepEqual(cfg.tiers[1]!.options, {
      module: './p.js',
      options: { segmentBytes: '1MiB' },
    });
    assert.deepEqual(cfg.tiers[2]!.options, { blockBytes: 4096, depth: 3 });
  });

  test('precedence: defaults < file < environment < flags', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-config-'));
    const file = join(dir, 'kvtier.json');
    await writeFile(
      file,
      JSON.stringify({ listen: 'tcp://127.0.0.1:7001', metrics: { port: 7101 }, logLevel: 'warn' }),
    );
    const fromFile = await loadConfig({ configPath: file }, {});
    assert.equal(fromFile.listen, 'tcp://127.0.0.1:7001');
    assert.equal(fromFile.metrics?.port, 7101);
    const env = {
      KVTIER_CONFIG: file,
      KVTIER_LISTEN: 'tcp://127.0.0.1:7002',
      KVTIER_METRICS_PORT: '7102',
      KVTIER_CPU_BYTES: '256MiB',
    };
    const fromEnv = await loadConfig({}, env);
    assert.equal(fromEnv.listen, 'tcp://127.0.0.1:7002');
    assert.equal(fromEnv.metrics?.port, 7102);
    assert.equal(fromEnv.logLevel, 'warn', 'file values the environment does not touch stay');
    assert.equal(fromEnv.tiers[0]!.options.capacityBytes, 256 * 1024 ** 2);
    const fromFlags = await loadConfig({ listen: 'tcp://127.0.0.1:7003', metricsPort: 0 }, env);
    assert.equal(fromFlags.listen, 'tcp://127.0.0.1:7003');
    assert.equal(fromFlags.metrics?.port, 0);
  });

  test('an unreadable or malformed file is a KVT_CONFIG error', async () => {
    await assert.rejects(loadConfig({ configPath: '/nonexistent/kvtier.json' }, {}), isConfigError);
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-config-'));
    const file = join(dir, 'bad.json');
    await writeFile(file, '{ "listen": ');
    await assert.rejects(loadConfig({ configPath: file }, {}), isConfigError);
    await assert.rejects(loadConfig({}, { KVTIER_METRICS_PORT: 'abc' }), isConfigError);
  });
});

describe('backend registry', () => {
  test('builds tiers in config order and refuses unknown types', async () => {
    const reg = new BackendRegistry();
    const tiers = await reg.createTiers([
      { name: 'cpu', type: 'local-cpu', options: { capacityBytes: 1024 * 1024 } },
      { name: 'mem', type: 'memory', options: {} },
    ]);
    assert.deepEqual(
      tiers.map((t) => [t.name, t.kind]),
      [
        ['cpu', 'local-cpu'],
        ['mem', 'memory'],
      ],
    );
    await Promise.all(tiers.map((t) => t.close()));
    await assert.rejects(
      reg.createTiers([{ name: 'x', type: 'nope', options: {} }]),
      (e: unknown) =>
        isConfigError(e) && (e as Error).message.includes('unknown backend type "nope"'),
    );
  });

  test('a tier that fails to start fails the whole start loudly and closes the tiers built before it', async () => {
    const reg = new BackendRegistry();
    let closed = 0;
    reg.register('tracked', async (_o, ctx) => {
      const inner = await reg.createTiers([{ name: ctx.name, type: 'memory', options: {} }]);
      const b = inner[0]!;
      return new Proxy(b, {
        get(target, prop, recv) {
          if (prop === 'close')
            return async () => {
              closed++;
              await target.close();
            };
          return Reflect.get(target, prop, recv) as unknown;
        },
      }) as StorageBackend;
    });
    reg.register('misconfigured', async () => {
      throw new KvtierError('KVT_CONFIG', 'unknown option "x"');
    });
    reg.register('broken', async () => {
      throw new Error('disk not mounted');
    });
    await assert.rejects(
      reg.createTiers([
        { name: 'a', type: 'tracked', options: {} },
        { name: 'b', type: 'misconfigured', options: {} },
      ]),
      (e: unknown) =>
        isConfigError(e) &&
        (e as Error).message.includes('tier "b" (misconfigured) failed to start: unknown option'),
    );
    assert.equal(closed, 1);
    // Not its config: a service it could not reach (KVT_BACKEND), which fails the call without
    // onStartDown (see late-start.test.ts for a start with it).
    await assert.rejects(
      reg.createTiers([
        { name: 'a', type: 'tracked', options: {} },
        { name: 'b', type: 'broken', options: {} },
      ]),
      (e: unknown) =>
        e instanceof KvtierError &&
        e.code === 'KVT_BACKEND' &&
        e.message.includes('tier "b" (broken) failed to start: disk not mounted'),
    );
    assert.equal(closed, 2);
    assert.throws(() => reg.register('memory', async () => assert.fail('unused')), isConfigError);
  });
});
