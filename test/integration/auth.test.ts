/**
 * CurveZMQ authentication and roles against a sidecar built from a config file as `kvtier serve`
 * builds it (loadConfig + Sidecar.start), over real ZMQ sockets: clients without a key or with
 * a key off the allow-list get no service while the server keeps serving others; every message
 * type is refused with KVT_FORBIDDEN for a role below it and served for the roles that include
 * it; refused requests change nothing; keys restricted to namespaces are refused every other
 * namespace (LOOKUP, PUT, GET, CLEAR, REGISTER, and data-plane messages for another namespace's
 * engine).
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import * as zmq from 'zeromq';
import { fallbackSample } from '../../scripts/protocol-fallback-samples.ts';
import { loadConfig } from '../../src/config/config.ts';
import { DataPlaneClient } from '../../src/data-plane/data-plane-client.ts';
import { type KvRegistration, resolveKvRegistration } from '../../src/data-plane/kv-layout.ts';
import { isKvtierError } from '../../src/errors.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { allowedTypes, ROLES, type Role } from '../../src/lookup-server/policy.ts';
import { decodeReply, encodeRequest } from '../../src/protocol/codec.ts';
import type { Reply, Request } from '../../src/protocol/messages.ts';
import { MESSAGES } from '../../src/protocol/wire-table.ts';
import type { ClientCurveKeys } from '../../src/security/curve-client.ts';
import {
  type CurveKeyPair,
  generateCurveKeyPair,
  writeKeyPair,
} from '../../src/security/curve-keys.ts';
import { Sidecar } from '../../src/sidecar.ts';
import { silentLogger } from '../../src/util/log.ts';
import { KV_FILE_BYTES, testRegistration } from '../support/engine-process.ts';
import { packHex, randomHashes, randomPayload } from '../support/fixtures.ts';

const dir = mkdtempSync(join(tmpdir(), 'kvtier-auth-'));
const kvPath = join(dir, 'kv.bin');
writeFileSync(kvPath, randomPayload(KV_FILE_BYTES));

const regA = testRegistration(kvPath, 'engine-a');
const regB: KvRegistration = { ...testRegistration(kvPath, 'engine-b'), modelId: 'test/other' };
const NS_A = resolveKvRegistration(regA).namespace.id;
const NS_B = resolveKvRegistration(regB).namespace.id;

const keys: Record<string, CurveKeyPair> = {};
let serverPublicKey = '';
let sidecar: Sidecar;
const sockets: zmq.Dealer[] = [];

function curveOf(name: string): ClientCurveKeys {
  const k = keys[name]!;
  return { serverPublicKey, publicKey: k.publicKey, secretKey: k.secretKey };
}

/** A DEALER with `name`'s key (none for undefined) sending one request and awaiting its reply. */
function rawClient(
  name: string | undefined,
  extra: Partial<zmq.SocketOptions<zmq.Dealer>> = {},
): (req: Request, timeoutMs?: number) => Promise<Reply | 'timeout'> {
  const k = name === undefined ? undefined : curveOf(name);
  const sock = new zmq.Dealer({
    linger: 0,
    ...(k !== undefined
      ? {
          curveServerKey: k.serverPublicKey,
          curvePublicKey: k.publicKey,
          curveSecretKey: k.secretKey,
        }
      : {}),
    ...extra,
  });
  sock.connect(sidecar.server.endpoint);
  sockets.push(sock);
  let nextId = 1;
  return async (req, timeoutMs = 5000) => {
    req.requestId = nextId++;
    sock.receiveTimeout = timeoutMs;
    await sock.send(encodeRequest(req));
    for (;;) {
      let frames: Buffer[];
      try {
        frames = await sock.receive();
      } catch (err) {
        if ((err as { code?: string }).code === 'EAGAIN') return 'timeout';
        throw err;
      }
      const rep = decodeReply(frames[frames.length - 1]!);
      if (rep.requestId === req.requestId) return rep;
    }
  };
}

function codeOf(rep: Reply | 'timeout'): string {
  if (rep === 'timeout') return 'timeout';
  return rep.type === 'error' ? rep.code : 'ok';
}

/** One well-formed request of every type, touching namespace A and engine `engine-a`. */
function requestOf(type: Request['type']): Request {
  const hashes = randomHashes(1);
  const base = { requestId: 0 };
  switch (type) {
    case 'lookup':
      return {
        ...base,
        type,
        lookupId: 'lk-a',
        namespaces: [NS_A],
        hashes: packHex(hashes),
        tokenCounts: Uint32Array.of(16),
        config: { pin: false },
      };
    case 'cancel':
      return { ...base, type, lookupId: 'lk-none' };
    case 'clear':
      return { ...base, type, namespaces: [NS_A] };
    case 'ping':
    case 'stats':
      return { ...base, type };
    case 'put':
      return {
        ...base,
        type,
        namespace: NS_A,
        hash: hashes[0]!,
        tokens: 16,
        payload: randomPayload(64),
      };
    case 'get':
      return { ...base, type, namespace: NS_A, hash: hashes[0]! };
    case 'register':
      return { ...base, type, registration: regA as unknown as Record<string, unknown> };
    case 'save':
      return {
        ...base,
        type,
        engineId: 'engine-a',
        engineRequestId: 'r1',
        skipChunks: 0,
        blockIds: Uint32Array.of(0, 1, 2, 3),
        chunkHashes: packHex(hashes),
      };
    case 'load':
      return {
        ...base,
        type,
        engineId: 'engine-a',
        engineRequestId: 'r1',
        lookupId: 'lk-none',
        deadlineMs: 0,
        stateSlot: -1,
        blockIds: Uint32Array.of(8, 9, 10, 11),
        chunkHashes: packHex(hashes),
      };
    case 'hold':
      return { ...base, type, engineId: 'engine-a', engineRequestId: 'r1', lookupId: 'lk-none' };
    case 'request-finished':
      return { ...base, type, engineId: 'engine-a', engineRequestId: 'r1', kind: 'finished' };
    case 'heartbeat':
      return { ...base, type, engineId: 'engine-a' };
    case 'unregister':
      return { ...base, type, engineId: 'engine-a' };
    default: {
      // A request added to the table without a case here: its sample from the field kinds.
      const spec = MESSAGES.find((m) => m.tag === type)!;
      return { ...fallbackSample(spec), requestId: 0 } as unknown as Request;
    }
  }
}

/**
 * The request types `requestOf` builds by hand, in an order that keeps engine-a registered until
 * its UNREGISTER.
 */
const LISTED: readonly Request['type'][] = [
  'ping',
  'stats',
  'lookup',
  'cancel',
  'register',
  'put',
  'get',
  'save',
  'hold',
  'load',
  'request-finished',
  'heartbeat',
  'clear',
  'unregister',
];

/** Every request type of the table: those, and any added since (before the UNREGISTER). */
const ALL_TYPES: Request['type'][] = [
  ...LISTED.slice(0, -1),
  ...MESSAGES.flatMap((m) =>
    m.dir === 'request' && !(LISTED as readonly string[]).includes(m.tag)
      ? [m.tag as Request['type']]
      : [],
  ),
  'unregister',
];

before(async () => {
  const clients: Record<string, unknown>[] = [];
  for (const name of [
    'server',
    'lookup',
    'worker',
    'admin',
    'worker-a',
    'lookup-a',
    'admin-a',
    'peer',
    'stranger',
  ]) {
    keys[name] = generateCurveKeyPair();
    await writeKeyPair(dir, name, keys[name]!);
  }
  serverPublicKey = keys.server!.publicKey;
  clients.push(
    { name: 'scheduler', publicKey: keys.lookup!.publicKey, role: 'lookup' },
    { name: 'engine', publicKeyFile: 'worker.pub', role: 'worker' },
    { name: 'ops', publicKeyFile: join(dir, 'admin.pub'), role: 'admin' },
    { name: 'tenant-a-engine', publicKeyFile: 'worker-a.pub', role: 'worker', namespaces: [NS_A] },
    {
      name: 'tenant-a-scheduler',
      publicKeyFile: 'lookup-a.pub',
      role: 'lookup',
      namespaces: [NS_A.toUpperCase()],
    },
    { name: 'tenant-a-ops', publicKeyFile: 'admin-a.pub', role: 'admin', namespaces: [NS_A] },
    { name: 'node-b', publicKeyFile: 'peer.pub', role: 'peer' },
  );
  const configPath = join(dir, 'kvtier.json');
  writeFileSync(
    configPath,
    JSON.stringify({
      listen: 'tcp://127.0.0.1:*',
      metrics: null,
      logLevel: 'silent',
      tiers: [{ name: 'cpu', type: 'local-cpu', capacityBytes: '16MiB' }],
      security: { serverSecretKeyFile: 'server.key', clients },
    }),
  );
  const config = await loadConfig({ configPath }, {});
  sidecar = await Sidecar.start({ config, log: silentLogger, processMetrics: false });
});

after(async () => {
  for (const s of sockets) s.close();
  await sidecar?.close();
  rmSync(dir, { recursive: true, force: true });
});

describe('CurveZMQ handshake', () => {
  it('gives a client without a key, or with a key off the allow-list, no service; others go on being served', async () => {
    const keyless = new LookupClient({ endpoint: sidecar.server.endpoint, requestTimeoutMs: 400 });
    const stranger = new LookupClient({
      endpoint: sidecar.server.endpoint,
      requestTimeoutMs: 400,
      curve: curveOf('stranger'),
    });
    // The right server key is not enough: the client's own key must be allow-listed.
    const wrongServer = new LookupClient({
      endpoint: sidecar.server.endpoint,
      requestTimeoutMs: 400,
      curve: { ...curveOf('lookup'), serverPublicKey: keys.stranger!.publicKey },
    });
    try {
      for (const c of [keyless, stranger, wrongServer])
        await assert.rejects(c.ping(), (e: unknown) => isKvtierError(e, 'KVT_TIMEOUT'));
      const good = new LookupClient({
        endpoint: sidecar.server.endpoint,
        curve: curveOf('lookup'),
      });
      try {
        const info = await good.ping();
        assert.equal(info.protocolVersion, 1);
      } finally {
        await good.close();
      }
    } finally {
      await Promise.all([keyless.close(), stranger.close(), wrongServer.close()]);
    }
  });

  it('names the connection by its key, whatever routing id the client asks for', async () => {
    const send = rawClient('lookup', { routingId: 'pretend-admin' });
    assert.equal(codeOf(await send(requestOf('ping'))), 'ok');
    assert.equal(codeOf(await send(requestOf('put'))), 'KVT_FORBIDDEN');
  });
});

describe('roles', () => {
  const expectations = (role: Role) => {
    const allowed = allowedTypes(role);
    return ALL_TYPES.map((t) => ({ type: t, allowed: allowed.has(t) }));
  };

  for (const role of ROLES) {
    it(`role ${role}: every message type is refused with KVT_FORBIDDEN or served, as the role says`, async () => {
      const send = rawClient(role);
      // The data-plane messages need engine-a registered (by a worker) unless the role may do it.
      const worker = rawClient('worker');
      if (role === 'lookup') assert.equal(codeOf(await worker(requestOf('register'))), 'ok');
      for (const { type, allowed } of expectations(role)) {
        const rep = await send(requestOf(type));
        const code = codeOf(rep);
        if (allowed)
          assert.notEqual(code, 'KVT_FORBIDDEN', `${role} may send ${type}, got ${code}`);
        else {
          assert.equal(code, 'KVT_FORBIDDEN', `${role} may not send ${type}`);
          assert.match(
            (rep as { message: string }).message,
            new RegExp(`may not send ${type.toUpperCase()}`),
          );
        }
        assert.notEqual(code, 'timeout', `${type} answered`);
      }
      if (role === 'lookup') await worker(requestOf('unregister'));
    });
  }

  it('a refused request changes nothing', async () => {
    const admin = rawClient('admin');
    const worker = rawClient('worker');
    const lookup = rawClient('lookup');
    const put = requestOf('put') as Extract<Request, { type: 'put' }>;
    // PUT by a worker: not stored.
    assert.equal(codeOf(await worker(put)), 'KVT_FORBIDDEN');
    const got = await admin({ type: 'get', requestId: 0, namespace: NS_A, hash: put.hash });
    assert.equal(got !== 'timeout' && got.type === 'get-result' && got.found, false);
    // Stored by the admin, then CLEAR by a worker and a scheduler: still there, epoch unchanged.
    assert.equal(codeOf(await admin(put)), 'ok');
    const epoch = ((await lookup(requestOf('ping'))) as unknown as { info: { epoch: number } }).info
      .epoch;
    assert.equal(
      codeOf(await worker({ type: 'clear', requestId: 0, namespaces: [] })),
      'KVT_FORBIDDEN',
    );
    assert.equal(
      codeOf(await lookup({ type: 'clear', requestId: 0, namespaces: [NS_A] })),
      'KVT_FORBIDDEN',
    );
    const after = await admin({ type: 'get', requestId: 0, namespace: NS_A, hash: put.hash });
    assert.ok(after !== 'timeout' && after.type === 'get-result' && after.found, 'chunk kept');
    assert.equal(
      ((await lookup(requestOf('ping'))) as unknown as { info: { epoch: number } }).info.epoch,
      epoch,
    );
    // UNREGISTER and REGISTER by a scheduler leave the worker's engine registered.
    assert.equal(codeOf(await worker(requestOf('register'))), 'ok');
    assert.equal(codeOf(await lookup(requestOf('unregister'))), 'KVT_FORBIDDEN');
    assert.equal(codeOf(await lookup(requestOf('register'))), 'KVT_FORBIDDEN');
    const hb = await worker(requestOf('heartbeat'));
    assert.ok(hb !== 'timeout' && hb.type === 'heartbeat-result' && hb.known);
    assert.equal(sidecar.dataPlane.stats().engines, 1);
    await worker(requestOf('unregister'));
  });
});

describe('namespace restriction', () => {
  it('refuses a restricted key every namespace but its own, and changes nothing', async () => {
    const lookupA = rawClient('lookup-a');
    const workerA = rawClient('worker-a');
    const adminA = rawClient('admin-a');
    const worker = rawClient('worker');
    const hashes = randomHashes(1);
    const lookup = (ns: string[]): Request => ({
      type: 'lookup',
      requestId: 0,
      lookupId: 'lk-ns',
      namespaces: ns,
      hashes: packHex(hashes),
      tokenCounts: Uint32Array.of(16),
      config: {},
    });
    assert.equal(codeOf(await lookupA(lookup([NS_A]))), 'ok');
    const refused = await lookupA(lookup([NS_A, NS_B]));
    assert.equal(codeOf(refused), 'KVT_FORBIDDEN');
    assert.match(
      (refused as { message: string }).message,
      new RegExp(`may not use namespace ${NS_B}`),
    );
    // PUT, GET and CLEAR of B, and CLEAR of everything, by the tenant's admin.
    const putB: Request = {
      type: 'put',
      requestId: 0,
      namespace: NS_B,
      hash: hashes[0]!,
      tokens: 16,
      payload: randomPayload(64),
    };
    assert.equal(codeOf(await adminA(putB)), 'KVT_FORBIDDEN');
    assert.equal(
      codeOf(await adminA({ type: 'get', requestId: 0, namespace: NS_B, hash: hashes[0]! })),
      'KVT_FORBIDDEN',
    );
    assert.equal(
      codeOf(await adminA({ type: 'clear', requestId: 0, namespaces: [NS_B] })),
      'KVT_FORBIDDEN',
    );
    assert.equal(
      codeOf(await adminA({ type: 'clear', requestId: 0, namespaces: [] })),
      'KVT_FORBIDDEN',
    );
    assert.equal(codeOf(await adminA({ type: 'clear', requestId: 0, namespaces: [NS_A] })), 'ok');
    const stats = (await worker({ type: 'stats', requestId: 0 })) as unknown as {
      stats: { tiers: { chunks: number }[] };
    };
    assert.equal(stats.stats.tiers[0]!.chunks, 0, 'the refused PUT stored nothing');
    // REGISTER of a B model: refused, nothing registered.
    const registerB: Request = {
      type: 'register',
      requestId: 0,
      registration: regB as unknown as Record<string, unknown>,
    };
    assert.equal(codeOf(await workerA(registerB)), 'KVT_FORBIDDEN');
    assert.equal(sidecar.dataPlane.namespaceOf('engine-b'), undefined);
    // Engine B registered by an unrestricted worker: the tenant's worker cannot touch it...
    assert.equal(codeOf(await worker(registerB)), 'ok');
    for (const t of [
      'save',
      'load',
      'hold',
      'request-finished',
      'heartbeat',
      'unregister',
    ] as const) {
      const req = { ...requestOf(t), engineId: 'engine-b' } as Request;
      assert.equal(codeOf(await workerA(req)), 'KVT_FORBIDDEN', `${t} of engine-b`);
    }
    // ...nor take its engine id over with a registration of its own namespace.
    const takeover: Request = {
      type: 'register',
      requestId: 0,
      registration: { ...regA, engineId: 'engine-b' } as unknown as Record<string, unknown>,
    };
    assert.equal(codeOf(await workerA(takeover)), 'KVT_FORBIDDEN');
    assert.equal(sidecar.dataPlane.namespaceOf('engine-b'), NS_B, 'engine-b still registered in B');
    // Its own engine works end to end through the TypeScript client.
    const dp = new DataPlaneClient({
      endpoint: sidecar.server.endpoint,
      heartbeatIntervalMs: 0,
      curve: curveOf('worker-a'),
    });
    try {
      const reg = await dp.register(regA);
      assert.equal(reg.namespace, NS_A);
      const saved = await dp.save({
        requestId: 'r1',
        blockIds: [0, 1, 2, 3],
        chunkHashes: packHex(hashes),
      });
      assert.equal(saved.saved, 1);
    } finally {
      await dp.close();
    }
    const lc = new LookupClient({
      endpoint: sidecar.server.endpoint,
      namespaces: [NS_A],
      curve: curveOf('lookup-a'),
    });
    try {
      const answer = await lc.lookupAsync('lk-ts', packHex(hashes), [16]);
      assert.equal(answer.hitTokens, 16);
    } finally {
      await lc.close();
    }
    await worker({ type: 'unregister', requestId: 0, engineId: 'engine-b' });
  });
});
