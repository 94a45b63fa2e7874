import { createReadStream } from 'node:fs';
import { basename } from 'node:path';
import { createInterface } from 'node:readline';
import { abortedError, KvtierError } from '../errors.ts';
import { describe, requireInt, requireNumber, requireString } from '../util/validate.ts';
import type { SimRequest, Workload } from './types.ts';

/**
 * The simulator's workloads. Every token comes from a seeded pseudo-random stream named by what
 * the tokens are (the system prompt, user 3's second question, trace block 17...), so equal names
 * give equal tokens, equal prefixes give equal chunk hashes, and a seed reproduces a run exactly.
 * Token ids lie in [0, 2^31).
 */

/** Options of {@link multiRoundQa}. */
export interface MultiRoundQaOptions {
  /** Users (conversations), each with its own history; default 4. */
  users?: number;
  /** Rounds per user; default 3. */
  rounds?: number;
  /** Tokens of the system prompt every user shares; default 1024. */
  systemPromptTokens?: number;
  /** Tokens of each new question; default 64. */
  questionTokens?: number;
  /** Tokens of each answer (the request's decode length, then part of the next prompt); default 128. */
  answerTokens?: number;
  /**
   * Time between a user's rounds in ms (the answer plus the user's think time); users are spread
   * evenly within it; default 1000.
   */
  roundIntervalMs?: number;
  /** Seed of every token stream; an integer >= 0; default 0. */
  seed?: number;
}

/** The defaults of {@link MultiRoundQaOptions}, in one place. */
export const MULTI_ROUND_QA_DEFAULTS: Readonly<Required<MultiRoundQaOptions>> = Object.freeze({
  users: 4,
  rounds: 3,
  systemPromptTokens: 1024,
  questionTokens: 64,
  answerTokens: 128,
  roundIntervalMs: 1000,
  seed: 0,
});

/** Options of {@link longDocQa}. */
export interface LongDocQaOptions {
  /** Distinct documents; default 4. */
  documents?: number;
  /** Tokens per document; default 4096. */
  documentTokens?: number;
  /** Query rounds after the warm-up; each round asks one query about every document; default 2. */
  queriesPerDocument?: number;
  /** Tokens of each query; default 32. */
  queryTokens?: number;
  /** Decode tokens of every request; default 16. */
  outputTokens?: number;
  /**
   * Time between consecutive requests in ms; default 1000, so that (as in LMCache's sequential
   * benchmark client) a document is read and saved before its queries arrive.
   */
  requestIntervalMs?: number;
  /** Seed of every token stream; an integer >= 0; default 0. */
  seed?: number;
}

/** The defaults of {@link LongDocQaOptions}, in one place. */
export const LONG_DOC_QA_DEFAULTS: Readonly<Required<LongDocQaOptions>> = Object.freeze({
  documents: 4,
  documentTokens: 4096,
  queriesPerDocument: 2,
  queryTokens: 32,
  outputTokens: 16,
  requestIntervalMs: 1000,
  seed: 0,
});

/** Options of {@link traceReplay}. */
export interface TraceReplayOptions {
  /** Path of a Mooncake JSONL trace (`timestamp` ms, `input_length`, `output_length`, `hash_ids`). */
  path: string;
  /** Replay only the first `limit` requests; default all. */
  limit?: number;
  /** Multiplies every arrival time (0.5 replays twice as fast); default 1. */
  timeScale?: number;
  /** Tokens per trace hash id; default 512 (the Mooncake release's block size). */
  blockTokens?: number;
  /** Truncates longer prompts to this many tokens; default no bound. */
  maxInputTokens?: number;
  /** Seed of every token stream; an integer >= 0; default 0. */
  seed?: number;
}

/** The defaults of {@link TraceReplayOptions} (all but `path`), in one place. */
export const TRACE_REPLAY_DEFAULTS = Object.freeze({
  limit: Number.POSITIVE_INFINITY,
  timeScale: 1,
  blockTokens: 512,
  maxInputTokens: Number.POSITIVE_INFINITY,
  seed: 0,
});

/** Largest accepted token count of one prompt segment; bounds a typo's allocation. */
const MAX_SEGMENT_TOKENS = 1 << 24;

/** Stream kinds: part of every stream's name so different kinds never share tokens. */
const Stream = {
  System: 1,
  Question: 2,
  Answer: 3,
  Document: 4,
  Query: 5,
  TraceBlock: 6,
  TracePad: 7,
} as const;

/**
 * Fills in defaults and validates.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the option and its allowed range.
 */
export function resolveMultiRoundQaOptions(
  o: MultiRoundQaOptions = {},
): Required<MultiRoundQaOptions> {
  const d = MULTI_ROUND_QA_DEFAULTS;
  return {
    users: requireInt('users', o.users ?? d.users, 1, 1_000_000),
    rounds: requireInt('rounds', o.rounds ?? d.rounds, 1, 1_000_000),
    systemPromptTokens: requireInt(
      'systemPromptTokens',
      o.systemPromptTokens ?? d.systemPromptTokens,
      0,
      MAX_SEGMENT_TOKENS,
    ),
    questionTokens: requireInt(
      'questionTokens',
      o.questionTokens ?? d.questionTokens,
      1,
      MAX_SEGMENT_TOKENS,
    ),
    answerTokens: requireInt(
      'answerTokens',
      o.answerTokens ?? d.answerTokens,
      1,
      MAX_SEGMENT_TOKENS,
    ),
    roundIntervalMs: requireNumber('roundIntervalMs', o.roundIntervalMs ?? d.roundIntervalMs, 0),
    seed: requireSeed(o.seed ?? d.seed),
  };
}

/**
 * Multi-round QA: every user shares one system prompt; round r of a user sends the system prompt,
 * the user's whole history (every earlier question and answer) and a new question, and decodes
 * `answerTokens`. Round r of user u arrives at `r * roundIntervalMs + u * roundIntervalMs / users`.
 * Request ids are `mrqa-u<u>-r<r>`, groups `user-<u>`.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for bad options.
 */
export function multiRoundQa(opts: MultiRoundQaOptions = {}): Workload {
  const o = resolveMultiRoundQaOptions(opts);
  const system = streamTokens(o.systemPromptTokens, o.seed, Stream.System);
  const histories: Uint32Array[][] = Array.from({ length: o.users }, () => [system]);
  const requests: SimRequest[] = [];
  for (let r = 0; r < o.rounds; r++) {
    for (let u = 0; u < o.users; u++) {
      const history = histories[u] as Uint32Array[];
      history.push(streamTokens(o.questionTokens, o.seed, Stream.Question, u, r));
      requests.push({
        id: `mrqa-u${u}-r${r}`,
        arrivalMs: r * o.roundIntervalMs + (u * o.roundIntervalMs) / o.users,
        promptTokens: concat(history),
        outputTokens: o.answerTokens,
        group: `user-${u}`,
      });
      history.push(streamTokens(o.answerTokens, o.seed, Stream.Answer, u, r));
    }
  }
  return { name: 'multi-round-qa', requests };
}

/**
 * Fills in defaults and validates.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the option and its allowed range.
 */
export function resolveLongDocQaOptions(o: LongDocQaOptions = {}): Required<LongDocQaOptions> {
  const d = LONG_DOC_QA_DEFAULTS;
  return {
    documents: requireInt('documents', o.documents ?? d.documents, 1, 1_000_000),
    documentTokens: requireInt(
      'documentTokens',
      o.documentTokens ?? d.documentTokens,
      1,
      MAX_SEGMENT_TOKENS,
    ),
    queriesPerDocument: requireInt(
      'queriesPerDocument',
      o.queriesPerDocument ?? d.queriesPerDocument,
      0,
      1_000_000,
    ),
    queryTokens: requireInt('queryTokens', o.queryTokens ?? d.queryTokens, 1, MAX_SEGMENT_TOKENS),
    outputTokens: requireInt('outputTokens', o.outputTokens ?? d.outputTokens, 1, 1_000_000),
    requestIntervalMs: requireNumber(
      'requestIntervalMs',
      o.requestIntervalMs ?? d.requestIntervalMs,
      0,
    ),
    seed: requireSeed(o.seed ?? d.seed),
  };
}

/**
 * Long-document QA (as LMCache's benchmark): a warm-up that reads each document once, then
 * `queriesPerDocument` rounds, each asking one new query about every document in order
 * (prompt = document + query). Requests arrive `requestIntervalMs` apart. Request ids are
 * `ldqa-warm-d<d>` and `ldqa-q<q>-d<d>`, groups `doc-<d>`.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for bad options.
 */
export function longDocQa(opts: LongDocQaOptions = {}): Workload {
  const o = resolveLongDocQaOptions(opts);
  const docs = Array.from({ length: o.documents }, (_, d) =>
    streamTokens(o.documentTokens, o.seed, Stream.Document, d),
  );
  const requests: SimRequest[] = [];
  const push = (id: string, d: number, promptTokens: Uint32Array) => {
    requests.push({
      id,
      arrivalMs: requests.length * o.requestIntervalMs,
      promptTokens,
      outputTokens: o.outputTokens,
      group: `doc-${d}`,
    });
  };
  for (const [d, doc] of docs.entries()) push(`ldqa-warm-d${d}`, d, doc);
  for (let q = 0; q < o.queriesPerDocument; q++) {
    for (const [d, doc] of docs.entries()) {
      push(
        `ldqa-q${q}-d${d}`,
        d,
        concat([doc, streamTokens(o.queryTokens, o.seed, Stream.Query, d, q)]),
      );
    }
  }
  return { name: 'long-doc-qa', requests };
}

/**
 * Fills in defaults and validates.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the option and its allowed range.
 */
export function resolveTraceReplayOptions(o: TraceReplayOptions): Required<TraceReplayOptions> {
  const d = TRACE_REPLAY_DEFAULTS;
  return {
    path: requireString('path', o.path, { nonEmpty: true }),
    limit: o.limit === undefined ? d.limit : requireInt('limit', o.limit, 1),
    timeScale: requireNumber('timeScale', o.timeScale ?? d.timeScale, 0),
    blockTokens: requireInt('blockTokens', o.blockTokens ?? d.blockTokens, 1, MAX_SEGMENT_TOKENS),
    maxInputTokens:
      o.maxInputTokens === undefined
        ? d.maxInputTokens
        : requireInt('maxInputTokens', o.maxInputTokens, 1),
    seed: requireSeed(o.seed ?? d.seed),
  };
}

/**
 * Replays a Mooncake JSONL trace, read line by line. A request's prompt is the concatenation, over
 * its `hash_ids`, of one pseudo-random block of `blockTokens` tokens per id (equal ids give equal
 * tokens and so equal chunk hashes), cut or padded (with tokens unique to the request) to
 * `input_length`, then to `maxInputTokens`. It arrives at `(timestamp - first timestamp) *
 * timeScale` ms and decodes `output_length` tokens. Request ids are `trace-<line index>`.
 *
 * Blocks are regenerated from their id rather than cached: a stream of 512 tokens costs less to
 * recompute than to keep for each of a trace's ~180k distinct ids, so memory is the prompts alone.
 *
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for bad options or a malformed line (the message
 *   names the file and line); `KVT_ABORTED` when `signal` aborts; the file system's error when the
 *   file cannot be read.
 */
export async function traceReplay(
  opts: TraceReplayOptions,
  { signal }: { signal?: AbortSignal } = {},
): Promise<Workload> {
  const o = resolveTraceReplayOptions(opts);
  if (signal?.aborted) throw abortedError(signal, 'trace replay');
  const input = createReadStream(o.path, { encoding: 'utf8' });
  const lines = createInterface({ input, crlfDelay: Number.POSITIVE_INFINITY });
  const requests: SimRequest[] = [];
  let firstTimestamp: number | undefined;
  let lineNo = 0;
  try {
    for await (const line of lines) {
      lineNo++;
      if (signal?.aborted) throw abortedError(signal, 'trace replay');
      if (line.trim() === '') continue;
      const entry = parseTraceLine(line, `${o.path}:${lineNo}`);
      firstTimestamp ??= entry.timestamp;
      const index = requests.length;
      const length = Math.min(entry.inputLength, o.maxInputTokens);
      requests.push({
        id: `trace-${index}`,
        arrivalMs: Math.max(0, entry.timestamp - firstTimestamp) * o.timeScale,
        promptTokens: tracePrompt(entry.hashIds, length, o.blockTokens, o.seed, index),
        outputTokens: entry.outputLength,
      });
      if (requests.length >= o.limit) break;
    }
  } finally {
    lines.close();
    input.destroy();
  }
  // Array#sort is stable: requests with equal arrivals keep their trace order.
  requests.sort((a, b) => a.arrivalMs - b.arrivalMs);
  return { name: `trace:${basename(o.path)}`, requests };
}

/**
 * The tokens trace replay gives hash id `id`: `blockTokens` tokens from the stream named by the
 * seed and the id. Exposed so tests and tools can check a replayed prompt block by block.
 */
export function traceBlockTokens(id: number, blockTokens: number, seed = 0): Uint32Array {
  return streamTokens(blockTokens, requireSeed(seed), Stream.TraceBlock, id);
}

interface TraceEntry {
  timestamp: number;
  inputLength: number;
  outputLength: number;
  hashIds: number[];
}

function parseTraceLine(line: string, where: string): TraceEntry {
  let v: unknown;
  try {
    v = JSON.parse(line);
  } catch (err) {
    throw new KvtierError('KVT_INVALID_ARGUMENT', `${where}: not valid JSON`, { cause: err });
  }
  const bad = (what: string, got: unknown) =>
    new KvtierError('KVT_INVALID_ARGUMENT', `${where}: ${what}, got ${describe(got)}`);
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw bad('expected an object', v);
  const rec = v as Record<string, unknown>;
  const { timestamp, input_length: inputLength, output_length: outputLength } = rec;
  if (typeof timestamp !== 'number' || !Number.isFinite(timestamp) || timestamp < 0) {
    throw bad('timestamp must be a finite number >= 0 (ms)', timestamp);
  }
  if (!isCount(inputLength)) throw bad('input_length must be an integer >= 0', inputLength);
  if (!isCount(outputLength)) throw bad('output_length must be an integer >= 0', outputLength);
  const ids = rec.hash_ids;
  if (!Array.isArray(ids) || !ids.every((id) => typeof id === 'number' && id >>> 0 === id)) {
    throw bad('hash_ids must be an array of integers in [0, 2^32)', ids);
  }
  return { timestamp, inputLength, outputLength, hashIds: ids as number[] };
}

function isCount(v: unknown): v is number {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;
}

function tracePrompt(
  hashIds: readonly number[],
  length: number,
  blockTokens: number,
  seed: number,
  index: number,
): Uint32Array {
  const out = new Uint32Array(length);
  let pos = 0;
  for (const id of hashIds) {
    if (pos >= length) break;
    const end = Math.min(pos + blockTokens, length);
    fillStream(out, pos, end, streamSeed(seed, Stream.TraceBlock, id));
    pos = end;
  }
  if (pos < length) fillStream(out, pos, length, streamSeed(seed, Stream.TracePad, index));
  return out;
}

function requireSeed(v: unknown): number {
  return requireInt('seed', v, 0);
}

function concat(parts: readonly Uint32Array[]): Uint32Array {
  let n = 0;
  for (const p of parts) n += p.length;
  const out = new Uint32Array(n);
  let pos = 0;
  for (const p of parts) {
    out.set(p, pos);
    pos += p.length;
  }
  return out;
}

function streamTokens(n: number, seed: number, ...name: number[]): Uint32Array {
  const out = new Uint32Array(n);
  fillStream(out, 0, n, streamSeed(seed, ...name));
  return out;
}

/** A 32-bit finaliser (murmur3's): spreads every input bit over the output. */
function mix32(x: number): number {
  let h = x >>> 0;
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** The 32-bit state of the stream named by `seed` and `name` (a kind and its indices). */
function streamSeed(seed: number, ...name: number[]): number {
  let h = mix32(mix32(seed >>> 0) ^ Math.floor(seed / 2 ** 32));
  for (const part of name) h = mix32((h ^ mix32(part + 0x9e3779b9)) + 0x7f4a7c15);
  return h;
}

/** Fills `out[start, end)` from a mulberry32 generator in state `state`; ids < 2^31. */
function fillStream(out: Uint32Array, start: number, end: number, state: number): void {
  let a = state | 0;
  for (let i = start; i < end; i++) {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), a | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    out[i] = (t ^ (t >>> 14)) & 0x7fffffff;
  }
}
