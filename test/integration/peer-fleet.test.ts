/**
 * A fleet without a shared store (docs/fleet.md, Peers): three `kvtier serve` processes, each with
 * host memory and a peer tier listing all three, and no Redis, S3 or shared directory. An engine
 * on A saves; the engine on B finds A's chunks through its peer tier and loads them byte-exact.
 * Chunks travel once: a chunk a sidecar got from a peer is not sent on, and a peer's request is
 * answered from the sidecar's own tiers. A frozen (SIGSTOP) and a dead (SIGKILL) peer are misses
 * answered well within the lookup deadline. A peer that misbehaves (a fake one on a real ZMQ
 * ROUTER here, since a real sidecar does not) is a miss, counted and logged once per interval,
 * never served. With CurveZMQ, sidecars authenticate to each other with their own keys (role
 * `peer`), and an engine's key may not send peer messages.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import * as zmq from 'zeromq';
import { RendezvousPlacement } from '../../src/backends/peer/peer-placement.ts';
import { resolveKvRegistration } from '../../src/data-plane/kv-layout.ts';
import type { ChunkHash } from '../../src/hashing/chunk-hash.ts';
import { LookupClient } from '../../src/lookup-client/lookup-client.ts';
import { decodeRequest, encodeReply } from '../../src/protocol/codec.ts';
import type { Reply } from '../../src/protocol/messages.ts';
import { RequestSocket } from '../../src/protocol/request-socket.ts';
import type { ClientCurveKeys } from '../../src/security/curve-client.ts';
import { generateCurveKeyPair, writeKeyPair } from '../../src/security/curve-keys.ts';
import { crc32c } from '../../src/util/crc32c.ts';
import { chunkBytes } from '../support/durability.ts';
import { blockContents, CHUNK_TOKENS, testRegistration } from '../support/engine-process.ts';
import { runEngineJob } from '../support/engine-runner.ts';
import { freeTcpPort, randomHashes, randomNamespace, withDeadline } from '../support/fixtures.ts';
import { type SidecarProcess, startSidecarProcess } from '../support/sidecar-process.ts';

const dir = mkdtempSync(join(tmpdir(), 'kvtier-peers-'));
/** Far below the clients' lookup deadline (LOOKUP_DEADLINE_MS): a silent peer is a miss by then. */
const PEER_TIMEOUT_MS = 3000;
/** The clients' lookup deadline: an answer of status `timeout` would mean a hang. */
const LOOKUP_DEADLINE_MS = 30_000;
const CHUNK = 64 * 1024;

interface Node {
  name: string;
  proc: SidecarProcess;
  endpoint: string;
  metricsUrl: string;
  client: LookupClient;
}

const nodes = new Map<string, Node>();
const live: Node[] = [];

function peerTier(self: string, peers: { name: string; endpoint: string }[], extra = {}) {
  return {
    name: 'peers',
    type: 'peer',
    self,
    peers,
    timeoutMs: PEER_TIMEOUT_MS,
    failureThreshold: 2,
    probeIntervalMs: 200,
    ...extra,
  };
}

async function startNode(
  name: string,
  endpoint: string,
  tiers: Record<string, unknown>[],
  extra: Record<string, unknown> = {},
  curve?: ClientCurveKeys,
): Promise<Node> {
  const proc = await startSidecarProcess(join(dir, `${name}.json`), {
    listen: endpoint,
    metrics: { host: '127.0.0.1', port: 0 },
    logLevel: 'warn',
    tiers: [{ name: 'cpu', type: 'local-cpu', capacityBytes: '64MiB' }, ...tiers],
    ...extra,
  });
  const m = /metrics at (http:\/\/\S+\/metrics)/.exec(proc.output);
  assert.ok(m, proc.output);
  const client = new LookupClient({
    endpoint,
    requestTimeoutMs: 60_000,
    lookupTimeoutMs: LOOKUP_DEADLINE_MS,
    ...(curve !== undefined ? { curve } : {}),
  });
  const node = { name, proc, endpoint, metricsUrl: m[1]!, client };
  live.push(node);
  return node;
}

const fleet = ['a', 'b', 'c'];
/** Where each chunk lives in the three-node fleet (the sidecars compute the same). */
const placement = new RendezvousPlacement(fleet, 1);
const homeOf = (ns: string, h: ChunkHash) => placement.homes(ns, h)[0]!;

/** `n` hashes of namespace `ns` whose home is `home`. */
function homedAt(ns: string, home: string, n: number): ChunkHash[] {
  const out: ChunkHash[] = [];
  while (out.length < n) for (const h of randomHashes(8)) if (homeOf(ns, h) === home) out.push(h);
  return out.slice(0, n);
}

const node = (name: string): Node => nodes.get(name)!;

before(async () => {
  const endpoints = Object.fromEntries(
    await Promise.all(
      fleet.map(async (n) => [n, `tcp://127.0.0.1:${await freeTcpPort()}`] as const),
    ),
  );
  const peers = fleet.map((n) => ({ name: n, endpoint: endpoints[n]! }));
  for (const n of fleet) nodes.set(n, await startNode(n, endpoints[n]!, [peerTier(n, peers)]));
});

after(async () => {
  for (const n of live) {
    await n.client.close();
    await n.proc.kill();
  }
  rmSync(dir, { recursive: true, force: true });
});

async function drained(n: Node): Promise<void> {
  await withDeadline(
    (async () => {
      for (;;) {
        const s = await n.client.stats();
        if ((s.writeThrough as { depth: number }).depth === 0) return;
        await new Promise((r) => setTimeout(r, 20));
      }
    })(),
    60_000,
    `${n.name}: write-through drain`,
  );
}

interface PeerStats {
  state: 'up' | 'down';
  requests: number;
  skipped: number;
  refused: Record<string, number>;
}

interface PeerTierStats {
  health: string;
  corruptObjects: number;
  peers: Record<string, PeerStats>;
}

async function peerStats(n: Node): Promise<PeerTierStats> {
  const tiers = (await n.client.stats()).tiers as { name: string }[];
  return tiers.find((t) => t.name === 'peers') as unknown as PeerTierStats;
}

async function lookup(n: Node, ns: string, hashes: readonly string[], prefetch = true) {
  return n.client.lookupAsync(
    `probe-${randomBytes(4).toString('hex')}`,
    hashes.map((h) => Buffer.from(h, 'hex')),
    hashes.map(() => CHUNK_TOKENS),
    { namespaces: [ns], config: { pin: false, prefetch } },
  );
}

async function until(what: string, ok: () => Promise<boolean>): Promise<void> {
  await withDeadline(
    (async () => {
      while (!(await ok())) await new Promise((r) => setTimeout(r, 50));
    })(),
    60_000,
    what,
  );
}

describe('three sidecars, host memory and a peer tier each, no shared store', {
  timeout: 300_000,
}, () => {
  it('an engine on A saves; the engine on B finds the chunks on the peers and loads them byte-exact', async () => {
    const [a, b, c] = [node('a'), node('b'), node('c')];
    // Homes a, b, c, b, a, c: B holds chunks 1 and 3 (A sends them to B) but not chunk 0, so its
    // lookup finds none in host memory first and gets every kind of home from the peer tier:
    // another sidecar, and B itself past its first host-memory miss.
    const ns = resolveKvRegistration(testRegistration(join(dir, 'src.kv'), 'engine-a')).namespace
      .id;
    const homes = ['a', 'b', 'c', 'b', 'a', 'c'];
    const hashes: ChunkHash[] = [];
    for (const home of homes) hashes.push(homedAt(ns, home, 1)[0]!);
    const from = Array.from({ length: 24 }, (_, i) => 3 + i * 2);
    const to = Array.from({ length: 24 }, (_, i) => 62 - i * 2);
    const src = join(dir, 'src.kv');
    const saved = await runEngineJob(
      {
        mode: 'save',
        endpoint: a.endpoint,
        kvPath: src,
        engineId: 'engine-a',
        requestId: 'save-1',
        blockIds: from,
        hashes,
      },
      60_000,
    );
    assert.equal(saved.saved, 6);
    assert.equal(saved.namespace, ns);
    await drained(a);
    // Each chunk went to its home: C holds (in host memory, no prefetch) exactly those homed there.
    for (const [i, h] of hashes.entries())
      assert.equal(
        (await lookup(c, ns, [h], false)).hitTokens,
        homes[i] === 'c' ? CHUNK_TOKENS : 0,
        `chunk ${i} (home ${homes[i]}) on C`,
      );

    const dst = join(dir, 'dst.kv');
    const loaded = await runEngineJob(
      {
        mode: 'load',
        endpoint: b.endpoint,
        kvPath: dst,
        statePath: join(dir, 'dst.state'),
        engineId: 'engine-b',
        requestId: 'load-1',
        blockIds: to,
        hashes,
      },
      60_000,
    );
    assert.equal(loaded.namespace, ns);
    assert.equal(loaded.hitTokens, 6 * CHUNK_TOKENS);
    assert.equal(loaded.loadedTokens, 6 * CHUNK_TOKENS);
    assert.deepEqual(loaded.invalidBlockIds, []);
    const s = readFileSync(src);
    const d = readFileSync(dst);
    for (const [j, blk] of from.entries())
      assert.ok(blockContents(d, to[j]!).equals(blockContents(s, blk)), `block ${blk} → ${to[j]}`);

    // No loops: A sent each chunk homed elsewhere once and nothing for B's requests; C, which
    // received chunks and answered B, never asked or sent anything itself.
    const sent = homes.filter((h) => h !== 'a').length;
    const pa = await peerStats(a);
    assert.equal(pa.peers.b!.requests + pa.peers.c!.requests, sent, 'A: one PEER_PUT per chunk');
    const pc = await peerStats(c);
    assert.equal(pc.peers.a!.requests + pc.peers.b!.requests, 0, 'C sent nothing on');
    assert.equal((await peerStats(b)).corruptObjects, 0);
  });

  it('a frozen peer (SIGSTOP) is a miss well within the lookup deadline, and serves again once thawed', async () => {
    const [a, b, c] = [node('a'), node('b'), node('c')];
    const ns = randomNamespace();
    const [onA] = homedAt(ns, 'a', 1);
    const [onC, onC2] = homedAt(ns, 'c', 2);
    for (const h of [onA!, onC!, onC2!])
      await a.client.put(ns, h, CHUNK_TOKENS, chunkBytes(h, CHUNK));
    await drained(a);
    process.kill(c.proc.pid, 'SIGSTOP');
    try {
      for (let i = 0; i < 3; i++) {
        const r = await lookup(b, ns, [onA!, onC!]);
        assert.equal(r.status, 'ok', 'answered, not timed out');
        assert.equal(r.hitTokens, CHUNK_TOKENS, "A's chunk, then C's is a miss");
      }
      const ps = await peerStats(b);
      assert.equal(ps.peers.c!.state, 'down', 'C is left out after two silent requests');
      assert.ok((ps.peers.c!.refused.timeout ?? 0) >= 2);
      assert.equal(ps.peers.a!.state, 'up');
      assert.equal(await b.client.get(ns, onC2!), null, 'a GET misses too');
    } finally {
      process.kill(c.proc.pid, 'SIGCONT');
    }
    await until('B asks C again', async () => (await peerStats(b)).peers.c!.state === 'up');
    assert.equal((await lookup(b, ns, [onA!, onC!])).hitTokens, 2 * CHUNK_TOKENS);
    const got = await b.client.get(ns, onC2!);
    assert.ok(got?.payload.equals(chunkBytes(onC2!, CHUNK)), 'C serves again, byte-exact');
  });

  it('a misbehaving peer is a miss, counted and logged once per interval, never served', async () => {
    const fake = await FakePeer.start();
    const xEndpoint = `tcp://127.0.0.1:${await freeTcpPort()}`;
    const pair = [
      { name: 'x', endpoint: xEndpoint },
      { name: 'fake', endpoint: fake.endpoint },
    ];
    const x = await startNode('x', xEndpoint, [
      peerTier('x', pair, { logIntervalMs: 600_000, failureThreshold: 2 }),
    ]);
    try {
      const ns = randomNamespace();
      const local = new RendezvousPlacement(['x', 'fake'], 1);
      const onFake = (n: number) => {
        const out: ChunkHash[] = [];
        while (out.length < n)
          for (const h of randomHashes(4)) if (local.homes(ns, h)[0] === 'fake') out.push(h);
        return out.slice(0, n);
      };
      // A well-behaved answer first: the fake is asked, and what it sends is loaded.
      const [good] = onFake(1);
      fake.store(ns, good!, chunkBytes(good!, CHUNK));
      fake.mode = 'good';
      assert.equal((await lookup(x, ns, [good!])).hitTokens, CHUNK_TOKENS);
      assert.ok((await x.client.get(ns, good!))?.payload.equals(chunkBytes(good!, CHUNK)));

      const refusedOf = async () => (await peerStats(x)).peers.fake!.refused;
      for (const mode of ['wrong-bytes', 'other-namespace', 'truncated'] as const) {
        fake.mode = mode;
        for (const h of onFake(2)) {
          fake.store(ns, h, chunkBytes(h, CHUNK));
          const r = await lookup(x, ns, [h]);
          assert.equal(r.status, 'ok');
          assert.equal(r.hitTokens, 0, `${mode}: a miss`);
          assert.equal(await x.client.get(ns, h), null, `${mode}: never served`);
        }
      }
      const refused = await refusedOf();
      // Two lookups and two GETs each.
      assert.equal(refused.checksum, 4, 'wrong bytes');
      assert.equal(refused.namespace, 4, "another namespace's chunks");
      assert.equal(refused.malformed, 4, 'truncated frames');
      assert.equal((await peerStats(x)).corruptObjects, 8);
      assert.equal((await peerStats(x)).peers.fake!.state, 'up', 'it answered: not left out');

      fake.mode = 'nothing';
      const [silent] = onFake(1);
      fake.store(ns, silent!, chunkBytes(silent!, CHUNK));
      for (let i = 0; i < 3; i++) {
        const r = await lookup(x, ns, [silent!]);
        assert.equal(r.status, 'ok', 'a silent peer is a miss, not a hang');
        assert.equal(r.hitTokens, 0);
      }
      assert.equal((await refusedOf()).timeout, 2, 'then left out');
      assert.equal((await peerStats(x)).peers.fake!.state, 'down');

      const metrics = await (await fetch(x.metricsUrl)).text();
      for (const [reason, n] of [
        ['checksum', 4],
        ['namespace', 4],
        ['malformed', 4],
        ['timeout', 2],
      ] as const)
        assert.match(
          metrics,
          new RegExp(
            `kvtier_peer_refused_total\\{tier="peers",peer="fake",reason="${reason}"\\} ${n}\\n`,
          ),
        );
      const lines = x.proc.output
        .split('\n')
        .filter((l) => l.includes('peer gave no usable answer'));
      assert.equal(lines.length, 1, `one line per interval for the peer:\n${lines.join('\n')}`);
      assert.match(lines[0]!, /"peer":"fake"/);

      // Its only peer left out, the tier is down (lookups skip it). The fake answers a PING again:
      // the tier is up once its breaker's probe sees it, and a good answer is used.
      assert.equal((await peerStats(x)).health, 'down');
      fake.mode = 'good';
      await until('x asks the fake again', async () => {
        const ps = await peerStats(x);
        return ps.peers.fake!.state === 'up' && ps.health === 'up';
      });
      assert.equal((await lookup(x, ns, [silent!])).hitTokens, CHUNK_TOKENS);
    } finally {
      await fake.close();
    }
  });

  it('a dead peer (SIGKILL) is a miss within the lookup deadline; the others still serve', async () => {
    const [a, b, c] = [node('a'), node('b'), node('c')];
    const ns = randomNamespace();
    const [onA] = homedAt(ns, 'a', 1);
    const [onC] = homedAt(ns, 'c', 1);
    for (const h of [onA!, onC!]) await a.client.put(ns, h, CHUNK_TOKENS, chunkBytes(h, CHUNK));
    await drained(a);
    await c.proc.kill('SIGKILL');
    for (let i = 0; i < 3; i++) {
      const r = await lookup(b, ns, [onA!, onC!]);
      assert.equal(r.status, 'ok');
      assert.equal(r.hitTokens, CHUNK_TOKENS);
    }
    assert.equal((await peerStats(b)).peers.c!.state, 'down');
    const got = await b.client.get(ns, onA!);
    assert.ok(got?.payload.equals(chunkBytes(onA!, CHUNK)));
  });
});

describe('peers with CurveZMQ', { timeout: 300_000 }, () => {
  it('sidecars authenticate to each other as role peer; an engine key may not send peer messages', async () => {
    const keys: Record<string, { publicKey: string; secretKey: string }> = {};
    for (const name of ['p', 'q', 'engine', 'ops']) {
      keys[name] = generateCurveKeyPair();
      await writeKeyPair(dir, name, keys[name]!);
    }
    const ep = {
      p: `tcp://127.0.0.1:${await freeTcpPort()}`,
      q: `tcp://127.0.0.1:${await freeTcpPort()}`,
    };
    const peers = [
      { name: 'p', endpoint: ep.p, publicKeyFile: 'p.pub' },
      { name: 'q', endpoint: ep.q, publicKeyFile: 'q.pub' },
    ];
    const curveOf = (server: 'p' | 'q', who: string): ClientCurveKeys => ({
      serverPublicKey: keys[server]!.publicKey,
      publicKey: keys[who]!.publicKey,
      secretKey: keys[who]!.secretKey,
    });
    const side = (self: 'p' | 'q', other: 'p' | 'q') =>
      startNode(
        self,
        ep[self],
        [peerTier(self, peers, { secretKeyFile: `${self}.key` })],
        {
          security: {
            serverSecretKeyFile: `${self}.key`,
            clients: [
              { name: other, publicKeyFile: `${other}.pub`, role: 'peer' },
              { name: 'engine', publicKeyFile: 'engine.pub', role: 'worker' },
              { name: 'ops', publicKeyFile: 'ops.pub', role: 'admin' },
            ],
          },
        },
        curveOf(self, 'ops'),
      );
    const p = await side('p', 'q');
    const q = await side('q', 'p');
    const ns = randomNamespace();
    const two = new RendezvousPlacement(['p', 'q'], 1);
    const homed = (home: string) => {
      for (;;) for (const h of randomHashes(4)) if (two.homes(ns, h)[0] === home) return h;
    };
    const [toQ, onP] = [homed('q'), homed('p')];
    for (const h of [toQ, onP]) await p.client.put(ns, h, CHUNK_TOKENS, chunkBytes(h, CHUNK));
    await drained(p);
    assert.equal((await lookup(q, ns, [toQ], false)).hitTokens, CHUNK_TOKENS, 'P sent it to Q');
    assert.equal((await lookup(q, ns, [onP])).hitTokens, CHUNK_TOKENS, 'Q read it from P');
    assert.ok((await q.client.get(ns, onP))?.payload.equals(chunkBytes(onP, CHUNK)));

    const ask = async (who: string, req: Parameters<RequestSocket['request']>[0]) => {
      const rs = new RequestSocket({
        endpoint: ep.p,
        curve: curveOf('p', who),
        requestTimeoutMs: 30_000,
      });
      try {
        return await rs.request(req).then(
          (r) => r.type,
          (e: { code: string }) => e.code,
        );
      } finally {
        await rs.close();
      }
    };
    const peerGet = {
      type: 'peer-get' as const,
      requestId: 0,
      namespace: ns,
      hashes: Buffer.from(onP, 'hex'),
    };
    assert.equal(
      await ask('engine', peerGet),
      'KVT_FORBIDDEN',
      "an engine's key: no peer messages",
    );
    assert.equal(await ask('q', peerGet), 'peer-get-result', "the peer's key");
    assert.equal(
      await ask('q', { type: 'get', requestId: 0, namespace: ns, hash: onP }),
      'KVT_FORBIDDEN',
      'a peer key reads chunks only through the peer messages',
    );
    // A PEER_PUT whose payload does not match its checksum stores nothing.
    const [bad] = randomHashes(1);
    const payload = chunkBytes(bad!, CHUNK);
    const putBad = {
      type: 'peer-put' as const,
      requestId: 0,
      namespace: ns,
      hash: bad!,
      tokens: CHUNK_TOKENS,
      crc32c: (crc32c(payload) + 1) >>> 0,
      payload,
    };
    assert.equal(await ask('q', putBad), 'KVT_CORRUPT');
    assert.equal((await lookup(p, ns, [bad!], false)).hitTokens, 0, 'not stored');
    assert.equal(
      await ask('q', { ...putBad, crc32c: crc32c(payload) }),
      'peer-put-result',
      'with its checksum it is',
    );
    assert.equal((await lookup(p, ns, [bad!], false)).hitTokens, CHUNK_TOKENS);
    const audit = p.proc.output.split('\n').filter((l) => l.includes('request refused'));
    assert.ok(
      audit.some((l) => l.includes('"client":"engine"')),
      audit.join('\n'),
    );
  });
});

type FakeMode = 'good' | 'wrong-bytes' | 'other-namespace' | 'truncated' | 'nothing';

/**
 * A peer that misbehaves on purpose, on a real ROUTER: it claims every chunk (PEER_CONTAINS),
 * answers PEER_GET as `mode` says, PING with the peer feature, and takes PEER_PUTs.
 */
class FakePeer {
  mode: FakeMode = 'good';
  readonly #router: zmq.Router;
  readonly #chunks = new Map<string, Buffer>();
  readonly #loop: Promise<void>;
  readonly endpoint: string;

  private constructor(router: zmq.Router) {
    this.#router = router;
    this.endpoint = router.lastEndpoint!;
    this.#loop = this.#serve();
  }

  static async start(): Promise<FakePeer> {
    const router = new zmq.Router({ linger: 0 });
    await router.bind('tcp://127.0.0.1:*');
    return new FakePeer(router);
  }

  store(ns: string, hash: string, payload: Buffer): void {
    this.#chunks.set(`${ns}/${hash}`, payload);
  }

  async #serve(): Promise<void> {
    try {
      for await (const [id, msg] of this.#router) {
        const req = decodeRequest(msg!);
        const reply = this.#answer(req);
        if (reply !== undefined) await this.#router.send([id!, reply]);
      }
    } catch {
      // Closed.
    }
  }

  #answer(req: ReturnType<typeof decodeRequest>): Buffer | undefined {
    // Silent is silent to everything, PING included (else its probe would bring it back).
    if (this.mode === 'nothing') return undefined;
    const base = { requestId: req.requestId };
    switch (req.type) {
      case 'ping':
        return encodeReply({ ...base, type: 'pong', info: { features: ['peer'] } });
      case 'peer-contains':
        return encodeReply({
          ...base,
          type: 'peer-contains-result',
          count: req.hashes.length / 32,
        });
      case 'peer-put':
        return encodeReply({ ...base, type: 'peer-put-result', outcome: 'stored' });
      case 'peer-get': {
        const hashes = (req.hashes.toString('hex').match(/.{64}/g) ?? []) as ChunkHash[];
        const chunks = hashes.flatMap((hash) => {
          const payload = this.#chunks.get(`${req.namespace}/${hash}`);
          if (payload === undefined) return [];
          const sent = Buffer.from(payload);
          if (this.mode === 'wrong-bytes') sent[sent.length >> 1]! ^= 0x40;
          return [{ hash, tokens: CHUNK_TOKENS, crc32c: crc32c(payload), payload: sent }];
        });
        const namespace = this.mode === 'other-namespace' ? randomNamespace() : req.namespace;
        const rep: Reply = { ...base, type: 'peer-get-result', namespace, chunks };
        const frame = encodeReply(rep);
        return this.mode === 'truncated' ? frame.subarray(0, frame.length - 100) : frame;
      }
      default:
        return encodeReply({ ...base, type: 'error', code: 'KVT_PROTOCOL', message: 'not here' });
    }
  }

  async close(): Promise<void> {
    this.#router.close();
    await this.#loop;
  }
}
