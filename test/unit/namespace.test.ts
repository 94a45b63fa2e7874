import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { isKvtierError } from '../../src/errors.ts';
import {
  bytesPerToken,
  canonicalNamespaceEncoding,
  deriveNamespace,
  headCovers,
  isNamespaceId,
  kvHeadRange,
  kvHeadsPerRank,
  type NamespaceSpec,
  normalizeDtype,
  requireNamespaceId,
} from '../../src/namespace/namespace.ts';

const LLAMA: NamespaceSpec = {
  modelId: 'meta-llama/Meta-Llama-3-8B',
  dtype: 'bfloat16',
  numLayers: 32,
  numKvHeads: 8,
  headDim: 128,
  blockSize: 16,
  tpSize: 2,
  tpRank: 0,
  mla: false,
  layoutVersion: 1,
};

const DSV3: NamespaceSpec = {
  modelId: 'deepseek-ai/DeepSeek-V3',
  dtype: 'bfloat16',
  numLayers: 61,
  numKvHeads: 1,
  headDim: 576,
  blockSize: 64,
  tpSize: 8,
  tpRank: 3,
  mla: true,
  layoutVersion: 1,
};

function assertInvalid(fn: () => unknown, pattern: RegExp): void {
  assert.throws(fn, (err: unknown) => {
    assert.ok(isKvtierError(err, 'KVT_INVALID_ARGUMENT'), `expected KVT_INVALID_ARGUMENT: ${err}`);
    assert.match(err.message, pattern);
    return true;
  });
}

describe('deriveNamespace worked examples', () => {
  // Ids computed independently with Python's hashlib (the reference script in docs/protocol.md section 9.3).
  test('Llama-3-8B tp2 rank 0', () => {
    const ns = deriveNamespace(LLAMA);
    assert.equal(ns.id, 'a9da765632a7de95394439b16b6ed39f');
    assert.equal(ns.label, 'meta-llama/Meta-Llama-3-8B/bfloat16/L32/H8x128/B16/h0-4/v1');
    assert.deepEqual({ ...ns.spec }, { ...LLAMA, ppSize: 1, ppRank: 0, ppFirstLayer: 0 });
    assert.ok(Object.isFrozen(ns) && Object.isFrozen(ns.spec));
  });

  test('Llama-3-8B tp2 rank 1', () => {
    assert.equal(deriveNamespace({ ...LLAMA, tpRank: 1 }).id, 'cdf60246c253dbe1fb1715f1dee10c2a');
  });

  test('DeepSeek-V3 MLA', () => {
    const ns = deriveNamespace(DSV3);
    assert.equal(ns.id, '585a8179300136bff281ba3e15397a88');
    assert.equal(ns.label, 'deepseek-ai/DeepSeek-V3/bfloat16/L61/H1x576/B64/mla/v1');
  });

  test('canonical encoding', () => {
    assert.equal(
      canonicalNamespaceEncoding({ ...LLAMA, dtype: 'bf16' }),
      'kvtier-ns/v2\nmodel_id=meta-llama/Meta-Llama-3-8B\ndtype=bfloat16\nnum_layers=32\n' +
        'num_kv_heads=8\nhead_dim=128\nblock_size=16\nmla=0\nkv_head_start=0\nkv_head_end=4\n' +
        'layout_version=1\n',
    );
    assert.match(canonicalNamespaceEncoding(DSV3), /\nmla=1\nkv_head_start=\*\nkv_head_end=\*\n/);
  });
});

describe('KV heads across TP sizes', () => {
  test('a rank holds numKvHeads / tpSize heads, or one replicated head past numKvHeads ranks', () => {
    assert.deepEqual(kvHeadRange(LLAMA), [0, 4]);
    assert.deepEqual(kvHeadRange({ ...LLAMA, tpRank: 1 }), [4, 8]);
    assert.deepEqual(kvHeadRange({ ...LLAMA, tpSize: 1, tpRank: 0 }), [0, 8]);
    assert.deepEqual(kvHeadRange({ ...LLAMA, tpSize: 4, tpRank: 3 }), [6, 8]);
    assert.deepEqual(kvHeadRange({ ...LLAMA, tpSize: 16, tpRank: 5 }), [2, 3]);
    assert.deepEqual(kvHeadRange({ ...LLAMA, tpSize: 16, tpRank: 15 }), [7, 8]);
    assert.deepEqual(kvHeadRange(DSV3), [0, 1]);
  });

  test('ranks of any TP size that hold the same heads share one id; others never do', () => {
    const ids = new Map<string, string>();
    for (const tp of [1, 2, 4, 8, 16, 32])
      for (let rank = 0; rank < tp; rank++) {
        const spec = { ...LLAMA, tpSize: tp, tpRank: rank };
        const ns = deriveNamespace(spec);
        const heads = kvHeadRange(spec).join('-');
        assert.match(ns.label, new RegExp(`/h${heads}/v1$`));
        const seen = ids.get(heads);
        if (seen === undefined) ids.set(heads, ns.id);
        else assert.equal(ns.id, seen, `tp ${tp} rank ${rank}`);
      }
    assert.equal(new Set(ids.values()).size, ids.size);
    assert.equal(ids.size, 1 + 2 + 4 + 8);
    assert.equal(
      deriveNamespace({ ...LLAMA, tpSize: 8, tpRank: 2 }).id,
      'f28719570c2cbf3b30aaa6bcaf21214e',
    );
  });

  test('covers: every other shard width, fewest shards first, overlapping the rank in order', () => {
    const shape = (spec: NamespaceSpec) =>
      headCovers(spec).map((c) => `${c.width}: ${c.shards.map((x) => `${x.start}-${x.end}`)}`);
    assert.deepEqual(shape({ ...LLAMA, tpSize: 1, tpRank: 0 }), [
      '4: 0-4,4-8',
      '2: 0-2,2-4,4-6,6-8',
      '1: 0-1,1-2,2-3,3-4,4-5,5-6,6-7,7-8',
    ]);
    assert.deepEqual(shape({ ...LLAMA, tpSize: 4, tpRank: 1 }), ['4: 0-4', '8: 0-8', '1: 2-3,3-4']);
    // More ranks than heads: the one head, read from any wider shard.
    assert.deepEqual(shape({ ...LLAMA, tpSize: 16, tpRank: 5 }), ['2: 2-4', '4: 0-4', '8: 0-8']);
    // Widths that do not nest: 12 heads, TP 3 (4 heads) from TP 4 (3 heads) reads two shards.
    assert.deepEqual(shape({ ...LLAMA, numKvHeads: 12, tpSize: 3, tpRank: 1 }), [
      '12: 0-12',
      '2: 4-6,6-8',
      '3: 3-6,6-9',
      '6: 0-6,6-12',
      '1: 4-5,5-6,6-7,7-8',
    ]);
    // Each shard's namespace is the one its own ranks derive.
    const tp2 = headCovers({ ...LLAMA, tpSize: 1, tpRank: 0 }).find((c) => c.width === 4)!;
    assert.deepEqual(
      tp2.shards.map((s) => s.namespace.id),
      [0, 1].map((r) => deriveNamespace({ ...LLAMA, tpRank: r }).id),
    );
    assert.deepEqual(headCovers(DSV3), []);
  });
});

describe('pipeline parallelism', () => {
  // Llama-3-8B at tp2 with four pipeline stages of 8 layers each (ids from Python's hashlib).
  const STAGE: NamespaceSpec = { ...LLAMA, numLayers: 8, ppSize: 4 };
  const STAGE_IDS = [
    '6cc2e884566277c77191b53f6de3433b',
    'be9f7e0c33e72523732cc63c326f401d',
    '46c457496ad2173e5c2ee07fd8eb3dcd',
    '5c38d8197a4597ed256097154ffab332',
  ];

  test('each stage has its own id', () => {
    STAGE_IDS.forEach((id, r) => {
      const ns = deriveNamespace({ ...STAGE, ppRank: r, ppFirstLayer: 8 * r });
      assert.equal(ns.id, id, `stage ${r}`);
      assert.equal(
        ns.label,
        `meta-llama/Meta-Llama-3-8B/bfloat16/L8/H8x128/B16/h0-4/pp4r${r}@L${8 * r}/v1`,
      );
    });
  });

  test('encoding appends three pp lines after layout_version', () => {
    assert.equal(
      canonicalNamespaceEncoding({ ...STAGE, ppRank: 1, ppFirstLayer: 8 }),
      'kvtier-ns/v2\nmodel_id=meta-llama/Meta-Llama-3-8B\ndtype=bfloat16\nnum_layers=8\n' +
        'num_kv_heads=8\nhead_dim=128\nblock_size=16\nmla=0\nkv_head_start=0\nkv_head_end=4\n' +
        'layout_version=1\npp_size=4\npp_rank=1\npp_first_layer=8\n',
    );
  });

  test('ppSize 1 gives the same id and encoding as a spec without pp fields', () => {
    const explicit = { ...LLAMA, ppSize: 1, ppRank: 0, ppFirstLayer: 0 };
    assert.equal(deriveNamespace(explicit).id, deriveNamespace(LLAMA).id);
    assert.equal(canonicalNamespaceEncoding(explicit), canonicalNamespaceEncoding(LLAMA));
    assert.equal(deriveNamespace({ ...LLAMA, ppSize: 1 }).label, deriveNamespace(LLAMA).label);
  });

  test('MLA keeps the pp lines: stages differ, tp ranks within a stage do not', () => {
    const stage1 = { ...DSV3, numLayers: 30, ppSize: 2, ppRank: 1, ppFirstLayer: 31 };
    const ns = deriveNamespace(stage1);
    assert.equal(ns.id, '6bbcf286cb2041fd8ca787ff1e95a52f');
    assert.equal(ns.label, 'deepseek-ai/DeepSeek-V3/bfloat16/L30/H1x576/B64/mla/pp2r1@L31/v1');
    assert.equal(deriveNamespace({ ...stage1, tpRank: 0 }).id, ns.id);
    assert.notEqual(deriveNamespace({ ...stage1, ppRank: 0, ppFirstLayer: 0 }).id, ns.id);
    assert.match(
      canonicalNamespaceEncoding(stage1),
      /\npp_size=2\npp_rank=1\npp_first_layer=31\n$/,
    );
  });

  test('every pp field changes the id', () => {
    const base = { ...STAGE, ppRank: 1, ppFirstLayer: 8 };
    const ids = new Set(
      [
        base,
        { ...base, ppSize: 8 },
        { ...base, ppRank: 2 },
        { ...base, ppFirstLayer: 9 },
        { ...base, ppSize: 1, ppRank: 0, ppFirstLayer: 0 },
      ].map((s) => deriveNamespace(s).id),
    );
    assert.equal(ids.size, 5);
  });

  const bad: [string, Partial<NamespaceSpec>, RegExp][] = [
    ['ppSize 0', { ppSize: 0 }, /namespace\.ppSize must be an integer in \[1, 1024\], got 0/],
    ['ppSize over 1024', { ppSize: 1025 }, /namespace\.ppSize/],
    ['fractional ppSize', { ppSize: 2.5 }, /namespace\.ppSize/],
    [
      'ppRank out of range',
      { ppSize: 4, ppRank: 4 },
      /namespace\.ppRank must be an integer in \[0, 3\], got 4/,
    ],
    ['ppRank without ppSize', { ppRank: 1 }, /namespace\.ppRank must be an integer in \[0, 0\]/],
    [
      'negative ppFirstLayer',
      { ppSize: 2, ppRank: 1, ppFirstLayer: -1 },
      /namespace\.ppFirstLayer/,
    ],
    ['string ppSize', { ppSize: '2' as unknown as number }, /namespace\.ppSize/],
    [
      'ppFirstLayer without pipeline parallelism',
      { ppFirstLayer: 4 },
      /namespace\.ppFirstLayer must be 0 when namespace\.ppSize is 1/,
    ],
  ];
  for (const [name, patch, pattern] of bad) {
    test(`rejects ${name}`, () => {
      assertInvalid(() => deriveNamespace({ ...LLAMA, ...patch }), pattern);
    });
  }
});

describe('deriveNamespace identity', () => {
  test('is deterministic', () => {
    assert.equal(deriveNamespace({ ...LLAMA }).id, deriveNamespace({ ...LLAMA }).id);
  });

  test('MLA ignores tpRank and tpSize', () => {
    const ids = new Set(
      [
        { tpSize: 1, tpRank: 0 },
        { tpSize: 8, tpRank: 0 },
        { tpSize: 8, tpRank: 7 },
        { tpSize: 16, tpRank: 5 },
      ].map((tp) => deriveNamespace({ ...DSV3, ...tp }).id),
    );
    assert.equal(ids.size, 1);
  });

  test('non-MLA ranks and sizes differ', () => {
    const ids = new Set(
      [
        { tpSize: 1, tpRank: 0 },
        { tpSize: 2, tpRank: 0 },
        { tpSize: 2, tpRank: 1 },
        { tpSize: 4, tpRank: 1 },
      ].map((tp) => deriveNamespace({ ...LLAMA, ...tp }).id),
    );
    assert.equal(ids.size, 4);
  });

  test('every field changes the id', () => {
    const base = deriveNamespace(LLAMA).id;
    const variants: Partial<NamespaceSpec>[] = [
      { modelId: 'meta-llama/Meta-Llama-3-8B-Instruct' },
      { modelId: 'meta-llama/meta-llama-3-8b' },
      { dtype: 'float16' },
      { numLayers: 31 },
      { numKvHeads: 16 },
      { headDim: 64 },
      { blockSize: 32 },
      { tpSize: 4 },
      { tpRank: 1 },
      { mla: true },
      { layoutVersion: 2 },
    ];
    const seen = new Set([base]);
    for (const v of variants) {
      const id = deriveNamespace({ ...LLAMA, ...v }).id;
      assert.ok(!seen.has(id), `changing ${JSON.stringify(v)} must change the id`);
      seen.add(id);
    }
  });

  test('dtype aliases give the same id as the canonical spelling', () => {
    const id = deriveNamespace(LLAMA).id;
    for (const dtype of ['bf16', 'BF16', 'torch.bfloat16', ' bfloat16 ']) {
      const ns = deriveNamespace({ ...LLAMA, dtype });
      assert.equal(ns.id, id, dtype);
      assert.equal(ns.spec.dtype, 'bfloat16');
    }
  });
});

describe('normalizeDtype', () => {
  const cases: [string, string][] = [
    ['fp16', 'float16'],
    ['half', 'float16'],
    ['torch.float16', 'float16'],
    ['fp32', 'float32'],
    ['float', 'float32'],
    ['fp8', 'float8_e4m3'],
    ['float8_e4m3fn', 'float8_e4m3'],
    ['fp8_e5m2', 'float8_e5m2'],
    ['int8', 'int8'],
    ['uint8', 'uint8'],
  ];
  for (const [alias, canonical] of cases) {
    test(`${alias} -> ${canonical}`, () => assert.equal(normalizeDtype(alias), canonical));
  }
  test('rejects unknown and ambiguous dtypes', () => {
    for (const d of ['auto', 'float8_e4m3fnuz', 'int4', '']) {
      assertInvalid(() => normalizeDtype(d), /dtype must be/);
    }
  });
});

describe('deriveNamespace validation', () => {
  const bad: [string, Partial<Record<keyof NamespaceSpec, unknown>>, RegExp][] = [
    ['empty modelId', { modelId: '' }, /namespace\.modelId must be a non-empty string/],
    ['non-string modelId', { modelId: 3 }, /namespace\.modelId must be a non-empty string, got 3/],
    ['padded modelId', { modelId: ' llama ' }, /namespace\.modelId must be without leading/],
    ['newline in modelId', { modelId: 'a\ndtype=x' }, /without control characters/],
    ['long modelId', { modelId: 'x'.repeat(513) }, /at most 512 characters/],
    ['unknown dtype', { dtype: 'auto' }, /namespace\.dtype must be one of/],
    ['zero layers', { numLayers: 0 }, /namespace\.numLayers must be an integer in \[1, /],
    ['fractional heads', { numKvHeads: 1.5 }, /namespace\.numKvHeads must be an integer/],
    ['zero headDim', { headDim: 0 }, /namespace\.headDim/],
    [
      'string blockSize',
      { blockSize: '16' },
      /namespace\.blockSize must be an integer .* got "16"/,
    ],
    ['zero tpSize', { tpSize: 0 }, /namespace\.tpSize/],
    ['rank out of range', { tpRank: 2 }, /namespace\.tpRank must be an integer in \[0, 1\], got 2/],
    ['negative rank', { tpRank: -1 }, /namespace\.tpRank/],
    ['non-boolean mla', { mla: 'no' }, /namespace\.mla must be a boolean/],
    ['layout 0', { layoutVersion: 0 }, /namespace\.layoutVersion/],
    [
      'heads not divisible by tp',
      { numKvHeads: 8, tpSize: 3, tpRank: 0 },
      /numKvHeads \(8\) and namespace\.tpSize \(3\) must divide one another/,
    ],
  ];
  for (const [name, patch, pattern] of bad) {
    test(`rejects ${name}`, () => {
      assertInvalid(() => deriveNamespace({ ...LLAMA, ...patch } as NamespaceSpec), pattern);
    });
  }

  test('rejects a non-object spec', () => {
    assertInvalid(() => deriveNamespace(null as unknown as NamespaceSpec), /must be an object/);
  });

  test('MLA does not require heads to divide tp size', () => {
    assert.doesNotThrow(() => deriveNamespace({ ...DSV3, tpSize: 3, tpRank: 2 }));
  });
});

describe('namespace ids', () => {
  test('isNamespaceId', () => {
    assert.ok(isNamespaceId(deriveNamespace(LLAMA).id));
    for (const s of [
      '',
      'ABCDEF0123456789abcdef0123456789',
      'abc',
      `${'a'.repeat(31)}g`,
      7,
      null,
    ]) {
      assert.equal(isNamespaceId(s), false, String(s));
    }
    assert.equal(isNamespaceId('a'.repeat(33)), false);
  });

  test('requireNamespaceId returns valid ids and names the field otherwise', () => {
    const id = deriveNamespace(DSV3).id;
    assert.equal(requireNamespaceId('lookup.namespace', id), id);
    assertInvalid(
      () => requireNamespaceId('lookup.namespace', 'xyz'),
      /lookup\.namespace must be a namespace id \(32 lowercase hex digits\), got "xyz"/,
    );
  });
});

describe('bytesPerToken', () => {
  test('Llama-3-8B at tp1 is 128 KiB per token; tp2 halves it per rank', () => {
    assert.equal(bytesPerToken({ ...LLAMA, tpSize: 1, tpRank: 0 }), 128 * 1024);
    assert.equal(bytesPerToken(LLAMA), 64 * 1024);
    assert.equal(kvHeadsPerRank(LLAMA), 4);
  });

  test('heads are replicated when there are fewer heads than ranks', () => {
    const spec = { ...LLAMA, tpSize: 16, tpRank: 15 };
    assert.equal(kvHeadsPerRank(spec), 1);
    assert.equal(bytesPerToken(spec), 2 * 32 * 1 * 128 * 2);
  });

  test('dtype sizes', () => {
    const one = { ...LLAMA, numLayers: 1, numKvHeads: 1, headDim: 1, tpSize: 1, tpRank: 0 };
    const sizes: [string, number][] = [
      ['float32', 8],
      ['fp16', 4],
      ['bf16', 4],
      ['fp8', 2],
      ['float8_e5m2', 2],
      ['int8', 2],
      ['uint8', 2],
    ];
    for (const [dtype, bytes] of sizes)
      assert.equal(bytesPerToken({ ...one, dtype }), bytes, dtype);
  });

  test('MLA stores one latent per layer, the same on every rank', () => {
    assert.equal(bytesPerToken(DSV3), 61 * 576 * 2);
    assert.equal(bytesPerToken({ ...DSV3, tpSize: 1, tpRank: 0 }), 61 * 576 * 2);
    assert.equal(kvHeadsPerRank(DSV3), 1);
  });

  test('validates the spec', () => {
    assertInvalid(() => bytesPerToken({ ...LLAMA, dtype: 'auto' }), /namespace\.dtype/);
  });
});
