/**
 * The `kvtier` CLI as an operator uses it, run in-process (`main` with its output captured)
 * against a real sidecar with CurveZMQ on: `--help` on every command from its one definition,
 * the top-level help, `put | get | clear | ls` with their exit codes and `--json`, roles
 * enforced, what a failed handshake says, and one-line errors for bad endpoints and numbers.
 */
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { CliIo } from '../../src/cli/client-io.ts';
import { COMMANDS } from '../../src/cli/commands.ts';
import { main } from '../../src/cli/main.ts';
import { parseCommand } from '../../src/cli/options.ts';
import { runSimulateCommand } from '../../src/cli/simulate-command.ts';
import { loadConfig } from '../../src/config/config.ts';
import { hashChunks, hashToHex } from '../../src/hashing/chunk-hasher.ts';
import { generateCurveKeyPair, writeKeyPair } from '../../src/security/curve-keys.ts';
import { Sidecar } from '../../src/sidecar.ts';
import { silentLogger } from '../../src/util/log.ts';
import { randomNamespace, randomPayload } from '../support/fixtures.ts';

interface Run {
  code: number;
  out: string;
  err: string[];
  bytes: Buffer;
}

/** Runs `kvtier ...argv` in this process with `stdin`, capturing what it writes. */
async function kvtier(
  argv: string[],
  opts: { stdin?: Buffer | string; env?: NodeJS.ProcessEnv; tty?: boolean } = {},
): Promise<Run> {
  const out: string[] = [];
  const err: string[] = [];
  const bytes: Buffer[] = [];
  const io: CliIo = {
    out: (l) => out.push(l),
    write: async (d) => {
      bytes.push(Buffer.from(d));
    },
    err: (l) => err.push(l),
    stdin: async () => Buffer.from(opts.stdin ?? ''),
    stdoutIsTTY: opts.tty ?? false,
    env: opts.env ?? {},
  };
  const code = await main(argv, io);
  return { code, out: out.join('\n'), err, bytes: Buffer.concat(bytes) };
}

describe('kvtier --help', () => {
  it('every command prints its usage from its definition, every option in it, and exits 0', async () => {
    for (const spec of COMMANDS) {
      const argv = [...spec.name.split(' '), '--help'];
      const r = await kvtier(argv);
      assert.equal(r.code, 0, `${spec.name}: ${r.err.join('\n')}`);
      assert.deepEqual(r.err, [], spec.name);
      assert.match(r.out, new RegExp(`^Usage: kvtier ${spec.name}`), spec.name);
      for (const o of spec.options)
        assert.ok(r.out.includes(`--${o.name}`), `${spec.name} --${o.name}`);
      assert.match(r.out, /--help +print this text/, spec.name);
    }
    for (const argv of [
      ['hash', '-h'],
      ['help', 'put'],
      ['config', '--help'],
    ]) {
      const r = await kvtier(argv);
      assert.equal(r.code, 0, argv.join(' '));
      assert.match(r.out, /^Usage: kvtier /, argv.join(' '));
    }
    // simulate has its own parser (and writes to the process's stdout through main).
    for (const flag of ['--help', '-h']) {
      const out: string[] = [];
      const err: string[] = [];
      const code = await runSimulateCommand([flag], {
        out: (l) => out.push(l),
        err: (l) => err.push(l),
        writeFile: async () => {},
      });
      assert.equal(code, 0, `simulate ${flag}: ${err.join('\n')}`);
      assert.deepEqual(err, [], `simulate ${flag}`);
      assert.match(out[0] ?? '', /^Usage: kvtier simulate /, `simulate ${flag}`);
    }
  });

  it('every option the help lists is one the command accepts, and no other', () => {
    for (const spec of COMMANDS) {
      for (const o of spec.options) {
        const flag = o.type === 'boolean' ? `--${o.name}` : `--${o.name}=1`;
        try {
          parseCommand(spec, [flag]);
        } catch (err) {
          assert.doesNotMatch((err as Error).message, /Unknown option/, `${spec.name} ${flag}`);
        }
      }
      assert.throws(
        () => parseCommand(spec, ['--no-such-flag']),
        /Unknown option '--no-such-flag'/,
      );
    }
  });

  it('the top-level help states the real defaults and every command', async () => {
    const r = await kvtier(['--help']);
    assert.equal(r.code, 0);
    assert.match(r.out, /a LocalCPU tier sized for the machine over a LocalDisk tier/);
    assert.doesNotMatch(r.out, /one LocalCPU tier/);
    assert.match(r.out, /hash +.*--lora, --mm/);
    for (const c of [...COMMANDS.map((s) => s.name), 'simulate'])
      assert.match(r.out, new RegExp(`^  ${c} `, 'm'), c);
    assert.equal((await kvtier([])).code, 2, 'no command is a usage error');
  });
});

describe('one-line errors', () => {
  it('an endpoint without tcp:// is a usage error that says what to type', async () => {
    const r = await kvtier(['stats', '--endpoint', 'localhost:5601']);
    assert.equal(r.code, 2);
    assert.deepEqual(r.err, [
      'kvtier stats: --endpoint must be a ZMQ endpoint: tcp://HOST:PORT (port 1..65535), ipc://PATH or inproc://NAME, got "localhost:5601" (did you mean "tcp://localhost:5601"?)',
    ]);
    const env = await kvtier(['ping'], { env: { KVTIER_ENDPOINT: 'kvtier:5555' } });
    assert.equal(env.code, 2);
    assert.match(env.err[0] ?? '', /^kvtier ping: KVTIER_ENDPOINT must be a ZMQ endpoint/);
  });

  it('numbers are checked by name, not turned into NaN', async () => {
    const r = await kvtier(['serve', '--metrics-port', 'abc']);
    assert.equal(r.code, 2);
    assert.deepEqual(r.err, [
      'kvtier serve: --metrics-port must be an integer in [0, 65535], got "abc"',
    ]);
    const t = await kvtier(['stats', '--timeout-ms', '1.5']);
    assert.deepEqual(t.err, [
      'kvtier stats: --timeout-ms must be an integer in [1, 2147483647], got "1.5"',
    ]);
  });

  it('keygen --out creates the folder (mode 0700) and the pair in it', async () => {
    const root = await mkdtemp(join(tmpdir(), 'kvtier-keygen-'));
    try {
      const out = join(root, 'etc', 'kvtier', 'keys');
      const r = await kvtier(['keygen', '--out', out, '--name', 'server']);
      assert.equal(r.code, 0, r.err.join('\n'));
      assert.equal((await stat(out)).mode & 0o777, 0o700);
      assert.equal((await stat(join(out, 'server.key'))).mode & 0o777, 0o600);
      assert.match(await readFile(join(out, 'server.pub'), 'utf8'), /^.{40}\n$/);
      const again = await kvtier(['keygen', '--out', out, '--name', 'server']);
      assert.equal(again.code, 2, 'an existing key is never overwritten');
      assert.match(again.err[0] ?? '', /^kvtier keygen: cannot write key pair: .*server\.key/);
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });
});

describe('put, get, clear, ls against a sidecar with CurveZMQ', () => {
  let dir = '';
  let sidecar: Sidecar | undefined;
  let endpoint = '';
  const env = (key: 'admin' | 'worker' | 'stranger', serverPub?: string): NodeJS.ProcessEnv => ({
    KVTIER_ENDPOINT: endpoint,
    KVTIER_KEY_FILE: join(dir, `${key}.key`),
    KVTIER_SERVER_KEY: serverPub ?? join(dir, 'server.pub'),
  });

  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'kvtier-cli-data-'));
    const pubs: Record<string, string> = {};
    for (const name of ['server', 'admin', 'worker', 'stranger']) {
      const pair = generateCurveKeyPair();
      await writeKeyPair(dir, name, pair);
      pubs[name] = pair.publicKey;
    }
    const file = join(dir, 'kvtier.json');
    await writeFile(
      file,
      JSON.stringify({
        listen: 'tcp://127.0.0.1:*',
        metrics: null,
        tiers: [{ name: 'cpu', type: 'local-cpu', capacityBytes: '64MiB' }],
        storage: { epochFile: null },
        security: {
          serverSecretKeyFile: 'server.key',
          clients: [
            { name: 'ops', publicKey: pubs.admin, role: 'admin' },
            { name: 'engine', publicKey: pubs.worker, role: 'worker' },
          ],
        },
      }),
    );
    const config = await loadConfig({ configPath: file }, {});
    sidecar = await Sidecar.start({ config, log: silentLogger, processMetrics: false });
    endpoint = sidecar.server.endpoint;
  });

  after(async () => {
    await sidecar?.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('put stores a file, get writes its bytes back, ls lists it, clear drops it', async () => {
    const ns = randomNamespace();
    const [chunk] = hashChunks(
      Array.from({ length: 256 }, (_, i) => i),
      { chunkSize: 256 },
    );
    const hash = hashToHex(chunk!.hash);
    const payload = randomPayload(5000);
    const file = join(dir, 'chunk.bin');
    await writeFile(file, payload);
    const admin = env('admin');

    const put = await kvtier(
      ['put', '--namespace', ns, '--hash', hash, '--token-count', '256', file],
      { env: admin },
    );
    assert.equal(put.code, 0, put.err.join('\n'));
    assert.equal(put.out, `stored ${hash} (256 tokens, 5000 bytes)`);
    const again = await kvtier(
      ['put', '--namespace', ns, '--hash', hash, '--token-count', '256', '--json'],
      {
        env: admin,
        stdin: payload,
      },
    );
    assert.equal(again.code, 0);
    assert.deepEqual(JSON.parse(again.out), {
      namespace: ns,
      hash,
      tokens: 256,
      bytes: 5000,
      outcome: 'exists',
    });

    const got = await kvtier(['get', '--namespace', ns, '--hash', hash], { env: env('worker') });
    assert.equal(got.code, 0, got.err.join('\n'));
    assert.ok(got.bytes.equals(payload), 'the bytes put come back');
    const out = join(dir, 'back.bin');
    const toFile = await kvtier(
      ['get', '--namespace', ns, '--hash', hash, '--out', out, '--json'],
      {
        env: admin,
      },
    );
    assert.deepEqual(JSON.parse(toFile.out), {
      namespace: ns,
      hash,
      found: true,
      tokens: 256,
      bytes: 5000,
      out,
    });
    assert.ok((await readFile(out)).equals(payload));
    const tty = await kvtier(['get', '--namespace', ns, '--hash', hash], { env: admin, tty: true });
    assert.equal(tty.code, 2);
    assert.match(tty.err[0] ?? '', /refusing to write a chunk’s bytes to a terminal/);

    const missing = 'ab'.repeat(32);
    const ls = await kvtier(['ls', '--namespace', ns], {
      env: admin,
      stdin: `0 256 ${hash}\n${missing}\n`,
    });
    assert.equal(ls.code, 3, 'a missing chunk: exit 3');
    assert.deepEqual(ls.out.split('\n'), [`${hash} 256 5000`, `${missing} missing`]);
    const lsJson = await kvtier(['ls', '--namespace', ns, hash, '--json'], { env: admin });
    assert.equal(lsJson.code, 0);
    assert.deepEqual(JSON.parse(lsJson.out), {
      namespace: ns,
      chunks: [{ hash, found: true, tokens: 256, bytes: 5000 }],
    });

    const clear = await kvtier(['clear', '--namespace', ns, '--json'], { env: admin });
    assert.equal(clear.code, 0, clear.err.join('\n'));
    const { cleared, epoch } = JSON.parse(clear.out) as { cleared: string[]; epoch: number };
    assert.deepEqual(cleared, [ns]);
    assert.equal(epoch, sidecar!.storage.epoch);
    const gone = await kvtier(['get', '--namespace', ns, '--hash', hash, '--json'], { env: admin });
    assert.equal(gone.code, 3);
    assert.deepEqual(JSON.parse(gone.out), { namespace: ns, hash, found: false });
  });

  it('roles apply: a worker key may not PUT or CLEAR', async () => {
    const ns = randomNamespace();
    const put = await kvtier(
      ['put', '--namespace', ns, '--hash', 'cd'.repeat(32), '--token-count', '1'],
      {
        env: env('worker'),
        stdin: 'x',
      },
    );
    assert.equal(put.code, 1);
    assert.deepEqual(put.err, [
      'kvtier put: KVT_FORBIDDEN: client "engine" (role worker) may not send PUT (needs role admin)',
    ]);
    const clear = await kvtier(['clear', '--all'], { env: env('worker') });
    assert.equal(clear.code, 1);
    assert.match(
      clear.err[0] ?? '',
      /KVT_FORBIDDEN: client "engine" \(role worker\) may not send CLEAR/,
    );
  });

  it('a wrong server key, no sidecar, or no keys, says which handshake did not complete', async () => {
    const wrong = generateCurveKeyPair().publicKey;
    const r = await kvtier(['ping', '--timeout-ms', '3000'], { env: env('admin', wrong) });
    assert.equal(r.code, 1);
    assert.equal(r.err.length, 1);
    assert.match(
      r.err[0] ?? '',
      /^kvtier ping: KVT_TIMEOUT: no CurveZMQ handshake — wrong server key, or the sidecar is down \(tcp:\/\/127\.0\.0\.1:\d+, /,
    );
    const stranger = await kvtier(['stats', '--timeout-ms', '3000'], { env: env('stranger') });
    assert.equal(stranger.code, 1);
    assert.match(
      stranger.err[0] ?? '',
      /CurveZMQ handshake refused: this client's key is not on the sidecar's allow-list/,
    );
    // No keys at all: the sidecar's refusal of a handshake without CurveZMQ is named, not taken
    // for a sidecar that is down.
    const keyless = await kvtier(['ping', '--timeout-ms', '5000'], {
      env: { KVTIER_ENDPOINT: endpoint },
    });
    assert.equal(keyless.code, 1);
    assert.deepEqual(keyless.err.length, 1);
    assert.match(
      keyless.err[0] ?? '',
      /^kvtier ping: KVT_TIMEOUT: no handshake — the sidecar requires CurveZMQ keys and this client has none \(docs\/security\.md\) \(tcp:\/\/127\.0\.0\.1:\d+, /,
    );
  });

  it('bad arguments are usage errors (exit 2) naming the flag', async () => {
    const admin = env('admin');
    const cases: [string[], RegExp][] = [
      [['put', '--hash', 'ab'.repeat(32), '--token-count', '1'], /--namespace ID is required/],
      [
        ['put', '--namespace', 'x', '--hash', 'ab'.repeat(32), '--token-count', '1'],
        /--namespace must be 32 hex digits, got "x"/,
      ],
      [
        ['get', '--namespace', randomNamespace(), '--hash', 'abc'],
        /--hash must be a chunk hash of 64 hex digits/,
      ],
      [
        ['put', '--namespace', randomNamespace(), '--hash', 'ab'.repeat(32), '--token-count', '0'],
        /--token-count must be an integer in \[1, /,
      ],
      [['clear'], /give --namespace ID \(repeatable\) or --all/],
      [
        ['put', '--namespace', randomNamespace(), '--hash', 'ab'.repeat(32), '--token-count', '1'],
        /stdin is empty/,
      ],
    ];
    for (const [argv, pattern] of cases) {
      const r = await kvtier(argv, { env: admin });
      assert.equal(r.code, 2, argv.join(' '));
      assert.equal(r.err.length, 1, argv.join(' '));
      assert.match(r.err[0] ?? '', pattern);
    }
  });
});
