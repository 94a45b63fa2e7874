/**
 * The store contract catches the bugs a trial plug-in had, every run: each variant below is the
 * reference store (test/support/shared-map-store.ts, which passes the whole suite) with one bug
 * planted, and each named case of the suite must reject against it, for the planted reason, run
 * after run, while the same case passes against the reference store. The races and reads are
 * arranged so that the catch does not depend on timing: a racing put awaits between its check and
 * its write, a cache is read before the other instance changes the key, a call that never settles
 * is caught by the suite's bound on settling.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type {
  StoreCallOptions,
  StoreKey,
  StorePutOptions,
} from '../../src/backends/store/kv-store.ts';
import { MapService, MapStore } from '../support/shared-map-store.ts';
import {
  runStoreContractCase,
  type StoreContractCaseId,
  type StoreContractOptions,
  type StoreContractSubject,
} from './store.contract.ts';

/** Runs of each catching case per test run. */
const RUNS = 3;
/** A short bound: the reference store settles in a turn; a store that hangs fails sooner. */
const OPTS: StoreContractOptions = { abortSettleMs: 500 };

const turn = () => new Promise<void>((resolve) => setImmediate(resolve));

/**
 * (a) A call whose signal fires is taken for a lost connection: the value is kept for a retry,
 * and the retry waits for a reconnection that never comes. The call never settles and keeps its
 * buffer.
 */
class RetryForeverStore extends MapStore {
  readonly retries: Uint8Array[] = [];
  readonly #reconnected = new Promise<void>(() => {});

  override async put(key: StoreKey, value: Uint8Array, opts: StorePutOptions): Promise<boolean> {
    for (;;) {
      try {
        return await super.put(key, value, opts);
      } catch {
        this.retries.push(value);
        await this.#reconnected;
      }
    }
  }

  override async get(key: StoreKey, opts: StoreCallOptions): Promise<Uint8Array | null> {
    for (;;) {
      try {
        return await super.get(key, opts);
      } catch {
        await this.#reconnected;
      }
    }
  }
}

/** (b) Put-if-absent as a check, then a write: two instances both find the key absent. */
class CheckThenWriteStore extends MapStore {
  override async put(key: StoreKey, value: Uint8Array, opts: StorePutOptions): Promise<boolean> {
    if (await this.has(key, opts)) return false;
    await turn();
    this.service.remove(key);
    return this.service.publish(key, value.slice(), Number.POSITIVE_INFINITY);
  }
}

/** (c) A listing that returns its first page only, while `clear` (which the wrapper prefers) works. */
class FirstPageListStore extends MapStore {
  override async *list(prefix: string, opts: StoreCallOptions) {
    let n = 0;
    for await (const e of super.list(prefix, opts)) {
      if (n++ === 16) return;
      yield e;
    }
  }
}

/** (d) Reads cached per instance, forgotten only on this instance's own put and delete. */
class CachedReadsStore extends MapStore {
  readonly #cache = new Map<string, Uint8Array | null>();

  override async get(key: StoreKey, opts: StoreCallOptions): Promise<Uint8Array | null> {
    const hit = this.#cache.get(key);
    if (hit !== undefined) return hit?.slice() ?? null;
    const v = await super.get(key, opts);
    this.#cache.set(key, v?.slice() ?? null);
    return v;
  }

  override async has(key: StoreKey, opts: StoreCallOptions): Promise<boolean> {
    const hit = this.#cache.get(key);
    if (hit !== undefined) return hit !== null;
    const v = await super.get(key, opts);
    this.#cache.set(key, v);
    return v !== null;
  }

  override async put(key: StoreKey, value: Uint8Array, opts: StorePutOptions): Promise<boolean> {
    const stored = await super.put(key, value, opts);
    if (stored) this.#cache.set(key, value.slice());
    return stored;
  }

  override async delete(key: StoreKey, opts: StoreCallOptions): Promise<number | false> {
    this.#cache.set(key, null);
    return super.delete(key, opts);
  }
}

/** (e) A put that publishes its buffer first and fills it afterwards: readers see a prefix. */
class FillInPlaceStore extends MapStore {
  override async put(key: StoreKey, value: Uint8Array, opts: StorePutOptions): Promise<boolean> {
    await this.service.turn(opts.signal, 'put');
    const bytes = new Uint8Array(value.byteLength);
    if (!this.service.publish(key, bytes, Number.POSITIVE_INFINITY)) return false;
    const slice = 4 * 1024 * 1024;
    for (let at = 0; at < value.byteLength; at += slice) {
      await turn();
      bytes.set(value.subarray(at, at + slice), at);
    }
    return true;
  }
}

/** (f) Every value put kept by reference "for debugging": the caller's buffers are never freed. */
class KeepsValuesStore extends MapStore {
  readonly recent: Uint8Array[] = [];

  override async put(key: StoreKey, value: Uint8Array, opts: StorePutOptions): Promise<boolean> {
    this.recent.push(value);
    return super.put(key, value, opts);
  }
}

interface Variant {
  readonly bug: string;
  readonly make: (service: MapService) => MapStore;
  /** The cases that must fail, each with what its failure must say. */
  readonly caught: readonly (readonly [StoreContractCaseId, RegExp])[];
}

const VARIANTS: readonly Variant[] = [
  {
    bug: '(a) a put or get that never settles after its abort, keeping its buffer',
    make: (s) => new RetryForeverStore(s),
    caught: [
      ['cancellation.abortedBefore', /did not settle within/],
      ['cancellation.abortedDuring', /did not settle within/],
      ['cancellation.stalled', /did not settle within/],
    ],
  },
  {
    bug: '(b) put-if-absent as has-then-put, with an await between',
    make: (s) => new CheckThenWriteStore(s),
    caught: [
      ['sharing.race', /both puts answered true/],
      ['atomicity.concurrentPuts', /of 16 concurrent puts of one key answered true/],
    ],
  },
  {
    bug: '(c) list omits entries while clear exists',
    make: (s) => new FirstPageListStore(s),
    caught: [['listing.list', /is not listed/]],
  },
  {
    bug: "(d) an instance-local read cache (stale after the other instance's change)",
    make: (s) => new CachedReadsStore(s),
    caught: [['sharing.visibility', /after the put: get|after the delete: get/]],
  },
  {
    bug: '(e) a put that publishes its buffer before filling it',
    make: (s) => new FillInPlaceStore(s),
    caught: [['atomicity.readsDuringLargePut', /during the put: .* none of the values put/]],
  },
  {
    bug: "(f) a store that keeps references to the caller's put buffers",
    make: (s) => new KeepsValuesStore(s),
    caught: [['cancellation.abortedDuring', /still holds \d+ put value/]],
  },
];

/** A subject over a fresh service whose every instance `make` builds. */
function factory(make: (service: MapService) => MapStore) {
  return async (): Promise<StoreContractSubject> => {
    const service = new MapService();
    return {
      store: make(service),
      open: async () => make(service),
      stall: async () => service.stall(),
      unstall: async () => service.unstall(),
      cleanup: async () => service.unstall(),
    };
  };
}

for (const v of VARIANTS) {
  describe(`planted bug ${v.bug}`, () => {
    for (const [id, reason] of v.caught) {
      test(`${id} passes on the reference store and fails on this one, ${RUNS} runs of ${RUNS}`, async () => {
        const passed = await runStoreContractCase(
          id,
          factory((s) => new MapStore(s)),
          OPTS,
        );
        assert.deepEqual(passed, {}, `${id} did not run on the reference store`);
        for (let run = 1; run <= RUNS; run++)
          await assert.rejects(
            runStoreContractCase(id, factory(v.make), OPTS),
            (err: unknown) => {
              assert.match(String((err as Error).message), reason, `run ${run}: failed otherwise`);
              return true;
            },
            `run ${run}: ${id} passed against the planted bug`,
          );
      });
    }
  });
}
