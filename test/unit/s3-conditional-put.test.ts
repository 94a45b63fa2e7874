/**
 * The S3 store's put-if-absent under the ways a service answers a conditional PutObject
 * (`If-None-Match: *`): 409 while another conditional put of the key is in progress (the store
 * looks again and answers as the first put ended), and 501 from a service without conditional
 * writes (plain puts from then on, logged once). The default, 412 after serializing, is the
 * store contract's own run (test/contract/store-s3.contract.test.ts).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { resolveS3BackendOptions } from '../../src/backends/s3/s3-options.ts';
import { S3Store } from '../../src/backends/s3/s3-store.ts';
import { storeKey } from '../../src/backends/store/kv-store.ts';
import { chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';
import { type Logger, silentLogger } from '../../src/util/log.ts';
import { runStoreContractCase, type StoreContractSubject } from '../contract/store.contract.ts';
import { type ConditionalPuts, S3RVER_CREDENTIALS, startS3 } from '../support/s3-server.ts';

/** A store contract subject over s3rver answering conditional puts as `mode` says. */
function subject(mode: ConditionalPuts, log: Logger = silentLogger) {
  return async (): Promise<StoreContractSubject> => {
    const s3 = await startS3({ conditionalPuts: mode });
    const options = resolveS3BackendOptions({
      bucket: s3.bucket,
      endpoint: s3.endpoint,
      ...S3RVER_CREDENTIALS,
      timeoutMs: 30_000,
    });
    const open = async () => {
      const store = new S3Store(options, 's3', log);
      await store.start();
      return store;
    };
    return { store: await open(), open, cleanup: () => s3.close() };
  };
}

describe('S3Store conditional puts', () => {
  it('409 while another put of the key is in progress: one put per key still answers true', async () => {
    for (const id of ['sharing.race', 'atomicity.concurrentPuts'] as const)
      assert.deepEqual(await runStoreContractCase(id, subject('conflict')), {}, id);
  });

  it('501 from a service without conditional writes: plain puts, logged once', async () => {
    const warnings: string[] = [];
    const log: Logger = { ...silentLogger, warn: (msg) => warnings.push(msg) };
    const s = await subject('unsupported', log)();
    try {
      const ns = '0123456789abcdef0123456789abcdef';
      for (let i = 0; i < 3; i++) {
        const key = storeKey(ns, chunkHashFromBytes(Buffer.alloc(32, i)));
        assert.equal(await s.store.put(key, Buffer.from(`value ${i}`), {}), true, `put ${i}`);
        assert.equal(await s.store.put(key, Buffer.from('again'), {}), false, `put ${i} again`);
        const got = await s.store.get(key, {});
        assert.equal(Buffer.from((got as { bytes: Uint8Array }).bytes).toString(), `value ${i}`);
      }
      assert.deepEqual(warnings, [
        'S3 service does not implement conditional writes; puts are plain',
      ]);
    } finally {
      await s.store.close();
      await s.cleanup();
    }
  });
});
