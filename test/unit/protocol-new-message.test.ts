/**
 * Adding a message the way a contributor does: one request entry and one reply entry appended to
 * the message table, nothing else. From the entries alone it gets its TypeScript types, the
 * codec, a fixture sample (no hand-written one), a docs/protocol.md layout block, a Python
 * table the Python package encodes and decodes it with, byte for byte as the TypeScript codec
 * does, and the Python client's encoder and methods for it. The committed protocol is
 * untouched: the extended table lives in this file only.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { DOC_PATH, docBlock, pythonTable, regenerateDoc } from '../../scripts/gen-protocol.ts';
import { fixtureMessages, messageSamples } from '../../scripts/gen-python-fixtures.ts';
import { pythonClientMethods, pythonEncoders } from '../../scripts/gen-python-requests.ts';
import { fallbackSample } from '../../scripts/protocol-fallback-samples.ts';
import { chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';
import { encodeRequest } from '../../src/protocol/codec.ts';
import { DEFAULT_LIMITS } from '../../src/protocol/limits.ts';
import type { MessageOf, MessagesOf } from '../../src/protocol/message-types.ts';
import type { Request } from '../../src/protocol/messages.ts';
import { createCodec } from '../../src/protocol/wire-codec.ts';
import { bool, enumOf, hash, id, ns, reply, request, u32 } from '../../src/protocol/wire-spec.ts';
import { MESSAGES } from '../../src/protocol/wire-table.ts';

const ROOT = new URL('../..', import.meta.url).pathname;
/** A request type code protocol v1 does not use yet, in either direction. */
const CODE = [...Array(0x80).keys()].find(
  (c) => c > 0 && !MESSAGES.some((m) => m.code === c || m.code === (c | 0x80)),
)!;
const hex2 = (n: number): string => `0x${n.toString(16).padStart(2, '0').toUpperCase()}`;

// The contributor's edit: two entries (in the real table they go in type-code order), with a
// type code the table leaves free.
const TABLE = [
  ...MESSAGES,
  request(
    'EXAMPLE_ECHO',
    CODE,
    '4.4',
    [
      id('echoId', 64),
      enumOf('mode', ['plain', 'loud'], 'KVT_INVALID_ARGUMENT'),
      { kind: 'hashes', key: 'hashes', max: 16 },
      { kind: 'u32s', key: 'weights', countOf: 'hashes', range: [1, 100] },
      u32('repeat'),
      { kind: 'json', key: 'options', booleans: ['trace'], object: 'require', omitEmpty: true },
      { kind: 'u64', key: 'notAfterNs', optional: true },
      { kind: 'bytes', key: 'tag', size: 8, optional: true },
    ],
    [{ rule: 'atMostCount', field: 'repeat', of: 'hashes' }],
  ),
  reply('EXAMPLE_ECHO_RESULT', CODE | 0x80, '4.4', [
    bool('echoed'),
    ns('namespace'),
    hash('hash'),
    { kind: 'i32', key: 'delta', min: -5 },
    { kind: 'json', key: 'info', object: 'coerce', late: true, lenient: true },
    { kind: 'blob', key: 'data' },
    {
      kind: 'list',
      key: 'parts',
      max: 4,
      record: 'EchoPart',
      of: [{ kind: 'str', key: 'name', max: 32 }, u32('size')],
    },
  ]),
] as const;

type Echo = MessageOf<'EXAMPLE_ECHO', typeof TABLE>;
type EchoResult = MessageOf<'EXAMPLE_ECHO_RESULT', typeof TABLE>;
type Equal<A, B> =
  (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
type Expect<T extends true> = T;
export type Checks = [
  Expect<
    Equal<
      Echo,
      {
        type: 'example-echo';
        requestId: number;
        echoId: string;
        mode: 'plain' | 'loud';
        hashes: Buffer;
        weights: Uint32Array;
        repeat: number;
        options: { trace?: boolean };
        notAfterNs?: bigint;
        tag?: Uint8Array;
      }
    >
  >,
  Expect<
    Equal<
      EchoResult['parts'],
      {
        name: string;
        size: number;
      }[]
    >
  >,
  Expect<Equal<Extract<MessagesOf<'request', typeof TABLE>, { type: 'example-echo' }>, Echo>>,
  Expect<
    Equal<Extract<MessagesOf<'reply', typeof TABLE>, { type: 'example-echo-result' }>, EchoResult>
  >,
];

const codec = createCodec(TABLE);
const tmp = mkdtempSync(join(tmpdir(), 'kvtier-new-message-'));
after(() => rmSync(tmp, { recursive: true, force: true }));

describe('a message added to the table alone', () => {
  it('is encoded and decoded by the codec of the table', () => {
    const echo: Echo = {
      type: 'example-echo',
      requestId: 41,
      echoId: 'é-1',
      mode: 'loud',
      hashes: Buffer.alloc(64, 7),
      weights: Uint32Array.of(3, 100),
      repeat: 2,
      options: { trace: true },
      tag: Buffer.from('01234567'),
    };
    const bytes = codec.encode(echo);
    // The optional u64 before a present `tag` is written as 0 and read back.
    assert.deepEqual(codec.decodeRequest(bytes, DEFAULT_LIMITS), { ...echo, notAfterNs: 0n });
    const rep: EchoResult = {
      type: 'example-echo-result',
      requestId: 41,
      echoed: true,
      namespace: '0123456789abcdef0123456789abcdef',
      hash: chunkHashFromBytes(Buffer.alloc(32, 9)),
      delta: -5,
      info: { n: 1 },
      data: Buffer.from([1, 2]),
      parts: [{ name: 'a', size: 1 }],
    };
    assert.deepEqual(codec.decodeReply(codec.encode(rep), DEFAULT_LIMITS), rep);
    // Its checks come from the entry: the range of `weights`, the rule on `repeat`.
    assert.throws(
      () =>
        codec.decodeRequest(
          codec.encode({ ...echo, weights: Uint32Array.of(0, 1) }),
          DEFAULT_LIMITS,
        ),
      /weights of element 0 is 0, allowed 1\.\.100/,
    );
    assert.throws(
      () => codec.encode({ ...echo, repeat: 3 }),
      /repeat is 3, more than the 2 chunks/,
    );
    // Protocol v1 itself is unchanged: its codec does not know the message.
    assert.throws(() => encodeRequest(echo as unknown as Request), /no message type example-echo/);
  });

  it('is refused at load when its type code or name is taken, or its code is of the other direction', () => {
    assert.throws(
      () => createCodec([...MESSAGES, request('EXAMPLE_ECHO', 0x01, '4.4', [])]),
      /EXAMPLE_ECHO \(0x1\) clashes with LOOKUP/,
    );
    assert.throws(
      () => createCodec([...MESSAGES, reply('PONG', 0x90, '4.4', [])]),
      /PONG \(0x90\) clashes with PONG/,
    );
    assert.throws(() => request('EXAMPLE_ECHO', CODE | 0x80, '4.4', []), /outside 0x0\.\.0x7f/);
    assert.throws(() => reply('EXAMPLE_ECHO_RESULT', CODE, '4.4', []), /outside 0x80\.\.0xff/);
  });

  it('gets a fixture sample built from its field kinds, every optional field set', () => {
    const { requests, replies } = messageSamples(TABLE);
    const echo = requests.find((s) => s.msg.type === 'example-echo');
    const result = replies.find((s) => s.msg.type === 'example-echo-result');
    assert.ok(echo && result, 'a sample of each direction');
    assert.equal(echo.name, 'example echo, from its field kinds');
    assert.deepEqual(echo.msg, fallbackSample(TABLE.at(-2)!));
    assert.equal(typeof echo.msg.notAfterNs, 'bigint');
    assert.equal((echo.msg.tag as Uint8Array).length, 8);
    // The messages that have hand-written samples keep them, and only them.
    assert.equal(requests.filter((s) => s.msg.type === 'lookup').length, 5);
    assert.deepEqual(codec.decodeRequest(codec.encode(echo.msg), DEFAULT_LIMITS), echo.msg);
    assert.deepEqual(codec.decodeReply(codec.encode(result.msg), DEFAULT_LIMITS), result.msg);
  });

  it('gets layout blocks at the end of its section of docs/protocol.md', () => {
    const [echo, result] = [TABLE.at(-2)!, TABLE.at(-1)!];
    const block = docBlock(echo);
    assert.ok(
      block.startsWith(
        `<!-- wire-layout: EXAMPLE_ECHO -->\nEXAMPLE_ECHO (\`${hex2(CODE)}\`, request) body`,
      ),
      block,
    );
    assert.match(block, /\| 4 \| weights \| u32le × count of hashes \| each 1\.\.100 \|/);
    assert.match(block, /\| 8 \| tag \| 8 bytes \| optional, trailing \|/);
    assert.match(block, /Across fields: repeat ≤ the number of hashes\./);
    const doc = regenerateDoc(readFileSync(join(ROOT, DOC_PATH), 'utf8'), TABLE);
    const section = doc.slice(doc.indexOf('\n### 4.4 '), doc.indexOf('\n### 4.5 '));
    assert.ok(section.endsWith(`\n\n${block}\n\n${docBlock(result)}\n`), section.slice(-400));
  });

  it('is encoded and decoded by the Python package from what gen:protocol writes alone', () => {
    const fixture = fixtureMessages(TABLE, codec) as {
      requests: { fields: { type: string; requestId: number }; hex: string }[];
      replies: { fields: { type: string }; hex: string }[];
    };
    const nameOf = new Map<string, string>(TABLE.map((m) => [m.tag, m.name]));
    const requests = fixture.requests
      .filter((c) => c.fields.type === 'example-echo')
      .map((c) => ({ ...c, message: nameOf.get(c.fields.type) }));
    const replies = fixture.replies.filter((c) => c.fields.type === 'example-echo-result');
    assert.equal(requests.length + replies.length, 2);

    cpSync(join(ROOT, 'python/kvtier_vllm'), join(tmp, 'kvtier_vllm'), {
      recursive: true,
      filter: (src) => !src.includes('__pycache__'),
    });
    writeFileSync(join(tmp, 'kvtier_vllm/protocol_table.py'), pythonTable(TABLE));
    writeFileSync(join(tmp, 'kvtier_vllm/protocol_encode.py'), pythonEncoders(TABLE));
    writeFileSync(join(tmp, 'kvtier_vllm/client_requests.py'), pythonClientMethods(TABLE));
    const run = spawnSync('/usr/bin/python3', ['-c', PY_ROUND_TRIP], {
      input: JSON.stringify({ requests, replies }),
      encoding: 'utf8',
      env: { ...process.env, PYTHONPATH: tmp, PYTHONDONTWRITEBYTECODE: '1' },
      timeout: 120_000,
    });
    assert.equal(run.status, 0, run.stderr);
    const got = JSON.parse(run.stdout) as {
      requests: string[];
      encoded: string[];
      replies: unknown[];
      methods: Record<string, string[]>;
    };
    assert.deepEqual(
      got.requests,
      requests.map((c) => c.hex),
    );
    // Its own encoder, encode_example_echo(request_id, echo_id, ...), sends the same bytes.
    assert.deepEqual(
      got.encoded,
      requests.map((c) => c.hex),
    );
    // The client sends it and waits for it, its parameters the fields in wire order.
    const params = [
      'echo_id',
      'mode',
      'hashes',
      'weights',
      'repeat',
      'options',
      'not_after_ns',
      'tag',
    ];
    assert.deepEqual(got.methods, {
      encode_example_echo: ['request_id', ...params],
      send_example_echo: ['self', ...params],
      example_echo: ['self', ...params],
    });
    assert.deepEqual(
      got.replies,
      replies.map((c) => c.fields),
    );
  });
});

/** Encodes each request case with the Python encoder and decodes each reply case's bytes. */
const PY_ROUND_TRIP = `
import json, sys
import inspect
from kvtier_vllm import protocol, protocol_decode, protocol_pack, protocol_table as T
from kvtier_vllm.client import KvtierClient

def py_value(f, v):
    if f["kind"] in ("hashes", "blob", "bytes"):
        return bytes.fromhex(v)
    return int(v) if f["kind"] == "u64" else v

def ts_json(f, v):
    k = f["kind"]
    if k in ("ns", "hash", "hashes", "blob", "bytes"):
        return v.hex()
    if k == "u64":
        return str(v)
    if k == "list":
        return [{g["name"]: ts_json(g, getattr(x, g["key"])) for g in f["of"]} for x in v]
    return v

cases = json.load(sys.stdin)
out = {"requests": [], "encoded": [], "replies": [], "methods": {}}
for c in cases["requests"]:
    spec, fields = T.MESSAGES[c["message"]], c["fields"]
    values = {f["key"]: py_value(f, fields[f["name"]]) for f in spec["fields"] if f["name"] in fields}
    out["requests"].append(protocol_pack.encode_message(c["message"], fields["requestId"], values).hex())
    encode = getattr(protocol, "encode_" + c["message"].lower())
    out["encoded"].append(encode(fields["requestId"], **values).hex())
for fn in (protocol.encode_example_echo, KvtierClient.send_example_echo, KvtierClient.example_echo):
    out["methods"][fn.__name__] = list(inspect.signature(fn).parameters)
for c in cases["replies"]:
    code, rid, rep = protocol_decode.decode_reply(bytes.fromhex(c["hex"]))
    name = next(n for n, s in T.MESSAGES.items() if s["code"] == code)
    fields = {"type": name.lower().replace("_", "-"), "requestId": rid}
    for f in T.MESSAGES[name]["fields"]:
        fields[f["name"]] = ts_json(f, getattr(rep, f["key"]))
    out["replies"].append(fields)
print(json.dumps(out))
`;
