import { randomBytes } from 'node:crypto';
import { mkdtemp, open, rm, truncate, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { objectPath } from '../../src/backends/files/file-store.ts';
import { CHUNK_HEADER_BYTES, encodeChunkObject } from '../../src/backends/format/chunk-format.ts';
import {
  LocalDiskBackend,
  type LocalDiskOptions,
} from '../../src/backends/local-disk/local-disk-backend.ts';
import type { ChunkHash } from '../../src/hashing/chunk-hash.ts';
import { chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';
import { type CorruptionKind, describeBackendContract } from './backend.contract.ts';

const OUTAGE_SKIP =
  'LocalDisk answers contains from its in-memory index by design, and a failing local disk ' +
  'cannot be produced for real here (permissions do not bind root; no fault-injecting mount)';

/** Damages the object file of (ns, hash) in place, as a failing disk or a stray writer would. */
async function corruptFile(path: string, ns: string, kind: CorruptionKind): Promise<void> {
  if (kind === 'truncate') return truncate(path, CHUNK_HEADER_BYTES + 100);
  if (kind === 'foreign-hash') {
    const other = chunkHashFromBytes(randomBytes(32));
    return writeFile(path, encodeChunkObject(ns, other, { tokens: 256, data: randomBytes(4096) }));
  }
  const fh = await open(path, 'r+');
  try {
    const at = kind === 'magic' ? 0 : CHUNK_HEADER_BYTES + 17;
    const b = Buffer.alloc(kind === 'magic' ? 4 : 1);
    await fh.read(b, 0, b.length, at);
    for (let i = 0; i < b.length; i++) b[i] = b[i]! ^ 0xff;
    await fh.write(b, 0, b.length, at);
  } finally {
    await fh.close();
  }
}

function subjectFactory(options: Omit<LocalDiskOptions, 'path'>) {
  return async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-disk-contract-'));
    const open = () => LocalDiskBackend.open({ ...options, path: dir }, { name: 'disk' });
    const backend = await open();
    const reopened: LocalDiskBackend[] = [];
    return {
      backend,
      corrupt: (ns: string, hash: ChunkHash, kind: CorruptionKind) =>
        corruptFile(objectPath(dir, ns, hash, backend.options.shardChars), ns, kind),
      reopen: async () => {
        const b = await open();
        reopened.push(b);
        return b;
      },
      cleanup: async () => {
        await Promise.all([backend, ...reopened].map((b) => b.close()));
        await rm(dir, { recursive: true, force: true });
      },
    };
  };
}

describeBackendContract(
  'LocalDiskBackend contract (1 GiB)',
  subjectFactory({ capacityBytes: 1024 ** 3, fsync: 'none' }),
  { skip: { outage: OUTAGE_SKIP } },
);

const capacityBytes = 8 * 1024 * 1024;

describeBackendContract(
  'LocalDiskBackend contract (8 MiB bound, fsync always)',
  subjectFactory({ capacityBytes, fsync: 'always', shardChars: 1 }),
  { capacityBytes, largeChunks: false, skip: { outage: OUTAGE_SKIP } },
);
