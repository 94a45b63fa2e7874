/**
 * What every contract test shares: its context (subject, backend, options), the case record,
 * sizes, and the helpers that make data and check results.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { cpus, loadavg } from 'node:os';
import type { TestContext } from 'node:test';
import type {
  Chunk,
  ChunkHash,
  NamespaceId,
  PutOutcome,
  StorageBackend,
} from '../../../src/backends/core/types.ts';
import { isKvtierError, type KvtierErrorCode } from '../../../src/errors.ts';
import { chunkHashFromBytes } from '../../../src/hashing/chunk-hash.ts';
import type { ContractOptions, ContractSubject } from '../backend.contract.ts';

export const KiB = 1024;
export const MiB = 1024 * KiB;
export const SMALL_BYTES = 64 * KiB;
export const LARGE_BYTES = 32 * MiB;
export const FULL_TOKENS = 256;
export const PARTIAL_TOKENS = 37;
/** Above this, the oversized-chunk test would allocate too much to be worth running. */
export const OVERSIZE_TEST_MAX_BYTES = 64 * MiB;
export const OUTCOMES: readonly PutOutcome[] = ['stored', 'exists', 'dropped'];

/**
 * How many times slower than an idle machine this one runs now: the 1-minute load average per
 * core, between 1 and 10, or `KVTIER_TEST_TIME_SCALE` when set. The suite's wall-clock bounds
 * (how long a call may take to settle after its signal, to fail while the service is down, to
 * recover) are multiplied by it: they catch a backend that hangs or ignores a signal, and must
 * not fail one that a busy machine (CI, two suites at once) merely runs late.
 */
export function timeScale(): number {
  const fixed = Number(process.env.KVTIER_TEST_TIME_SCALE);
  if (Number.isFinite(fixed) && fixed > 0) return fixed;
  return Math.min(10, Math.max(1, (loadavg()[0] ?? 0) / Math.max(1, cpus().length)));
}

/** `ms` times {@link timeScale}, rounded up. */
export function scaledMs(ms: number): number {
  return Math.ceil(ms * timeScale());
}

/** What one test gets: its fresh subject, the subject's backend, and the suite's options. */
export interface Ctx {
  readonly s: ContractSubject;
  readonly b: StorageBackend;
  readonly t: TestContext;
  readonly o: ContractOptions;
}

/** One contract test: `skip` is known when the suite is defined, `need` once a subject exists. */
export interface Case {
  readonly title: string;
  readonly skip?: (o: ContractOptions) => string | undefined;
  readonly need?: (c: Ctx) => string | undefined;
  readonly run: (c: Ctx) => Promise<void>;
}

export function randomNs(): NamespaceId {
  return randomBytes(16).toString('hex');
}

export function randomHash(): ChunkHash {
  return chunkHashFromBytes(randomBytes(32));
}

export function randomHashes(n: number): ChunkHash[] {
  return Array.from({ length: n }, randomHash);
}

/**
 * A chunk of `bytes` unique bytes. Past 64 KiB a random block of prime length is repeated
 * (a native fill): cheap for 32 MiB, yet any shift, truncation or swap still shows.
 */
export function makeChunk(bytes: number, tokens = FULL_TOKENS): Chunk {
  if (bytes <= SMALL_BYTES) return { tokens, data: randomBytes(bytes) };
  return { tokens, data: Buffer.allocUnsafeSlow(bytes).fill(randomBytes(4099)) };
}

export function evictionBytes(b: StorageBackend, o: ContractOptions): number {
  const bytes = o.evictionChunkBytes ?? Math.floor(o.capacityBytes! / 8);
  return Math.min(bytes, b.capabilities.maxChunkBytes);
}

/** Puts `count` fresh chunks of `bytes`; each must be stored (the pressure of eviction tests). */
export async function fill(b: StorageBackend, ns: NamespaceId, count: number, bytes: number) {
  for (const [i, h] of randomHashes(count).entries())
    assert.equal(await b.put(ns, h, makeChunk(bytes)), 'stored', `pressure put ${i + 1}`);
}

/** Checks tokens and bytes. Call right after the get: views may be valid only until a yield. */
export function assertChunk(actual: Chunk | null | undefined, expected: Chunk, what: string): void {
  assert.ok(actual !== undefined, `${what}: no entry in the result`);
  assert.ok(actual !== null, `${what}: a miss, expected a hit`);
  assert.equal(actual.tokens, expected.tokens, `${what}: tokens`);
  assert.equal(actual.data.byteLength, expected.data.byteLength, `${what}: byte length`);
  const a = Buffer.from(actual.data.buffer, actual.data.byteOffset, actual.data.byteLength);
  const e = Buffer.from(expected.data.buffer, expected.data.byteOffset, expected.data.byteLength);
  if (!a.equals(e))
    assert.fail(`${what}: bytes differ from offset ${a.findIndex((x, i) => x !== e[i])}`);
}

export function assertKvtierError(err: unknown, what: string): void {
  assert.ok(isKvtierError(err), `${what} rejected with a non-KvtierError: ${String(err)}`);
}

export type Settled<T> = { ok: true; value: T } | { ok: false; error: unknown };

/** Runs `call` (a sync throw counts as a rejection); fails the test if it has not settled in `ms`. */
export async function settle<T>(
  call: () => T | Promise<T>,
  ms: number,
  what: string,
): Promise<Settled<T>> {
  let timer: NodeJS.Timeout | undefined;
  const outcome = (async () => call())().then(
    (value): Settled<T> => ({ ok: true, value }),
    (error: unknown): Settled<T> => ({ ok: false, error }),
  );
  const late = new Promise<null>((resolve) => {
    timer = setTimeout(() => resolve(null), ms);
  });
  try {
    const r = await Promise.race([outcome, late]);
    if (r === null) assert.fail(`${what} did not settle within ${ms} ms`);
    return r;
  } finally {
    clearTimeout(timer);
  }
}

/** Expects `call` to throw, or to return a promise that rejects, with a KvtierError of `code`. */
export async function expectCode(
  what: string,
  code: KvtierErrorCode,
  call: () => unknown,
): Promise<void> {
  const r = await settle(call, 5000, what);
  if (r.ok) assert.fail(`${what} after close succeeded; expected ${code}`);
  assert.ok(isKvtierError(r.error, code), `${what}: expected ${code}, got ${String(r.error)}`);
}
