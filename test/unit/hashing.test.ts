import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
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

// Vectors computed independently with Python's hashlib (reference script in docs/protocol.md 9.3).
const SEEDS: Record<string, string> = {
  '': '34a565440fdf6529a1deceeb2feafc2508dd2da9f482f2701e98ab8f602f4bfa',
  'tenant-a': '22aeca334410c1e1167fb24fdd79da2b4be61ac20e2845358515948588b7652b',
  'café/β': '13ff7898bca09f293a15c34a97a904701db0ad51205ac60b9bfb3958d14bd90b',
};

const LORA_SEEDS: [string, string, string][] = [
  ['', 'sql-lora', '1071aa6c4df4b94f037d34a9b22775cda29c69ce64b4b02bcedebbe840ef6c1d'],
  ['tenant-a', 'café-lora', 'b28a4c22adf82d656045a624af1aef4eed7cf5bc5b60c5f81dc715217c2699d0'],
];

// Given out of order on purpose: hashed sorted by (offset, length, id bytes).
const MM_J = [
  { id: 'img-b', offset: 300, length: 10 },
  { id: 'img-a', offset: 100, length: 200 },
  { id: 'aud', offset: 300, length: 10 },
  { id: 'vid', offset: 500, length: 12 },
];
const MM_K = [
  { id: '7b2a0c9d5e1f', offset: 0, length: 576 },
  { id: 'img-2', offset: 590, length: 10 },
];

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
  {
    name: 'I: tokens 0..599, chunk 256, partial, lora "sql-lora"',
    tokens: range(600),
    opts: { partial: true, lora: 'sql-lora' },
    expected: [
      [0, 256, 'd88c53c78ca9d1971e841302411b654ff3bf99146c479392579496abf47a767f'],
      [256, 512, '5fc8628785858c9e88d24327ffac77b539d3d41b27f43c6c4f71d1d6141d26f1'],
      [512, 600, '4bc8604f60694a979ffcbb46ec9936a76d04fe904a010ae6a5819f82178a44aa'],
    ],
  },
  {
    name: 'J: tokens 0..799, chunk 256, four mm spans',
    tokens: range(800),
    opts: { mm: MM_J },
    expected: [
      [0, 256, '02ee7be5a350f17415c167a89ab99d6b5db4ee0d8224eba7cd306ff00eb7d7dc'],
      [256, 512, 'de3a4bb7a36345e0e671a9e885cd79df1c780ae1b8df490e4f7f798c0f772c40'],
      [512, 768, 'afd3e39b52854016782d81b09fd57893f5283ffe1055438ba841927a67d663a4'],
    ],
  },
  {
    name: 'K: tokens 0..599, chunk 256, partial, salt "tenant-a", lora "café-lora", two mm spans',
    tokens: range(600),
    opts: { partial: true, salt: 'tenant-a', lora: 'café-lora', mm: MM_K },
    expected: [
      [0, 256, 'a7b705cdd00119307d78fc9e54d3b731303f0aa9dbee60f4c03fe6dcb63f0d0b'],
      [256, 512, '989fd695ff4bf0a1ce1d002b1669567888543711b6d871b4bf73d4260ef3d7f3'],
      [512, 600, '960e20e5cfe65a5f73eb34beaa8f4e645a8c6808c286e59eae9b680cfb04c72b'],
    ],
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
  for (const [salt, lora, hex] of LORA_SEEDS) {
    test(`seed for salt ${JSON.stringify(salt)} and lora ${JSON.stringify(lora)}`, () => {
      assert.equal(hashSeed(salt, lora).toString('hex'), hex);
    });
  }
  test('an empty lora is no lora', () => {
    assert.equal(hashSeed('tenant-a', '').toString('hex'), SEEDS['tenant-a']);
  });
  test('the lora seed length-prefixes salt and name, so they cannot trade bytes', () => {
    assert.notEqual(hashSeed('ab', 'c').toString('hex'), hashSeed('a', 'bc').toString('hex'));
    assert.notEqual(hashSeed('', 'x').toString('hex'), hashSeed('x').toString('hex'));
  });
  test('refuses a lora with a lone surrogate', () => {
    assertInvalid(() => hashSeed('', '\uDC00'), /lora must be a well-formed/);
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

  test('the vectors in docs/protocol.md 9.3 are these vectors', () => {
    const doc = readFileSync(new URL('../../docs/protocol.md', import.meta.url), 'utf8');
    const section = doc.slice(
      doc.indexOf('### 9.3 Test vectors'),
      doc.indexOf('#### Reference script'),
    );
    // Split into `**X.** ...` paragraphs; each one's fenced block lists its chunks.
    const blocks = new Map<string, string[]>();
    for (const part of section.split(/^(?=\*\*[A-Z]\.\*\*)/m).slice(1)) {
      const letter = part.slice(2, 3);
      const fence = /```\n([^`]*)```/.exec(part);
      blocks.set(letter, fence?.[1]?.trim().split('\n') ?? []);
    }
    for (const v of VECTORS) {
      const letter = v.name.slice(0, 1);
      assert.ok(blocks.has(letter), `vector ${letter} is in the doc`);
      assert.deepEqual(
        blocks.get(letter),
        v.expected.map((c) => c.join(' ')),
        `vector ${letter}`,
      );
    }
    for (const [, , hex] of LORA_SEEDS) assert.ok(section.includes(hex), `seed ${hex}`);
  });

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

describe('hashChunks extras (lora, mm)', () => {
  const tokens = range(1024);
  const plain = hashChunks(tokens, { chunkSize: 64 });

  test('no lora and no spans hash as before; empty lists and names are none', () => {
    assert.deepEqual(
      render(hashChunks(tokens, { chunkSize: 64, lora: '', mm: [] })),
      render(plain),
    );
  });

  test('a lora changes every chunk', () => {
    const a = hashChunks(tokens, { chunkSize: 64, lora: 'x' });
    for (let i = 0; i < a.length; i++)
      assert.ok(!a[i]?.hash.equals(plain[i]?.hash ?? Buffer.alloc(0)));
  });

  test('a span changes the chunks it overlaps and every later one, not earlier ones', () => {
    // Tokens [130, 140) lie in chunk 2.
    const a = hashChunks(tokens, { chunkSize: 64, mm: [{ id: 'img', offset: 130, length: 10 }] });
    for (let i = 0; i < a.length; i++) {
      assert.equal(a[i]?.hash.equals(plain[i]?.hash ?? Buffer.alloc(0)), i < 2, `chunk ${i}`);
    }
  });

  test('span boundaries: [offset, offset + length) overlaps chunk [start, end) exactly when offset < end and offset + length > start', () => {
    const at = (offset: number, length: number) =>
      render(hashChunks(tokens, { chunkSize: 64, mm: [{ id: 'i', offset, length }] }));
    // Ending at 128 touches chunks 1 only; starting at 128 touches chunk 2 only.
    assert.deepEqual(at(64, 64).slice(0, 1), render(plain).slice(0, 1));
    assert.notDeepEqual(at(64, 64)[1], render(plain)[1]);
    assert.deepEqual(at(127, 1).slice(0, 1), render(plain).slice(0, 1));
    assert.deepEqual(at(128, 1).slice(0, 2), render(plain).slice(0, 2));
    // A span past the hashed tokens changes nothing, which keeps the prefix property.
    assert.deepEqual(at(1024, 5), render(plain));
    const long = render(hashChunks(range(1030), { chunkSize: 64, partial: true }));
    const withSpan = render(
      hashChunks(range(1030), {
        chunkSize: 64,
        partial: true,
        mm: [{ id: 'i', offset: 1024, length: 5 }],
      }),
    );
    assert.deepEqual(withSpan.slice(0, 16), long.slice(0, 16));
    assert.notDeepEqual(withSpan[16], long[16]);
  });

  test('the order of spans does not matter; their ids, offsets and lengths do', () => {
    const base = render(hashChunks(range(800), { mm: MM_J }));
    assert.deepEqual(render(hashChunks(range(800), { mm: [...MM_J].reverse() })), base);
    const variants = [
      [{ ...MM_J[0], id: 'img-x' }, ...MM_J.slice(1)],
      [{ ...MM_J[0], offset: 301 }, ...MM_J.slice(1)],
      [{ ...MM_J[0], length: 11 }, ...MM_J.slice(1)],
      MM_J.slice(1),
    ] as (typeof MM_J)[];
    for (const mm of variants) assert.notDeepEqual(render(hashChunks(range(800), { mm })), base);
  });

  test('a string id is its UTF-8 bytes', () => {
    const a = hashChunks(tokens, { chunkSize: 64, mm: [{ id: 'é', offset: 0, length: 1 }] });
    const b = hashChunks(tokens, {
      chunkSize: 64,
      mm: [{ id: new Uint8Array([0xc3, 0xa9]), offset: 0, length: 1 }],
    });
    assert.deepEqual(render(a), render(b));
  });

  test('the prefix property holds with spans', () => {
    const long = render(hashChunks(range(800), { mm: MM_J }));
    for (const n of [256, 300, 512, 700]) {
      const short = render(hashChunks(range(n), { mm: MM_J }));
      assert.deepEqual(short, long.slice(0, short.length), `n ${n}`);
    }
  });

  test('resolveChunkHasherOptions sorts spans and takes ids as bytes', () => {
    const r = resolveChunkHasherOptions({ mm: MM_J, lora: 'l' });
    assert.equal(r.lora, 'l');
    assert.deepEqual(
      r.mm.map((s) => [s.offset, s.length, s.id.toString('utf8')]),
      [
        [100, 200, 'img-a'],
        [300, 10, 'aud'],
        [300, 10, 'img-b'],
        [500, 12, 'vid'],
      ],
    );
  });

  const bad: [string, unknown, RegExp][] = [
    ['not an array', { id: 'a', offset: 0, length: 1 }, /mm must be an array of/],
    ['a null span', [null], /mm\[0\] must be an object/],
    [
      'an empty id',
      [{ id: '', offset: 0, length: 1 }],
      /mm\[0\]\.id must be 1\.\.1024 bytes, got 0 bytes/,
    ],
    [
      'a long id',
      [{ id: 'x'.repeat(1025), offset: 0, length: 1 }],
      /mm\[0\]\.id must be 1\.\.1024 bytes, got 1025/,
    ],
    [
      'a numeric id',
      [{ id: 7, offset: 0, length: 1 }],
      /mm\[0\]\.id must be a string or a Uint8Array, got 7/,
    ],
    [
      'an ill-formed id',
      [{ id: 'a\uD800', offset: 0, length: 1 }],
      /mm\[0\]\.id must be a well-formed/,
    ],
    [
      'a negative offset',
      [{ id: 'a', offset: -1, length: 1 }],
      /mm\[0\]\.offset must be an integer >= 0, got -1/,
    ],
    ['a fractional offset', [{ id: 'a', offset: 0.5, length: 1 }], /mm\[0\]\.offset/],
    [
      'a zero length',
      [{ id: 'a', offset: 0, length: 0 }],
      /mm\[0\]\.length must be an integer >= 1, got 0/,
    ],
    ['a missing length', [{ id: 'a', offset: 0 }], /mm\[0\]\.length .* got undefined/],
    [
      'an end at 2^32',
      [
        { id: 'a', offset: 1, length: 1 },
        { id: 'a', offset: 2 ** 32 - 2, length: 2 },
      ],
      /mm\[1\]\.length must keep offset \+ length < 2\^32, got offset 4294967294 and length 2/,
    ],
  ];
  for (const [name, mm, pattern] of bad) {
    test(`rejects ${name} in mm`, () => {
      assertInvalid(() => hashChunks([1], { mm: mm as ChunkHasherOptions['mm'] }), pattern);
    });
  }

  test('accepts an id of 1024 bytes and an end of 2^32 - 1', () => {
    const mm = [
      { id: 'x'.repeat(1024), offset: 0, length: 1 },
      { id: 'y', offset: 2 ** 32 - 2, length: 1 },
    ];
    assert.equal(hashChunks([1], { partial: true, mm }).length, 1);
  });

  test('rejects a non-string or ill-formed lora', () => {
    assertInvalid(() => hashChunks([1], { lora: 3 as unknown as string }), /lora must be a string/);
    assertInvalid(() => hashChunks([1], { lora: 'a\uDBFF' }), /lora must be a well-formed/);
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
    assert.deepEqual(resolveChunkHasherOptions(), {
      chunkSize: 256,
      salt: '',
      partial: false,
      lora: '',
      mm: [],
    });
    assert.deepEqual(resolveChunkHasherOptions({ chunkSize: 16, salt: 's', partial: true }), {
      chunkSize: 16,
      salt: 's',
      partial: true,
      lora: '',
      mm: [],
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
