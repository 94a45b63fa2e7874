/**
 * The contract every {@link KvStore} passes, checked on the store itself rather than through
 * `StoreBackend` (which serializes puts per key, answers aborted callers at once and never lists
 * a store that can clear, so it hides a store's own races, hangs and listing). A few-line test
 * file per store runs it against a real service:
 *
 * ```ts
 * describeStoreContract('my store', async () => {
 *   const store = new MyStore(dir);
 *   return { store, open: async () => new MyStore(dir), cleanup: () => rm(dir, { recursive: true }) };
 * });
 * ```
 *
 * Every test builds a fresh subject, uses random keys, closes every store instance it got once
 * and calls `cleanup()`. Tests that do not apply (a method the store lacks, an `info` flag, a hook
 * the subject does not offer, a group in `opts.skip`) are reported as skipped with the reason,
 * never as passed. Each test is also a function, {@link runStoreContractCase}, that rejects when
 * the store breaks the contract.
 */
import { describe, it } from 'node:test';
import type { KvStore } from '../../src/backends/store/kv-store.ts';
import { concurrentPuts, readsDuringLargePut } from './store-suite/atomicity.ts';
import {
  absentKey,
  canClear,
  deleteAnswers,
  infoFlags,
  oneByteApart,
  putIfAbsent,
  roundTrip,
  storedCrc,
} from './store-suite/basics.ts';
import { abortedBefore, abortedDuring, abortedWhileStalled } from './store-suite/cancellation.ts';
import { attempt, type StoreCase, type StoreCtx, within } from './store-suite/context.ts';
import { callsAfterClose, closeInFlight, ttlExpiry } from './store-suite/lifecycle.ts';
import { clearSpaces, countKeys, listKeys } from './store-suite/listing.ts';
import { persistence, racedPuts, visibility } from './store-suite/sharing.ts';
import { scaledMs } from './suite/context.ts';

/** A store under test plus what reaches past it. Built fresh per test. */
export interface StoreContractSubject {
  /** A started store (its `start`, if any, has resolved). The suite closes it, once. */
  store: KvStore;
  /**
   * Opens another started instance over the same storage: a second client of a shared service,
   * or the same directory or database reopened. The `sharing` group keeps both open at once
   * (when `info.shared`); `persistence` opens it after closing the first (when
   * `info.persistent`). The suite closes every instance it opened, once.
   */
  open?(): Promise<KvStore>;
  /**
   * Freezes the service so that calls hang with their connections open (`SIGSTOP` a server, a
   * gate every call waits on), and undoes it; for the `cancellation` group's stalled test.
   */
  stall?(): Promise<void>;
  unstall?(): Promise<void>;
  /** Removes what the subject created (directories, keys, servers); every store is closed by then. */
  cleanup(): Promise<void>;
}

/**
 * Test groups `StoreContractOptions.skip` can turn off, with a reason:
 * - `listing`: `list` (called whenever the store has it, `clear` or not), `count`, `clear`;
 * - `atomicity`: concurrent puts of one key through one instance; reads during a 32 MiB put;
 * - `cancellation`: calls settle within `abortSettleMs` once their signal fires, leave each key
 *   whole or empty, and keep no reference to a put's value; a stalled service (with the hooks);
 * - `sharing`: two live instances: put-if-absent raced on many keys, and changes seen at once by
 *   the other instance, round after round (needs `open` and `info.shared`);
 * - `persistence`: a fresh instance reads what a closed one wrote (needs `open`, `info.persistent`);
 * - `ttl`: a value put with `ttlMs` expires, others stay (needs `info.ttl`).
 * The basics and the lifecycle (close, calls after close) always run.
 */
export type StoreContractGroup =
  | 'listing'
  | 'atomicity'
  | 'cancellation'
  | 'sharing'
  | 'persistence'
  | 'ttl';

/** Every test of the suite by id, `<group>.<name>`: what `skip` and {@link runStoreContractCase} take. */
export type StoreContractCaseId =
  | 'basics.info'
  | 'basics.clearable'
  | 'basics.absent'
  | 'basics.roundTrip'
  | 'basics.putIfAbsent'
  | 'basics.delete'
  | 'basics.oneByteApart'
  | 'basics.crc'
  | 'listing.list'
  | 'listing.count'
  | 'listing.clear'
  | 'atomicity.concurrentPuts'
  | 'atomicity.readsDuringLargePut'
  | 'cancellation.abortedBefore'
  | 'cancellation.abortedDuring'
  | 'cancellation.stalled'
  | 'sharing.race'
  | 'sharing.visibility'
  | 'persistence.reopen'
  | 'ttl.expiry'
  | 'lifecycle.closeInFlight'
  | 'lifecycle.afterClose';

/** How the suite runs against one store. */
export interface StoreContractOptions {
  /**
   * Longest a call may take to settle once its signal fires (and `close` to settle, and a put's
   * buffer to be released once its call settled), ms (default 2000). A bound on hangs, not a
   * speed: it is multiplied by the machine's load factor (`KVTIER_TEST_TIME_SCALE`, else the load
   * average per core, 1 to 10).
   */
  abortSettleMs?: number;
  /** Run the 32 MiB test of the `atomicity` group (default true). */
  largeValues?: boolean;
  /** Keys both instances race on in the `sharing` group (default 32). */
  raceKeys?: number;
  /** Rounds of the cross-instance visibility test, each way in turn (default 24). */
  visibilityRounds?: number;
  /** How long past its TTL a value may still be read, ms, scaled like `abortSettleMs` (default 5000). */
  ttlSlackMs?: number;
  /**
   * Skip reasons, by group (every test of it) or by test id (one test, e.g. where the service the
   * suite runs against differs from the real one in a way the store cannot help): what does not
   * apply, and why. The basics and lifecycle can be skipped only test by test.
   */
  skip?: Partial<Record<StoreContractGroup | StoreContractCaseId, string>>;
}

const DEFAULT_ABORT_SETTLE_MS = 2000;

const has =
  (method: 'list' | 'clear' | 'count') =>
  ({ store }: StoreCtx) =>
    typeof store[method] === 'function' ? undefined : `the store has no ${method}`;
const stallable = ({ s }: StoreCtx) =>
  s.stall !== undefined && s.unstall !== undefined
    ? undefined
    : 'the subject has no stall/unstall hooks';
const twoInstances =
  (flag: 'shared' | 'persistent') =>
  ({ s, store }: StoreCtx) => {
    if (!store.info[flag]) return `info.${flag} is false`;
    return s.open === undefined ? 'the subject has no open hook' : undefined;
  };
const ttl = ({ store }: StoreCtx) => (store.info.ttl ? undefined : 'info.ttl is false');
const noLarge = (o: StoreContractOptions) =>
  o.largeValues === false ? 'largeValues: false' : undefined;

type Group = StoreCase['group'];
const k = (
  id: StoreContractCaseId,
  title: string,
  run: StoreCase['run'],
  need?: StoreCase['need'],
  skip?: StoreCase['skip'],
): StoreCase => ({ id, group: id.slice(0, id.indexOf('.')) as Group, title, run, need, skip });

/** Every test of the suite, in the order it runs; see {@link runStoreContractCase}. */
export const STORE_CONTRACT_CASES: readonly StoreCase[] = [
  k('basics.info', 'info declares persistent, shared, evicts and ttl', infoFlags),
  k('basics.clearable', 'the store has list or clear (a namespace can be cleared)', canClear),
  k('basics.absent', 'an absent key: get null, has false, delete false', absentKey),
  k('basics.roundTrip', 'values of 0 B to 8 MiB round-trip; put keeps no view', roundTrip),
  k('basics.putIfAbsent', 'put of an existing key is false and keeps the value', putIfAbsent),
  k('basics.delete', 'delete answers the bytes or true, then false', deleteAnswers),
  k('basics.oneByteApart', 'keys one byte apart hold their own values', oneByteApart),
  k('basics.crc', "a get's crc32c, when given, is that of its bytes", storedCrc),
  k(
    'listing.list',
    'list yields every key under its prefix once, sizes right',
    listKeys,
    has('list'),
  ),
  k('listing.count', 'count tallies the keys and bytes under a prefix', countKeys, has('count')),
  k('listing.clear', 'clear removes its prefix only and tallies it', clearSpaces, has('clear')),
  k(
    'atomicity.concurrentPuts',
    '16 concurrent puts of one key: one true, one value',
    concurrentPuts,
  ),
  k(
    'atomicity.readsDuringLargePut',
    'get and has during a 32 MiB put see nothing or the whole value',
    readsDuringLargePut,
    undefined,
    noLarge,
  ),
  k('cancellation.abortedBefore', 'calls with an aborted signal settle', abortedBefore),
  k(
    'cancellation.abortedDuring',
    '4 MiB puts and gets aborted at five points settle, keys whole or empty, buffers released',
    abortedDuring,
  ),
  k(
    'cancellation.stalled',
    'calls aborted while the service is stalled settle; buffers released after',
    abortedWhileStalled,
    stallable,
  ),
  k(
    'sharing.race',
    'put-if-absent raced by two instances: one true and one whole value per key',
    racedPuts,
    twoInstances('shared'),
  ),
  k(
    'sharing.visibility',
    "each instance sees the other's puts and deletes at once, round after round",
    visibility,
    twoInstances('shared'),
  ),
  k(
    'persistence.reopen',
    'a fresh instance reads what a closed one wrote',
    persistence,
    twoInstances('persistent'),
  ),
  k('ttl.expiry', 'a value put with ttlMs expires; others stay', ttlExpiry, ttl),
  k('lifecycle.closeInFlight', 'close settles with calls in flight, and so do they', closeInFlight),
  k('lifecycle.afterClose', 'every call after close rejects', callsAfterClose),
];

const GROUPS: readonly StoreContractGroup[] = [
  'listing',
  'atomicity',
  'cancellation',
  'sharing',
  'persistence',
  'ttl',
];

function checkOptions(opts: StoreContractOptions): void {
  for (const key of ['abortSettleMs', 'raceKeys', 'visibilityRounds', 'ttlSlackMs'] as const) {
    const v = opts[key];
    if (v !== undefined && !(Number.isSafeInteger(v) && v > 0))
      throw new TypeError(`options.${key} must be a positive integer, got ${String(v)}`);
  }
  for (const [key, reason] of Object.entries(opts.skip ?? {})) {
    const known =
      (GROUPS as readonly string[]).includes(key) || STORE_CONTRACT_CASES.some((c) => c.id === key);
    if (!known)
      throw new TypeError(
        `options.skip.${key}: not a group (${GROUPS.join(', ')}) nor a test id (STORE_CONTRACT_CASES)`,
      );
    if (typeof reason !== 'string' || reason === '')
      throw new TypeError(`options.skip.${key} must be the reason, a non-empty string`);
  }
}

/** Why `c` is skipped before a subject is built, or undefined. */
function skipReason(c: StoreCase, o: StoreContractOptions): string | undefined {
  const group = c.group === 'basics' || c.group === 'lifecycle' ? undefined : o.skip?.[c.group];
  return group ?? o.skip?.[c.id] ?? c.skip?.(o);
}

/** How one case ended: passed, or skipped with the reason (a failure rejects). */
export type StoreCaseResult = { readonly skipped?: string };

/**
 * Runs one test of the suite (by its `id`, e.g. `'sharing.race'`; see
 * {@link STORE_CONTRACT_CASES}) against a fresh subject from `factory`, outside node:test.
 * @returns `{ skipped: reason }` when the test does not apply, else `{}`.
 * @throws the test's assertion error when the store breaks the contract; TypeError for an
 *   unknown id or bad options.
 */
export async function runStoreContractCase(
  id: StoreContractCaseId,
  factory: () => Promise<StoreContractSubject>,
  opts: StoreContractOptions = {},
): Promise<StoreCaseResult> {
  checkOptions(opts);
  const c = STORE_CONTRACT_CASES.find((x) => x.id === id);
  if (c === undefined) throw new TypeError(`no store contract case "${id}"`);
  return runCase(c, factory, opts);
}

async function runCase(
  c: StoreCase,
  factory: () => Promise<StoreContractSubject>,
  o: StoreContractOptions,
): Promise<StoreCaseResult> {
  const early = skipReason(c, o);
  if (early !== undefined) return { skipped: early };
  const s = await factory();
  const settleMs = scaledMs(o.abortSettleMs ?? DEFAULT_ABORT_SETTLE_MS);
  const opened: KvStore[] = [s.store];
  const closed = new Set<KvStore>();
  const close = async (store: KvStore): Promise<void> => {
    if (closed.has(store)) return;
    closed.add(store);
    const r = await within(
      attempt(() => store.close()),
      settleMs,
      'close',
    );
    if (!r.ok) throw r.error;
  };
  const ctx: StoreCtx = {
    s,
    store: s.store,
    o,
    settleMs,
    open: async () => {
      if (s.open === undefined) throw new TypeError('the subject has no open hook');
      const store = await s.open();
      opened.push(store);
      return store;
    },
    close,
  };
  let failure: unknown;
  let result: StoreCaseResult = {};
  try {
    const missing = c.need?.(ctx);
    if (missing !== undefined) result = { skipped: missing };
    else await c.run(ctx);
  } catch (err) {
    failure = err;
  }
  for (const store of opened) {
    try {
      await close(store);
    } catch (err) {
      failure ??= err;
    }
  }
  try {
    await s.cleanup();
  } catch (err) {
    failure ??= err;
  }
  if (failure !== undefined) throw failure;
  return result;
}

/**
 * Defines a `describe(name)` block with the whole store contract for the store `factory` builds.
 * @param factory builds a fresh subject per test; the suite closes its stores and calls `cleanup()`.
 * @throws TypeError at definition time on invalid options.
 */
export function describeStoreContract(
  name: string,
  factory: () => Promise<StoreContractSubject>,
  opts: StoreContractOptions = {},
): void {
  checkOptions(opts);
  describe(name, () => {
    for (const group of new Set(STORE_CONTRACT_CASES.map((c) => c.group))) {
      describe(group, () => {
        for (const c of STORE_CONTRACT_CASES.filter((x) => x.group === group)) {
          it(c.title, { skip: skipReason(c, opts) ?? false }, async (t) => {
            const r = await runCase(c, factory, opts);
            if (r.skipped !== undefined) t.skip(r.skipped);
          });
        }
      });
    }
  });
}
