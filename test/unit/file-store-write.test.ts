import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import * as fsp from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import {
  EARLY_HEADER_MAX_BYTES,
  realFileSystem,
  writeChunkFileAtomic,
} from '../../src/backends/files/file-store.ts';
import { KvtierError } from '../../src/errors.ts';

const root = mkdtempSync(join(tmpdir(), 'kvtier-file-store-'));
after(() => rmSync(root, { recursive: true, force: true }));
let n = 0;

describe('writeChunkFileAtomic', () => {
  it('writes the header at 0 and the payload after it, creating the directory when missing', async () => {
    const dir = join(root, `d${n++}`, 'shard');
    const path = join(dir, 'x.kvc');
    const payload = randomBytes(3 * 1024 * 1024 + 5);
    const header = randomBytes(128);
    let made = 0;
    const bytes = await writeChunkFileAtomic(
      realFileSystem,
      path,
      async () => header,
      128,
      payload,
      {
        fsync: 'data',
        makeDir: async () => {
          made++;
          await fsp.mkdir(dir, { recursive: true });
        },
      },
    );
    assert.equal(bytes, 128 + payload.length);
    assert.equal(made, 1);
    const got = readFileSync(path);
    assert.equal(Buffer.compare(got.subarray(0, 128), header), 0);
    assert.equal(Buffer.compare(got.subarray(128), payload), 0);
    assert.deepEqual(readdirSync(dir), ['x.kvc'], 'no temp file left');
  });

  for (const [what, makeHeader, code] of [
    [
      'a header that fails',
      async () => {
        throw new KvtierError('KVT_INVALID_ARGUMENT', 'bad chunk');
      },
      'KVT_INVALID_ARGUMENT',
    ],
    ['a header of the wrong size', async () => Buffer.alloc(100), 'KVT_INTERNAL'],
  ] as const) {
    it(`${what}: rejects, and neither the object nor a temp file is left`, async () => {
      const dir = join(root, `d${n++}`);
      await fsp.mkdir(dir);
      const path = join(dir, 'y.kvc');
      await assert.rejects(
        writeChunkFileAtomic(realFileSystem, path, makeHeader, 128, randomBytes(1 << 20), {
          fsync: 'none',
          makeDir: async () => {},
        }),
        (e: unknown) => e instanceof KvtierError && e.code === code,
      );
      assert.deepEqual(readdirSync(dir), []);
    });
  }

  for (const [what, size] of [
    ['a small payload', 1024],
    ['a large payload', EARLY_HEADER_MAX_BYTES + 1],
  ] as const) {
    it(`${what}, a directory that cannot be made: the open error, no header work left running`, async () => {
      const path = join(root, `missing-${n++}`, 'z.kvc');
      let started = 0;
      let settled = 0;
      await assert.rejects(
        writeChunkFileAtomic(
          realFileSystem,
          path,
          async () => {
            started++;
            await new Promise((r) => setTimeout(r, 20));
            settled++;
            return Buffer.alloc(128);
          },
          128,
          Buffer.alloc(size),
          { fsync: 'none', makeDir: async () => {} },
        ),
        (e: unknown) => (e as { code?: string }).code === 'ENOENT',
      );
      assert.equal(settled, started, 'every header started has settled');
      assert.equal(started, size <= EARLY_HEADER_MAX_BYTES ? 1 : 0);
    });
  }
});
