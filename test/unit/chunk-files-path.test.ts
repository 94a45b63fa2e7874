import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ChunkFiles } from '../../src/backends/files/chunk-files.ts';
import { objectPath, realFileSystem } from '../../src/backends/files/file-store.ts';
import { chunkHash } from '../../src/hashing/chunk-hash.ts';
import { silentLogger } from '../../src/util/log.ts';

describe('ChunkFiles.path', () => {
  it('is objectPath for every root spelling and shard width', () => {
    const ns = '00112233445566778899aabbccddeeff';
    const hash = chunkHash('ab'.repeat(32));
    for (const root of ['/tmp/store', '/tmp/store/', '.', './a/../b', 'a//b/', '/', 'rel']) {
      for (const shardChars of [0, 2, 8]) {
        const files = new ChunkFiles({
          fs: realFileSystem,
          root,
          shardChars,
          maxChunkBytes: 1024,
          fsync: 'none',
          createRoot: false,
          tier: 't',
          log: silentLogger,
          onCorrupt: () => {},
        });
        assert.equal(
          files.path(ns, hash),
          objectPath(root, ns, hash, shardChars),
          `${root} ${shardChars}`,
        );
      }
    }
  });
});
