/**
 * The example plug-in (examples/log-store-backend) passes the contract suite, loaded the way a
 * deployment loads it: through the registry's `module` tier type, by a path relative to the
 * plug-in base directory (the config file's directory in a deployment).
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import {
  appendFile,
  mkdtemp,
  open,
  readdir,
  readFile,
  rm,
  stat,
  truncate,
  writeFile,
} from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { CircuitBreakerBackend } from '../../src/backends/core/circuit-breaker.ts';
import type { StorageBackend } from '../../src/backends/core/types.ts';
import { CHUNK_HEADER_BYTES, encodeChunkObject } from '../../src/backends/format/chunk-format.ts';
import { BackendRegistry, type TierConfig } from '../../src/backends/registry.ts';
import { loadConfig } from '../../src/config/config.ts';
import { isKvtierError } from '../../src/errors.ts';
import { type ChunkHash, chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';
import { type CorruptionKind, describeBackendContract } from './backend.contract.ts';

// The plug-in logs torn tails and corrupt objects as warnings; the tests provoke both.
process.env.KVTIER_LOG_LEVEL ??= 'error';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const MODULE = './examples/log-store-backend/index.ts';
const KiB = 1024;
const MiB = 1024 * KiB;

async function loadTier(
  options: Record<string, unknown>,
  health: TierConfig['health'] = false,
): Promise<StorageBackend> {
  const registry = new BackendRegistry({ pluginBaseDir: ROOT });
  const [tier] = await registry.createTiers([
    { name: 'log', type: 'module', options: { module: MODULE, options }, health },
  ]);
  assert.ok(tier !== undefined, 'createTiers returned the tier');
  return tier;
}

/** An object found by reading the segments as docs/storage-format.md describes them. */
interface Located {
  path: string;
  offset: number;
  length: number;
  fileBytes: number;
}

/** Finds the object of (ns, hash) by walking the headers of the namespace's segment files. */
async function locate(dir: string, ns: string, hash: string): Promise<Located> {
  const names = (await readdir(dir)).filter((n) => n.startsWith(`${ns}.`) && n.endsWith('.seg'));
  for (const name of names.sort()) {
    const path = join(dir, name);
    const buf = await readFile(path);
    let pos = 0;
    while (pos + CHUNK_HEADER_BYTES <= buf.length) {
      // payloadBytes is the u64 at header offset 72; the chunk hash the 32 bytes at offset 32.
      const length = CHUNK_HEADER_BYTES + Number(buf.readBigUInt64LE(pos + 72));
      if (buf.toString('hex', pos + 32, pos + 64) === hash)
        return { path, offset: pos, length, fileBytes: buf.length };
      pos += length;
    }
  }
  throw new Error(`no object for ${hash} in the segments of ${ns} under ${dir}`);
}

/** Damages the object of (ns, hash) in its segment, at its offset. */
async function corruptObject(
  dir: string,
  ns: string,
  hash: string,
  kind: CorruptionKind,
): Promise<void> {
  const at = await locate(dir, ns, hash);
  if (kind === 'truncate') {
    // A log can only be cut at its end; the subject's small segments leave the object there.
    if (at.offset + at.length !== at.fileBytes)
      throw new Error(`cannot truncate ${hash}: it is not the last object of ${at.path}`);
    return truncate(at.path, at.offset + CHUNK_HEADER_BYTES + 100);
  }
  let bytes: Buffer;
  let pos = at.offset;
  if (kind === 'foreign-hash') {
    // Another chunk's valid object of the same length, so the segment's layout is unchanged.
    const data = randomBytes(at.length - CHUNK_HEADER_BYTES);
    bytes = encodeChunkObject(ns, chunkHashFromBytes(randomBytes(32)), { tokens: 256, data });
  } else {
    if (kind === 'payload') pos += CHUNK_HEADER_BYTES + 17;
    bytes = Buffer.alloc(kind === 'magic' ? 4 : 1);
  }
  const fh = await open(at.path, 'r+');
  try {
    if (kind !== 'foreign-hash') {
      await fh.read(bytes, 0, bytes.length, pos);
      for (let i = 0; i < bytes.length; i++) bytes[i] = bytes[i]! ^ 0xff;
    }
    await fh.write(bytes, 0, bytes.length, pos);
  } finally {
    await fh.close();
  }
}

describeBackendContract(
  'log-store example plug-in contract (loaded as type "module")',
  async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-log-store-'));
    // Segments of 64 KiB: 64 KiB chunks each end their segment (so `truncate` can cut one),
    // while the suite's 4 KiB chunks share segments.
    const options = { path: dir, segmentBytes: 64 * KiB, maxChunkBytes: 40 * MiB };
    const backend = await loadTier(options);
    const reopened: StorageBackend[] = [];
    return {
      backend,
      corrupt: (ns: string, hash: string, kind: CorruptionKind) =>
        corruptObject(dir, ns, hash, kind),
      reopen: async () => {
        const b = await loadTier(options);
        reopened.push(b);
        return b;
      },
      cleanup: async () => {
        await Promise.all([backend, ...reopened].map((b) => b.close()));
        await rm(dir, { recursive: true, force: true });
      },
    };
  },
  {
    skip: {
      outage:
        'a local directory cannot be taken down for real here, and the index answers contains ' +
        'without I/O by design',
    },
  },
);

describe('log-store example plug-in specifics', () => {
  const ns = randomBytes(16).toString('hex');
  const hashes = () => Array.from({ length: 3 }, () => chunkHashFromBytes(randomBytes(32)));
  const chunk = (bytes = 4 * KiB) => ({ tokens: 256, data: randomBytes(bytes) });

  it('truncates a torn tail on reopen and appends after it', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-log-store-'));
    try {
      const [a, b, c] = hashes() as [ChunkHash, ChunkHash, ChunkHash];
      const [ca, cb, cc] = [chunk(), chunk(), chunk()];
      const first = await loadTier({ path: dir });
      assert.equal(await first.put(ns, a, ca), 'stored');
      assert.equal(await first.put(ns, b, cb), 'stored');
      await first.close();
      const [seg] = (await readdir(dir)).filter((n) => n.endsWith('.seg'));
      assert.ok(seg !== undefined, 'a segment file exists');
      const segPath = join(dir, seg);
      const whole = (await stat(segPath)).size;
      assert.equal(whole, 2 * (CHUNK_HEADER_BYTES + 4 * KiB), 'both objects in one segment');
      // A crash mid-append: a header and part of a payload.
      const torn = encodeChunkObject(ns, c, cc).subarray(0, CHUNK_HEADER_BYTES + 1000);
      await appendFile(segPath, torn);

      const second = await loadTier({ path: dir });
      try {
        assert.equal((await stat(segPath)).size, whole, 'the torn bytes are cut off');
        const s = second.stats() as { truncatedBytes?: number };
        assert.equal(s.truncatedBytes, torn.length, 'truncatedBytes counts them');
        assert.equal(await second.batchedContains(ns, [a, b, c]), 2, 'a and b survive; c is gone');
        assert.equal(await second.put(ns, c, cc), 'stored');
      } finally {
        await second.close();
      }
      const third = await loadTier({ path: dir });
      try {
        const got = await third.batchedGet(ns, [a, b, c]);
        for (const [h, expected] of [
          [a, ca],
          [b, cb],
          [c, cc],
        ] as const) {
          const actual = got.get(h);
          assert.ok(actual != null, `chunk ${h.slice(0, 8)} is a hit after the second reopen`);
          assert.deepEqual(Buffer.from(actual.data), expected.data);
        }
      } finally {
        await third.close();
      }
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('a corrupt read is counted in corruptObjects and the index entry dropped', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-log-store-'));
    const b = await loadTier({ path: dir });
    try {
      const [x, y] = hashes() as [ChunkHash, ChunkHash];
      await b.put(ns, x, chunk());
      await b.put(ns, y, chunk());
      await corruptObject(dir, ns, x, 'payload');
      assert.equal((await b.batchedGet(ns, [x])).get(x), null, 'a miss, not data');
      assert.equal(b.stats().corruptObjects, 1);
      assert.equal(b.stats().chunks, 1, 'only y is indexed');
      assert.equal(await b.put(ns, x, chunk()), 'stored', 'a later put stores a good copy');
    } finally {
      await b.close();
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('drops puts past capacityBytes; clear deletes the segments and frees the space', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-log-store-'));
    const object = CHUNK_HEADER_BYTES + 4 * KiB;
    const b = await loadTier({ path: dir, capacityBytes: 2 * object });
    try {
      const [x, y, z] = hashes() as [ChunkHash, ChunkHash, ChunkHash];
      assert.equal(await b.put(ns, x, chunk()), 'stored');
      assert.equal(await b.put(ns, y, chunk()), 'stored');
      assert.equal(await b.put(ns, z, chunk()), 'dropped', 'no room: dropped, not waited for');
      assert.equal(b.stats().droppedPuts, 1);
      assert.equal(await b.remove(ns, [x]), 1);
      assert.equal(b.stats().bytesUsed, 2 * object, 'remove reclaims nothing in a log');
      assert.equal(await b.put(ns, z, chunk()), 'dropped', 'still full after remove');
      await b.clear(ns);
      assert.equal(b.stats().bytesUsed, 0, 'clear reclaims the space');
      assert.deepEqual(
        (await readdir(dir)).filter((n) => n.endsWith('.seg')),
        [],
        'clear deletes the segment files',
      );
      assert.equal(await b.put(ns, z, chunk()), 'stored');
    } finally {
      await b.close();
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('gets a circuit breaker unless health is false', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-log-store-'));
    try {
      const tier = await loadTier({ path: dir }, { timeoutMs: 500 });
      assert.ok(tier instanceof CircuitBreakerBackend, 'wrapped in a CircuitBreakerBackend');
      assert.equal(tier.kind, 'log-store');
      await tier.close();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('rejects bad options at startup with KVT_CONFIG naming the option', async () => {
    const cases: [Record<string, unknown>, string][] = [
      [{}, 'path must be a non-empty string'],
      [{ path: '/tmp/x', segmentSize: 1 }, 'unknown log-store option "segmentSize"'],
      [{ path: '/tmp/x', maxChunkBytes: 0 }, 'maxChunkBytes must be an integer'],
      [{ path: '/tmp/x', maxChunkBytes: '3GiB' }, 'maxChunkBytes must be an integer'],
      [{ path: '/tmp/x', capacityBytes: 'lots' }, 'capacityBytes must be a byte size'],
    ];
    for (const [options, mention] of cases) {
      await assert.rejects(
        loadTier(options),
        (e: unknown) =>
          isKvtierError(e, 'KVT_CONFIG') &&
          e.message.includes(mention) &&
          e.message.includes('log'),
        `options ${JSON.stringify(options)} should fail mentioning ${mention}`,
      );
    }
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-log-store-'));
    try {
      const b = await loadTier({ path: dir, maxChunkBytes: '8MiB', segmentBytes: '1MiB' });
      assert.equal(b.capabilities.maxChunkBytes, 8 * MiB, 'size strings are accepted');
      await b.close();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("loads from a config file, the module path relative to the file's directory", async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-log-store-'));
    try {
      const configPath = join(dir, 'kvtier.json');
      const module = relative(dir, join(ROOT, MODULE));
      const tiers = [
        { name: 'cpu', type: 'local-cpu', capacityBytes: '64MiB' },
        {
          name: 'log',
          type: 'module',
          module: module.startsWith('.') ? module : `./${module}`,
          options: { path: join(dir, 'segments'), segmentBytes: '1MiB' },
          health: { timeoutMs: 1000, failureThreshold: 3, probeIntervalMs: 1000 },
        },
      ];
      await writeFile(configPath, JSON.stringify({ tiers }));
      const cfg = await loadConfig({ configPath }, {});
      assert.equal(cfg.baseDir, dir, 'relative paths resolve against the config directory');
      const built = await new BackendRegistry({ pluginBaseDir: cfg.baseDir }).createTiers(
        cfg.tiers,
      );
      try {
        assert.deepEqual(
          built.map((t) => t.kind),
          ['local-cpu', 'log-store'],
        );
        const h = chunkHashFromBytes(randomBytes(32));
        assert.equal(await built[1]!.put(ns, h, chunk()), 'stored');
        assert.equal(await built[1]!.batchedContains(ns, [h]), 1);
      } finally {
        await Promise.all(built.map((t) => t.close()));
      }
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
