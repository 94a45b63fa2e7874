import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { isKvtierError } from '../../src/errors.ts';
import { hashChunks, hashToHex } from '../../src/hashing/chunk-hasher.ts';
import type { Workload } from '../../src/sim/types.ts';
import { longDocQa, multiRoundQa, traceBlockTokens, traceReplay } from '../../src/sim/workloads.ts';

/** The real traces live next to the repository, in ../shared/traces. */
const TRACE_DIR = fileURLToPath(new URL('../../../shared/traces/', import.meta.url));
function tracePath(name: 'conversation' | 'synthetic'): string {
  return join(TRACE_DIR, `mooncake-${name}.jsonl`);
}

function hexChunks(tokens: Uint32Array, chunkSize = 256): string[] {
  return hashChunks(tokens, { chunkSize }).map((c) => hashToHex(c.hash));
}

function sameTokens(w: Workload, v: Workload): boolean {
  if (w.requests.length !== v.requests.length) return false;
  return w.requests.every((r, i) => {
    const o = v.requests[i];
    return (
      o !== undefined &&
      r.id === o.id &&
      Buffer.compare(bytes(r.promptTokens), bytes(o.promptTokens)) === 0
    );
  });
}

function bytes(t: Uint32Array): Buffer {
  return Buffer.from(t.buffer, t.byteOffset, t.byteLength);
}

interface TraceLine {
  timestamp: number;
  input_length: number;
  output_length: number;
  hash_ids: number[];
}

async function readTraceLines(path: string, n: number): Promise<TraceLine[]> {
  return (await readFile(path, 'utf8'))
    .split('\n')
    .filter((l) => l.trim() !== '')
    .slice(0, n)
    .map((l) => JSON.parse(l) as TraceLine);
}

function maxToken(w: Workload): number {
  let m = 0;
  for (const r of w.requests) for (const t of r.promptTokens) if (t > m) m = t;
  return m;
}

describe('multiRoundQa', () => {
  const opts = {
    users: 3,
    rounds: 3,
    systemPromptTokens: 300,
    questionTokens: 40,
    answerTokens: 60,
    seed: 7,
  };

  it('is deterministic: the same seed gives the same tokens, another seed other tokens', () => {
    assert.equal(sameTokens(multiRoundQa(opts), multiRoundQa(opts)), true);
    assert.equal(sameTokens(multiRoundQa(opts), multiRoundQa({ ...opts, seed: 8 })), false);
  });

  it('sends system prompt + the whole history + a new question each round', () => {
    const w = multiRoundQa(opts);
    assert.equal(w.requests.length, 9);
    for (const r of w.requests) {
      const round = Number(/-r(\d+)$/.exec(r.id)?.[1]);
      assert.equal(r.promptTokens.length, 300 + round * (40 + 60) + 40, r.id);
      assert.equal(r.outputTokens, 60);
    }
    // Round 1 of user 0 starts with round 0's whole prompt (its history).
    const r0 = w.requests.find((r) => r.id === 'mrqa-u0-r0')?.promptTokens;
    const r1 = w.requests.find((r) => r.id === 'mrqa-u0-r1')?.promptTokens;
    assert.ok(r0 !== undefined && r1 !== undefined, 'both rounds exist');
    assert.deepEqual(r1.subarray(0, r0.length), r0);
  });

  it('shares the system prompt across users: equal prefix chunks hash equal', () => {
    const w = multiRoundQa({ ...opts, systemPromptTokens: 512 });
    const a = hexChunks(w.requests.find((r) => r.id === 'mrqa-u0-r0')!.promptTokens);
    const b = hexChunks(w.requests.find((r) => r.id === 'mrqa-u2-r0')!.promptTokens);
    // 512 + 40 tokens: two full chunks, both inside the shared system prompt.
    assert.equal(a.length, 2);
    assert.deepEqual(a, b);
    // A user's later round shares every chunk of its earlier round's full chunks.
    const later = hexChunks(w.requests.find((r) => r.id === 'mrqa-u2-r2')!.promptTokens);
    assert.deepEqual(later.slice(0, b.length), b);
    // Different users diverge after the system prompt: with 300 system tokens, chunk 0 is shared
    // and chunk 1 holds each user's own question.
    const v = multiRoundQa(opts);
    const u0 = hexChunks(v.requests.find((r) => r.id === 'mrqa-u0-r2')!.promptTokens);
    const u1 = hexChunks(v.requests.find((r) => r.id === 'mrqa-u1-r2')!.promptTokens);
    assert.equal(u0[0], u1[0]);
    assert.equal(typeof u0[1], 'string');
    assert.notEqual(u0[1], u1[1]);
  });

  it('spreads arrivals over time in order, and keeps token ids below 2^31', () => {
    const w = multiRoundQa({ ...opts, roundIntervalMs: 90 });
    const arrivals = w.requests.map((r) => r.arrivalMs);
    assert.deepEqual(arrivals, [0, 30, 60, 90, 120, 150, 180, 210, 240]);
    assert.equal(maxToken(w) < 2 ** 31, true);
  });

  it('refuses bad options with KVT_INVALID_ARGUMENT', () => {
    assert.throws(
      () => multiRoundQa({ users: 0 }),
      (err: unknown) => isKvtierError(err, 'KVT_INVALID_ARGUMENT') && /users/.test(err.message),
    );
  });
});

describe('longDocQa', () => {
  const opts = {
    documents: 3,
    documentTokens: 600,
    queriesPerDocument: 2,
    queryTokens: 20,
    seed: 1,
  };

  it('reads each document once, then query rounds of document + query', () => {
    const w = longDocQa(opts);
    assert.deepEqual(
      w.requests.map((r) => r.id),
      [
        'ldqa-warm-d0',
        'ldqa-warm-d1',
        'ldqa-warm-d2',
        'ldqa-q0-d0',
        'ldqa-q0-d1',
        'ldqa-q0-d2',
        'ldqa-q1-d0',
        'ldqa-q1-d1',
        'ldqa-q1-d2',
      ],
    );
    const warm = w.requests[0]!.promptTokens;
    const q1 = w.requests[6]!.promptTokens;
    assert.equal(warm.length, 600);
    assert.equal(q1.length, 620);
    assert.deepEqual(q1.subarray(0, 600), warm);
    // Queries differ from round to round.
    assert.notDeepEqual(w.requests[3]!.promptTokens.subarray(600), q1.subarray(600));
    const arrivals = w.requests.map((r) => r.arrivalMs);
    assert.deepEqual(
      arrivals,
      [...arrivals].sort((a, b) => a - b),
    );
  });

  it('is deterministic and documents share their chunk hashes with their queries', () => {
    assert.equal(sameTokens(longDocQa(opts), longDocQa(opts)), true);
    const w = longDocQa(opts);
    const doc = hexChunks(w.requests[1]!.promptTokens);
    const query = hexChunks(w.requests[4]!.promptTokens);
    assert.equal(doc.length, 2);
    assert.deepEqual(query.slice(0, 2), doc);
    assert.notEqual(hexChunks(w.requests[0]!.promptTokens)[0], doc[0]);
  });
});

describe('traceReplay', () => {
  for (const name of ['conversation', 'synthetic'] as const) {
    const path = tracePath(name);
    const skip = existsSync(path) ? false : `${path} is missing`;
    it(`replays the first lines of the ${name} trace faithfully`, { skip }, async () => {
      const n = 200;
      const lines = await readTraceLines(path, n);
      const w = await traceReplay({ path, limit: n, timeScale: 0.5 });
      assert.equal(w.requests.length, n);
      const byId = new Map(w.requests.map((r) => [r.id, r]));
      const blockOf = new Map<number, string>();
      let shared = 0;
      for (const [i, line] of lines.entries()) {
        const r = byId.get(`trace-${i}`);
        assert.ok(r !== undefined, `request trace-${i} exists`);
        assert.equal(r.promptTokens.length, line.input_length);
        assert.equal(r.outputTokens, line.output_length);
        assert.equal(r.arrivalMs, (line.timestamp - lines[0]!.timestamp) * 0.5);
        for (const [k, id] of line.hash_ids.entries()) {
          const start = k * 512;
          const end = Math.min(start + 512, line.input_length);
          if (start >= end) break;
          const block = bytes(r.promptTokens.subarray(start, end)).toString('hex');
          if (end - start === 512) {
            const seen = blockOf.get(id);
            if (seen === undefined) blockOf.set(id, block);
            else {
              shared++;
              assert.equal(block, seen, `hash id ${id} gives the same tokens every time`);
            }
          }
          assert.deepEqual(
            r.promptTokens.subarray(start, end),
            traceBlockTokens(id, 512).subarray(0, end - start),
          );
        }
      }
      assert.equal(shared > 0, true, 'the trace reuses hash ids in its first lines');
      const arrivals = w.requests.map((r) => r.arrivalMs);
      assert.deepEqual(
        arrivals,
        [...arrivals].sort((a, b) => a - b),
      );
      assert.equal(maxToken(w) < 2 ** 31, true);
    });
  }

  it('equal leading hash ids give equal chunk hashes', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-trace-'));
    try {
      const path = join(dir, 't.jsonl');
      const lines = [
        { timestamp: 100, input_length: 1100, output_length: 5, hash_ids: [7, 8, 9] },
        { timestamp: 300, input_length: 1300, output_length: 5, hash_ids: [7, 8, 4] },
        { timestamp: 200, input_length: 700, output_length: 5, hash_ids: [1, 2] },
        // input_length beyond its blocks: padded with tokens of its own.
        { timestamp: 400, input_length: 600, output_length: 5, hash_ids: [7] },
      ];
      await writeFile(path, `${lines.map((l) => JSON.stringify(l)).join('\n')}\n\n`);
      const w = await traceReplay({ path, blockTokens: 512, timeScale: 2 });
      assert.deepEqual(
        w.requests.map((r) => [r.id, r.arrivalMs, r.promptTokens.length]),
        [
          ['trace-0', 0, 1100],
          ['trace-2', 200, 700],
          ['trace-1', 400, 1300],
          ['trace-3', 600, 600],
        ],
      );
      const [a, , b, c] = w.requests.map((r) => hexChunks(r.promptTokens));
      // Blocks 7 and 8 (1024 tokens) are four 256-token chunks in common; block 9 vs 4 differ.
      assert.deepEqual(a!.slice(0, 4), b!.slice(0, 4));
      assert.notEqual(a![4], b![4]);
      assert.deepEqual(c!.slice(0, 2), a!.slice(0, 2));
      const padded = w.requests[3]!.promptTokens;
      assert.deepEqual(padded.subarray(0, 512), traceBlockTokens(7, 512));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('names the file and line of a malformed line, and honours an aborted signal', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'kvtier-trace-'));
    try {
      const path = join(dir, 'bad.jsonl');
      await writeFile(
        path,
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n{"timestamp": 1, "input_length": -1}\n',
      );
      await assert.rejects(
        traceReplay({ path }),
        (err: unknown) =>
          isKvtierError(err, 'KVT_INVALID_ARGUMENT') &&
          err.message.includes(`${path}:2`) &&
          /input_length/.test(err.message),
      );
      const ac = new AbortController();
      ac.abort();
      await assert.rejects(traceReplay({ path }, { signal: ac.signal }), (err: unknown) =>
        isKvtierError(err, 'KVT_ABORTED'),
      );
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
