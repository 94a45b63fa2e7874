import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { isKvtierError } from '../../src/errors.ts';
import {
  type ChunkHasherOptions,
  hashChunks,
  hashSeed,
  hashToHex,
  hexToHash,
  packHashes,
  resolveChunkHasherOptions,
  tokenCounts,
} from '../../src/hashing/chunk-hasher.ts';

// Vectors computed independently with Python's hashlib (script in docs/hashing.md).
const SEEDS: Record<string, string> = {
  '': '34a565440fdf6529a1deceeb2feafc2508dd2da9f482f2701e98ab8f602f4bfa',
  'tenant-a': '22aeca334410c1e1167fb24fdd79da2b4be61ac20e2845358515948588b7652b',
  'café/β': '13ff7898bca09f293a15c34a97a904701db0ad51205ac60b9bfb3958d14bd90b',
};

const range = (n: number): number[] => Array.from({ length: n }, (_, i) => i);

interface Vector {
  name: string;
  tokens: number[];
  opts: ChunkHasherOptions;
  expected: [number, number, string][];
}

const VECTORS: Vector[] = [
  {
    name: 'A: tokens 0..599, chunk 256, no partial',
    tokens: range(600),
    opts: {},
    expected: [
      [0, 256, '9023a6f72e494c809d3ea5b388ef2ff49d20cc1d48e046e2a6c8d259b8592548'],
      [256, 512, '3b0d4074d7c396f8848f7b6439a3a8d85f5996b37d759ea087988e8960a9b73c'],
    ],
  },
  {
    name: 'B: tokens 0..599, chunk 256, partial',
    tokens: range(600),
    opts: { partial: true },
    expected: [
      [0, 256, '9023a6f72e494c809d3ea5b388ef2ff49d20cc1d48e046e2a6c8d259b8592548'],
      [256, 512, '3b0d4074d7c396f8848f7b6439a3a8d85f5996b37d759ea087988e8960a9b73c'],
      [512, 600, '87aeb361fb11f300e6a1be34afcd9db475aa1ba6b34a7703bdaa5681bc0dee5b'],
    ],
  },
  {
    name: 'C: tokens 0..599, chunk 256, partial, salt "tenant-a"',
    tokens: range(600),
    opts: { partial: true, salt: 'tenant-a' },
    expected: [
      [0, 256, 'abbe6e77a2a624a3f8660f9670d0d8ebeace117a760dc0ecb2f8b72c5e0e185d'],
      [256, 512, '161e3fc9b8a584b5ed88b507eb18554b567a371e217784654640291f54af8864'],
      [512, 600, 'f1b6e5b31257d7105eaf36f7b12c32d9199bc5e60a05accb06777af319e58b5d'],
    ],
  },
  { name: 'D: empty, partial', tokens: [], opts: { partial: true }, expected: [] },
  { name: 'E: [42], no partial', tokens: [42], opts: {}, expected: [] },
  {
    name: 'F: [42], partial',
    tokens: [42],
    opts: { partial: true },
    expected: [[0, 1, '1c3d636cd94ac2f03a11b50562b84137f1239682ef043bf5f2155d980f6b60b6']],
  },
  {
    name: 'G: large values, chunk 4, partial',
    tokens: [4294967295, 0, 1, 2147483648, 65535, 16777216],
    opts: { chunkSize: 4, partial: true },
    expected: [
      [0, 4, 'f5b9f2d27bf39f4eb2bf9e1298157f390eec75f904949579a311c00abf912f82'],
      [4, 6, '0b74e8d2b12c2ef8a112d0cc31ae3f72b4cac9b267cf94b3e4c2573861154cb2'],
    ],
  },
  {
    name: 'H: [7], chunk 1, salt "café/β"',
    tokens: [7],
    opts: { chunkSize: 1, salt: 'café/β' },
    expected: [[0, 1, 'f22573737e9eae4e9be8490ad3c845a4eb7ea4287c07b91fd801d1e813c3ac56']],
  },
];

const render = (cs: { start: number; end: number; hash: Buffer }[]) =>
  cs.map((c): [number, number, string] => [c.start, c.end, hashToHex(c.hash)]);

function assertInvalid(fn: () => unknown, pattern: RegExp): void {
  assert.throws(fn, (err: unknown) => {
    assert.ok(isKvtierError(err, 'KVT_INVALID_ARGUMENT'), `expected KVT_INVALID_ARGUMENT: ${err}`);
    assert.match(err.message, pattern);
    return true;
  });
}

describe('hashSeed', () => {
  for (const [salt, hex] of Object.entries(SEEDS)) {
    test(`seed for salt ${JSON.stringify(salt)}`, () => {
      assert.equal(hashSeed(salt).toString('hex'), hex);
    });
  }
  test('default salt is empty', () => {
    assert.equal(hashSeed().toString('hex'), SEEDS['']);
  });
  test('refuses a salt with a lone surrogate', () => {
    assertInvalid(() => hashSeed('a\uD800b'), /salt must be a well-formed/);
  });
});

describe('hashChunks vectors', () => {
  for (const v of VECTORS) {
    test(`${v.name} (number[])`, () => {
      assert.deepEqual(render(hashChunks(v.tokens, v.opts)), v.expected);
    });
    test(`${v.name} (Uint32Array)`, () => {
      assert.deepEqual(render(hashChunks(Uint32Array.from(v.tokens), v.opts)), v.expected);
    });
  }

  test('a Uint32Array view at a non-zero offset hashes only its own tokens', () => {
    const backing = new Uint32Array(610);
    backing.fill(99);
    backing.set(range(600), 5);
    const view = backing.subarray(5, 605);
    assert.deepEqual(render(hashChunks(view, { partial: true })), VECTORS[1]?.expected);
  });
});

describe('hashChunks properties', () => {
  const tokens = Array.from({ length: 2000 }, (_, i) => (i * 2654435761) >>> 0);

  test('number[] and Uint32Array agree for many chunk sizes', () => {
    for (const chunkSize of [1, 3, 16, 256, 1999, 2000, 4096]) {
      for (const partial of [false, true]) {
        const a = render(hashChunks(tokens, { chunkSize, partial }));
        const b = render(hashChunks(Uint32Array.from(tokens), { chunkSize, partial }));
        assert.deepEqual(a, b, `chunkSize ${chunkSize} partial ${partial}`);
      }
    }
  });

  test('the hashes of a prefix are the first hashes of the longer sequence', () => {
    const long = hashChunks(tokens, { chunkSize: 16 });
    for (const n of [0, 16, 17, 160, 1000, 1999]) {
      const short = hashChunks(tokens.slice(0, n), { chunkSize: 16 });
      assert.equal(short.length, Math.floor(n / 16));
      assert.deepEqual(render(short), render(long.slice(0, short.length)));
    }
  });

  test('a change in one token changes that chunk and every later one, not earlier ones', () => {
    const changed = tokens.slice();
    changed[40] = (changed[40] ?? 0) + 1;
    const a = hashChunks(tokens, { chunkSize: 16 });
    const b = hashChunks(changed, { chunkSize: 16 });
    for (let i = 0; i < a.length; i++) {
      const same = a[i]?.hash.equals(b[i]?.hash ?? Buffer.alloc(0));
      assert.equal(same, i < 2, `chunk ${i}`);
    }
  });

  test('a different salt gives different hashes everywhere', () => {
    const a = hashChunks(tokens, { chunkSize: 64 });
    const b = hashChunks(tokens, { chunkSize: 64, salt: 'tenant-b' });
    assert.equal(a.length, b.length);
    for (let i = 0; i < a.length; i++) assert.ok(!a[i]?.hash.equals(b[i]?.hash ?? Buffer.alloc(0)));
  });

  test('chunk boundaries cover [i*chunkSize, min((i+1)*chunkSize, n))', () => {
    const cs = hashChunks(range(10), { chunkSize: 4, partial: true });
    assert.deepEqual(
      cs.map((c) => [c.start, c.end]),
      [
        [0, 4],
        [4, 8],
        [8, 10],
      ],
    );
    assert.deepEqual(tokenCounts(cs), [4, 4, 2]);
    assert.equal(hashChunks(range(8), { chunkSize: 4, partial: true }).length, 2);
  });

  test('returned hashes are independent buffers', () => {
    const cs = hashChunks(range(8), { chunkSize: 4 });
    const copy = Buffer.from(cs[1]?.hash ?? []);
    cs[0]?.hash.fill(0);
    assert.deepEqual(cs[1]?.hash, copy);
  });
});

describe('hashChunks validation', () => {
  const bad: [string, unknown[], RegExp][] = [
    ['negative', [1, -1], /token 1 must be an integer in \[0, 4294967295\], got -1/],
    ['too large', [4294967296], /token 0 .* got 4294967296/],
    ['fraction', [0, 0, 1.5], /token 2 .* got 1\.5/],
    ['NaN', [NaN], /token 0 .* got NaN/],
    ['Infinity', [Infinity], /token 0 .* got Infinity/],
    ['string', ['5'], /token 0 .* got "5"/],
    ['null', [null], /token 0 .* got null/],
    ['hole', [1, undefined], /token 1 .* got undefined/],
  ];
  for (const [name, tokens, pattern] of bad) {
    test(`rejects a ${name} token`, () => {
      assertInvalid(() => hashChunks(tokens as number[], { partial: true }), pattern);
    });
  }

  test('rejects a bad token in a trailing chunk that is not hashed', () => {
    assertInvalid(() => hashChunks([1, 2, 3, -4], { chunkSize: 3 }), /token 3 .* got -4/);
  });

  test('accepts the extremes 0 and 2^32-1', () => {
    assert.equal(hashChunks([0, 4294967295], { chunkSize: 2 }).length, 1);
  });

  test('rejects bad options with the option named', () => {
    assertInvalid(() => hashChunks([1], { chunkSize: 0 }), /chunkSize must be an integer in \[1, /);
    assertInvalid(() => hashChunks([1], { chunkSize: 2.5 }), /chunkSize/);
    assertInvalid(() => hashChunks([1], { chunkSize: (1 << 20) + 1 }), /chunkSize/);
    assertInvalid(() => hashChunks([1], { salt: 5 as unknown as string }), /salt must be a string/);
    assertInvalid(
      () => hashChunks([1], { partial: 'yes' as unknown as boolean }),
      /partial must be a boolean/,
    );
  });

  test('resolveChunkHasherOptions fills defaults', () => {
    assert.deepEqual(resolveChunkHasherOptions(), { chunkSize: 256, salt: '', partial: false });
    assert.deepEqual(resolveChunkHasherOptions({ chunkSize: 16, salt: 's', partial: true }), {
      chunkSize: 16,
      salt: 's',
      partial: true,
    });
  });
});

describe('hash helpers', () => {
  test('packHashes concatenates in order', () => {
    const cs = hashChunks(range(12), { chunkSize: 4 });
    const packed = packHashes(cs);
    assert.equal(packed.length, 96);
    for (let i = 0; i < 3; i++) {
      assert.deepEqual(packed.subarray(i * 32, i * 32 + 32), cs[i]?.hash);
    }
    assert.equal(packHashes([]).length, 0);
  });

  test('packHashes rejects a hash of the wrong length', () => {
    assertInvalid(
      () => packHashes([{ hash: new Uint8Array(32) }, { hash: new Uint8Array(31) }]),
      /chunks\[1\]\.hash must be 32 bytes, got 31 bytes/,
    );
  });

  test('hex round trip', () => {
    const hex = SEEDS['tenant-a'] ?? '';
    const h = hexToHash(hex);
    assert.equal(h.length, 32);
    assert.equal(hashToHex(h), hex);
    assert.equal(hashToHex(new Uint8Array(h)), hex);
  });

  test('hexToHash accepts only 64 lowercase hex digits', () => {
    const hex = SEEDS[''] ?? '';
    for (const s of [hex.toUpperCase(), hex.slice(1), `${hex}0`, `${hex.slice(1)}g`, '']) {
      assertInvalid(() => hexToHash(s), /hash must be 64 lowercase hex digits/);
    }
    assertInvalid(() => hexToHash(7 as unknown as string), /got 7/);
  });

  test('hashToHex rejects a wrong length', () => {
    assertInvalid(() => hashToHex(new Uint8Array(16)), /hash must be 32 bytes, got 16 bytes/);
  });
});
