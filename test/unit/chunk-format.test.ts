import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { crc32 } from 'node:zlib';
import xxhash from 'xxhash-wasm';
import {
  CHUNK_CHECKSUM_CRC32C,
  CHUNK_CHECKSUM_XXH64,
  CHUNK_DECODE_FAILURES,
  CHUNK_FORMAT_VERSION,
  CHUNK_HEADER_BYTES,
  CHUNK_MAGIC,
  CHUNK_MAX_PAYLOAD_BYTES,
  type ChunkDecodeFailure,
  chunkObjectBytes,
  chunkPayloadChecksum,
  decodeChunkHeader,
  decodeChunkObject,
  encodeChunkHeader,
  encodeChunkObject,
  encodeChunkObjectInto,
  verifyChunkPayload,
} from '../../src/backends/format/chunk-format.ts';
import { KvtierError } from '../../src/errors.ts';
import { chunkHash } from '../../src/hashing/chunk-hash.ts';

const NS = '00112233445566778899aabbccddeeff';
const HASH = chunkHash('000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f');
const OTHER_NS = 'ffeeddccbbaa99887766554433221100';
const OTHER_HASH = chunkHash('f'.repeat(64));
const KiB = 1024;
const MiB = 1024 * KiB;

/** Deterministic PRNG (mulberry32) so every run mutates the same way. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
}

function payload(size: number, seed = 1): Buffer {
  const next = rng(seed);
  const b = Buffer.allocUnsafe(size);
  for (let i = 0; i < size; i++) b[i] = (next() * 256) | 0;
  return b;
}

function reasonOf(r: { ok: true } | { ok: false; reason: ChunkDecodeFailure }): string {
  return r.ok ? 'ok' : r.reason;
}

/** Rewrites the header CRC so a deliberately edited header passes its self-check. */
function resealHeader(obj: Buffer): Buffer {
  obj.writeUInt32LE(crc32(obj.subarray(0, 124)), 124);
  return obj;
}

function expectInvalid(fn: () => unknown, pattern: RegExp): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof KvtierError, 'throws a KvtierError');
    assert.equal(e.code, 'KVT_INVALID_ARGUMENT');
    assert.match(e.message, pattern);
    return true;
  });
}

describe('chunk format constants and checksum', () => {
  it('has the documented magic, version and header size', () => {
    assert.equal(CHUNK_MAGIC.toString('latin1'), 'KVTC');
    assert.equal(CHUNK_FORMAT_VERSION, 2);
    assert.equal(CHUNK_HEADER_BYTES, 128);
    assert.equal(CHUNK_HEADER_BYTES % 8, 0);
    assert.equal(chunkObjectBytes(10), 138);
  });

  it('algorithm 1 is standard XXH64 with seed 0 (published test vectors)', () => {
    assert.equal(chunkPayloadChecksum(Buffer.alloc(0), CHUNK_CHECKSUM_XXH64), 0xef46db3751d8e999n);
    assert.equal(
      chunkPayloadChecksum(Buffer.from('abc'), CHUNK_CHECKSUM_XXH64),
      0x44bc2cf5ad770999n,
    );
  });

  it('algorithm 2, the default, is standard CRC-32C (published test vector)', () => {
    assert.equal(chunkPayloadChecksum(Buffer.from('123456789')), 0xe3069283n);
    assert.equal(
      chunkPayloadChecksum(Buffer.from('123456789'), CHUNK_CHECKSUM_CRC32C),
      0xe3069283n,
    );
  });

  it('hashing in slices equals one-shot XXH64 across slice boundaries', async () => {
    const xx = await xxhash();
    for (const size of [128 * KiB - 1, 128 * KiB, 128 * KiB + 1, MiB + 7, 3 * MiB]) {
      const b = payload(size, size);
      assert.equal(chunkPayloadChecksum(b, CHUNK_CHECKSUM_XXH64), xx.h64Raw(b), `size ${size}`);
    }
  });
});

describe('encode/decode round trip', () => {
  for (const size of [1, 64 * KiB, 32 * MiB]) {
    it(`round-trips a ${size}-byte payload; the decoded data is a view, not a copy`, () => {
      const data = payload(size, size);
      const obj = encodeChunkObject(NS, HASH, { tokens: 256, data });
      assert.equal(obj.length, CHUNK_HEADER_BYTES + size);
      const r = decodeChunkObject(NS, HASH, obj);
      assert.equal(reasonOf(r), 'ok');
      if (!r.ok) return;
      assert.equal(r.chunk.tokens, 256);
      assert.equal(Buffer.compare(r.chunk.data, data), 0);
      assert.equal(r.chunk.data.buffer, obj.buffer);
      assert.equal(r.chunk.data.byteOffset, obj.byteOffset + CHUNK_HEADER_BYTES);
      assert.deepEqual(r.header, {
        version: 2,
        namespace: NS,
        hash: HASH,
        tokens: 256,
        layout: 0,
        payloadBytes: size,
        checksumAlgorithm: CHUNK_CHECKSUM_CRC32C,
        checksum: chunkPayloadChecksum(data),
      });
    });
  }

  it('header + payload written separately equals the single object', () => {
    const data = payload(5000);
    const chunk = { tokens: 17, data };
    const header = encodeChunkHeader(NS, HASH, chunk, 9);
    assert.equal(header.length, CHUNK_HEADER_BYTES);
    const obj = encodeChunkObject(NS, HASH, chunk, 9);
    assert.equal(Buffer.compare(Buffer.concat([header, data]), obj), 0);
    const h = decodeChunkHeader(NS, HASH, header);
    assert.equal(reasonOf(h), 'ok');
    if (!h.ok) return;
    assert.equal(h.header.layout, 9);
    assert.equal(h.header.tokens, 17);
    assert.equal(verifyChunkPayload(h.header, data), true);
    assert.equal(verifyChunkPayload(h.header, data.subarray(1)), false);
    const flipped = Buffer.from(data);
    flipped[4999]! ^= 0x80;
    assert.equal(verifyChunkPayload(h.header, flipped), false);
  });

  it('encodes into a caller buffer at an offset, byte for byte like encodeChunkObject', () => {
    const chunk = { tokens: 5, data: payload(777) };
    const expected = encodeChunkObject(NS, HASH, chunk, 3);
    const target = new Uint8Array(expected.length + 20).fill(0xee);
    assert.equal(encodeChunkObjectInto(target, NS, HASH, chunk, 3, 11), expected.length);
    assert.equal(Buffer.compare(target.subarray(11, 11 + expected.length), expected), 0);
    assert.deepEqual([target[10], target[11 + expected.length]], [0xee, 0xee]);
    expectInvalid(() => encodeChunkObjectInto(target, NS, HASH, chunk, 3, 21), /must hold/);
    expectInvalid(() => encodeChunkObjectInto(target, NS, HASH, chunk, 3, -1), /must hold/);
  });

  it('decodes a plain Uint8Array view at a non-zero offset', () => {
    const obj = encodeChunkObject(NS, HASH, { tokens: 1, data: payload(300) });
    const backing = new Uint8Array(obj.length + 10);
    backing.set(obj, 7);
    const view = backing.subarray(7, 7 + obj.length);
    const r = decodeChunkObject(NS, HASH, view);
    assert.equal(reasonOf(r), 'ok');
    if (!r.ok) return;
    assert.equal(r.chunk.data.byteOffset, 7 + CHUNK_HEADER_BYTES);
    assert.equal(Buffer.compare(r.chunk.data, obj.subarray(CHUNK_HEADER_BYTES)), 0);
  });

  it('rejects bad arguments with KVT_INVALID_ARGUMENT', () => {
    const data = payload(8);
    expectInvalid(() => encodeChunkObject(NS, HASH, { tokens: 1, data: Buffer.alloc(0) }), /1 to/);
    expectInvalid(() => encodeChunkHeader(NS.slice(1), HASH, { tokens: 1, data }), /namespace/);
    expectInvalid(() => encodeChunkObject(NS, HASH, { tokens: 0, data }), /tokens/);
    expectInvalid(() => encodeChunkObject(NS, HASH, { tokens: 1.5, data }), /tokens/);
    expectInvalid(() => encodeChunkObject(NS, HASH, { tokens: 1, data }, -1), /layout/);
    expectInvalid(() => encodeChunkObject(NS, HASH, { tokens: 1, data }, 2 ** 32), /layout/);
  });
});

describe('every failure reason from a targeted mutation', () => {
  const data = payload(1000, 42);
  const good = encodeChunkObject(NS, HASH, { tokens: 200, data });
  /** A copy of the good object, edited by `fn`, optionally with its header CRC resealed. */
  const mutate = (fn: (b: Buffer) => void, reseal = false): Buffer => {
    const b = Buffer.from(good);
    fn(b);
    return reseal ? resealHeader(b) : b;
  };
  const flip = (i: number, mask: number): Buffer =>
    mutate((b) => {
      b[i]! ^= mask;
    });
  const seen = new Set<string>();
  const expectReason = (obj: Uint8Array, reason: ChunkDecodeFailure, ns = NS, hash = HASH) => {
    const r = decodeChunkObject(ns, hash, obj);
    assert.equal(reasonOf(r), reason);
    seen.add(reasonOf(r));
  };

  it('truncated: cut inside the header and inside the payload', () => {
    for (const len of [0, 1, 3, 4, 64, 123, 127, 128, 129, 600, good.length - 1]) {
      expectReason(good.subarray(0, len), 'truncated');
    }
  });

  it('magic: any byte of the magic', () => {
    for (let i = 0; i < 4; i++) expectReason(flip(i, 0x01), 'magic');
  });

  it('version: another version, with or without a resealed header', () => {
    expectReason(
      mutate((b) => b.writeUInt16LE(3, 4)),
      'version',
    );
    expectReason(
      mutate((b) => b.writeUInt16LE(0, 4), true),
      'version',
    );
  });

  it('header: a flipped bit anywhere in the header after the version', () => {
    for (let i = 6; i < CHUNK_HEADER_BYTES; i++) {
      expectReason(flip(i, 0x10), 'header');
    }
  });

  it('header: fields invalid in v2 are rejected even with a valid header CRC', () => {
    const cases: [string, (b: Buffer) => void][] = [
      ['headerBytes', (b) => b.writeUInt16LE(64, 6)],
      ['flags', (b) => b.writeUInt32LE(1, 8)],
      ['tokens 0', (b) => b.writeUInt32LE(0, 64)],
      ['checksumAlg 1 (v1 only)', (b) => b.writeUInt32LE(1, 68)],
      ['checksumAlg 3', (b) => b.writeUInt32LE(3, 68)],
      ['CRC-32C above 32 bits', (b) => b.writeUInt32LE(1, 84)],
      ['version 1 with CRC-32C', (b) => b.writeUInt16LE(1, 4)],
      ['payloadBytes 0', (b) => b.writeBigUInt64LE(0n, 72)],
      ['payloadBytes > max', (b) => b.writeBigUInt64LE(BigInt(CHUNK_MAX_PAYLOAD_BYTES + 1), 72)],
      ['payloadBytes 2^64-1', (b) => b.writeBigUInt64LE(2n ** 64n - 1n, 72)],
      [
        'reserved',
        (b) => {
          b[100] = 1;
        },
      ],
    ];
    for (const [name, edit] of cases) {
      const obj = mutate(edit, true);
      const r = decodeChunkObject(NS, HASH, obj);
      assert.equal(reasonOf(r), 'header', name);
    }
  });

  it('header CRC catches a flipped token count that the payload checksum cannot see', () => {
    const flipped = flip(64, 0x01);
    expectReason(flipped, 'header');
    // Proof that only the header CRC stood in the way: resealed, the wrong count decodes.
    const r = decodeChunkObject(NS, HASH, resealHeader(flipped));
    assert.equal(reasonOf(r), 'ok');
    assert.equal(r.ok && r.chunk.tokens, 201);
  });

  it('namespace and hash: an object found under the wrong key', () => {
    expectReason(good, 'namespace', OTHER_NS, HASH);
    expectReason(good, 'namespace', NS.toUpperCase(), HASH);
    expectReason(good, 'hash', NS, OTHER_HASH);
    const h = decodeChunkHeader(NS, OTHER_HASH, good);
    assert.equal(reasonOf(h), 'hash');
  });

  it('length: trailing bytes after the payload', () => {
    expectReason(Buffer.concat([good, Buffer.from([0])]), 'length');
    expectReason(Buffer.concat([good, good]), 'length');
  });

  it('checksum: a flipped payload byte at the start, middle and end', () => {
    for (const i of [CHUNK_HEADER_BYTES, CHUNK_HEADER_BYTES + 500, good.length - 1]) {
      expectReason(flip(i, 0x01), 'checksum');
    }
  });

  it('produced every failure reason at least once', () => {
    assert.deepEqual([...seen].sort(), [...CHUNK_DECODE_FAILURES].sort());
  });
});

describe('seeded random-mutation fuzz', () => {
  it('never throws and never accepts a mutated object', () => {
    const next = rng(0xc0ffee);
    const int = (n: number) => Math.floor(next() * n);
    const bases = [1, 7, 200, 4096].map((size) =>
      encodeChunkObject(NS, HASH, { tokens: 1 + int(1000), data: payload(size, size) }),
    );
    const counts = new Map<string, number>();
    let mutated = 0;
    for (let iter = 0; iter < 4000; iter++) {
      const base = bases[iter % bases.length]!;
      let obj = Buffer.from(base);
      const kind = int(7);
      if (kind === 0) {
        const i = int(obj.length);
        obj[i]! ^= 1 << int(8);
      } else if (kind === 1) {
        for (let k = 1 + int(8); k > 0; k--) obj[int(obj.length)] = int(256);
      } else if (kind === 2) {
        obj = obj.subarray(0, int(obj.length));
      } else if (kind === 3) {
        obj = Buffer.concat([obj, payload(1 + int(16), iter)]);
      } else if (kind === 4) {
        const i = int(obj.length + 1);
        obj = Buffer.concat([obj.subarray(0, i), Buffer.from([int(256)]), obj.subarray(i)]);
      } else if (kind === 5) {
        const i = int(obj.length);
        obj = Buffer.concat([obj.subarray(0, i), obj.subarray(i + 1)]);
      } else {
        const i = int(CHUNK_HEADER_BYTES);
        payload(1 + int(32), iter).copy(obj, i);
      }
      if (obj.equals(base)) continue;
      mutated++;
      let reason: string;
      try {
        reason = reasonOf(decodeChunkObject(NS, HASH, obj));
        decodeChunkHeader(NS, HASH, obj);
      } catch (e) {
        assert.fail(`iteration ${iter} (mutation ${kind}) threw: ${String(e)}`);
      }
      assert.notEqual(reason, 'ok', `iteration ${iter} (mutation ${kind}) was accepted`);
      counts.set(reason, (counts.get(reason) ?? 0) + 1);
    }
    assert.ok(mutated > 3500, `enough mutated objects were tried (${mutated})`);
    for (const r of ['truncated', 'header', 'checksum', 'length', 'magic']) {
      assert.ok((counts.get(r) ?? 0) > 0, `fuzz produced '${r}' (${JSON.stringify([...counts])})`);
    }
  });
});

describe('docs/storage-format.md', () => {
  it('the worked example is exactly what the encoder produces, and decodes', () => {
    const doc = readFileSync(new URL('../../docs/storage-format.md', import.meta.url), 'utf8');
    const m = /<!-- chunk-example:begin -->\s*```\n([\s\S]*?)```\s*<!-- chunk-example:end -->/.exec(
      doc,
    );
    assert.ok(m?.[1] !== undefined, 'the doc has a chunk-example block');
    const fromDoc = Buffer.from(m[1].replace(/\s+/g, ''), 'hex');
    assert.match(doc, new RegExp(`namespace \`${NS}\``));
    assert.match(doc, new RegExp(`chunk hash \`${HASH}\``));
    const encoded = encodeChunkObject(NS, HASH, { tokens: 3, data: Buffer.from('KV bytes') });
    assert.equal(fromDoc.toString('hex'), encoded.toString('hex'));
    const r = decodeChunkObject(NS, HASH, fromDoc);
    assert.equal(reasonOf(r), 'ok');
    assert.equal(r.ok && Buffer.from(r.chunk.data).toString('latin1'), 'KV bytes');
    assert.equal(r.ok && r.chunk.tokens, 3);
  });

  it('the version-1 example (XXH64) still decodes, byte for byte the v2 payload', () => {
    const doc = readFileSync(new URL('../../docs/storage-format.md', import.meta.url), 'utf8');
    const m =
      /<!-- chunk-example-v1:begin -->\s*```\n([\s\S]*?)```\s*<!-- chunk-example-v1:end -->/.exec(
        doc,
      );
    assert.ok(m?.[1] !== undefined, 'the doc has a chunk-example-v1 block');
    const fromDoc = Buffer.from(m[1].replace(/\s+/g, ''), 'hex');
    const r = decodeChunkObject(NS, HASH, fromDoc);
    assert.equal(reasonOf(r), 'ok');
    assert.equal(r.ok && r.header.version, 1);
    assert.equal(r.ok && r.header.checksumAlgorithm, CHUNK_CHECKSUM_XXH64);
    assert.equal(r.ok && r.header.checksum, 0x35152189fc0dde25n);
    assert.equal(r.ok && Buffer.from(r.chunk.data).toString('latin1'), 'KV bytes');
  });
});
