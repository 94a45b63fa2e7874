import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { KVTIER_ERROR_CODES, KvtierError, type KvtierErrorCode } from '../../src/errors.ts';
import { chunkHash } from '../../src/hashing/chunk-hash.ts';
import {
  decodeHeader,
  decodeReply,
  decodeRequest,
  encodeReply,
  encodeRequest,
  hashesToHex,
  peekRequestId,
} from '../../src/protocol/codec.ts';
import {
  DEFAULT_LIMITS,
  type LookupConfig,
  type LookupRequest,
  type LookupResult,
  type Reply,
  type Request,
  WIRE_LIMITS,
} from '../../src/protocol/messages.ts';

const NS_A = 'a9da765632a7de95394439b16b6ed39f';
const NS_B = 'ccd750d5fc54b2450fad560f67df94f4';
const H0 = chunkHash('9023a6f72e494c809d3ea5b388ef2ff49d20cc1d48e046e2a6c8d259b8592548');
const H1 = chunkHash('3b0d4074d7c396f8848f7b6439a3a8d85f5996b37d759ea087988e8960a9b73c');

function lookup(over: Partial<LookupRequest> = {}): LookupRequest {
  return {
    type: 'lookup',
    requestId: 7,
    lookupId: 'req-1',
    namespaces: [NS_A],
    hashes: Buffer.from(H0 + H1, 'hex'),
    tokenCounts: Uint32Array.of(256, 256),
    config: { pin: true },
    ...over,
  };
}

const REQUESTS: Request[] = [
  lookup(),
  lookup({ requestId: 0xffffffff, lookupId: 'é/β', namespaces: [NS_A, NS_B], config: {} }),
  lookup({ hashes: Buffer.alloc(0), tokenCounts: new Uint32Array(0), config: { prefetch: false } }),
  lookup({ config: { pin: false, prefetch: true } }),
  { type: 'cancel', requestId: 3, lookupId: 'req-1' },
  { type: 'clear', requestId: 4, namespaces: [] },
  { type: 'clear', requestId: 5, namespaces: [NS_A, NS_B] },
  { type: 'ping', requestId: 6 },
  { type: 'stats', requestId: 8 },
  {
    type: 'put',
    requestId: 9,
    namespace: NS_B,
    hash: H1,
    tokens: 17,
    payload: Buffer.from([1, 2, 3]),
  },
  { type: 'get', requestId: 10, namespace: NS_A, hash: H0 },
];

const REPLIES: Reply[] = [
  {
    type: 'lookup-result',
    requestId: 7,
    lookupId: 'req-1',
    status: 'ok',
    epoch: 3,
    hitTokens: 512,
    hitChunks: 2,
    tiers: [
      { tier: 'cpu', tokens: 256 },
      { tier: 'disk', tokens: 256 },
    ],
  },
  {
    type: 'lookup-result',
    requestId: 1,
    lookupId: 'x',
    status: 'canceled',
    epoch: 0,
    hitTokens: 0,
    hitChunks: 0,
    tiers: [],
  },
  {
    type: 'lookup-result',
    requestId: 2,
    lookupId: 'y',
    status: 'stale',
    epoch: 0xffffffff,
    hitTokens: 0,
    hitChunks: 0,
    tiers: [],
  },
  { type: 'cancel-result', requestId: 3, found: true },
  { type: 'cancel-result', requestId: 3, found: false },
  { type: 'clear-result', requestId: 4, epoch: 12 },
  { type: 'pong', requestId: 6, info: { protocolVersion: 1, limits: { ...DEFAULT_LIMITS } } },
  { type: 'stats-result', requestId: 8, stats: { epoch: 2, tiers: [{ name: 'cpu' }] } },
  { type: 'put-result', requestId: 9, outcome: 'stored' },
  { type: 'put-result', requestId: 9, outcome: 'exists' },
  { type: 'put-result', requestId: 9, outcome: 'dropped' },
  { type: 'get-result', requestId: 10, found: true, tokens: 17, payload: Buffer.from([9, 8]) },
  { type: 'get-result', requestId: 10, found: false, tokens: 0, payload: Buffer.alloc(0) },
  ...KVTIER_ERROR_CODES.map(
    (code): Reply => ({ type: 'error', requestId: 11, code, message: `boom ${code} ✓` }),
  ),
];

function throwsCode(fn: () => unknown, code: KvtierErrorCode, label = ''): void {
  assert.throws(
    fn,
    (err: unknown) => {
      assert.ok(err instanceof KvtierError, `${label}: expected a KvtierError, got ${String(err)}`);
      assert.equal(err.code, code, `${label}: ${err.message}`);
      return true;
    },
    label,
  );
}

/** Builds a frame by hand (independently of the codec) from a header and body parts. */
function frame(type: number, requestId: number, ...parts: (Buffer | number[])[]): Buffer {
  const head = Buffer.alloc(8);
  head.write('kv', 0, 'latin1');
  head[2] = 1;
  head[3] = type;
  head.writeUInt32LE(requestId, 4);
  return Buffer.concat([head, ...parts.map((p) => (Buffer.isBuffer(p) ? p : Buffer.from(p)))]);
}
const u16 = (v: number) => {
  const b = Buffer.alloc(2);
  b.writeUInt16LE(v);
  return b;
};
const u32 = (v: number) => {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(v);
  return b;
};
const str = (s: string | Buffer) => {
  const b = Buffer.isBuffer(s) ? s : Buffer.from(s, 'utf8');
  return Buffer.concat([u16(b.length), b]);
};

interface LookupParts {
  id?: Buffer | string;
  nsCount?: number;
  chunks?: number;
  hashBytes?: number;
  counts?: number[];
  config?: Buffer | string;
  configLen?: number;
}

/** A LOOKUP frame with any field overridden, valid ones included. */
function lookupFrame(p: LookupParts = {}): Buffer {
  const nsCount = p.nsCount ?? 1;
  const counts = p.counts ?? [256, 256];
  const cfg =
    typeof p.config === 'string' ? Buffer.from(p.config, 'utf8') : (p.config ?? Buffer.alloc(0));
  return frame(
    0x01,
    7,
    str(p.id ?? 'req-1'),
    [nsCount],
    Buffer.alloc(16 * nsCount, 0xab),
    u32(p.chunks ?? counts.length),
    Buffer.alloc(p.hashBytes ?? 32 * counts.length, 0xcd),
    Buffer.concat(counts.map(u32)),
    u32(p.configLen ?? cfg.length),
    cfg,
  );
}

function putFrame(tokens: number, payloadLen: number, payload = Buffer.alloc(payloadLen, 7)) {
  return frame(
    0x05,
    9,
    Buffer.alloc(16, 1),
    Buffer.alloc(32, 2),
    u32(tokens),
    u32(payloadLen),
    payload,
  );
}

describe('codec round trip', () => {
  it('decodes every request type back to what was encoded', () => {
    for (const req of REQUESTS) {
      assert.deepEqual(decodeRequest(encodeRequest(req)), req, req.type);
    }
  });

  it('decodes every reply type back to what was encoded', () => {
    for (const rep of REPLIES) {
      assert.deepEqual(decodeReply(encodeReply(rep)), rep, rep.type);
    }
  });

  it('accepts a plain Uint8Array view, not only a Buffer', () => {
    const bytes = encodeRequest(lookup());
    const copy = new Uint8Array(bytes.length + 3);
    copy.set(bytes, 3);
    assert.deepEqual(decodeRequest(copy.subarray(3)), lookup());
  });

  it('reads the header and peeks the request id', () => {
    const bytes = encodeRequest({ type: 'ping', requestId: 0xdeadbeef });
    assert.deepEqual(decodeHeader(bytes), { version: 1, type: 0x04, requestId: 0xdeadbeef });
    assert.equal(peekRequestId(bytes), 0xdeadbeef);
    assert.equal(peekRequestId(bytes.subarray(0, 7)), 0);
    const badMagic = Buffer.from(bytes);
    badMagic[0] = 0;
    assert.equal(peekRequestId(badMagic), 0xdeadbeef);
  });

  it('splits packed hashes into hex', () => {
    assert.deepEqual(hashesToHex(Buffer.from(H0 + H1, 'hex')), [H0, H1]);
    assert.deepEqual(hashesToHex(Buffer.alloc(0)), []);
  });

  it('sends an empty config as zero bytes', () => {
    const bytes = encodeRequest(lookup({ config: {} }));
    assert.equal(bytes.readUInt32LE(bytes.length - 4), 0);
  });

  it('truncates long error messages at a character boundary', () => {
    const message = 'é'.repeat(600);
    const rep = decodeReply(
      encodeReply({ type: 'error', requestId: 1, code: 'KVT_BACKEND', message }),
    );
    assert.equal(rep.type, 'error');
    if (rep.type !== 'error') return;
    assert.equal(Buffer.byteLength(rep.message), WIRE_LIMITS.maxErrorMessageBytes);
    assert.ok(message.startsWith(rep.message));
  });

  it('maps an unknown error code to KVT_INTERNAL', () => {
    const rep = decodeReply(frame(0xff, 5, str('KVT_SOMETHING_NEW'), str('hi')));
    assert.deepEqual(rep, { type: 'error', requestId: 5, code: 'KVT_INTERNAL', message: 'hi' });
  });
});

/** Hex bytes of a `<!-- codec-example: NAME -->` block in docs/protocol.md, comments stripped. */
function docExample(doc: string, name: string): Buffer {
  const re = new RegExp(`<!-- codec-example: ${name} -->\\s*\`\`\`text\\n([\\s\\S]*?)\`\`\``);
  const m = re.exec(doc);
  assert.ok(m?.[1] !== undefined, `docs/protocol.md has no codec-example block "${name}"`);
  const hex = m[1]
    .split('\n')
    .map((line) => line.split('#')[0]!)
    .join('')
    .replace(/\s+/g, '');
  assert.match(hex, /^([0-9a-f]{2})+$/, `block "${name}" must hold hex bytes`);
  return Buffer.from(hex, 'hex');
}

describe('worked example in docs/protocol.md', () => {
  const doc = readFileSync(new URL('../../docs/protocol.md', import.meta.url), 'utf8');
  const result: LookupResult = {
    type: 'lookup-result',
    requestId: 7,
    lookupId: 'req-1',
    status: 'ok',
    epoch: 3,
    hitTokens: 512,
    hitChunks: 2,
    tiers: [
      { tier: 'cpu', tokens: 256 },
      { tier: 'disk', tokens: 256 },
    ],
  };

  it('LOOKUP request bytes match the codec both ways', () => {
    const bytes = docExample(doc, 'lookup-request');
    assert.equal(bytes.length, 124);
    assert.deepEqual(encodeRequest(lookup()), bytes);
    assert.deepEqual(decodeRequest(bytes), lookup());
  });

  it('LOOKUP_RESULT bytes match the codec both ways', () => {
    const bytes = docExample(doc, 'lookup-result');
    assert.equal(bytes.length, 48);
    assert.deepEqual(encodeReply(result), bytes);
    assert.deepEqual(decodeReply(bytes), result);
  });
});

describe('decoder validation', () => {
  const valid = REQUESTS.map((r) => encodeRequest(r));

  it('refuses short frames, bad magic, bad version and unknown types', () => {
    const ping = encodeRequest({ type: 'ping', requestId: 1 });
    for (let n = 0; n < 8; n++)
      throwsCode(() => decodeRequest(ping.subarray(0, n)), 'KVT_PROTOCOL', `len ${n}`);
    for (const [at, v] of [
      [0, 0x6a],
      [1, 0x00],
      [2, 0],
      [2, 2],
      [2, 0xff],
    ] as const) {
      const bad = Buffer.from(ping);
      bad[at] = v;
      throwsCode(() => decodeRequest(bad), 'KVT_PROTOCOL', `byte ${at} = ${v}`);
      throwsCode(() => decodeReply(bad), 'KVT_PROTOCOL', `reply byte ${at} = ${v}`);
    }
    for (const type of [0x00, 0x08, 0x7f, 0x80, 0x81, 0x84, 0xff]) {
      throwsCode(() => decodeRequest(frame(type, 1)), 'KVT_PROTOCOL', `request type ${type}`);
    }
    for (const type of [0x00, 0x01, 0x04, 0x88]) {
      throwsCode(() => decodeReply(frame(type, 1)), 'KVT_PROTOCOL', `reply type ${type}`);
    }
  });

  it('refuses every truncation of every valid request and reply', () => {
    for (const bytes of valid) {
      for (let n = 0; n < bytes.length; n++) {
        throwsCode(
          () => decodeRequest(bytes.subarray(0, n)),
          'KVT_PROTOCOL',
          `type ${bytes[3]} cut at ${n}`,
        );
      }
    }
    for (const rep of REPLIES) {
      const bytes = encodeReply(rep);
      for (let n = 0; n < bytes.length; n++) {
        throwsCode(
          () => decodeReply(bytes.subarray(0, n)),
          'KVT_PROTOCOL',
          `${rep.type} cut at ${n}`,
        );
      }
    }
  });

  it('refuses trailing bytes after every request and every non-error reply', () => {
    for (const bytes of valid) {
      throwsCode(
        () => decodeRequest(Buffer.concat([bytes, Buffer.of(0)])),
        'KVT_PROTOCOL',
        `type ${bytes[3]}`,
      );
    }
    for (const rep of REPLIES.filter((r) => r.type !== 'error')) {
      throwsCode(
        () => decodeReply(Buffer.concat([encodeReply(rep), Buffer.of(0)])),
        'KVT_PROTOCOL',
        rep.type,
      );
    }
  });

  it('enforces the chunk count limit, default and configured', () => {
    const max = DEFAULT_LIMITS.maxChunksPerLookup;
    throwsCode(
      () => decodeRequest(lookupFrame({ chunks: max + 1, hashBytes: 0, counts: [] })),
      'KVT_TOO_LARGE',
    );
    const atMax = lookupFrame({ counts: new Array<number>(max).fill(1) });
    assert.equal((decodeRequest(atMax) as LookupRequest).tokenCounts.length, max);
    const limits = { ...DEFAULT_LIMITS, maxChunksPerLookup: 2 };
    throwsCode(() => decodeRequest(lookupFrame({ counts: [1, 1, 1] }), limits), 'KVT_TOO_LARGE');
    assert.equal(
      (decodeRequest(lookupFrame({ counts: [1, 1] }), limits) as LookupRequest).tokenCounts.length,
      2,
    );
  });

  it('enforces token counts of 1..maxTokensPerChunk in LOOKUP and PUT', () => {
    const max = DEFAULT_LIMITS.maxTokensPerChunk;
    throwsCode(() => decodeRequest(lookupFrame({ counts: [256, 0] })), 'KVT_INVALID_ARGUMENT');
    throwsCode(() => decodeRequest(lookupFrame({ counts: [max + 1] })), 'KVT_INVALID_ARGUMENT');
    throwsCode(() => decodeRequest(lookupFrame({ counts: [0xffffffff] })), 'KVT_INVALID_ARGUMENT');
    assert.deepEqual(
      (decodeRequest(lookupFrame({ counts: [1, max] })) as LookupRequest).tokenCounts,
      Uint32Array.of(1, max),
    );
    throwsCode(
      () =>
        decodeRequest(lookupFrame({ counts: [5] }), { ...DEFAULT_LIMITS, maxTokensPerChunk: 4 }),
      'KVT_INVALID_ARGUMENT',
    );
    throwsCode(() => decodeRequest(putFrame(0, 4)), 'KVT_INVALID_ARGUMENT');
    throwsCode(() => decodeRequest(putFrame(max + 1, 4)), 'KVT_INVALID_ARGUMENT');
    assert.equal(decodeRequest(putFrame(max, 4)).type, 'put');
    // Long lists too (read in one copy, then checked), naming the element out of range.
    const long = Array.from({ length: 100 }, (_, i) => 1 + i);
    assert.deepEqual(
      (decodeRequest(lookupFrame({ counts: long })) as LookupRequest).tokenCounts,
      Uint32Array.from(long),
    );
    long[70] = 0;
    assert.throws(() => decodeRequest(lookupFrame({ counts: long })), {
      code: 'KVT_INVALID_ARGUMENT',
      message: /token count of element 70 is 0, allowed 1\.\./,
    });
    long[70] = max + 1;
    throwsCode(() => decodeRequest(lookupFrame({ counts: long })), 'KVT_INVALID_ARGUMENT');
  });

  it('enforces the payload limit and refuses an empty payload', () => {
    // The declared length alone is refused, before any payload bytes are needed.
    throwsCode(
      () => decodeRequest(putFrame(1, DEFAULT_LIMITS.maxPayloadBytes + 1, Buffer.alloc(0))),
      'KVT_TOO_LARGE',
    );
    const limits = { ...DEFAULT_LIMITS, maxPayloadBytes: 16 };
    throwsCode(() => decodeRequest(putFrame(1, 17), limits), 'KVT_TOO_LARGE');
    assert.equal(decodeRequest(putFrame(1, 16), limits).type, 'put');
    throwsCode(() => decodeRequest(putFrame(1, 0)), 'KVT_INVALID_ARGUMENT');
  });

  it('validates the lookup config', () => {
    throwsCode(() => decodeRequest(lookupFrame({ config: '{"pin":tru' })), 'KVT_PROTOCOL');
    throwsCode(() => decodeRequest(lookupFrame({ config: '\u0000' })), 'KVT_PROTOCOL');
    // Invalid UTF-8 inside a JSON string (a lone continuation byte, a truncated sequence, an
    // overlong form) is refused, not replaced by U+FFFD.
    for (const bad of [[0x80], [0xe2, 0x82], [0xc0, 0xaf]]) {
      const config = Buffer.concat([
        Buffer.from('{"pin":true,"note":"'),
        Buffer.from(bad),
        Buffer.from('"}'),
      ]);
      throwsCode(() => decodeRequest(lookupFrame({ config })), 'KVT_PROTOCOL', String(bad));
    }
    for (const bad of [
      'null',
      '[]',
      '5',
      '"pin"',
      'true',
      '{"pin":1}',
      '{"pin":"true"}',
      '{"prefetch":null}',
      '{"prefetch":0}',
    ]) {
      throwsCode(() => decodeRequest(lookupFrame({ config: bad })), 'KVT_INVALID_ARGUMENT', bad);
    }
    throwsCode(
      () => decodeRequest(lookupFrame({ configLen: WIRE_LIMITS.maxConfigBytes + 1 })),
      'KVT_TOO_LARGE',
    );
    const big = `{"pin":false,"x":"${'a'.repeat(WIRE_LIMITS.maxConfigBytes - 20)}"}`;
    assert.equal(Buffer.byteLength(big), WIRE_LIMITS.maxConfigBytes);
    const cfg = (text: string) =>
      (decodeRequest(lookupFrame({ config: text })) as LookupRequest).config;
    assert.deepEqual(cfg(big), { pin: false } satisfies LookupConfig);
    assert.deepEqual(cfg('{"prefetch":false,"future":[1,2]}'), { prefetch: false });
    assert.deepEqual(cfg('{}'), {});
    assert.deepEqual(cfg(''), {});
    assert.deepEqual(cfg('{"pin":true,"note":"é β 🙂"}'), { pin: true });
  });

  it('validates lookup ids and namespace counts', () => {
    throwsCode(() => decodeRequest(lookupFrame({ id: '' })), 'KVT_INVALID_ARGUMENT');
    throwsCode(() => decodeRequest(lookupFrame({ id: 'a'.repeat(257) })), 'KVT_TOO_LARGE');
    throwsCode(
      () => decodeRequest(lookupFrame({ id: 'ü'.repeat(129) })),
      'KVT_TOO_LARGE',
      '258 UTF-8 bytes',
    );
    assert.equal(
      (decodeRequest(lookupFrame({ id: 'ü'.repeat(128) })) as LookupRequest).lookupId,
      'ü'.repeat(128),
    );
    throwsCode(
      () => decodeRequest(frame(0x02, 1, str('a'.repeat(257)))),
      'KVT_TOO_LARGE',
      'cancel',
    );
    throwsCode(
      () => decodeRequest(frame(0x02, 1, str(''))),
      'KVT_INVALID_ARGUMENT',
      'empty cancel id',
    );
    throwsCode(() => decodeRequest(lookupFrame({ nsCount: 0 })), 'KVT_INVALID_ARGUMENT');
    throwsCode(() => decodeRequest(lookupFrame({ nsCount: 17 })), 'KVT_INVALID_ARGUMENT');
    throwsCode(() => decodeRequest(lookupFrame({ nsCount: 255 })), 'KVT_INVALID_ARGUMENT');
    assert.equal(
      (decodeRequest(lookupFrame({ nsCount: 16 })) as LookupRequest).namespaces.length,
      16,
    );
  });

  it('refuses unknown lookup statuses and put outcomes in replies', () => {
    throwsCode(
      () => decodeReply(frame(0x81, 1, str('x'), [3], u32(0), u32(0), u32(0), [0])),
      'KVT_PROTOCOL',
    );
    throwsCode(() => decodeReply(frame(0x85, 1, [3])), 'KVT_PROTOCOL');
    throwsCode(() => decodeReply(frame(0x84, 1, u32(3), Buffer.from('{x}'))), 'KVT_PROTOCOL');
    throwsCode(() => decodeReply(frame(0x81, 1, str('a'.repeat(257)))), 'KVT_TOO_LARGE');
  });
});

describe('encoder validation', () => {
  it('refuses values the wire cannot carry', () => {
    throwsCode(() => encodeRequest(lookup({ lookupId: 'a'.repeat(257) })), 'KVT_TOO_LARGE');
    throwsCode(() => encodeRequest(lookup({ namespaces: [] })), 'KVT_INVALID_ARGUMENT');
    throwsCode(
      () => encodeRequest(lookup({ namespaces: new Array<string>(17).fill(NS_A) })),
      'KVT_INVALID_ARGUMENT',
    );
    throwsCode(
      () => encodeRequest(lookup({ namespaces: [NS_A.toUpperCase()] })),
      'KVT_INVALID_ARGUMENT',
    );
    throwsCode(
      () => encodeRequest(lookup({ namespaces: [NS_A.slice(2)] })),
      'KVT_INVALID_ARGUMENT',
    );
    throwsCode(
      () => encodeRequest(lookup({ tokenCounts: Uint32Array.of(256) })),
      'KVT_INVALID_ARGUMENT',
    );
    const n = WIRE_LIMITS.maxChunksPerLookup + 1;
    throwsCode(
      () =>
        encodeRequest(lookup({ hashes: Buffer.alloc(32 * n), tokenCounts: new Uint32Array(n) })),
      'KVT_TOO_LARGE',
    );
    const config = { pin: true, pad: 'x'.repeat(WIRE_LIMITS.maxConfigBytes) } as LookupConfig;
    throwsCode(() => encodeRequest(lookup({ config })), 'KVT_TOO_LARGE');
    throwsCode(
      () => encodeRequest({ type: 'cancel', requestId: 1, lookupId: 'é'.repeat(129) }),
      'KVT_TOO_LARGE',
    );
    throwsCode(
      () =>
        encodeRequest({
          type: 'clear',
          requestId: 1,
          namespaces: new Array<string>(256).fill(NS_A),
        }),
      'KVT_TOO_LARGE',
    );
    throwsCode(
      () => encodeRequest({ type: 'clear', requestId: 1, namespaces: ['nope'] }),
      'KVT_INVALID_ARGUMENT',
    );
    const put = {
      type: 'put',
      requestId: 1,
      namespace: NS_A,
      hash: H0,
      tokens: 1,
      payload: Buffer.of(1),
    } as const;
    throwsCode(() => encodeRequest({ ...put, namespace: 'g'.repeat(32) }), 'KVT_INVALID_ARGUMENT');
    // A hash is checked where text becomes a ChunkHash (the client's put and get), not re-checked here.
    throwsCode(() => chunkHash(H0.slice(1)), 'KVT_INVALID_ARGUMENT');
    throwsCode(() => chunkHash(`${H0}00`), 'KVT_INVALID_ARGUMENT');
    throwsCode(() => chunkHash(H0.toUpperCase()), 'KVT_INVALID_ARGUMENT');
  });
});

describe('identity and range of fields', () => {
  it('refuses invalid UTF-8 in a lookup id instead of rewriting it', () => {
    throwsCode(() => decodeRequest(lookupFrame({ id: Buffer.from([0x66, 0xff]) })), 'KVT_PROTOCOL');
    throwsCode(() => decodeRequest(lookupFrame({ id: Buffer.alloc(256, 0xff) })), 'KVT_PROTOCOL');
    const ok = decodeRequest(lookupFrame({ id: Buffer.from('é-1', 'utf8') })) as LookupRequest;
    assert.equal(ok.lookupId, 'é-1');
  });

  it('refuses u32 fields it cannot represent instead of wrapping them', () => {
    const rep: LookupResult = {
      type: 'lookup-result',
      requestId: 1,
      lookupId: 'x',
      status: 'ok',
      epoch: 0,
      hitTokens: 2 ** 32,
      hitChunks: 1,
      tiers: [],
    };
    throwsCode(() => encodeReply(rep), 'KVT_INTERNAL');
    throwsCode(() => encodeReply({ ...rep, hitTokens: -1 }), 'KVT_INTERNAL');
  });
});

/** Deterministic PRNG (mulberry32) so a failing fuzz case reproduces. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const FUZZ_CODES: ReadonlySet<string> = new Set([
  'KVT_PROTOCOL',
  'KVT_TOO_LARGE',
  'KVT_INVALID_ARGUMENT',
]);

describe('decoder fuzz', () => {
  it('only ever returns a message or throws a KvtierError with a protocol code', () => {
    const random = rng(0x6b76);
    const int = (n: number) => Math.floor(random() * n);
    const seeds = [
      ...REQUESTS.map((r) => encodeRequest(r)),
      ...REPLIES.map((r) => encodeReply(r)),
      lookupFrame({ config: '{"pin":false,"prefetch":true}' }),
    ];
    const smallLimits = { maxChunksPerLookup: 4, maxPayloadBytes: 8, maxTokensPerChunk: 300 };
    const outcomes = { decoded: 0, refused: 0 };
    const codes = new Set<string>();
    for (let i = 0; i < 4000; i++) {
      const bytes = Buffer.from(seeds[int(seeds.length)]!);
      let mutated: Buffer = bytes;
      const kind = int(5);
      if (kind === 0) {
        for (let k = 1 + int(4); k > 0; k--) bytes[int(bytes.length)] = int(256);
      } else if (kind === 1) {
        mutated = bytes.subarray(0, int(bytes.length + 1));
      } else if (kind === 2) {
        const extra = Buffer.alloc(1 + int(40));
        for (let k = 0; k < extra.length; k++) extra[k] = int(256);
        mutated = Buffer.concat([bytes, extra]);
      } else if (kind === 3 && bytes.length >= 12) {
        // Hits length and count fields with extreme values.
        const v = [0, 1, 0xff, 0xffff, 0x10000, 0x7fffffff, 0xffffffff, int(2 ** 32)][int(8)]!;
        bytes.writeUInt32LE(v, 8 + int(bytes.length - 11));
      } else {
        bytes[8 + int(Math.max(1, bytes.length - 8))] = int(256);
        mutated = bytes.subarray(0, Math.min(bytes.length, 8 + int(bytes.length)));
      }
      const limits = i % 3 === 0 ? smallLimits : DEFAULT_LIMITS;
      for (const decode of [(b: Buffer) => decodeRequest(b, limits), decodeReply]) {
        try {
          const msg = decode(mutated);
          assert.equal(typeof msg.type, 'string');
          assert.ok(Number.isInteger(msg.requestId) && msg.requestId >= 0);
          outcomes.decoded++;
        } catch (err) {
          assert.ok(
            err instanceof KvtierError,
            `case ${i}: non-KvtierError ${String(err)} for ${mutated.toString('hex')}`,
          );
          assert.ok(
            FUZZ_CODES.has(err.code),
            `case ${i}: code ${err.code} for ${mutated.toString('hex')}`,
          );
          codes.add(err.code);
          outcomes.refused++;
        }
      }
    }
    // The corpus must exercise both paths and every code, or the loop proves little.
    assert.ok(outcomes.decoded > 500, `decoded ${outcomes.decoded}`);
    assert.ok(outcomes.refused > 500, `refused ${outcomes.refused}`);
    assert.deepEqual([...codes].sort(), [...FUZZ_CODES].sort());
  });
});
