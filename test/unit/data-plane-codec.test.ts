/**
 * The data-plane messages (docs/protocol.md section 4.9) through the one codec: round trips,
 * byte layouts built by hand, every validation error on decode and on encode.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { KvtierError, type KvtierErrorCode } from '../../src/errors.ts';
import {
  decodeReply,
  decodeRequest,
  encodeReply,
  encodeRequest,
} from '../../src/protocol/codec.ts';
import {
  DATA_PLANE_LIMITS,
  type DataPlaneReply,
  type DataPlaneRequest,
  type LoadRequestMessage,
  type SaveRequestMessage,
} from '../../src/protocol/data-plane-messages.ts';
import type { Request } from '../../src/protocol/messages.ts';
import { MESSAGES } from '../../src/protocol/wire-table.ts';

const NS = '48f3d9651eaf7e9014cf0c0d7bc30fba';
const H0 = '9023a6f72e494c809d3ea5b388ef2ff49d20cc1d48e046e2a6c8d259b8592548';
const H1 = '3b0d4074d7c396f8848f7b6439a3a8d85f5996b37d759ea087988e8960a9b73c';
const HASHES = Buffer.from(H0 + H1, 'hex');

function save(over: Partial<SaveRequestMessage> = {}): SaveRequestMessage {
  return {
    type: 'save',
    requestId: 21,
    engineId: 'eng-0',
    engineRequestId: 'req-é',
    skipChunks: 1,
    blockIds: Uint32Array.of(7, 3, 0xffffffff, 9),
    chunkHashes: HASHES,
    ...over,
  };
}

function load(over: Partial<LoadRequestMessage> = {}): LoadRequestMessage {
  return {
    type: 'load',
    requestId: 22,
    engineId: 'eng-0',
    engineRequestId: 'req-1',
    lookupId: 'lk-1',
    deadlineMs: 2500,
    stateSlot: 3,
    blockIds: Uint32Array.of(1, 2, 3),
    chunkHashes: HASHES,
    ...over,
  };
}

const REQUESTS: DataPlaneRequest[] = [
  {
    type: 'register',
    requestId: 20,
    registration: { engineId: 'eng-0', layers: [{ k: { path: '/dev/shm/kv', offsetBytes: 0 } }] },
  },
  save(),
  save({ skipChunks: 0, blockIds: new Uint32Array(0), chunkHashes: Buffer.alloc(0) }),
  load(),
  load({ deadlineMs: 0, stateSlot: -1 }),
  load({ deadlineMs: 0xffffffff, stateSlot: 0x7fffffff }),
  load({ skipBlocks: 0 }),
  load({ skipBlocks: 3 }),
  load({ skipBlocks: 0xffffffff }),
  load({ skipBlocks: 0, blockIds: new Uint32Array(0), chunkHashes: Buffer.alloc(0) }),
  save({ notAfterNs: 123_456_789_012n }),
  save({ notAfterNs: 0xffffffffffffffffn }),
  save({ notAfterNs: 42n, cudaEvent: Buffer.from(Array.from({ length: 64 }, (_, i) => i * 3)) }),
  load({ skipBlocks: 0, notAfterNs: 5n }),
  load({ skipBlocks: 2, notAfterNs: 0xffffffffffffffffn }),
  { type: 'hold', requestId: 23, engineId: 'e', engineRequestId: 'r', lookupId: 'l' },
  ...(['finished', 'aborted', 'preempted'] as const).map(
    (kind): DataPlaneRequest => ({
      type: 'request-finished',
      requestId: 24,
      engineId: 'e',
      engineRequestId: 'r',
      kind,
    }),
  ),
  { type: 'heartbeat', requestId: 0xffffffff, engineId: 'eng-0' },
  { type: 'unregister', requestId: 26, engineId: 'eng-é' },
];

const REPLIES: DataPlaneReply[] = [
  {
    type: 'register-result',
    requestId: 20,
    engineId: 'eng-0',
    namespace: NS,
    chunkSize: 256,
    blockSize: 16,
  },
  { type: 'save-result', requestId: 21, saved: 3, skipped: 1, dropped: 0xffffffff },
  { type: 'load-result', requestId: 22, loadedTokens: 512, invalidBlockIds: Uint32Array.of(5, 1) },
  { type: 'load-result', requestId: 22, loadedTokens: 0, invalidBlockIds: new Uint32Array(0) },
  { type: 'hold-result', requestId: 23, heldChunks: 4 },
  { type: 'request-finished-result', requestId: 24, released: true },
  { type: 'request-finished-result', requestId: 24, released: false },
  { type: 'heartbeat-result', requestId: 25, known: true },
  { type: 'heartbeat-result', requestId: 25, known: false },
  { type: 'unregister-result', requestId: 26, released: true },
  { type: 'unregister-result', requestId: 26, released: false },
];

function withoutSkip(req: LoadRequestMessage): LoadRequestMessage {
  const { skipBlocks: _, notAfterNs: __, ...rest } = req;
  return rest;
}

function withoutNotAfter<T extends SaveRequestMessage | LoadRequestMessage>(req: T): T {
  const { notAfterNs: _, ...rest } = req;
  return rest as T;
}

function withoutEvent(req: SaveRequestMessage): SaveRequestMessage {
  const { cudaEvent: _, ...rest } = req;
  return rest;
}

/** Cuts of an encoded request that leave a valid shorter one (optional trailing fields). */
function validCuts(req: DataPlaneRequest, length: number): Map<number, DataPlaneRequest> {
  const cuts = new Map<number, DataPlaneRequest>();
  if (req.type === 'save' && req.cudaEvent !== undefined) {
    cuts.set(length - 64, withoutEvent(req));
    cuts.set(length - 72, withoutNotAfter(withoutEvent(req)));
  } else if (req.type === 'save' && req.notAfterNs !== undefined)
    cuts.set(length - 8, withoutNotAfter(req));
  if (req.type === 'load') {
    if (req.notAfterNs !== undefined) {
      cuts.set(length - 8, withoutNotAfter(req));
      cuts.set(length - 12, withoutSkip(req));
    } else if (req.skipBlocks !== undefined) cuts.set(length - 4, withoutSkip(req));
  }
  return cuts;
}

function throwsCode(fn: () => unknown, code: KvtierErrorCode, label: string): void {
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
/** A request type code the table does not use, nor its reply code. */
const FREE = [...Array(0x80).keys()].find(
  (c) => c > 0 && !MESSAGES.some((m) => m.code === c || m.code === (c | 0x80)),
)!;

function frame(type: number, ...parts: (Buffer | number[])[]): Buffer {
  const head = Buffer.from([0x6b, 0x76, 1, type, 5, 0, 0, 0]);
  return Buffer.concat([head, ...parts.map((p) => (Buffer.isBuffer(p) ? p : Buffer.from(p)))]);
}
const u32 = (v: number) => {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(v);
  return b;
};
const i32 = (v: number) => {
  const b = Buffer.alloc(4);
  b.writeInt32LE(v);
  return b;
};
const str = (s: string | Buffer) => {
  const bytes = Buffer.isBuffer(s) ? s : Buffer.from(s, 'utf8');
  const len = Buffer.alloc(2);
  len.writeUInt16LE(bytes.length);
  return Buffer.concat([len, bytes]);
};
const ids = (...v: number[]) => Buffer.concat([u32(v.length), ...v.map(u32)]);
const hashes = (n: number) => Buffer.concat([u32(n), Buffer.alloc(32 * n, 0xab)]);

describe('data-plane codec: round trips', () => {
  it('decodes every request it encodes to the same message', () => {
    for (const req of REQUESTS) assert.deepEqual(decodeRequest(encodeRequest(req)), req, req.type);
  });

  it('decodes every reply it encodes to the same message', () => {
    for (const rep of REPLIES) assert.deepEqual(decodeReply(encodeReply(rep)), rep, rep.type);
  });

  it('lays out SAVE, LOAD, HOLD and REQUEST_FINISHED exactly as documented', () => {
    const s = save({ requestId: 5, skipChunks: 1, blockIds: Uint32Array.of(7, 3) });
    assert.deepEqual(
      encodeRequest(s),
      frame(0x09, str('eng-0'), str('req-é'), u32(1), ids(7, 3), u32(2), HASHES),
    );
    const l = load({ requestId: 5, stateSlot: -1, blockIds: Uint32Array.of(4) });
    assert.deepEqual(
      encodeRequest(l),
      frame(
        0x0a,
        str('eng-0'),
        str('req-1'),
        str('lk-1'),
        u32(2500),
        i32(-1),
        ids(4),
        u32(2),
        HASHES,
      ),
    );
    assert.deepEqual(
      encodeRequest({ ...l, skipBlocks: 2 }),
      frame(
        0x0a,
        str('eng-0'),
        str('req-1'),
        str('lk-1'),
        u32(2500),
        i32(-1),
        ids(4),
        u32(2),
        HASHES,
        u32(2),
      ),
      'skipBlocks is a u32 after the hashes',
    );
    assert.deepEqual(
      encodeRequest({ type: 'unregister', requestId: 5, engineId: 'e' }),
      frame(0x0e, str('e')),
    );
    assert.deepEqual(
      encodeReply({ type: 'unregister-result', requestId: 5, released: true }),
      frame(0x8e, [1]),
    );
    assert.deepEqual(
      encodeRequest({
        type: 'hold',
        requestId: 5,
        engineId: 'e',
        engineRequestId: 'r',
        lookupId: 'l',
      }),
      frame(0x0b, str('e'), str('r'), str('l')),
    );
    assert.deepEqual(
      encodeRequest({
        type: 'request-finished',
        requestId: 5,
        engineId: 'e',
        engineRequestId: 'r',
        kind: 'preempted',
      }),
      frame(0x0c, str('e'), str('r'), [2]),
    );
    assert.deepEqual(
      encodeReply({
        type: 'load-result',
        requestId: 5,
        loadedTokens: 32,
        invalidBlockIds: Uint32Array.of(9),
      }),
      frame(0x8a, u32(32), ids(9)),
    );
    assert.deepEqual(
      encodeReply({
        type: 'register-result',
        requestId: 5,
        engineId: 'e',
        namespace: NS,
        chunkSize: 256,
        blockSize: 16,
      }),
      frame(0x88, str('e'), Buffer.from(NS, 'hex'), u32(256), u32(16)),
    );
  });

  it('refuses every truncation of every valid request and reply', () => {
    for (const req of REQUESTS) {
      const bytes = encodeRequest(req);
      // Cutting optional trailing fields whole leaves a valid message without them.
      const cuts = validCuts(req, bytes.length);
      for (let n = 8; n < bytes.length; n++)
        if (cuts.has(n)) assert.deepEqual(decodeRequest(bytes.subarray(0, n)), cuts.get(n));
        else
          throwsCode(
            () => decodeRequest(bytes.subarray(0, n)),
            'KVT_PROTOCOL',
            `${req.type} cut at ${n}`,
          );
      throwsCode(
        () => decodeRequest(Buffer.concat([bytes, Buffer.from([0])])),
        'KVT_PROTOCOL',
        `${req.type} with a trailing byte`,
      );
    }
    for (const rep of REPLIES) {
      const bytes = encodeReply(rep);
      for (let n = 8; n < bytes.length; n++)
        throwsCode(
          () => decodeReply(bytes.subarray(0, n)),
          'KVT_PROTOCOL',
          `${rep.type} cut at ${n}`,
        );
      throwsCode(
        () => decodeReply(Buffer.concat([bytes, Buffer.from([0])])),
        'KVT_PROTOCOL',
        `${rep.type} with a trailing byte`,
      );
    }
  });
});

describe('data-plane codec: decode validation', () => {
  const cases: [string, Buffer, KvtierErrorCode][] = [
    [
      'register: JSON over 1 MiB',
      frame(0x08, u32(DATA_PLANE_LIMITS.maxRegistrationBytes + 1)),
      'KVT_TOO_LARGE',
    ],
    ['register: not JSON', frame(0x08, u32(3), Buffer.from('{x}')), 'KVT_PROTOCOL'],
    ['register: JSON array', frame(0x08, u32(2), Buffer.from('[]')), 'KVT_INVALID_ARGUMENT'],
    ['register: JSON null', frame(0x08, u32(4), Buffer.from('null')), 'KVT_INVALID_ARGUMENT'],
    ['register: JSON number', frame(0x08, u32(1), Buffer.from('7')), 'KVT_INVALID_ARGUMENT'],
    [
      'save: empty engineId',
      frame(0x09, str(''), str('r'), u32(0), ids(), hashes(0)),
      'KVT_INVALID_ARGUMENT',
    ],
    [
      'save: empty requestId',
      frame(0x09, str('e'), str(''), u32(0), ids(), hashes(0)),
      'KVT_INVALID_ARGUMENT',
    ],
    ['save: engineId over 256 bytes', frame(0x09, str('e'.repeat(257))), 'KVT_TOO_LARGE'],
    [
      'save: engineId not UTF-8',
      frame(0x09, str(Buffer.from([0xff, 0xfe])), str('r')),
      'KVT_PROTOCOL',
    ],
    [
      'save: too many blocks',
      frame(0x09, str('e'), str('r'), u32(0), u32(DATA_PLANE_LIMITS.maxBlocksPerMessage + 1)),
      'KVT_TOO_LARGE',
    ],
    [
      'save: too many chunks',
      frame(
        0x09,
        str('e'),
        str('r'),
        u32(0),
        ids(1),
        u32(DATA_PLANE_LIMITS.maxChunksPerMessage + 1),
      ),
      'KVT_TOO_LARGE',
    ],
    [
      'save: block ids truncated',
      frame(0x09, str('e'), str('r'), u32(0), u32(3), u32(1)),
      'KVT_PROTOCOL',
    ],
    [
      'save: hashes truncated',
      frame(0x09, str('e'), str('r'), u32(0), ids(1), u32(2), Buffer.alloc(40)),
      'KVT_PROTOCOL',
    ],
    [
      'save: skipChunks over the chunk count',
      frame(0x09, str('e'), str('r'), u32(3), ids(1, 2), hashes(2)),
      'KVT_INVALID_ARGUMENT',
    ],
    [
      'load: empty lookupId',
      frame(0x0a, str('e'), str('r'), str(''), u32(0), i32(-1), ids(), hashes(0)),
      'KVT_INVALID_ARGUMENT',
    ],
    [
      'load: stateSlot -2',
      frame(0x0a, str('e'), str('r'), str('l'), u32(0), i32(-2), ids(), hashes(0)),
      'KVT_INVALID_ARGUMENT',
    ],
    [
      'load: too many chunks',
      frame(
        0x0a,
        str('e'),
        str('r'),
        str('l'),
        u32(0),
        i32(-1),
        ids(),
        u32(DATA_PLANE_LIMITS.maxChunksPerMessage + 1),
      ),
      'KVT_TOO_LARGE',
    ],
    ['hold: empty lookupId', frame(0x0b, str('e'), str('r'), str('')), 'KVT_INVALID_ARGUMENT'],
    [
      'hold: lookupId over 256 bytes',
      frame(0x0b, str('e'), str('r'), str('l'.repeat(257))),
      'KVT_TOO_LARGE',
    ],
    ['request finished: kind 3', frame(0x0c, str('e'), str('r'), [3]), 'KVT_INVALID_ARGUMENT'],
    ['request finished: no kind', frame(0x0c, str('e'), str('r')), 'KVT_PROTOCOL'],
    ['heartbeat: empty engineId', frame(0x0d, str('')), 'KVT_INVALID_ARGUMENT'],
    ['heartbeat: trailing bytes', frame(0x0d, str('e'), [0]), 'KVT_PROTOCOL'],
    ...[1, 2, 3, 5, 8].map((n): [string, Buffer, KvtierErrorCode] => [
      `load: ${n} bytes after the hashes`,
      frame(
        0x0a,
        str('e'),
        str('r'),
        str('l'),
        u32(0),
        i32(-1),
        ids(1),
        hashes(1),
        Buffer.alloc(n),
      ),
      'KVT_PROTOCOL',
    ]),
    [
      'load: skipBlocks 1 with no chunks',
      frame(0x0a, str('e'), str('r'), str('l'), u32(0), i32(-1), ids(), hashes(0), u32(1)),
      'KVT_INVALID_ARGUMENT',
    ],
    [
      'load: stateSlot -2 is reported before a bad skipBlocks (wire order)',
      frame(0x0a, str('e'), str('r'), str('l'), u32(0), i32(-2), ids(), hashes(0), u32(1)),
      'KVT_INVALID_ARGUMENT',
    ],
    ['unregister: empty engineId', frame(0x0e, str('')), 'KVT_INVALID_ARGUMENT'],
    ['unregister: engineId over 256 bytes', frame(0x0e, str('e'.repeat(257))), 'KVT_TOO_LARGE'],
    ['unregister: no engineId', frame(0x0e), 'KVT_PROTOCOL'],
    ['unregister: trailing bytes', frame(0x0e, str('e'), [0]), 'KVT_PROTOCOL'],
    [`unknown request type 0x${FREE.toString(16)}`, frame(FREE), 'KVT_PROTOCOL'],
  ];
  for (const [label, bytes, code] of cases) {
    it(`${label} → ${code}`, () => throwsCode(() => decodeRequest(bytes), code, label));
  }

  it('accepts the limits themselves (decoding the largest SAVE the limits allow)', () => {
    const nb = DATA_PLANE_LIMITS.maxBlocksPerMessage;
    const nc = DATA_PLANE_LIMITS.maxChunksPerMessage;
    const bytes = frame(
      0x09,
      str('e'),
      str('r'),
      u32(0),
      u32(nb),
      Buffer.alloc(4 * nb),
      hashes(nc),
    );
    const req = decodeRequest(bytes) as SaveRequestMessage;
    assert.equal(req.blockIds.length, nb);
    assert.equal(req.chunkHashes.length, 32 * nc);
  });

  it('decodes a LOAD without the trailing skipBlocks as before, and with it as given', () => {
    const base = [str('e'), str('r'), str('l'), u32(0), i32(-1), ids(1, 2), hashes(1)];
    const without = decodeRequest(frame(0x0a, ...base)) as LoadRequestMessage;
    assert.equal(without.skipBlocks, undefined);
    assert.equal('skipBlocks' in without, false);
    const withSkip = decodeRequest(frame(0x0a, ...base, u32(3))) as LoadRequestMessage;
    assert.equal(withSkip.skipBlocks, 3);
    const zero = decodeRequest(frame(0x0a, ...base, u32(0))) as LoadRequestMessage;
    assert.equal(zero.skipBlocks, 0);
  });

  it('decodes SAVE and LOAD not-after times when present, and refuses other tails', () => {
    const u64 = (v: bigint) => {
      const b = Buffer.alloc(8);
      b.writeBigUInt64LE(v);
      return b;
    };
    const saveBase = [str('e'), str('r'), u32(0), ids(1, 2), hashes(1)];
    const plainSave = decodeRequest(frame(0x09, ...saveBase)) as SaveRequestMessage;
    assert.equal('notAfterNs' in plainSave, false);
    const timedSave = decodeRequest(frame(0x09, ...saveBase, u64(7n))) as SaveRequestMessage;
    assert.equal(timedSave.notAfterNs, 7n);
    const event = Array.from({ length: 64 }, (_, i) => i + 1);
    // Encoded without a not-after time, an event is preceded by a zero one (none).
    const eventOnly = decodeRequest(
      encodeRequest(save({ cudaEvent: Uint8Array.from(event) })),
    ) as SaveRequestMessage;
    assert.deepEqual([eventOnly.notAfterNs, [...eventOnly.cudaEvent!]], [0n, event]);
    throwsCode(
      () => encodeRequest(save({ cudaEvent: new Uint8Array(63) })),
      'KVT_INVALID_ARGUMENT',
      'a 63-byte event',
    );
    const evented = decodeRequest(frame(0x09, ...saveBase, u64(0n), event)) as SaveRequestMessage;
    assert.deepEqual([evented.notAfterNs, [...evented.cudaEvent!]], [0n, event]);
    // An event without the notAfterNs before it, or cut short, is not a SAVE.
    for (const tail of [
      [1, 2, 3, 4],
      [0, 0, 0, 0, 0, 0, 0, 0, 0],
      event,
      [...u64(0n), ...event.slice(1)],
      [...u64(0n), ...event, 0],
    ])
      throwsCode(
        () => decodeRequest(frame(0x09, ...saveBase, tail)),
        'KVT_PROTOCOL',
        `save + ${tail.length}`,
      );
    const loadBase = [str('e'), str('r'), str('l'), u32(0), i32(-1), ids(1, 2), hashes(1)];
    const timedLoad = decodeRequest(
      frame(0x0a, ...loadBase, u32(1), u64(9n)),
    ) as LoadRequestMessage;
    assert.deepEqual([timedLoad.skipBlocks, timedLoad.notAfterNs], [1, 9n]);
    throwsCode(() => decodeRequest(frame(0x0a, ...loadBase, u64(9n))), 'KVT_PROTOCOL', 'load + 8');
  });

  it('reads an unknown reply type as an error, and a reply flag other than 1 as false', () => {
    assert.throws(() => decodeRequest(frame(FREE)), /unknown request type/);
    assert.throws(() => decodeReply(frame(FREE | 0x80)), /unknown reply type/);
    throwsCode(() => decodeReply(frame(FREE | 0x80)), 'KVT_PROTOCOL', 'reply type');
    assert.deepEqual(decodeReply(frame(0x8e, [2])), {
      type: 'unregister-result',
      requestId: 5,
      released: false,
    });
    assert.deepEqual(decodeReply(frame(0x8d, [7])), {
      type: 'heartbeat-result',
      requestId: 5,
      known: false,
    });
  });
});

describe('data-plane codec: encode validation', () => {
  const cases: [string, Request, KvtierErrorCode][] = [
    ['empty engineId', save({ engineId: '' }), 'KVT_INVALID_ARGUMENT'],
    ['requestId over 256 bytes', save({ engineRequestId: 'é'.repeat(129) }), 'KVT_TOO_LARGE'],
    ['negative skipChunks', save({ skipChunks: -1 }), 'KVT_INVALID_ARGUMENT'],
    [
      'hash bytes not a multiple of 32',
      save({ chunkHashes: Buffer.alloc(33) }),
      'KVT_INVALID_ARGUMENT',
    ],
    [
      'too many block ids',
      save({ blockIds: new Uint32Array(DATA_PLANE_LIMITS.maxBlocksPerMessage + 1) }),
      'KVT_TOO_LARGE',
    ],
    [
      'too many chunks',
      save({ chunkHashes: Buffer.alloc(32 * (DATA_PLANE_LIMITS.maxChunksPerMessage + 1)) }),
      'KVT_TOO_LARGE',
    ],
    ['empty lookupId', load({ lookupId: '' }), 'KVT_INVALID_ARGUMENT'],
    ['stateSlot -2', load({ stateSlot: -2 }), 'KVT_INVALID_ARGUMENT'],
    ['stateSlot 2^31', load({ stateSlot: 2 ** 31 }), 'KVT_INVALID_ARGUMENT'],
    ['deadline over u32', load({ deadlineMs: 2 ** 32 }), 'KVT_INVALID_ARGUMENT'],
    ['fractional deadline', load({ deadlineMs: 1.5 }), 'KVT_INVALID_ARGUMENT'],
    ['negative skipBlocks', load({ skipBlocks: -1 }), 'KVT_INVALID_ARGUMENT'],
    ['fractional skipBlocks', load({ skipBlocks: 1.5 }), 'KVT_INVALID_ARGUMENT'],
    ['skipBlocks over u32', load({ skipBlocks: 2 ** 32 }), 'KVT_INVALID_ARGUMENT'],
    ['negative save notAfterNs', save({ notAfterNs: -1n }), 'KVT_INVALID_ARGUMENT'],
    ['save notAfterNs over u64', save({ notAfterNs: 2n ** 64n }), 'KVT_INVALID_ARGUMENT'],
    ['load notAfterNs over u64', load({ notAfterNs: 2n ** 64n }), 'KVT_INVALID_ARGUMENT'],
    [
      'skipBlocks with no chunks',
      load({ skipBlocks: 1, blockIds: new Uint32Array(0), chunkHashes: Buffer.alloc(0) }),
      'KVT_INVALID_ARGUMENT',
    ],
    [
      'empty unregister engineId',
      { type: 'unregister', requestId: 1, engineId: '' },
      'KVT_INVALID_ARGUMENT',
    ],
    [
      'unregister engineId over 256 bytes',
      { type: 'unregister', requestId: 1, engineId: 'é'.repeat(129) },
      'KVT_TOO_LARGE',
    ],
    [
      'unknown end kind',
      {
        type: 'request-finished',
        requestId: 1,
        engineId: 'e',
        engineRequestId: 'r',
        kind: 'evicted' as 'finished',
      },
      'KVT_INVALID_ARGUMENT',
    ],
    [
      'registration not an object',
      { type: 'register', requestId: 1, registration: null as unknown as Record<string, unknown> },
      'KVT_INVALID_ARGUMENT',
    ],
    [
      'registration over 1 MiB',
      {
        type: 'register',
        requestId: 1,
        registration: { modelId: 'x'.repeat(DATA_PLANE_LIMITS.maxRegistrationBytes) },
      },
      'KVT_TOO_LARGE',
    ],
    [
      'empty heartbeat engineId',
      { type: 'heartbeat', requestId: 1, engineId: '' },
      'KVT_INVALID_ARGUMENT',
    ],
  ];
  for (const [label, req, code] of cases) {
    it(`${label} → ${code}`, () => throwsCode(() => encodeRequest(req), code, label));
  }
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

describe('data-plane examples in docs/protocol.md', () => {
  const doc = readFileSync(new URL('../../docs/protocol.md', import.meta.url), 'utf8');

  it('the partial-chunk LOAD matches the codec both ways', () => {
    const req: LoadRequestMessage = {
      type: 'load',
      requestId: 9,
      engineId: 'w0',
      engineRequestId: 'r1',
      lookupId: 'lk',
      deadlineMs: 0,
      stateSlot: -1,
      blockIds: Uint32Array.of(7, 9),
      chunkHashes: Buffer.from(H0, 'hex'),
      skipBlocks: 2,
    };
    const bytes = docExample(doc, 'load-skip-request');
    assert.equal(bytes.length, 80);
    assert.deepEqual(encodeRequest(req), bytes);
    assert.deepEqual(decodeRequest(bytes), req);
  });

  it('UNREGISTER and its reply match the codec both ways', () => {
    const req: DataPlaneRequest = { type: 'unregister', requestId: 10, engineId: 'w0' };
    const rep: DataPlaneReply = { type: 'unregister-result', requestId: 10, released: true };
    assert.deepEqual(encodeRequest(req), docExample(doc, 'unregister-request'));
    assert.deepEqual(decodeRequest(docExample(doc, 'unregister-request')), req);
    assert.deepEqual(encodeReply(rep), docExample(doc, 'unregister-result'));
    assert.deepEqual(decodeReply(docExample(doc, 'unregister-result')), rep);
  });
});
