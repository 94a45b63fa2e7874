/**
 * The peer tier's parts that need no other process: its options as the config file reads them
 * (each bad option a problem naming it), rendezvous placement (the same homes everywhere, few
 * moves when a sidecar joins), and the verification of a peer's answer.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { describe, test } from 'node:test';
import { PEER_OPTIONS } from '../../src/backends/peer/peer-options.ts';
import { RendezvousPlacement, rendezvousWeight } from '../../src/backends/peer/peer-placement.ts';
import { verifyPeerChunks } from '../../src/backends/peer/peer-verify.ts';
import { ConfigError, resolveConfig } from '../../src/config/config.ts';
import { chunkHash } from '../../src/hashing/chunk-hash.ts';
import { generateCurveKeyPair } from '../../src/security/curve-keys.ts';
import { crc32c } from '../../src/util/crc32c.ts';
import { randomHashes, randomNamespace } from '../support/fixtures.ts';

const KEY = generateCurveKeyPair().publicKey;
const CPU = { name: 'cpu', type: 'local-cpu', capacityBytes: '64MiB' };

function problems(peer: Record<string, unknown>): string[] {
  try {
    resolveConfig({ tiers: [CPU, { name: 'peers', type: 'peer', ...peer }] });
  } catch (err) {
    assert.ok(err instanceof ConfigError, String(err));
    return err.problems.map((p) => `${p.path}: ${p.message}`);
  }
  return [];
}

const twoPeers = [
  { name: 'a', endpoint: 'tcp://10.0.0.1:5555' },
  { name: 'b', endpoint: 'tcp://10.0.0.2:5555' },
];

describe('peer tier options in the config file', () => {
  test('a valid list passes, with defaults applied by the resolver', () => {
    assert.deepEqual(problems({ self: 'a', peers: twoPeers }), []);
    const o = PEER_OPTIONS.resolve({ self: 'a', peers: twoPeers });
    assert.equal(o.replicas, 1);
    assert.equal(o.timeoutMs, 1000);
    assert.equal(o.maxChunksPerRequest, 16);
    assert.equal(o.secretKeyFile, null);
  });

  test('each bad option is a problem that names it and says what is allowed', () => {
    assert.deepEqual(problems({ peers: twoPeers }), ['tiers[1].self: is required']);
    assert.deepEqual(problems({ self: 'c', peers: twoPeers }), [
      'tiers[1].self: must name one of peers ("a", "b"), got "c"',
    ]);
    assert.deepEqual(problems({ self: 'a', peers: [] }), [
      'tiers[1].peers: must be a non-empty array of { name, endpoint, publicKey | publicKeyFile }, got an array of length 0',
    ]);
    assert.deepEqual(
      problems({ self: 'a', peers: [twoPeers[0], { name: 'b', endpoint: '10.0.0.2:5555' }] }),
      [
        'tiers[1].peers[1].endpoint: must be a ZMQ endpoint: tcp://HOST:PORT (port 1..65535), ipc://PATH or inproc://NAME, got "10.0.0.2:5555"',
      ],
    );
    assert.deepEqual(problems({ self: 'a', peers: [...twoPeers, { ...twoPeers[1], name: 'c' }] }), [
      'tiers[1].peers: must list each endpoint once, "tcp://10.0.0.2:5555" appears twice',
    ]);
    assert.deepEqual(problems({ self: 'a', peers: [...twoPeers, twoPeers[0]] }), [
      'tiers[1].peers: must name each sidecar once, "a" appears twice',
      'tiers[1].peers: must list each endpoint once, "tcp://10.0.0.1:5555" appears twice',
    ]);
    assert.deepEqual(problems({ self: 'a', peers: twoPeers, replicas: 3 }), [
      'tiers[1].replicas: must be at most the number of peers (2), got 3',
    ]);
    assert.deepEqual(problems({ self: 'a', peers: twoPeers, timeoutMs: 0 }), [
      'tiers[1].timeoutMs: must be an integer in [1, 600000], got 0',
    ]);
    assert.deepEqual(problems({ self: 'a', peers: twoPeers, maxChunksPerRequest: 256 }), [
      'tiers[1].maxChunksPerRequest: must be an integer in [1, 255], got 256',
    ]);
    assert.deepEqual(
      problems({ self: 'a', peers: [twoPeers[0], { ...twoPeers[1], publicKey: 'short' }] }),
      [
        'tiers[1].peers[1].publicKey: must be a CurveZMQ key: 40 characters of Z85 text (kvtier keygen), got "short"',
      ],
    );
    assert.match(
      problems({ self: 'a', peers: twoPeers, peerz: 1 })[0]!,
      /tiers\[1\]\.peerz: unknown peer option/,
    );
  });

  test('CurveZMQ to all peers or none: keys and the secret key file go together', () => {
    assert.deepEqual(
      problems({ self: 'a', peers: [twoPeers[0], { ...twoPeers[1], publicKey: KEY }] }),
      [
        'tiers[1].secretKeyFile: is required when the peers have public keys (the peers authenticate this sidecar by it)',
      ],
    );
    assert.deepEqual(problems({ self: 'a', peers: twoPeers, secretKeyFile: 'a.key' }), [
      'tiers[1].peers: must give every peer a public key when any has one or secretKeyFile is set (CurveZMQ to all or none); "b" has none',
    ]);
    assert.deepEqual(
      problems({
        self: 'a',
        peers: [twoPeers[0], { ...twoPeers[1], publicKey: KEY, publicKeyFile: 'b.pub' }],
        secretKeyFile: 'a.key',
      }),
      ['tiers[1].peers: must give peers[1] publicKey or publicKeyFile, not both'],
    );
    // This sidecar's own entry needs no key.
    assert.deepEqual(
      problems({
        self: 'a',
        peers: [twoPeers[0], { ...twoPeers[1], publicKeyFile: 'b.pub' }],
        secretKeyFile: 'a.key',
      }),
      [],
    );
  });
});

describe('rendezvous placement', () => {
  const names = ['node-a', 'node-b', 'node-c'];

  test('every sidecar computes the same homes, whatever the order of its list', () => {
    const ns = randomNamespace();
    const one = new RendezvousPlacement(names, 2);
    const other = new RendezvousPlacement([...names].reverse(), 2);
    for (const h of randomHashes(50)) {
      const homes = one.homes(ns, h);
      assert.equal(homes.length, 2);
      assert.deepEqual(other.homes(ns, h), homes);
      const w = homes.map((n) => rendezvousWeight(n, ns, h));
      assert.ok(w[0]! >= w[1]!, 'best first');
    }
  });

  test('the weight is SHA-256 over name, NUL, namespace and hash, as docs/fleet.md specifies', () => {
    const ns = '0123456789abcdef0123456789abcdef';
    const h = chunkHash('ab'.repeat(32));
    assert.equal(rendezvousWeight('node-a', ns, h).length, 16);
    assert.equal(rendezvousWeight('node-a', ns, h), rendezvousWeight('node-a', ns, h));
    assert.notEqual(rendezvousWeight('node-a', ns, h), rendezvousWeight('node-b', ns, h));
  });

  test('chunks spread over the sidecars, and one joining moves only the chunks it now homes', () => {
    const ns = randomNamespace();
    const hashes = randomHashes(3000);
    const before = new RendezvousPlacement(names, 1);
    const after = new RendezvousPlacement([...names, 'node-d'], 1);
    const count = new Map<string, number>();
    let moved = 0;
    for (const h of hashes) {
      const [was] = before.homes(ns, h);
      const [is] = after.homes(ns, h);
      count.set(was!, (count.get(was!) ?? 0) + 1);
      if (was !== is) {
        moved++;
        assert.equal(is, 'node-d', 'a chunk moves only to the new sidecar');
      }
    }
    for (const n of names) assert.ok(count.get(n)! > 800, `${n} homes ${count.get(n)} of 3000`);
    assert.ok(moved > 500 && moved < 1000, `${moved} of 3000 moved (about a quarter)`);
  });
});

describe("verification of a peer's answer", () => {
  const ns = randomNamespace();
  const [h1, h2, h3] = randomHashes(3);
  const asked = new Set([h1!, h2!]);
  const chunk = (hash: typeof h1, payload: Buffer, crc = crc32c(payload), tokens = 16) => ({
    hash: hash!,
    tokens,
    crc32c: crc,
    payload,
  });
  const reply = (chunks: ReturnType<typeof chunk>[], namespace = ns) => ({
    type: 'peer-get-result' as const,
    requestId: 1,
    namespace,
    chunks,
  });

  test('accepts what was asked for with its checksum; refuses everything else, with the reason', async () => {
    const [p1, p2] = [randomBytes(4096), randomBytes(512 * 1024)];
    const ok = await verifyPeerChunks(ns, asked, reply([chunk(h1, p1), chunk(h2, p2)]), 1 << 20);
    assert.deepEqual(ok.refused, []);
    assert.ok(Buffer.from(ok.chunks.get(h1!)!.data).equals(p1));
    assert.ok(Buffer.from(ok.chunks.get(h2!)!.data).equals(p2));

    const flipped = Buffer.from(p2);
    flipped[1000]! ^= 1;
    const bad = await verifyPeerChunks(
      ns,
      asked,
      reply([
        chunk(h1, p1, crc32c(p1), 0),
        chunk(h2, flipped, crc32c(p2)),
        chunk(h3, p1),
        chunk(h1, Buffer.alloc(0)),
      ]),
      1 << 20,
    );
    assert.deepEqual(bad.refused.sort(), ['checksum', 'hash', 'size', 'tokens']);
    assert.equal(bad.chunks.size, 0);

    const big = await verifyPeerChunks(ns, asked, reply([chunk(h1, p2)]), 4096);
    assert.deepEqual(big.refused, ['size']);
    const twice = await verifyPeerChunks(ns, asked, reply([chunk(h1, p1), chunk(h1, p1)]), 1 << 20);
    assert.deepEqual(twice.refused, ['duplicate']);
    assert.equal(twice.chunks.size, 1);
  });

  test("another namespace's chunks are refused whole, whatever their checksums", async () => {
    const p = randomBytes(4096);
    const other = await verifyPeerChunks(
      ns,
      asked,
      reply([chunk(h1, p), chunk(h2, p)], randomNamespace()),
      1 << 20,
    );
    assert.deepEqual(other.refused, ['namespace', 'namespace']);
    assert.equal(other.chunks.size, 0);
  });
});
