/**
 * Writes python/tests/fixtures/cross-language.json: what the TypeScript implementation computes
 * for a set of inputs, so the Python package (python/kvtier_vllm) is checked byte for byte
 * against it: chunk hashes (salts, partial chunks, LoRA, multimodal spans), seeds, namespace ids
 * (tensor and pipeline parallelism, MLA), and the encoded bytes of requests and replies of every
 * message type with the TypeScript decoder's reading of each (the samples of
 * protocol-samples.ts, and for a message that has none there one built from its field kinds).
 *
 *     node --import tsx scripts/gen-python-fixtures.ts          # rewrite the file
 *     node --import tsx scripts/gen-python-fixtures.ts --check  # exit 1 when it is stale
 *
 * test/unit/python-fixtures.test.ts runs the check, so a change on the TypeScript side that
 * forgets the fixture fails CI; python/tests checks the Python side against the file.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { isDeepStrictEqual } from 'node:util';
import { type ChunkHasherOptions, hashChunks, hashSeed } from '../src/hashing/chunk-hasher.ts';
import {
  canonicalNamespaceEncoding,
  deriveNamespace,
  headCovers,
  kvHeadRange,
  type NamespaceSpec,
} from '../src/namespace/namespace.ts';
import { DEFAULT_LIMITS } from '../src/protocol/limits.ts';
import {
  decodeReplyMessage,
  decodeRequestMessage,
  encodeMessage,
  type MessageCodec,
} from '../src/protocol/wire-codec.ts';
import type { MessageSpec } from '../src/protocol/wire-spec.ts';
import { MESSAGES } from '../src/protocol/wire-table.ts';
import { fallbackSample, type SampleMessage } from './protocol-fallback-samples.ts';
import { REPLIES, REQUESTS } from './protocol-samples.ts';

/** Where the fixture lives, relative to the repository root. */
export const FIXTURE_PATH = 'python/tests/fixtures/cross-language.json';

/** A deterministic token sequence (a 32-bit LCG), so the fixture needs no randomness. */
function lcgTokens(n: number, seed: number, max = 2 ** 32): number[] {
  const out: number[] = [];
  let x = seed >>> 0;
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    out.push(max === 2 ** 32 ? x : x % max);
  }
  return out;
}

type TokenSpec = number[] | { range: [number, number] } | { lcg: [number, number, number] };

function expandTokens(t: TokenSpec): number[] {
  if (Array.isArray(t)) return t;
  if ('range' in t)
    return Array.from({ length: t.range[1] - t.range[0] }, (_, i) => t.range[0] + i);
  return lcgTokens(t.lcg[0], t.lcg[1], t.lcg[2]);
}

interface MmSpec {
  /** The id as a UTF-8 string, or `idHex` for raw bytes. */
  id?: string;
  idHex?: string;
  offset: number;
  length: number;
}

interface HashCase {
  name: string;
  tokens: TokenSpec;
  chunkSize?: number;
  salt?: string;
  partial?: boolean;
  lora?: string;
  mm?: MmSpec[];
}

const HASH_CASES: HashCase[] = [
  { name: 'A 0..599', tokens: { range: [0, 600] } },
  { name: 'B 0..599 partial', tokens: { range: [0, 600] }, partial: true },
  { name: 'C salt tenant-a', tokens: { range: [0, 600] }, partial: true, salt: 'tenant-a' },
  { name: 'empty', tokens: [], partial: true },
  { name: 'one token, no partial', tokens: [42] },
  { name: 'one token, partial', tokens: [42], partial: true },
  {
    name: 'extreme token ids, chunk size 4',
    tokens: [4294967295, 0, 1, 2147483648, 65535, 16777216],
    chunkSize: 4,
    partial: true,
  },
  { name: 'non-ASCII salt, chunk size 1', tokens: [7], chunkSize: 1, salt: 'café/β' },
  {
    name: 'salt with emoji and CJK',
    tokens: { lcg: [100, 3, 151_936] },
    chunkSize: 16,
    salt: '租户-🚀',
    partial: true,
  },
  { name: 'lcg 1000 tokens, chunk 64', tokens: { lcg: [1000, 7, 2 ** 32] }, chunkSize: 64 },
  {
    name: 'lcg 257 tokens, chunk 256, partial',
    tokens: { lcg: [257, 11, 128_256] },
    partial: true,
  },
  { name: 'lora', tokens: { range: [0, 600] }, partial: true, lora: 'sql-lora' },
  { name: 'empty lora is none', tokens: { range: [0, 600] }, lora: '' },
  {
    name: 'salt and non-ASCII lora',
    tokens: { range: [0, 300] },
    salt: 'tenant-a',
    lora: 'café-lora',
    chunkSize: 100,
  },
  {
    name: 'mm spans sorted and clipped',
    tokens: { range: [0, 800] },
    mm: [
      { id: 'img-b', offset: 300, length: 10 },
      { id: 'img-a', offset: 100, length: 200 },
      { id: 'aud', offset: 300, length: 10 },
      { id: 'vid', offset: 500, length: 12 },
    ],
  },
  {
    name: 'salt, lora and mm',
    tokens: { range: [0, 600] },
    partial: true,
    salt: 'tenant-a',
    lora: 'café-lora',
    mm: [
      { id: '7b2a0c9d5e1f', offset: 0, length: 576 },
      { id: 'img-2', offset: 590, length: 10 },
    ],
  },
  {
    name: 'mm raw-byte ids, same offset and length, beyond the prompt',
    tokens: { lcg: [512, 5, 32_000] },
    chunkSize: 128,
    partial: true,
    mm: [
      { idHex: 'ff00', offset: 120, length: 16 },
      { idHex: '00ff', offset: 120, length: 16 },
      { idHex: '00', offset: 127, length: 1 },
      { idHex: '01', offset: 128, length: 1 },
      { idHex: 'abcdef', offset: 600, length: 50 },
    ],
  },
];

const NAMESPACE_CASES: { name: string; spec: NamespaceSpec }[] = (() => {
  const llama = {
    modelId: 'meta-llama/Meta-Llama-3-8B',
    dtype: 'bfloat16',
    numLayers: 32,
    numKvHeads: 8,
    headDim: 128,
    blockSize: 16,
    mla: false,
    layoutVersion: 1,
  };
  const dsv3 = {
    modelId: 'deepseek-ai/DeepSeek-V3',
    dtype: 'bfloat16',
    numLayers: 61,
    numKvHeads: 1,
    headDim: 576,
    blockSize: 64,
    mla: true,
    layoutVersion: 1,
  };
  const cases: { name: string; spec: NamespaceSpec }[] = [
    { name: 'llama tp2 r0', spec: { ...llama, tpSize: 2, tpRank: 0 } },
    { name: 'llama tp2 r1', spec: { ...llama, tpSize: 2, tpRank: 1 } },
    {
      name: 'llama tp1, dtype alias bf16',
      spec: { ...llama, dtype: 'bf16', tpSize: 1, tpRank: 0 },
    },
    { name: 'llama tp16 replicated heads', spec: { ...llama, tpSize: 16, tpRank: 15 } },
    { name: 'llama tp4 r1', spec: { ...llama, tpSize: 4, tpRank: 1 } },
    { name: 'llama tp8 r2 (same heads as tp16 r5)', spec: { ...llama, tpSize: 8, tpRank: 2 } },
    {
      name: '12 heads tp3 r1 (shards that do not nest)',
      spec: { ...llama, numKvHeads: 12, tpSize: 3, tpRank: 1 },
    },
    { name: 'dsv3 mla tp8 r3', spec: { ...dsv3, tpSize: 8, tpRank: 3 } },
    { name: 'dsv3 mla tp1', spec: { ...dsv3, tpSize: 1, tpRank: 0 } },
    {
      name: 'dsv3 mla pp2 stage 1',
      spec: {
        ...dsv3,
        numLayers: 30,
        tpSize: 8,
        tpRank: 3,
        ppSize: 2,
        ppRank: 1,
        ppFirstLayer: 31,
      },
    },
    {
      name: 'qwen fp8, torch. prefix, layout 2',
      spec: {
        modelId: 'Qwen/Qwen2.5-7B-Instruct',
        dtype: 'torch.float8_e4m3fn',
        numLayers: 28,
        numKvHeads: 4,
        headDim: 128,
        blockSize: 32,
        mla: false,
        tpSize: 4,
        tpRank: 2,
        layoutVersion: 2,
      },
    },
    {
      name: 'non-ASCII model id',
      spec: {
        modelId: 'ünïcødé/模型-7B',
        dtype: 'FP16',
        numLayers: 2,
        numKvHeads: 2,
        headDim: 64,
        blockSize: 16,
        mla: false,
        tpSize: 1,
        tpRank: 0,
        layoutVersion: 1,
      },
    },
    {
      name: 'llama pp1 explicit is plain',
      spec: { ...llama, tpSize: 2, tpRank: 0, ppSize: 1, ppRank: 0, ppFirstLayer: 0 },
    },
  ];
  for (let r = 0; r < 4; r++)
    cases.push({
      name: `llama pp4 stage ${r}`,
      spec: {
        ...llama,
        numLayers: 8,
        tpSize: 2,
        tpRank: 0,
        ppSize: 4,
        ppRank: r,
        ppFirstLayer: 8 * r,
      },
    });
  return cases;
})();

/** JSON form of a decoded message: buffers as hex, typed arrays as lists, u64s as decimal strings. */
function plain(v: unknown): unknown {
  if (Buffer.isBuffer(v)) return v.toString('hex');
  if (typeof v === 'bigint') return v.toString(); // a u64 does not fit a JSON number exactly
  if (v instanceof Uint32Array) return Array.from(v);
  if (Array.isArray(v)) return v.map(plain);
  if (typeof v === 'object' && v !== null) {
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) out[k] = plain(x);
    return out;
  }
  return v;
}

function hashCase(c: HashCase): Record<string, unknown> {
  const opts: ChunkHasherOptions = {};
  if (c.chunkSize !== undefined) opts.chunkSize = c.chunkSize;
  if (c.salt !== undefined) opts.salt = c.salt;
  if (c.partial !== undefined) opts.partial = c.partial;
  if (c.lora !== undefined) opts.lora = c.lora;
  if (c.mm !== undefined)
    opts.mm = c.mm.map((s) => ({
      id: s.idHex !== undefined ? Buffer.from(s.idHex, 'hex') : s.id!,
      offset: s.offset,
      length: s.length,
    }));
  const chunks = hashChunks(expandTokens(c.tokens), opts).map((h) => [
    h.start,
    h.end,
    h.hash.toString('hex'),
  ]);
  return { ...c, chunks };
}

/** One sample message of the fixture. */
export interface Sample {
  name: string;
  msg: SampleMessage;
}

/**
 * The sample messages of `table`, requests and replies: the hand-written ones of
 * protocol-samples.ts, then one built from its field kinds (protocol-fallback-samples.ts) for
 * each entry that has none there.
 */
export function messageSamples(table: readonly MessageSpec[] = MESSAGES): {
  requests: Sample[];
  replies: Sample[];
} {
  const requests: Sample[] = REQUESTS.map(({ name, req }) => ({ name, msg: req as SampleMessage }));
  const replies: Sample[] = REPLIES.map(({ name, rep }) => ({ name, msg: rep as SampleMessage }));
  const sampled = new Set([...requests, ...replies].map((s) => s.msg.type));
  for (const m of table)
    if (!sampled.has(m.tag))
      (m.dir === 'request' ? requests : replies).push({
        name: `${m.name.toLowerCase().replace(/_/g, ' ')}, from its field kinds`,
        msg: fallbackSample(m),
      });
  return { requests, replies };
}

/** The protocol v1 codec, as `createCodec(MESSAGES)` builds it. */
const V1: MessageCodec = {
  encode: encodeMessage,
  decodeRequest: decodeRequestMessage,
  decodeReply: decodeReplyMessage,
};

/**
 * The fixture's `requests` and `replies`: each sample of `table` encoded by `codec`, with the
 * decoder's reading of the bytes (what a server or client reads back: the form the fields are
 * given in).
 */
export function fixtureMessages(
  table: readonly MessageSpec[] = MESSAGES,
  codec: MessageCodec = V1,
): { requests: unknown[]; replies: unknown[] } {
  const { requests, replies } = messageSamples(table);
  const entry = (s: Sample, decode: (b: Buffer) => unknown) => {
    const bytes = codec.encode(s.msg);
    return { name: s.name, fields: plain(decode(bytes)), hex: bytes.toString('hex') };
  };
  return {
    requests: requests.map((s) => entry(s, (b) => codec.decodeRequest(b, DEFAULT_LIMITS))),
    replies: replies.map((s) => entry(s, (b) => codec.decodeReply(b, DEFAULT_LIMITS))),
  };
}

/** Everything the fixture holds, computed by the TypeScript implementation. */
export function buildPythonFixtures(): Record<string, unknown> {
  return {
    comment:
      'Generated by scripts/gen-python-fixtures.ts from the TypeScript hasher, namespace derivation and codec; do not edit. tokens: a list, {range:[a,b]} = a..b-1, or {lcg:[n,seed,max]} = n values of x=(1664525*x+1013904223) mod 2^32 from x=seed, each taken mod max.',
    seeds: [
      ['', ''],
      ['tenant-a', ''],
      ['café/β', ''],
      ['', 'sql-lora'],
      ['tenant-a', 'café-lora'],
    ].map(([salt, lora]) => ({ salt, lora, seed: hashSeed(salt, lora).toString('hex') })),
    hashes: HASH_CASES.map(hashCase),
    namespaces: NAMESPACE_CASES.map(({ name, spec }) => {
      const ns = deriveNamespace(spec);
      return {
        name,
        spec,
        id: ns.id,
        label: ns.label,
        encoding: canonicalNamespaceEncoding(spec),
        heads: kvHeadRange(spec),
        covers: headCovers(spec).map((c) => ({
          width: c.width,
          shards: c.shards.map((x) => [x.start, x.end, x.namespace.id]),
        })),
      };
    }),
    ...fixtureMessages(),
  };
}

/** The fixture as parsed JSON (what the committed file must hold, whatever its formatting). */
export function pythonFixturesJson(): unknown {
  return JSON.parse(JSON.stringify(buildPythonFixtures()));
}

/** Writes the fixture, formatted by the repository's Biome so `npm run lint` accepts it. */
function write(path: string): void {
  writeFileSync(path, `${JSON.stringify(buildPythonFixtures(), null, 2)}\n`);
  const root = fileURLToPath(new URL('..', import.meta.url));
  const biome = spawnSync(
    join(root, 'node_modules', '.bin', 'biome'),
    ['format', '--write', path],
    {
      cwd: root,
      encoding: 'utf8',
    },
  );
  if (biome.status !== 0)
    process.stderr.write(`biome format failed:\n${biome.stdout}${biome.stderr}`);
}

/** Whether the committed fixture is what the TypeScript side computes now (names it when not). */
export function checkFixtures(): boolean {
  const root = fileURLToPath(new URL('..', import.meta.url));
  let current: unknown;
  try {
    current = JSON.parse(readFileSync(join(root, FIXTURE_PATH), 'utf8'));
  } catch {}
  if (isDeepStrictEqual(current, pythonFixturesJson())) return true;
  process.stderr.write(`${FIXTURE_PATH} is stale: run npm run gen:protocol\n`);
  return false;
}

/** Rewrites the fixture. */
export function writeFixtures(): void {
  write(join(fileURLToPath(new URL('..', import.meta.url)), FIXTURE_PATH));
  process.stdout.write(`wrote ${FIXTURE_PATH}\n`);
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  if (process.argv.includes('--check')) process.exitCode = checkFixtures() ? 0 : 1;
  else writeFixtures();
}
