/**
 * What every test of the store-level contract shares: its context (subject, store, options, the
 * bound on settling), the case record, values that are cheap to make and to check at any size,
 * keys, and the helpers that settle a call under a bound, read a listing and watch buffers for
 * release.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { setTimeout as delay } from 'node:timers/promises';
import v8 from 'node:v8';
import vm from 'node:vm';
import type { ChunkHash, NamespaceId } from '../../../src/backends/core/types.ts';
import {
  type KvStore,
  type StoredValue,
  type StoreKey,
  storeKey,
} from '../../../src/backends/store/kv-store.ts';
import { chunkHashFromBytes } from '../../../src/hashing/chunk-hash.ts';
import type {
  StoreContractCaseId,
  StoreContractGroup,
  StoreContractOptions,
  StoreContractSubject,
} from '../store.contract.ts';

export const KiB = 1024;
export const MiB = 1024 * KiB;

/** What one test gets. */
export interface StoreCtx {
  readonly s: StoreContractSubject;
  /** The subject's first instance. */
  readonly store: KvStore;
  readonly o: StoreContractOptions;
  /** How long a call may take to settle once its signal fires, its close, or a release (ms, scaled). */
  readonly settleMs: number;
  /** A second instance over the same storage (the subject's `open`); the suite closes it. */
  open(): Promise<KvStore>;
  /** Closes `store` once, failing the test if it does not settle within {@link settleMs}. */
  close(store: KvStore): Promise<void>;
}

/** One test: `skip` is known when the suite is defined, `need` once a subject exists. */
export interface StoreCase {
  /** Stable name, `<group>.<name>`, for `skip` and `runStoreContractCase`. */
  readonly id: StoreContractCaseId;
  readonly group: StoreContractGroup | 'basics' | 'lifecycle';
  readonly title: string;
  readonly skip?: ((o: StoreContractOptions) => string | undefined) | undefined;
  readonly need?: ((c: StoreCtx) => string | undefined) | undefined;
  readonly run: (c: StoreCtx) => Promise<void>;
}

export function randomNs(): NamespaceId {
  return randomBytes(16).toString('hex');
}

export function randomHash(): ChunkHash {
  return chunkHashFromBytes(randomBytes(32));
}

export function randomKey(ns: NamespaceId = randomNs()): StoreKey {
  return storeKey(ns, randomHash());
}

/**
 * A value of `bytes` bytes: a random block of prime length repeated, so that making and checking
 * one costs no second copy at 32 MiB, two values never match, and any shift, cut or mix shows.
 */
export class Pattern {
  readonly bytes: number;
  readonly #block = randomBytes(4099);

  constructor(bytes: number) {
    this.bytes = bytes;
  }

  /** A fresh buffer (its own memory, never a pooled slab) holding the value. */
  make(): Buffer {
    return Buffer.allocUnsafeSlow(this.bytes).fill(this.#block);
  }

  /** Undefined when `actual` is the value, else what differs. */
  differs(actual: Uint8Array): string | undefined {
    if (actual.byteLength !== this.bytes)
      return `${actual.byteLength} bytes, expected ${this.bytes}`;
    const a = Buffer.from(actual.buffer, actual.byteOffset, actual.byteLength);
    const n = this.#block.length;
    for (let at = 0; at < a.length; at += n) {
      const piece = a.subarray(at, at + n);
      if (!piece.equals(this.#block.subarray(0, piece.length))) {
        const i = piece.findIndex((x, j) => x !== this.#block[j]);
        return `bytes differ from offset ${at + i}`;
      }
    }
    return undefined;
  }
}

/** The bytes of a get's answer. */
export function bytesOf(v: Uint8Array | StoredValue | null): Uint8Array | null {
  if (v === null) return null;
  return v instanceof Uint8Array ? v : v.bytes;
}

/** Fails unless `v` is the whole value of `p`. */
export function assertValue(v: Uint8Array | StoredValue | null, p: Pattern, what: string): void {
  const b = bytesOf(v);
  assert.ok(b !== null, `${what}: null, expected the ${p.bytes}-byte value`);
  const d = p.differs(b);
  if (d !== undefined) assert.fail(`${what}: not the value put: ${d}`);
}

/** Fails unless `v` is null or the whole value of one of `ps`; returns which (-1 for null). */
export function noneOrWhole(
  v: Uint8Array | StoredValue | null,
  ps: readonly Pattern[],
  what: string,
): number {
  const b = bytesOf(v);
  if (b === null) return -1;
  const i = ps.findIndex((p) => p.differs(b) === undefined);
  if (i < 0)
    assert.fail(`${what}: a ${b.byteLength}-byte value that is none of the values put (torn)`);
  return i;
}

export type Settled<T> = { ok: true; value: T } | { ok: false; error: unknown };

/**
 * Runs `call`; a synchronous throw counts as a rejection. The stacks of the error and of its
 * causes are rendered at once: until then V8 keeps the frames' closures, which would hold the
 * call's arguments (a put's value) alive for as long as the suite keeps the error.
 */
export function attempt<T>(call: () => T | Promise<T>): Promise<Settled<T>> {
  return (async () => call())().then(
    (value): Settled<T> => ({ ok: true, value }),
    (error: unknown): Settled<T> => {
      let e: unknown = error;
      for (let depth = 0; e instanceof Error && depth < 8; depth++, e = e.cause) void e.stack;
      return { ok: false, error };
    },
  );
}

/** Awaits `outcome`, failing the test if it has not settled `ms` after this call. */
export async function within<T>(
  outcome: Promise<Settled<T>>,
  ms: number,
  what: string,
): Promise<Settled<T>> {
  let timer: NodeJS.Timeout | undefined;
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

/** Every entry `list(prefix)` yields, by key; fails on a key listed twice or not under `prefix`. */
export async function listed(
  store: KvStore,
  prefix: string,
  what: string,
): Promise<Map<string, number | undefined>> {
  const out = new Map<string, number | undefined>();
  for await (const e of store.list!(prefix, {})) {
    assert.ok(e.key.startsWith(prefix), `${what}: list("${prefix}") yielded ${e.key}`);
    assert.ok(!out.has(e.key), `${what}: list("${prefix}") yielded ${e.key} twice`);
    out.set(e.key, e.bytes);
  }
  return out;
}

/** True when `d` is the answer of a delete that removed a value of `bytes` bytes. */
export function removedAnswer(d: number | boolean, bytes: number): boolean {
  return d === true || d === bytes;
}

let gcFn: (() => void) | undefined;

/**
 * A full garbage collection: `global.gc` when node runs with `--expose-gc`, else the flag is set
 * now and `gc` taken from a fresh context (V8 exposes it to contexts made after the flag).
 */
export function collectGarbage(): void {
  if (gcFn === undefined) {
    const g = (globalThis as { gc?: () => void }).gc;
    if (typeof g === 'function') gcFn = g;
    else {
      v8.setFlagsFromString('--expose-gc');
      gcFn = vm.runInNewContext('gc') as () => void;
    }
  }
  gcFn();
}

/**
 * Watches buffers for release: each registered buffer's memory (its `ArrayBuffer`, which any
 * view or copy of the reference keeps alive) is reported once the garbage collector frees it.
 */
export class ReleaseWatch {
  readonly #held = new Set<string>();
  readonly #registry = new FinalizationRegistry<string>((what) => this.#held.delete(what));

  watch(value: Uint8Array, what: string): void {
    assert.ok(!this.#held.has(what), `watched twice: ${what}`);
    this.#held.add(what);
    this.#registry.register(value.buffer, what);
  }

  /**
   * Collects garbage until every watched buffer is freed or `ms` pass; returns what is still
   * held (the caller has dropped its own references).
   */
  async held(ms: number): Promise<string[]> {
    const until = Date.now() + ms;
    for (;;) {
      collectGarbage();
      // Finalizers run as tasks after the collection.
      await delay(10);
      if (this.#held.size === 0 || Date.now() >= until) return [...this.#held];
    }
  }
}
