/**
 * The store contract against the S3 tier's own store (S3Store) on s3rver in this process: a
 * server and bucket per subject, a second instance as a second client of it.
 */
import { resolveS3BackendOptions } from '../../src/backends/s3/s3-options.ts';
import { S3Store } from '../../src/backends/s3/s3-store.ts';
import { silentLogger } from '../../src/util/log.ts';
import { S3RVER_CREDENTIALS, startS3 } from '../support/s3-server.ts';
import { describeStoreContract } from './store.contract.ts';

describeStoreContract(
  'S3Store store contract (s3rver)',
  async () => {
    const s3 = await startS3();
    // Per request: generous, so that a 32 MiB round trip on a busy machine is not a timeout.
    const options = resolveS3BackendOptions({
      bucket: s3.bucket,
      endpoint: s3.endpoint,
      ...S3RVER_CREDENTIALS,
      timeoutMs: 30_000,
    });
    const open = async () => {
      const store = new S3Store(options, 's3', silentLogger);
      await store.start();
      return store;
    };
    return { store: await open(), open, cleanup: () => s3.close() };
  },
  {},
);
