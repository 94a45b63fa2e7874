import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fsp from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { crc32 } from 'node:zlib';
import xxhash from 'xxhash-wasm';
import { objectPath } from '../../src/backends/files/file-store.ts';
import {
  CHECKSUM_CRC32C,
  CHECKSUM_SYNC_MAX_BYTES,
  CHECKSUM_XXH64,
  copyPayloadCrc32cAsync,
  crc32cEngine,
  payloadChecksum,
  payloadChecksumAsync,
} from '../../src/backends/format/checksum.ts';
import {
  CHUNK_HEADER_BYTES,
  type ChunkDecodeFailure,
  decodeChunkHeader,
  decodeChunkObject,
  decodeChunkObjectAsync,
  encodeChunkHeaderAsync,
  encodeChunkObject,
  encodeChunkObjectAsync,
  encodeChunkObjectIntoAsync,
  verifyChunkPayloadAsync,
} from '../../src/backends/format/chunk-format.ts';
import { FsBackend } from '../../src/backends/fs/fs-backend.ts';
import { type ChunkHash, chunkHash } from '../../src/hashing/chunk-hash.ts';
import { loadNative } from '../../src/native/native-addon.ts';
import { crc32c } from '../../src/util/crc32c.ts';

const native = loadNative().addon;
const NS = 'a1'.repeat(16);
const HASH = chunkHash('b2'.repeat(32));
/**
 * Odd sizes around the JS slice-by-8 step and the native paths' edges: folding from 512 bytes,
 * the three-way split from 3 KiB, folding beside crc32 chains from 16 KiB to 1 MiB.
 */
const ODD_SIZES = [
  1, 3, 7, 9, 15, 17, 255, 511, 512, 513, 527, 575, 767, 768, 1021, 1087, 3071, 3072, 3073, 3079,
  16_383, 16_384, 16_759, 17_000, 65_537, 262_144, 1_000_003, 1_048_576, 1_048_577,
];

function reasonOf(r: { ok: true } | { ok: false; reason: ChunkDecodeFailure }): string {
  return r.ok ? 'ok' : r.reason;
}

/**
 * The same chunk in stored format version 1 (XXH64), as an older kvtier wrote it: the writer of
 * v1 filled exactly these fields, so rewriting a v2 object's version, algorithm and checksum
 * and resealing the header gives the old bytes.
 */
async function v1Object(
  ns: string,
  hash: ChunkHash,
  tokens: number,
  data: Buffer,
): Promise<Buffer> {
  const xx = await xxhash();
  const obj = encodeChunkObject(ns, hash, { tokens, data });
  obj.writeUInt16LE(1, 4);
  obj.writeUInt32LE(1, 68);
  obj.writeBigUInt64LE(xx.h64Raw(data), 80);
  obj.writeUInt32LE(crc32(obj.subarray(0, 124)), 124);
  return obj;
}

describe('CRC-32C', () => {
  // RFC 3720 (iSCSI) appendix B.4 and the common check value.
  const vectors: [string, Buffer, number][] = [
    ['"123456789"', Buffer.from('123456789'), 0xe3069283],
    ['empty', Buffer.alloc(0), 0],
    ['32 zero bytes', Buffer.alloc(32, 0), 0x8a9136aa],
    ['32 0xff bytes', Buffer.alloc(32, 0xff), 0x62a8ab43],
    ['0..31', Buffer.from(Array.from({ length: 32 }, (_, i) => i)), 0x46dd794e],
    ['31..0', Buffer.from(Array.from({ length: 32 }, (_, i) => 31 - i)), 0x113fdb5c],
  ];

  it('JavaScript: the published vectors', () => {
    for (const [name, data, want] of vectors) assert.equal(crc32c(data), want, name);
  });

  it('native, sync and on the pool: the published vectors', { skip: native === null }, async () => {
    const a = native!;
    for (const [name, data, want] of vectors) {
      assert.equal(a.crc32c(data), want, name);
      assert.equal(await a.crc32cAsync(data), want, name);
    }
    // A large buffer takes the three-way hardware path.
    const big = Buffer.alloc(1 << 20, 0x5a);
    assert.equal(a.crc32c(big), crc32c(big));
  });

  it('native equals JavaScript on random buffers of odd sizes, whole and continued', {
    skip: native === null,
  }, async () => {
    const a = native!;
    for (const size of ODD_SIZES) {
      const data = randomBytes(size);
      const want = crc32c(data);
      assert.equal(a.crc32c(data), want, `sync ${size}`);
      assert.equal(await a.crc32cAsync(data), want, `async ${size}`);
      // A view at an odd offset into a larger buffer.
      const backing = randomBytes(size + 13);
      data.copy(backing, 5);
      assert.equal(a.crc32c(backing.subarray(5, 5 + size)), want, `view ${size}`);
      // Continuing from a previous result over a split buffer gives the whole buffer's CRC.
      const cut = Math.floor(size / 3);
      assert.equal(crc32c(data.subarray(cut), a.crc32c(data.subarray(0, cut))), want);
      assert.equal(a.crc32c(data.subarray(cut), crc32c(data.subarray(0, cut))), want);
    }
  });

  it('native equals JavaScript for every length up to 2 KiB, at every alignment, from any start', {
    skip: native === null,
  }, () => {
    // Covers each path's edges: the crc32 chains below 512 bytes and from 3 KiB, the folding
    // loop's 256- and 64-byte steps, its 16-byte tail and the bytes after it.
    const a = native!;
    const backing = randomBytes(2048 + 64);
    for (let n = 0; n <= 2048; n++) {
      const off = n % 61;
      const view = backing.subarray(off, off + n);
      const start = (n * 2_654_435_761) >>> 0;
      assert.equal(a.crc32c(view, start), crc32c(view, start), `length ${n} at ${off}`);
    }
  });

  it('native equals JavaScript for every length across two steps of the fold-beside-chains path', {
    skip: native === null,
  }, () => {
    // From 16 KiB the native CRC folds 256 bytes a step while three crc32 chains take 40 bytes
    // each (376 bytes a step); what is left after the last whole step is folded or chained on.
    const a = native!;
    const backing = randomBytes(17_500);
    for (let n = 16_384; n <= 16_384 + 2 * 376 + 1; n++) {
      const view = backing.subarray(n % 7, (n % 7) + n);
      assert.equal(a.crc32c(view, n), crc32c(view, n), `length ${n}`);
    }
  });

  it('native copy + CRC-32C in one pass: the copy is exact and the CRC is the payload’s', {
    skip: native === null,
  }, async () => {
    const a = native!;
    for (const size of [...ODD_SIZES, 256 * 1024 + 1, (5 << 20) + 3]) {
      const src = randomBytes(size);
      const dst = Buffer.alloc(size + 40, 0xee);
      assert.equal(await a.copyCrc32cAsync(src, dst, 17), crc32c(src), `crc ${size}`);
      assert.equal(Buffer.compare(dst.subarray(17, 17 + size), src), 0, `copy ${size}`);
      assert.ok(
        dst.subarray(0, 17).every((b) => b === 0xee),
        'nothing before the offset',
      );
      assert.ok(
        dst.subarray(17 + size).every((b) => b === 0xee),
        'nothing after the payload',
      );
    }
    const buf = randomBytes(4096);
    await assert.rejects(a.copyCrc32cAsync(buf, Buffer.alloc(4096), 1), /does not fit/);
    await assert.rejects(a.copyCrc32cAsync(buf.subarray(0, 2048), buf, 1024), /overlap/);
  });

  it('native read + CRC-32C in one pass: the bytes are the file’s, the CRC covers crcFrom on', {
    skip: native === null,
  }, async (t) => {
    const a = native!;
    const dir = await fsp.mkdtemp(join(tmpdir(), 'kvtier-pread-'));
    t.after(() => fsp.rm(dir, { recursive: true, force: true }));
    for (const size of [1, 4097, 256 * 1024 + 7, (3 << 20) + 1]) {
      const data = randomBytes(size);
      const path = join(dir, `f${size}`);
      await fsp.writeFile(path, data);
      const fh = await fsp.open(path, 'r');
      try {
        const dst = Buffer.alloc(size);
        const from = Math.min(size, 128);
        assert.equal(await a.preadCrc32cAsync(fh.fd, dst, 0, from), crc32c(data.subarray(from)));
        assert.equal(Buffer.compare(dst, data), 0, `bytes ${size}`);
        // From a position, and past the end of the file: a short read is refused.
        const tail = Buffer.alloc(size - Math.floor(size / 2));
        assert.equal(
          await a.preadCrc32cAsync(fh.fd, tail, Math.floor(size / 2), 0),
          crc32c(data.subarray(Math.floor(size / 2))),
        );
        await assert.rejects(a.preadCrc32cAsync(fh.fd, Buffer.alloc(size + 1), 0, 0), {
          code: 'KVT_BACKEND',
          nativeCode: 'ERR_SHORT_READ',
        });
      } finally {
        await fh.close();
      }
    }
  });

  it('decodeChunkObjectAsync checks a CRC computed while reading instead of reading again', async () => {
    const data = randomBytes(1 << 20);
    const obj = encodeChunkObject(NS, HASH, { tokens: 256, data });
    const right = crc32c(obj.subarray(CHUNK_HEADER_BYTES));
    assert.equal(reasonOf(await decodeChunkObjectAsync(NS, HASH, obj, right)), 'ok');
    // A wrong value is believed (so it is what was checked): a checksum failure.
    assert.equal(reasonOf(await decodeChunkObjectAsync(NS, HASH, obj, right ^ 1)), 'checksum');
    // Bytes after the payload: the value does not cover the payload alone and is not used.
    const longer = Buffer.concat([obj, Buffer.alloc(5)]);
    assert.equal(
      reasonOf(await decodeChunkObjectAsync(NS, HASH, longer, crc32c(longer.subarray(128)))),
      reasonOf(await decodeChunkObjectAsync(NS, HASH, longer)),
    );
  });

  it('copyPayloadCrc32cAsync gives the copy and the checksum on either side of the threshold', async () => {
    for (const size of [CHECKSUM_SYNC_MAX_BYTES, CHECKSUM_SYNC_MAX_BYTES + 1, 3 << 20]) {
      const src = randomBytes(size);
      const dst = Buffer.alloc(size + CHUNK_HEADER_BYTES);
      const got = await copyPayloadCrc32cAsync(src, dst, CHUNK_HEADER_BYTES);
      assert.equal(got, payloadChecksum(CHECKSUM_CRC32C, src));
      assert.equal(Buffer.compare(dst.subarray(CHUNK_HEADER_BYTES), src), 0);
    }
    // Overlapping views (refused by the addon) are still copied, through the fallback.
    const buf = randomBytes(2 << 20);
    const want = Buffer.from(buf.subarray(0, 1 << 20));
    assert.equal(
      await copyPayloadCrc32cAsync(buf.subarray(0, 1 << 20), buf, 4096),
      payloadChecksum(CHECKSUM_CRC32C, want),
    );
    assert.equal(Buffer.compare(buf.subarray(4096, 4096 + (1 << 20)), want), 0);
    await assert.rejects(copyPayloadCrc32cAsync(randomBytes(10), Buffer.alloc(10), 1), RangeError);
  });

  for (const [what, env, hw] of [
    ['table path (KVTIER_CRC32C_SOFTWARE=1)', 'KVTIER_CRC32C_SOFTWARE', false],
    ['crc32 chains (KVTIER_CRC32C_NO_FOLD=1)', 'KVTIER_CRC32C_NO_FOLD', true],
  ] as const) {
    it(`native ${what} equals JavaScript`, {
      skip: native === null,
    }, (t) => {
      if (hw && !native!.probe().crc32cHardware) {
        t.skip('no crc32 instruction');
        return;
      }
      // The CPU instruction is detected once per process, so the table path runs in a child.
      const script = [
        `const a = require(${JSON.stringify(native!.path)});`,
        "const { randomBytes } = require('node:crypto');",
        'const out = [];',
        `for (const n of ${JSON.stringify(ODD_SIZES)}) { const b = randomBytes(n); out.push([b.toString('base64'), a.crc32c(b, 0)]); }`,
        'console.log(JSON.stringify({ hw: a.probe().crc32cHardware, out }));',
      ].join('\n');
      const run = spawnSync(process.execPath, ['-e', script], {
        env: { ...process.env, [env]: '1' },
        encoding: 'utf8',
        maxBuffer: 64 * 1024 * 1024,
      });
      assert.equal(run.status, 0, run.stderr);
      const res = JSON.parse(run.stdout) as { hw: boolean; out: [string, number][] };
      assert.equal(res.hw, hw);
      for (const [b64, crc] of res.out) assert.equal(crc, crc32c(Buffer.from(b64, 'base64')));
    });
  }

  it('native rejects what is not a buffer, and a crc outside u32', {
    skip: native === null,
  }, () => {
    const a = native!;
    assert.throws(() => a.crc32c('abc' as unknown as Uint8Array), { code: 'KVT_INVALID_ARGUMENT' });
    assert.throws(() => a.crc32c(Buffer.from('a'), 2 ** 32), { code: 'KVT_INVALID_ARGUMENT' });
  });

  it('the checksum module reports its engine and agrees sync and async', async () => {
    const e = crc32cEngine();
    assert.equal(e.engine, native === null ? 'js' : 'native');
    for (const size of [CHECKSUM_SYNC_MAX_BYTES - 1, CHECKSUM_SYNC_MAX_BYTES + 1, 4_000_037]) {
      const data = randomBytes(size);
      const want = BigInt(crc32c(data));
      assert.equal(payloadChecksum(CHECKSUM_CRC32C, data), want);
      assert.equal(await payloadChecksumAsync(CHECKSUM_CRC32C, data), want);
      const xx = payloadChecksum(CHECKSUM_XXH64, data);
      assert.equal(await payloadChecksumAsync(CHECKSUM_XXH64, data), xx);
    }
  });
});

describe('stored format version 2 (CRC-32C) beside version 1 (XXH64)', () => {
  const dirs: string[] = [];
  after(async () => {
    await Promise.all(dirs.map((d) => fsp.rm(d, { recursive: true, force: true })));
  });

  it('writes version 2 with algorithm 2; the async encoders give the same bytes', async () => {
    const data = randomBytes(CHECKSUM_SYNC_MAX_BYTES * 3 + 5);
    const chunk = { tokens: 256, data };
    const obj = encodeChunkObject(NS, HASH, chunk);
    assert.equal(obj.readUInt16LE(4), 2);
    assert.equal(obj.readUInt32LE(68), 2);
    assert.equal(obj.readBigUInt64LE(80), BigInt(crc32c(data)));
    assert.deepEqual(await encodeChunkObjectAsync(NS, HASH, chunk), obj);
    const header = await encodeChunkHeaderAsync(NS, HASH, chunk);
    assert.deepEqual(header, obj.subarray(0, CHUNK_HEADER_BYTES));
    const target = Buffer.alloc(obj.length + 3);
    assert.equal(await encodeChunkObjectIntoAsync(target, NS, HASH, chunk, 0, 3), obj.length);
    assert.deepEqual(target.subarray(3), obj);
  });

  it('reads version-1 objects and verifies them with XXH64', async () => {
    for (const size of [1, 1000, CHECKSUM_SYNC_MAX_BYTES * 2 + 1]) {
      const data = randomBytes(size);
      const old = await v1Object(NS, HASH, 7, data);
      for (const r of [
        decodeChunkObject(NS, HASH, old),
        await decodeChunkObjectAsync(NS, HASH, old),
      ]) {
        assert.equal(reasonOf(r), 'ok');
        assert.equal(r.ok && r.header.version, 1);
        assert.equal(r.ok && r.header.checksumAlgorithm, CHECKSUM_XXH64);
        assert.equal(r.ok && Buffer.compare(r.chunk.data, data), 0);
      }
      const h = decodeChunkHeader(NS, HASH, old);
      assert.ok(h.ok);
      assert.equal(await verifyChunkPayloadAsync(h.header, data), true);
      const bad = Buffer.from(old);
      bad[CHUNK_HEADER_BYTES + Math.floor(size / 2)]! ^= 0x04;
      assert.equal(reasonOf(await decodeChunkObjectAsync(NS, HASH, bad)), 'checksum');
    }
  });

  it('a corrupted version-2 chunk is a checksum failure, sync and on the pool', async () => {
    const data = randomBytes(4 * 1024 * 1024 + 3);
    const obj = encodeChunkObject(NS, HASH, { tokens: 256, data });
    for (const at of [CHUNK_HEADER_BYTES, CHUNK_HEADER_BYTES + 2_000_001, obj.length - 1]) {
      const bad = Buffer.from(obj);
      bad[at]! ^= 0x80;
      assert.equal(reasonOf(decodeChunkObject(NS, HASH, bad)), 'checksum');
      assert.equal(reasonOf(await decodeChunkObjectAsync(NS, HASH, bad)), 'checksum');
    }
    assert.equal(reasonOf(await decodeChunkObjectAsync(NS, HASH, obj)), 'ok');
  });

  it('a file backend serves an old-format file and treats a corrupted new one as a miss', async () => {
    const dir = await fsp.mkdtemp(join(tmpdir(), 'kvtier-checksum-'));
    dirs.push(dir);
    const backend = await FsBackend.open({ path: dir, timeoutMs: 5000 }, { name: 'fs' });
    try {
      const oldHash = chunkHash('c3'.repeat(32));
      const oldData = randomBytes(600_000);
      const oldPath = objectPath(dir, NS, oldHash, backend.options.shardChars);
      await fsp.mkdir(join(oldPath, '..'), { recursive: true });
      await fsp.writeFile(oldPath, await v1Object(NS, oldHash, 9, oldData));
      const got = (await backend.batchedGet(NS, [oldHash])).get(oldHash);
      assert.equal(got?.tokens, 9);
      assert.equal(got && Buffer.compare(got.data, oldData), 0);

      const data = randomBytes(600_000);
      assert.equal(await backend.put(NS, HASH, { tokens: 256, data }), 'stored');
      const fresh = (await backend.batchedGet(NS, [HASH])).get(HASH);
      assert.equal(fresh && Buffer.compare(fresh.data, data), 0, 'read back whole and verified');
      const path = objectPath(dir, NS, HASH, backend.options.shardChars);
      const stored = await fsp.readFile(path);
      assert.equal(stored.readUInt16LE(4), 2);
      stored[CHUNK_HEADER_BYTES + 300_000]! ^= 0x01;
      await fsp.writeFile(path, stored);
      assert.equal((await backend.batchedGet(NS, [HASH])).get(HASH) ?? null, null);
      // The corrupt file was removed: a later read is a plain miss.
      await assert.rejects(fsp.stat(path), { code: 'ENOENT' });
    } finally {
      await backend.close();
    }
  });
});
