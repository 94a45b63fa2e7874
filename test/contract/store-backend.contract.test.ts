/**
 * The contract suite against the four-method store wrapper over the smallest store there is: a
 * Map that keeps whole values, with no `clear`, `count` or `valueBuffer` (clear goes through
 * `list`, `delete` answers `true` without a size). The corrupt hook damages the stored values.
 */
import { randomBytes } from 'node:crypto';
import type { StorageBackend } from '../../src/backends/core/types.ts';
import { CHUNK_HEADER_BYTES, encodeChunkObject } from '../../src/backends/format/chunk-format.ts';
import type { KvStore, StoreKey } from '../../src/backends/store/kv-store.ts';
import { StoreBackend } from '../../src/backends/store/store-backend.ts';
import { chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';
import { type CorruptionKind, describeBackendContract } from './backend.contract.ts';

/** Values live in a Map shared by every instance over it (persistence and sharing). */
class MapStore implements KvStore {
  readonly info = { persistent: true, shared: true, evicts: false, ttl: false };
  constructor(readonly values: Map<StoreKey, Uint8Array>) {}
  async get(key: StoreKey) {
    return this.values.get(key) ?? null;
  }
  async has(key: StoreKey) {
    return this.values.has(key);
  }
  async put(key: StoreKey, value: Uint8Array) {
    if (this.values.has(key)) return false;
    this.values.set(key, Uint8Array.from(value)); // the caller reuses `value`
    return true;
  }
  async delete(key: StoreKey) {
    return this.values.delete(key);
  }
  async *list(prefix: string) {
    for (const key of [...this.values.keys()]) if (key.startsWith(prefix)) yield { key };
  }
  async close() {}
}

function damaged(obj: Uint8Array, ns: string, kind: CorruptionKind): Uint8Array {
  const b = Buffer.from(obj);
  switch (kind) {
    case 'payload':
      b[CHUNK_HEADER_BYTES + 5]! ^= 0xff;
      return b;
    case 'truncate':
      return b.subarray(0, CHUNK_HEADER_BYTES + 10);
    case 'magic':
      b.fill(0, 0, 4);
      return b;
    case 'foreign-hash':
      return encodeChunkObject(ns, chunkHashFromBytes(randomBytes(32)), {
        tokens: 1,
        data: randomBytes(64),
      });
  }
}

describeBackendContract(
  'StoreBackend over a Map store',
  async () => {
    const values = new Map<StoreKey, Uint8Array>();
    const opened: StorageBackend[] = [];
    const open = async () => {
      const b = new StoreBackend(
        new MapStore(values),
        { kind: 'map', maxChunkBytes: 48 * 1024 * 1024, concurrency: 3 },
        { name: 'map' },
      );
      await b.start();
      opened.push(b);
      return b;
    };
    const backend = await open();
    return {
      backend,
      corrupt: async (ns, hash, kind) => {
        const key = `${ns}/${hash}` as StoreKey;
        values.set(key, damaged(values.get(key)!, ns, kind));
      },
      reopen: open,
      cleanup: async () => {
        await Promise.all(opened.map((b) => b.close()));
      },
    };
  },
  { skip: { outage: 'a Map cannot go down' } },
);
