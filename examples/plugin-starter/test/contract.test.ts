// The kvtier contract suites against this package: the backend contract against both plug-ins
// (the four-method store in src/index.ts, the full StorageBackend in src/full-backend.ts), each
// loaded the way a sidecar loads it: through kvtier's BackendRegistry as a `type: "module"` tier;
// and the store contract against the store itself (DirStore), where StoreBackend cannot hide its
// races, hangs or listing. Run: npm test.
import { randomBytes } from 'node:crypto';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  BackendRegistry,
  CHUNK_HEADER_BYTES,
  chunkHashFromBytes,
  encodeChunkObject,
  resolveConfig,
  type StorageBackend,
} from 'kvtier';
import {
  type CorruptionKind,
  describeBackendContract,
  describeStoreContract,
} from 'kvtier/testing';
import { DirStore } from '../src/index.js';

const plugins = {
  'dir-kv (four-method store)': fileURLToPath(new URL('../src/index.js', import.meta.url)),
  'dir-store (full StorageBackend)': fileURLToPath(
    new URL('../src/full-backend.js', import.meta.url),
  ),
};

/** One tier named "dirs" of `plugin`, as a config file in `configDir` would name it. */
async function load(plugin: string, configDir: string): Promise<StorageBackend> {
  const { tiers } = resolveConfig({
    tiers: [
      {
        name: 'dirs',
        type: 'module',
        module: plugin,
        options: { path: './chunks', maxChunkBytes: '48MiB' },
        health: false, // the raw backend; production wraps it in kvtier's circuit breaker
      },
    ],
  });
  const registry = new BackendRegistry({ pluginBaseDir: configDir });
  const [tier] = await registry.createTiers(tiers);
  if (tier === undefined) throw new Error('no tier was built');
  return tier;
}

/** The damaged form of a stored object for each kind of corruption the suite asks for. */
function damage(obj: Buffer, ns: string, kind: CorruptionKind): Buffer {
  const b = Buffer.from(obj);
  switch (kind) {
    case 'payload':
      b.writeUInt8(b.readUInt8(CHUNK_HEADER_BYTES + 17) ^ 0xff, CHUNK_HEADER_BYTES + 17);
      return b;
    case 'truncate':
      return b.subarray(0, CHUNK_HEADER_BYTES + 100);
    case 'magic':
      b.fill(0, 0, 4);
      return b;
    case 'foreign-hash':
      return encodeChunkObject(ns, chunkHashFromBytes(randomBytes(32)), {
        tokens: 256,
        data: randomBytes(4096),
      });
  }
}

for (const [name, plugin] of Object.entries(plugins)) {
  describeBackendContract(
    `${name} plug-in contract`,
    async () => {
      const dir = await mkdtemp(join(tmpdir(), 'dir-store-'));
      const backend = await load(plugin, dir);
      const others: StorageBackend[] = [];
      return {
        backend,
        corrupt: async (ns, hash, kind) => {
          const file = join(dir, 'chunks', ns, `${hash}.kvtc`);
          await writeFile(file, damage(await readFile(file), ns, kind));
        },
        reopen: async () => {
          const b = await load(plugin, dir);
          others.push(b);
          return b;
        },
        cleanup: async () => {
          await Promise.all([backend, ...others].map((b) => b.close()));
          await rm(dir, { recursive: true, force: true });
        },
      };
    },
    { skip: { outage: 'a local directory cannot be taken down for real here' } },
  );
}

// Two DirStores over one directory are two instances of one shared store (the sharing group).
describeStoreContract('DirStore store contract', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'dir-kv-'));
  return {
    store: new DirStore(dir),
    open: async () => new DirStore(dir),
    cleanup: () => rm(dir, { recursive: true, force: true }),
  };
});
