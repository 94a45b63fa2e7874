import { randomBytes } from 'node:crypto';
import { mkdtemp, open, rename, rm, truncate, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { objectPath } from '../../src/backends/files/file-store.ts';
import { CHUNK_HEADER_BYTES, encodeChunkObject } from '../../src/backends/format/chunk-format.ts';
import { FsBackend } from '../../src/backends/fs/fs-backend.ts';
import type { ChunkHash } from '../../src/hashing/chunk-hash.ts';
import { chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';
import { type CorruptionKind, describeBackendContract } from './backend.contract.ts';

/** Damages the object file of (ns, hash) in place, as a failing server or a stray writer would. */
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

describeBackendContract(
  'FsBackend contract (shared directory)',
  async () => {
    const base = await mkdtemp(join(tmpdir(), 'kvtier-fs-contract-'));
    const dir = join(base, 'mount');
    const open = () => FsBackend.open({ path: dir, timeoutMs: 2000 }, { name: 'fs' });
    const backend = await open();
    const others: FsBackend[] = [];
    return {
      backend,
      corrupt: (ns: string, hash: ChunkHash, kind: CorruptionKind) =>
        corruptFile(objectPath(dir, ns, hash, backend.options.shardChars), ns, kind),
      // A vanished mount, for real: every path under the directory fails with ENOTDIR.
      down: async () => {
        await rename(dir, `${dir}.away`);
        await writeFile(dir, 'not a directory');
      },
      up: async () => {
        await rm(dir);
        await rename(`${dir}.away`, dir);
      },
      reopen: async () => {
        const b = await open();
        others.push(b);
        return b;
      },
      cleanup: async () => {
        await Promise.all([backend, ...others].map((b) => b.close()));
        await rm(base, { recursive: true, force: true });
      },
    };
  },
  { downTimeoutMs: 3000 },
);
