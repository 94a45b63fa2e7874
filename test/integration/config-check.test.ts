/**
 * `kvtier config check` against `kvtier serve`: every config serve refuses before binding is
 * refused by the check with the same problem (key files and their modes, the bind rule, paths
 * that must be writable, plug-ins whose factories throw KVT_CONFIG or return no backend), a
 * plug-in the check builds is closed again, bad JSON is reported with its line and column, and
 * what the check prints is a config serve accepts. A tier the check could not reach (serve starts
 * with it down) is listed and passes, unless --strict.
 */
import assert from 'node:assert/strict';
import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { runConfigCommand } from '../../src/cli/config-command.ts';
import { loadConfig } from '../../src/config/config.ts';
import { isKvtierError } from '../../src/errors.ts';
import { generateCurveKeyPair, writeKeyPair } from '../../src/security/curve-keys.ts';
import { Sidecar } from '../../src/sidecar.ts';
import { silentLogger } from '../../src/util/log.ts';

const memoryUrl = new URL('../../src/backends/memory/memory-backend.ts', import.meta.url).href;

let dir = '';
let serverKey = '';
let clientPub = '';

before(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kvtier-config-check-'));
  const server = await writeKeyPair(join(dir, 'keys'), 'server', generateCurveKeyPair());
  const client = await writeKeyPair(join(dir, 'keys'), 'client', generateCurveKeyPair());
  serverKey = server.secretPath;
  clientPub = client.publicPath;
  await writeFile(
    join(dir, 'good-plugin.ts'),
    `import { writeFileSync } from 'node:fs';
import { MemoryBackend } from ${JSON.stringify(memoryUrl)};
export async function createBackend(options: Record<string, unknown>, ctx: { name: string }) {
  const b = new MemoryBackend({ capacityBytes: 1 << 20 }, ctx);
  const close = b.close.bind(b);
  b.close = async () => { writeFileSync(options.closedMarker as string, 'closed'); return close(); };
  writeFileSync(options.builtMarker as string, 'built');
  return b;
}
`,
  );
  await writeFile(
    join(dir, 'half-plugin.ts'),
    `export async function createBackend(_o: unknown, ctx: { name: string }) {
  return { name: ctx.name, kind: 'half', batchedGet: async () => new Map(), close: async () => {} };
}
`,
  );
  await writeFile(
    join(dir, 'misconfigured-plugin.ts'),
    `export async function createBackend() { throw Object.assign(new Error('token must be 40 characters'), { code: 'KVT_CONFIG' }); }\n`,
  );
  await writeFile(
    join(dir, 'throwing-plugin.ts'),
    `export async function createBackend() { throw new Error('connect ECONNREFUSED 127.0.0.1:9'); }\n`,
  );
  await writeFile(
    join(dir, 'hanging-plugin.ts'),
    'export function createBackend() { return new Promise(() => {}); }\n',
  );
});

after(async () => {
  await chmod(join(dir, 'keys', 'server.key'), 0o600).catch(() => {});
  await rm(dir, { recursive: true, force: true });
});

interface Check {
  code: number;
  out: string;
  err: string[];
}

async function check(file: string, extra: string[] = []): Promise<Check> {
  const out: string[] = [];
  const err: string[] = [];
  const code = await runConfigCommand(['check', ...extra, file], {
    out: (l) => out.push(l),
    err: (l) => err.push(l),
    env: { XDG_CACHE_HOME: join(dir, 'cache') },
  });
  return { code, out: out.join('\n'), err };
}

let n = 0;
async function configFile(doc: Record<string, unknown>): Promise<string> {
  const file = join(dir, `c${n++}.json`);
  await writeFile(file, JSON.stringify(doc, null, 2));
  return file;
}

const CPU = { name: 'cpu', type: 'local-cpu', capacityBytes: '64MiB' };

/** A config with what the test needs; loopback endpoints, no metrics, its epoch in the temp dir. */
function base(over: Record<string, unknown>): Record<string, unknown> {
  return {
    listen: 'tcp://127.0.0.1:*',
    metrics: null,
    tiers: [CPU],
    storage: { epochFile: join(dir, 'cache', 'epoch') },
    ...over,
  };
}

/** What `kvtier serve --config file` does with it: the start-up error message, or '' if it serves. */
async function serve(file: string): Promise<string> {
  let sidecar: Sidecar | undefined;
  try {
    const config = await loadConfig({ configPath: file }, { XDG_CACHE_HOME: join(dir, 'cache') });
    sidecar = await Sidecar.start({ config, log: silentLogger, processMetrics: false });
    return '';
  } catch (err) {
    assert.ok(isKvtierError(err), `serve failed with ${String(err)}`);
    return err.message;
  } finally {
    await sidecar?.close();
  }
}

/** Both refuse `doc`, each naming the problem `pattern` matches. */
async function bothRefuse(
  doc: Record<string, unknown>,
  path: string,
  pattern: RegExp,
): Promise<void> {
  const file = await configFile(doc);
  const r = await check(file);
  assert.equal(r.code, 1, `config check passed what serve refuses: ${r.out}`);
  assert.equal(r.out, '');
  const line = r.err.find((l) => l.startsWith(`${file}: ${path}: `));
  assert.ok(line !== undefined, `no problem at ${path}: ${JSON.stringify(r.err)}`);
  assert.match(line, pattern);
  assert.match(await serve(file), pattern);
}

describe('kvtier config check runs the checks serve runs before it binds', () => {
  it('a missing server secret key file', async () => {
    await bothRefuse(
      base({
        security: {
          serverSecretKeyFile: join(dir, 'keys', 'absent.key'),
          clients: [{ publicKeyFile: clientPub, role: 'admin' }],
        },
      }),
      'security',
      /cannot read security\.serverSecretKeyFile .*absent\.key/,
    );
  });

  it('a secret key readable by group and others (mode 0644)', async () => {
    const key = join(dir, 'keys', 'server.key');
    await chmod(key, 0o644);
    try {
      await bothRefuse(
        base({
          security: {
            serverSecretKeyFile: key,
            clients: [{ publicKeyFile: clientPub, role: 'admin' }],
          },
        }),
        'security',
        /readable by group or others \(mode 0644\); chmod 600 it/,
      );
    } finally {
      await chmod(key, 0o600);
    }
  });

  it('a client public key file that holds no key', async () => {
    const bad = join(dir, 'keys', 'bad.pub');
    await writeFile(bad, 'not a key\n');
    await bothRefuse(
      base({
        security: {
          serverSecretKeyFile: serverKey,
          clients: [{ publicKeyFile: bad, role: 'lookup' }],
        },
      }),
      'security',
      /security\.clients\[0\]\.publicKeyFile .*bad\.pub must be a CurveZMQ key/,
    );
  });

  it('a non-loopback endpoint without keys', async () => {
    await bothRefuse(
      base({ listen: 'tcp://0.0.0.0:5555' }),
      'security',
      /refusing to serve tcp:\/\/0\.0\.0\.0:5555 without CurveZMQ keys/,
    );
  });

  it('an event stream on a non-loopback endpoint without keys', async () => {
    await bothRefuse(
      base({ events: { endpoint: 'tcp://0.0.0.0:*', replayEndpoint: null } }),
      'events',
      /refusing to publish events on tcp:\/\/0\.0\.0\.0:\* without CurveZMQ keys/,
    );
    // allowed explicitly: both accept it (serve then warns)
    const file = await configFile(
      base({
        events: { endpoint: 'tcp://0.0.0.0:*', replayEndpoint: null },
        security: { allowUnauthenticated: true },
      }),
    );
    const r = await check(file);
    assert.equal(r.code, 0, r.err.join('\n'));
    assert.equal(await serve(file), '');
  });

  it('a disk tier path that cannot be created (its parent is a file)', async () => {
    const file = join(dir, 'a-file');
    await writeFile(file, 'x');
    await bothRefuse(
      base({
        tiers: [
          CPU,
          { name: 'disk', type: 'local-disk', path: join(file, 'chunks'), capacityBytes: '64MiB' },
        ],
      }),
      'tiers[1].path',
      /chunks cannot be created: .*a-file is not a directory/,
    );
  });

  it('a disk tier path in a directory this user may not write', {
    skip: process.getuid?.() === 0 ? 'root may write any directory' : false,
  }, async () => {
    const ro = join(dir, 'read-only');
    await mkdir(ro, { mode: 0o555 });
    await bothRefuse(
      base({
        tiers: [
          CPU,
          { name: 'disk', type: 'local-disk', path: join(ro, 'chunks'), capacityBytes: '64MiB' },
        ],
      }),
      'tiers[1].path',
      /read-only is not writable by this user/,
    );
  });

  it('an epoch file in a place that cannot be written', async () => {
    const file = join(dir, 'another-file');
    await writeFile(file, 'x');
    await bothRefuse(
      base({ storage: { epochFile: join(file, 'epoch') } }),
      'storage.epochFile',
      /another-file exists and is not a directory/,
    );
  });

  it('a plug-in whose factory returns an incomplete backend', async () => {
    await bothRefuse(
      base({ tiers: [CPU, { name: 'p', type: 'module', module: './half-plugin.ts' }] }),
      'tiers[1]',
      /tier "p" \(module\) failed to start: .*its factory must resolve to a StorageBackend .*missing methods: batchedContains, put/,
    );
  });

  it('a plug-in whose factory throws KVT_CONFIG (its options)', async () => {
    await bothRefuse(
      base({ tiers: [CPU, { name: 'p', type: 'module', module: './misconfigured-plugin.ts' }] }),
      'tiers[1]',
      /tier "p" \(module\) failed to start: .*token must be 40 characters/,
    );
  });

  it('builds a working plug-in and closes it again', async () => {
    const built = join(dir, 'built.marker');
    const closed = join(dir, 'closed.marker');
    const file = await configFile(
      base({
        tiers: [
          CPU,
          {
            name: 'p',
            type: 'module',
            module: './good-plugin.ts',
            options: { builtMarker: built, closedMarker: closed },
          },
        ],
      }),
    );
    const r = await check(file);
    assert.equal(r.code, 0, r.err.join('\n'));
    assert.equal(await readFile(built, 'utf8'), 'built');
    assert.equal(await readFile(closed, 'utf8'), 'closed');
  });

  it('reports bad JSON with its line and column, as serve does', async () => {
    const file = join(dir, 'broken.json');
    await writeFile(file, '{\n  "listen": "tcp://127.0.0.1:5555",\n  "logLevel": }\n');
    const r = await check(file);
    assert.equal(r.code, 1);
    assert.deepEqual(r.err, [
      `${file}: config file ${file} is not valid JSON: unexpected "}" at line 3, column 15`,
    ]);
    assert.match(await serve(file), /unexpected "}" at line 3, column 15/);
    const cut = join(dir, 'cut.json');
    await writeFile(cut, '{\n  "tiers": [\n');
    assert.match((await check(cut)).err[0] ?? '', /ends early, at line 3, column 1$/);
  });

  it('prints a config that serve and the check itself accept, wherever it is saved', async () => {
    const key = serverKey;
    const file = await configFile({
      ...base({}),
      tiers: [
        CPU,
        { name: 'disk', type: 'local-disk', path: join(dir, 'disk'), capacityBytes: '64MiB' },
        {
          name: 'p',
          type: 'module',
          module: './good-plugin.ts',
          options: { builtMarker: join(dir, 'b2'), closedMarker: join(dir, 'c2') },
        },
      ],
      security: {
        serverSecretKeyFile: key,
        clients: [{ name: 'eng', publicKeyFile: clientPub, role: 'worker' }],
      },
    });
    const first = await check(file);
    assert.equal(first.code, 0, first.err.join('\n'));
    // Saved elsewhere: relative paths (the plug-in) must still resolve.
    await mkdir(join(dir, 'elsewhere'), { recursive: true });
    const again = join(dir, 'elsewhere', 'resolved.json');
    await writeFile(again, first.out);
    const second = await check(again);
    assert.equal(second.code, 0, second.err.join('\n'));
    assert.equal(second.out, first.out, 'the resolved config resolves to itself');
    assert.equal(await serve(again), '');
  });
});

describe('tiers config check could not reach: listed, not problems (serve starts with them down)', () => {
  /** A port nothing listens on (bound, then closed again). */
  async function closedPort(): Promise<number> {
    const srv = createServer();
    await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
    const { port } = srv.address() as AddressInfo;
    await new Promise<void>((resolve) => srv.close(() => resolve()));
    return port;
  }

  /** Checks `doc` with and without --strict; serve must start. Returns the lines listed. */
  async function unreachable(doc: Record<string, unknown>, path: string, why: RegExp) {
    const file = await configFile(doc);
    const r = await check(file);
    assert.equal(r.code, 0, r.err.join('\n'));
    assert.equal(r.err.length, 1, r.err.join('\n'));
    assert.ok(r.err[0]!.startsWith(`${file}: ${path}: `), r.err[0]);
    assert.match(r.err[0]!, why);
    assert.match(r.err[0]!, /serve starts with it down and it joins when it answers$/);
    // The output is the resolved config, as for a config whose tiers all answer.
    const resolved = JSON.parse(r.out) as { tiers: { name: string }[] };
    assert.deepEqual(
      resolved.tiers.map((t) => t.name),
      (doc.tiers as { name: string }[]).map((t) => t.name),
    );
    const strict = await check(file, ['--strict']);
    assert.equal(strict.code, 1);
    assert.equal(strict.out, '');
    assert.deepEqual(strict.err, r.err);
    assert.equal(await serve(file), '', 'serve starts with the tier down');
  }

  it('a Redis server that is not running', async () => {
    const port = await closedPort();
    const file = await configFile(
      base({ tiers: [CPU, { name: 'remote', type: 'redis', port, keyPrefix: 'x:' }] }),
    );
    const offline = await check(file, ['--offline']);
    assert.equal(offline.code, 0, offline.err.join('\n'));
    assert.deepEqual(offline.err, [], '--offline reaches for nothing');
    await unreachable(
      base({ tiers: [CPU, { name: 'remote', type: 'redis', port, keyPrefix: 'x:' }] }),
      'tiers[1]',
      new RegExp(
        `tier "remote" \\(redis\\) could not be reached: .*127\\.0\\.0\\.1:${port}.*ECONNREFUSED`,
      ),
    );
    assert.equal((await check(file)).out, offline.out, 'the same resolved config');
  });

  it('an S3 endpoint that refuses connections', async () => {
    const port = await closedPort();
    await unreachable(
      base({
        tiers: [
          CPU,
          {
            name: 'objects',
            type: 's3',
            bucket: 'kv',
            endpoint: `http://127.0.0.1:${port}`,
            accessKeyId: 'AKID',
            secretAccessKey: 'secret',
            maxAttempts: 1,
          },
        ],
      }),
      'tiers[1]',
      /tier "objects" \(s3\) could not be reached: .*ECONNREFUSED/,
    );
  });

  it('a plug-in whose start throws (not on its options)', async () => {
    await unreachable(
      base({ tiers: [CPU, { name: 'p', type: 'module', module: './throwing-plugin.ts' }] }),
      'tiers[1]',
      /tier "p" \(module\) could not be reached: plug-in module "\.\/throwing-plugin\.ts": connect ECONNREFUSED/,
    );
  });

  it('a plug-in whose start does not finish within health.timeoutMs', async () => {
    await unreachable(
      base({
        tiers: [
          CPU,
          { name: 'p', type: 'module', module: './hanging-plugin.ts', health: { timeoutMs: 300 } },
        ],
      }),
      'tiers[1]',
      /tier "p" \(module\) could not be reached: its start \(health\.timeoutMs\) timed out after 300 ms/,
    );
  });
});
