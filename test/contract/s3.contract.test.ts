import { GetObjectCommand, PutObjectCommand } from '@aws-sdk/client-s3';
import type { StorageBackend } from '../../src/backends/core/types.ts';
import { CHUNK_HEADER_BYTES, encodeChunkObject } from '../../src/backends/format/chunk-format.ts';
import { S3Backend } from '../../src/backends/s3/s3-backend.ts';
import { chunkHash } from '../../src/hashing/chunk-hash.ts';
import { S3RVER_CREDENTIALS, startS3 } from '../support/s3-server.ts';
import { type CorruptionKind, describeBackendContract } from './backend.contract.ts';

// Per request: generous, so that a 32 MiB round trip on a busy machine is not a timeout (an
// outage is a refused connection, seen at once).
const timeoutMs = 30_000;
// Above 32 MiB so the large-chunk test runs, small enough for the oversized-put test to run too.
const maxChunkBytes = 48 * 1024 * 1024;

describeBackendContract(
  'S3Backend contract (s3rver)',
  async () => {
    const s3 = await startS3();
    const raw = s3.client();
    const opened: StorageBackend[] = [];
    const open = async (): Promise<StorageBackend> => {
      const b = new S3Backend(
        {
          bucket: s3.bucket,
          endpoint: s3.endpoint,
          ...S3RVER_CREDENTIALS,
          timeoutMs,
          maxChunkBytes,
        },
        { name: 's3' },
      );
      opened.push(b);
      await b.start();
      return b;
    };
    const backend = await open();
    const corrupt = async (ns: string, hash: string, kind: CorruptionKind): Promise<void> => {
      const Key = `kvtier/${ns}/${hash}`;
      const got = await raw.send(new GetObjectCommand({ Bucket: s3.bucket, Key }));
      const obj = Buffer.from(await got.Body!.transformToByteArray());
      let bad: Buffer;
      if (kind === 'payload') {
        bad = obj;
        bad[CHUNK_HEADER_BYTES + 7] = bad[CHUNK_HEADER_BYTES + 7]! ^ 0xff;
      } else if (kind === 'truncate') {
        bad = obj.subarray(0, obj.length - 100);
      } else if (kind === 'magic') {
        bad = obj;
        bad.write('XXXX', 0, 'latin1');
      } else {
        const other = chunkHash(hash.replace(/^./, (c) => (c === '0' ? '1' : '0')));
        bad = encodeChunkObject(ns, other, { tokens: 1, data: obj.subarray(CHUNK_HEADER_BYTES) });
      }
      await raw.send(new PutObjectCommand({ Bucket: s3.bucket, Key, Body: bad }));
    };
    return {
      backend,
      corrupt,
      down: () => s3.stop(),
      up: () => s3.restart(),
      reopen: open,
      cleanup: async () => {
        await Promise.all(opened.map((b) => b.close()));
        await s3.close();
      },
    };
  },
  { downTimeoutMs: 5000 },
);
