import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import * as fsp from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import {
  CHUNK_HEADER_BYTES,
  CHUNK_HEADER_CHECKSUM_AT,
  CHUNK_HEADER_CRC_AT,
  decodeChunkObject,
  encodeChunkHeader,
  encodeChunkHeaderTemplate,
} from '../../src/backends/format/chunk-format.ts';
import { isKvtierError } from '../../src/errors.ts';
import { chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';
import { loadNative } from '../../src/native/native-addon.ts';
import { crc32c } from '../../src/util/crc32c.ts';

const addon = loadNative().addon;
const skip = addon === null ? 'the native addon is not built' : false;
const dirs: string[] = [];
after(async () => {
  await Promise.all(dirs.map((d) => fsp.rm(d, { recursive: true, force: true })));
});

async function tempDir(): Promise<string> {
  const d = await fsp.mkdtemp(join(tmpdir(), 'kvtier-native-files-'));
  dirs.push(d);
  return d;
}

const KiB = 1024;
const SLICE = 256 * KiB;

describe('native file functions', { skip }, () => {
  const files = addon!.files;

  it('statFiles gives size, mtime and kind, and -1 for what is not there', async () => {
    const dir = await tempDir();
    await fsp.writeFile(join(dir, 'a'), Buffer.alloc(1234));
    await fsp.mkdir(join(dir, 'sub'));
    const t = new Date(1_700_000_000_500);
    await fsp.utimes(join(dir, 'a'), t, t);
    const r = await files.statFiles(dir, ['a', 'sub', 'gone']);
    assert.deepEqual([r[0], r[1], r[2]], [1234, 1_700_000_000_500, 1]);
    assert.equal(r[5], 0, 'a directory is not a file');
    assert.equal(r[6], -1);
    const none = await files.statFiles(join(dir, 'nothere'), ['a']);
    assert.equal(none[0], -1, 'a missing directory: every name missing');
  });

  it('readFileCrc32c reads whole files and checksums them at every size around a slice', async () => {
    const dir = await tempDir();
    const sizes = [
      0,
      1,
      127,
      128,
      129,
      SLICE - 1,
      SLICE + 128,
      3 * SLICE + 129,
      4 * 1024 * KiB + 3,
    ];
    for (const size of sizes) {
      const bytes = randomBytes(size);
      const path = join(dir, `f${size}`);
      await fsp.writeFile(path, bytes);
      const dst = Buffer.alloc(size);
      const r = await files.readFileCrc32c(path, dst, 1 << 30, CHUNK_HEADER_BYTES);
      assert.equal(r.status, 'ok', `size ${size}`);
      assert.deepEqual(dst, bytes, `bytes of ${size}`);
      const from = Math.min(size, CHUNK_HEADER_BYTES);
      assert.equal(r.crc, crc32c(bytes.subarray(from)), `crc of ${size}`);
      assert.equal(r.size, size);
    }
  });

  it('readFileCrc32c reads nothing into a buffer of the wrong size, and tells the size', async () => {
    const dir = await tempDir();
    const path = join(dir, 'f');
    await fsp.writeFile(path, randomBytes(5000));
    const dst = Buffer.alloc(4000, 7);
    const r = await files.readFileCrc32c(path, dst, 1 << 20, 0);
    assert.deepEqual([r.status, r.size], ['size', 5000]);
    assert.ok(
      dst.every((b) => b === 7),
      'dst untouched',
    );
    const big = await files.readFileCrc32c(path, Buffer.alloc(5000), 4999, 0);
    assert.deepEqual([big.status, big.size], ['too-large', 5000]);
    const gone = await files.readFileCrc32c(join(dir, 'no'), Buffer.alloc(1), 10, 0);
    assert.equal(gone.status, 'missing');
    await assert.rejects(files.readFileCrc32c(dir, Buffer.alloc(4096), 1 << 20, 0), (err) =>
      isKvtierError(err, 'KVT_BACKEND'),
    );
  });

  it('writeFileAtomic writes an object whose checksums it filled in, creating directories', async () => {
    const dir = await tempDir();
    const ns = randomBytes(16).toString('hex');
    // Payloads are written in pieces that end on 2 MiB file offsets (the first one 128 bytes
    // short of 2 MiB, after the header): sizes on, around and past those ends.
    const piece = 2 * 1024 * KiB;
    for (const payloadBytes of [
      1,
      300 * KiB,
      piece - CHUNK_HEADER_BYTES,
      piece - CHUNK_HEADER_BYTES + 1,
      piece + 17,
      2 * piece + 5,
    ]) {
      const hash = chunkHashFromBytes(randomBytes(32));
      const chunk = { tokens: 99, data: randomBytes(payloadBytes) };
      const header = encodeChunkHeaderTemplate(ns, hash, chunk);
      const before = Buffer.from(header);
      const final = join(dir, ns, hash.slice(0, 2), `${hash}.kvc`);
      for (const fsync of [0, 1, 2] as const) {
        await fsp.rm(final, { force: true });
        const n = await files.writeFileAtomic(`${final}.tmp`, final, header, chunk.data, {
          fsync,
          makeDirs: [join(dir, ns), join(dir, ns, hash.slice(0, 2))],
          checksumAt: CHUNK_HEADER_CHECKSUM_AT,
          headerCrcAt: CHUNK_HEADER_CRC_AT,
        });
        assert.equal(n, CHUNK_HEADER_BYTES + payloadBytes);
        const obj = await fsp.readFile(final);
        const decoded = decodeChunkObject(ns, hash, obj);
        assert.ok(decoded.ok, `decodes (${payloadBytes} bytes, fsync ${fsync})`);
        assert.deepEqual(Buffer.from(decoded.chunk.data), chunk.data);
        assert.deepEqual(obj.subarray(0, CHUNK_HEADER_BYTES), encodeChunkHeader(ns, hash, chunk));
        assert.deepEqual(header, before, 'the template is not changed');
      }
    }
    assert.deepEqual(
      (await fsp.readdir(dir, { recursive: true })).filter((f) => f.endsWith('.tmp')),
      [],
    );
  });

  it('writeFileAtomic removes its temp file when it fails, and reports the errno', async () => {
    const dir = await tempDir();
    const final = join(dir, 'taken');
    await fsp.mkdir(join(final, 'inside'), { recursive: true }); // rename onto a non-empty directory
    const chunk = { tokens: 1, data: randomBytes(1000) };
    const hash = chunkHashFromBytes(randomBytes(32));
    const header = encodeChunkHeaderTemplate(randomBytes(16).toString('hex'), hash, chunk);
    const opts = { fsync: 0, makeDirs: [], checksumAt: 80, headerCrcAt: 124 } as const;
    await assert.rejects(
      files.writeFileAtomic(join(dir, 'x.tmp'), final, header, chunk.data, opts),
      (err: unknown) => isKvtierError(err, 'KVT_BACKEND') && /rename/.test(String(err)),
    );
    assert.deepEqual((await fsp.readdir(dir)).sort(), ['taken']);
    await assert.rejects(
      files.writeFileAtomic(
        join(dir, 'no', 'x.tmp'),
        join(dir, 'no', 'x'),
        header,
        chunk.data,
        opts,
      ),
      (err: unknown) => isKvtierError(err, 'KVT_NOT_FOUND'),
      'no directory and none to make',
    );
  });
});
