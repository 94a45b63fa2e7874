/**
 * CurveZMQ keys (Z85, the public key derived from the secret one, key files, keygen), the role
 * table, the routing ids the ZAP handler mints (a forged or tampered one names no one), the
 * non-loopback rule, and the `security` config section's validation.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, test } from 'node:test';
import { runKeygenCommand } from '../../src/cli/keygen-command.ts';
import { defaultConfig, loadConfig, resolveConfig } from '../../src/config/config.ts';
import { serverAuthFromConfig } from '../../src/config/server-auth.ts';
import { isKvtierError } from '../../src/errors.ts';
import { chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';
import { ServerAuth } from '../../src/lookup-server/auth.ts';
import { allowedTypes, namespacesOf, ROLES, roleFor } from '../../src/lookup-server/policy.ts';
import { isLocalEndpoint } from '../../src/protocol/endpoint.ts';
import type { Request } from '../../src/protocol/messages.ts';
import { MESSAGES } from '../../src/protocol/wire-table.ts';
import {
  curvePublicKey,
  generateCurveKeyPair,
  isZ85Key,
  readKeyFile,
  z85Decode,
  z85Encode,
} from '../../src/security/curve-keys.ts';
import { silentLogger } from '../../src/util/log.ts';

const dir = mkdtempSync(join(tmpdir(), 'kvtier-sec-'));
after(() => rmSync(dir, { recursive: true, force: true }));

describe('Z85 keys', () => {
  test('round-trips and matches the ZeroMQ RFC 32 test vector', () => {
    const bytes = Buffer.from([0x86, 0x4f, 0xd2, 0x6f, 0xb5, 0x59, 0xf7, 0x5b]);
    assert.equal(z85Encode(bytes), 'HelloWorld');
    const pair = generateCurveKeyPair();
    assert.equal(z85Encode(z85Decode(pair.secretKey)), pair.secretKey);
    assert.ok(isZ85Key(pair.publicKey));
    assert.equal(isZ85Key(`${pair.publicKey.slice(0, 39)}"`), false);
    assert.equal(isZ85Key('#'.repeat(40)), false, 'a value over 32 bits per group');
    assert.equal(isZ85Key(pair.publicKey.slice(1)), false);
  });

  test('derives the public key libzmq generated from the secret one', () => {
    for (let i = 0; i < 5; i++) {
      const pair = generateCurveKeyPair();
      assert.equal(curvePublicKey(pair.secretKey), pair.publicKey);
    }
  });

  test('keygen writes NAME.key (0600, never overwritten) and NAME.pub; a group-readable secret is refused', async () => {
    const lines: string[] = [];
    assert.equal(
      await runKeygenCommand(['--out', dir, '--name', 'srv'], { out: (l) => lines.push(l) }),
      0,
    );
    const secret = readFileSync(join(dir, 'srv.key'), 'utf8').trim();
    const pub = readFileSync(join(dir, 'srv.pub'), 'utf8').trim();
    assert.equal(statSync(join(dir, 'srv.key')).mode & 0o777, 0o600);
    assert.equal(curvePublicKey(secret), pub);
    assert.ok(lines.some((l) => l.includes(pub)));
    assert.equal(await readKeyFile(join(dir, 'srv.key'), 'secret', true), secret);
    await assert.rejects(
      runKeygenCommand(['--out', dir, '--name', 'srv'], { out: () => {} }),
      (e: unknown) => isKvtierError(e, 'KVT_CONFIG'),
    );
    const loose = join(dir, 'loose.key');
    writeFileSync(loose, secret, { mode: 0o644 });
    await assert.rejects(
      readKeyFile(loose, 'secret', true),
      /readable by group or others.*chmod 600/,
    );
    writeFileSync(join(dir, 'bad.pub'), 'not a key');
    await assert.rejects(
      readKeyFile(join(dir, 'bad.pub'), 'public', false),
      /40 characters of Z85/,
    );
    const printed: string[] = [];
    await runKeygenCommand([], { out: (l) => printed.push(l) });
    const json = JSON.parse(printed[0]!) as { publicKey: string; secretKey: string };
    assert.equal(curvePublicKey(json.secretKey), json.publicKey);
  });
});

describe('roles and routing ids', () => {
  test('each role adds to the one below it', () => {
    assert.deepEqual([...allowedTypes('lookup')].sort(), ['cancel', 'lookup', 'ping', 'stats']);
    assert.ok(allowedTypes('worker').has('save') && !allowedTypes('worker').has('put'));
    assert.ok(allowedTypes('admin').has('clear') && allowedTypes('admin').has('lookup'));
    assert.equal(roleFor('get'), 'worker');
    assert.equal(roleFor('put'), 'admin');
    // admin: every request of the message table, so a message added to it is an operator's.
    const all = MESSAGES.filter((m) => m.dir === 'request').map((m) => m.tag);
    assert.deepEqual([...allowedTypes('admin')].sort(), all.sort());
    for (const role of ROLES) for (const t of allowedTypes(role)) assert.ok(all.includes(t), t);
  });

  test('a request names the namespaces of its namespace fields in the message table', () => {
    const ns = (n: number) => String(n).repeat(32);
    const hash = chunkHashFromBytes(Buffer.alloc(32, 1));
    const base = { requestId: 1 };
    const cases: [Request, readonly string[] | 'all'][] = [
      [
        {
          ...base,
          type: 'lookup',
          lookupId: 'l',
          namespaces: [ns(1), ns(2)],
          hashes: Buffer.alloc(0),
          tokenCounts: new Uint32Array(0),
          config: {},
        },
        [ns(1), ns(2)],
      ],
      [{ ...base, type: 'clear', namespaces: [ns(3)] }, [ns(3)]],
      [{ ...base, type: 'clear', namespaces: [] }, 'all'],
      [
        { ...base, type: 'put', namespace: ns(4), hash, tokens: 1, payload: Buffer.from('x') },
        [ns(4)],
      ],
      [{ ...base, type: 'get', namespace: ns(5), hash }, [ns(5)]],
      [{ ...base, type: 'cancel', lookupId: 'l' }, []],
      [{ ...base, type: 'ping' }, []],
      [{ ...base, type: 'heartbeat', engineId: 'e' }, []],
      [{ ...base, type: 'register', registration: {} }, []],
    ];
    for (const [req, want] of cases) assert.deepEqual(namespacesOf(req), want, req.type);
  });

  test('a routing id the handler did not mint, or with a changed byte, names no one', () => {
    const client = generateCurveKeyPair();
    const auth = new ServerAuth({
      secretKey: generateCurveKeyPair().secretKey,
      clients: [{ publicKey: client.publicKey, role: 'admin' }],
    });
    const forged = Buffer.alloc(57);
    forged[0] = 0x4b;
    z85Decode(client.publicKey).copy(forged, 1);
    assert.equal(auth.principalOf(forged), undefined);
    assert.equal(auth.principalOf(Buffer.from('pretend-admin')), undefined);
    assert.throws(
      () => auth.authorize(forged, { type: 'ping', requestId: 1 }, () => undefined),
      (e: unknown) => isKvtierError(e, 'KVT_UNAUTHENTICATED'),
    );
  });

  test('an allow-list with a bad key, role, namespace or a key twice is refused', () => {
    const secretKey = generateCurveKeyPair().secretKey;
    const k = generateCurveKeyPair().publicKey;
    const bad = [
      [{ publicKey: 'x', role: 'lookup' }, /publicKey must be 40/],
      [{ publicKey: k, role: 'root' }, /role/],
      [{ publicKey: k, role: 'lookup', namespaces: ['abc'] }, /32 hex digits/],
    ] as const;
    for (const [c, re] of bad)
      assert.throws(() => new ServerAuth({ secretKey, clients: [c as never] }), re);
    assert.throws(
      () =>
        new ServerAuth({
          secretKey,
          clients: [
            { publicKey: k, role: 'lookup' },
            { publicKey: k, role: 'admin' },
          ],
        }),
      /listed twice/,
    );
  });

  test('the test hooks zapReplyDelayMs and failFirstHandshakes are validated', () => {
    const secretKey = generateCurveKeyPair().secretKey;
    for (const [opt, re] of [
      [{ zapReplyDelayMs: -1 }, /zapReplyDelayMs must be an integer in \[0, 1000\]/],
      [{ zapReplyDelayMs: 1.5 }, /zapReplyDelayMs/],
      [{ failFirstHandshakes: -1 }, /failFirstHandshakes must be an integer >= 0/],
    ] as const)
      assert.throws(() => new ServerAuth({ secretKey, clients: [], ...opt }), re);
  });
});

describe('binds and config', () => {
  test('loopback, ipc and inproc are local; anything else is not', () => {
    for (const e of [
      'tcp://127.0.0.1:5555',
      'tcp://127.1.2.3:*',
      'tcp://localhost:1',
      'tcp://[::1]:5555',
      'ipc:///tmp/k',
      'inproc://x',
    ])
      assert.ok(isLocalEndpoint(e), e);
    for (const e of [
      'tcp://0.0.0.0:5555',
      'tcp://*:5555',
      'tcp://10.0.0.2:5555',
      'tcp://eth0:5555',
      'tcp://[::]:5555',
    ])
      assert.equal(isLocalEndpoint(e), false, e);
  });

  test('a non-loopback bind without keys is refused unless allowed, then served with a warning', async () => {
    const cfg = { ...defaultConfig(), listen: 'tcp://0.0.0.0:5555' };
    await assert.rejects(
      serverAuthFromConfig(cfg, silentLogger),
      /refusing to serve tcp:\/\/0\.0\.0\.0:5555 without CurveZMQ keys/,
    );
    const warnings: string[] = [];
    const log = { ...silentLogger, warn: (m: string) => warnings.push(m) };
    const allowed = { ...cfg, security: { ...cfg.security, allowUnauthenticated: true } };
    assert.equal(await serverAuthFromConfig(allowed, log), undefined);
    assert.match(warnings.join(), /without authentication/);
    assert.equal(await serverAuthFromConfig(defaultConfig(), silentLogger), undefined);
    const fromEnv = await loadConfig(
      { listen: 'tcp://0.0.0.0:5555' },
      { KVTIER_ALLOW_UNAUTHENTICATED: '1' },
    );
    assert.equal(fromEnv.security.allowUnauthenticated, true);
    await assert.rejects(
      loadConfig({}, { KVTIER_ALLOW_UNAUTHENTICATED: 'yes' }),
      /KVTIER_ALLOW_UNAUTHENTICATED/,
    );
  });

  test('the security section is validated with key paths', () => {
    const k = generateCurveKeyPair().publicKey;
    const problems = (security: unknown) => {
      try {
        resolveConfig({ security });
        return '';
      } catch (e) {
        return (e as Error).message;
      }
    };
    assert.match(
      problems({ serverSecretKeyFile: 's.key' }),
      /security\.clients: must list at least one client/,
    );
    assert.match(
      problems({ clients: [{ publicKey: k, role: 'lookup' }] }),
      /security\.serverSecretKeyFile: is required/,
    );
    assert.match(
      problems({ serverSecretKeyFile: 's.key', clients: [{ role: 'lookup' }] }),
      /security\.clients\[0\]: must give exactly one of publicKey and publicKeyFile/,
    );
    assert.match(
      problems({ serverSecretKeyFile: 's.key', clients: [{ publicKey: 'short', role: 'lookup' }] }),
      /clients\[0\]\.publicKey: must be a CurveZMQ key/,
    );
    assert.match(
      problems({ serverSecretKeyFile: 's.key', clients: [{ publicKey: k, role: 'root' }] }),
      /clients\[0\]\.role: must be one of "lookup", "worker", "admin"/,
    );
    assert.match(
      problems({
        serverSecretKeyFile: 's.key',
        clients: [{ publicKey: k, role: 'lookup', namespaces: [] }],
      }),
      /namespaces: must be a non-empty array/,
    );
    assert.match(
      problems({ allowUnauthenticated: 'yes' }),
      /allowUnauthenticated: must be a boolean/,
    );
    const ok = resolveConfig({
      security: {
        serverSecretKeyFile: 's.key',
        clients: [
          { publicKey: k, role: 'worker', namespaces: ['00112233445566778899aabbccddeeff'] },
        ],
      },
    });
    assert.equal(ok.security.clients[0]!.role, 'worker');
  });

  test('the test fault KVTIER_TEST_FAIL_FIRST_HANDSHAKES is read from the environment and validated', async () => {
    const server = generateCurveKeyPair();
    writeFileSync(join(dir, 'fault-server.key'), `${server.secretKey}\n`, { mode: 0o600 });
    const cfg = resolveConfig({
      security: {
        serverSecretKeyFile: join(dir, 'fault-server.key'),
        clients: [{ publicKey: generateCurveKeyPair().publicKey, role: 'lookup' }],
      },
    });
    await assert.rejects(
      serverAuthFromConfig(cfg, silentLogger, { KVTIER_TEST_FAIL_FIRST_HANDSHAKES: 'two' }),
      (e: unknown) =>
        isKvtierError(e, 'KVT_CONFIG') && /KVTIER_TEST_FAIL_FIRST_HANDSHAKES/.test(String(e)),
    );
    const warnings: string[] = [];
    const log = { ...silentLogger, warn: (m: string) => warnings.push(m) };
    const auth = await serverAuthFromConfig(cfg, log, { KVTIER_TEST_FAIL_FIRST_HANDSHAKES: '2' });
    assert.ok(auth instanceof ServerAuth);
    assert.match(warnings.join(), /test fault on/);
    await auth.close();
  });
});
