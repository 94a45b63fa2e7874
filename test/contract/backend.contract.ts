/**
 * The contract every {@link StorageBackend} passes: one suite, run by a few-line test file per
 * backend against a real directory or server (plug-in authors run it the same way):
 *
 * ```ts
 * describeBackendContract('redis', async () => ({ backend, down, up, cleanup }), {
 *   downTimeoutMs: 2000,
 *   skip: { pins: 'redis does not pin' },
 * });
 * ```
 *
 * Every test builds a fresh subject through the factory, calls `cleanup()` in a `finally`, and
 * uses random namespaces and hashes, so tests never see each other's data. Tests that do not
 * apply (a capability the backend lacks, a hook the subject does not offer, a group in
 * `opts.skip`) are reported as skipped, never as passed.
 */
import { describe, it } from 'node:test';
import type { StorageBackend } from '../../src/backends/core/types.ts';
import { KvtierError } from '../../src/errors.ts';
import {
  boundedEviction,
  callsAfterClose,
  clearSpaces,
  closeTwice,
  concurrentPuts,
  containsPins,
  corruption,
  isolatedSpaces,
  keyedGet,
  largeChunk,
  oversizedChunk,
  partialChunk,
  persistence,
  pinnedUnderPressure,
  pinRefcount,
  prefixContains,
  putExisting,
  removeChunks,
  roundTrip,
  sharing,
  smallChunk,
} from './suite/basics.ts';
import { type Case, type Ctx, OVERSIZE_TEST_MAX_BYTES } from './suite/context.ts';
import { abortedBefore, abortedDuring, outage, stalledUnderBreaker } from './suite/faults.ts';
import { invalidUtf8Hashes, oneByteApart, readAfterClear, readAfterRemove } from './suite/keys.ts';
import { corruptNeverServed, heldIsNeverReused, reuseAfterRelease } from './suite/release.ts';

// The store-level contract (a KvStore checked on its own), shipped in `kvtier/testing` beside it.
export {
  describeStoreContract,
  runStoreContractCase,
  STORE_CONTRACT_CASES,
  type StoreCaseResult,
  type StoreContractCaseId,
  type StoreContractGroup,
  type StoreContractOptions,
  type StoreContractSubject,
} from './store.contract.ts';
export type { StoreCase, StoreCtx } from './store-suite/context.ts';

/** Ways a subject can damage a stored object below the backend's API. */
export type CorruptionKind = 'payload' | 'truncate' | 'magic' | 'foreign-hash';

/** Every {@link CorruptionKind}; the suite runs one test per kind. */
export const CORRUPTION_KINDS: readonly CorruptionKind[] = [
  'payload',
  'truncate',
  'magic',
  'foreign-hash',
];

/** A backend under test plus the hooks that reach below its API. Built fresh per test. */
export interface ContractSubject {
  backend: StorageBackend;
  /**
   * Damages the stored object of (ns, hash) in place, below the backend's API: `payload` flips
   * payload bytes, `truncate` cuts the object short, `magic` breaks the header's magic,
   * `foreign-hash` puts another chunk's valid object under this key.
   */
  corrupt?(ns: string, hash: string, kind: CorruptionKind): Promise<void>;
  /** Makes the backend's service unavailable (kill the server, unmount...), and back. */
  down?(): Promise<void>;
  up?(): Promise<void>;
  /**
   * Freezes the service so that calls hang (connections stay open, nothing answers: SIGSTOP a
   * server), and undoes it; for the `cancellation` group's breaker test.
   */
  stall?(): Promise<void>;
  unstall?(): Promise<void>;
  /** Opens a second, fresh backend instance over the same storage (persistence, sharing). */
  reopen?(): Promise<StorageBackend>;
  /** Removes everything the subject created (dirs, keys, buckets, servers). */
  cleanup(): Promise<void>;
}

/**
 * Test groups that `ContractOptions.skip` can turn off, with a reason:
 * - `pins`: refcounted pins, pins taken by contains and put, a pinned chunk under eviction;
 * - `eviction`: `bytesUsed` within `capacityBytes`, old chunks evicted (needs `capacityBytes`);
 * - `corruption`: each {@link CorruptionKind} is a miss, never data, then removed;
 * - `cancellation`: aborted and timed-out signals, a stalled service under the breaker;
 * - `release`: `Chunk.release` (a get's buffer given back for reuse) never lets one chunk's
 *   bytes show up in another: released buffers give way to later gets that stay byte-exact, a
 *   chunk not released is never overwritten, a corrupt object read into a released buffer is
 *   never served. It holds for a backend without the hook too (nothing is reused); skip it only
 *   while a reuse scheme is being written, with the reason;
 * - `outage`: calls while the service is down settle, and it serves again after `up()`;
 * - `persistence`: a fresh instance reads what another wrote, a shared store shows both.
 */
export type ContractGroup =
  | 'pins'
  | 'eviction'
  | 'corruption'
  | 'cancellation'
  | 'release'
  | 'outage'
  | 'persistence';

/** How the suite runs against one backend configuration. */
export interface ContractOptions {
  /** Backend enforces a byte bound and evicts: the factory was configured with this capacity. */
  capacityBytes?: number;
  /** Run the 32 MiB chunk test (default true). */
  largeChunks?: boolean;
  /** Longest a call may take while the service is down before it must settle, ms (default 5000). */
  downTimeoutMs?: number;
  /** Skip reasons for tests that do not apply, keyed by test group name. */
  skip?: Partial<Record<ContractGroup, string>>;
  /**
   * Chunk size of the eviction and pin-pressure tests in bytes (default `capacityBytes / 8`, at
   * most `maxChunkBytes`). Those tests put `3 × floor(capacityBytes / evictionChunkBytes) + 1`
   * chunks of this size; set it when your bound counts more than payload bytes per chunk (headers,
   * file-system blocks) so that one chunk is a small fraction of the bound, or to keep the tests
   * fast against a large bound.
   */
  evictionChunkBytes?: number;
  /**
   * Longest a call may take to settle once its signal fires, ms (default 1000); the breaker test
   * of the `cancellation` group also allows it past the breaker's deadline.
   */
  abortSettleMs?: number;
  /** Longest the backend may take to serve again after `up()`, ms (default 20000). */
  recoverTimeoutMs?: number;
}

/**
 * Defines a `describe(name)` block with the whole contract for the backend `factory` builds.
 * @param factory builds a fresh subject per test; the suite always calls its `cleanup()`.
 * @throws TypeError at definition time on invalid options.
 */
export function describeBackendContract(
  name: string,
  factory: () => Promise<ContractSubject>,
  opts: ContractOptions = {},
): void {
  for (const key of [
    'capacityBytes',
    'downTimeoutMs',
    'evictionChunkBytes',
    'recoverTimeoutMs',
    'abortSettleMs',
  ]) {
    const v = opts[key as keyof ContractOptions];
    if (v !== undefined && !(Number.isSafeInteger(v) && (v as number) > 0))
      throw new TypeError(`options.${key} must be a positive integer, got ${String(v)}`);
  }
  describe(name, () => {
    for (const [section, cases] of SECTIONS) {
      describe(section, () => {
        for (const c of cases) {
          const skip = opts.skip?.[section as ContractGroup] ?? c.skip?.(opts);
          it(c.title, { skip: skip ?? false }, async (t) => {
            const s = await factory();
            try {
              const ctx: Ctx = { s, b: s.backend, t, o: opts };
              const missing = c.need?.(ctx);
              if (missing !== undefined) t.skip(missing);
              else await c.run(ctx);
            } finally {
              await s.cleanup();
            }
          });
        }
      });
    }
  });
}

// ---- the table ----

const noLarge = (o: ContractOptions) =>
  o.largeChunks === false ? 'largeChunks: false' : undefined;
const noCap = (o: ContractOptions) =>
  o.capacityBytes === undefined ? 'no capacityBytes given: the backend has no bound' : undefined;
const pinning = ({ b }: Ctx) =>
  b.capabilities.pinning ? undefined : 'capabilities.pinning is false';
const oversizable = ({ b }: Ctx) =>
  b.capabilities.maxChunkBytes > OVERSIZE_TEST_MAX_BYTES
    ? `maxChunkBytes ${b.capabilities.maxChunkBytes} is too large to allocate past`
    : undefined;
const corruptible = ({ s }: Ctx) => (s.corrupt ? undefined : 'the subject has no corrupt hook');
const downable = ({ s }: Ctx) => (s.down && s.up ? undefined : 'the subject has no down/up hooks');
const stallable = ({ s }: Ctx) =>
  s.stall && s.unstall ? undefined : 'the subject has no stall/unstall hooks';
const reopenable =
  (cap: 'persistent' | 'shared') =>
  ({ s, b }: Ctx) => {
    if (s.reopen === undefined) return 'the subject has no reopen hook';
    return b.capabilities[cap] ? undefined : `capabilities.${cap} is false`;
  };

type Need = (c: Ctx) => string | undefined;
type Skip = (o: ContractOptions) => string | undefined;
const k = (title: string, run: Case['run'], need?: Need, skip?: Skip): Case => ({
  title,
  run,
  need,
  skip,
});

/** Sections named after a {@link ContractGroup} are skipped as a whole by `opts.skip[group]`. */
const SECTIONS: readonly (readonly [string, readonly Case[]])[] = [
  [
    'basics',
    [
      k('put, contains and get round-trip byte-exact, keeping tokens', roundTrip),
      k('batchedContains counts the contiguous prefix of hits', prefixContains),
      k('batchedGet is keyed: a missing middle chunk is null', keyedGet),
      k('put of an existing key is exists and keeps the first bytes', putExisting),
      k('remove returns the count; removed chunks are misses', removeChunks),
      k('clear(ns) clears only that namespace; clear() clears all', clearSpaces),
      k('namespaces are isolated: one hash, one chunk per namespace', isolatedSpaces),
      k('20 concurrent puts of one key leave one byte-exact copy', concurrentPuts),
      k('a 64 KiB chunk round-trips as a copy of the caller buffer', smallChunk),
      k('a 32 MiB chunk round-trips byte-exact', largeChunk, undefined, noLarge),
      k('a partial chunk (37 tokens) round-trips next to a full one', partialChunk),
      k('a chunk over maxChunkBytes is never stored', oversizedChunk, oversizable),
      k('a get or contains after remove misses (no stale read)', readAfterRemove),
      k('a get or contains after clear(ns) and clear() misses', readAfterClear),
      k('hashes whose bytes are not UTF-8 each round-trip to their own chunk', invalidUtf8Hashes),
      k('hashes one byte apart round-trip to their own chunks', oneByteApart),
    ],
  ],
  [
    'pins',
    [
      k('pin/unpin are refcounted; put with pin pins', pinRefcount, pinning),
      k('batchedContains with pin pins exactly the hits', containsPins, pinning),
      k(
        'a pinned chunk survives eviction until its last unpin',
        pinnedUnderPressure,
        pinning,
        noCap,
      ),
    ],
  ],
  [
    'eviction',
    [
      k(
        'bytesUsed stays within capacityBytes; old chunks are evicted',
        boundedEviction,
        undefined,
        noCap,
      ),
    ],
  ],
  [
    'corruption',
    CORRUPTION_KINDS.map((kind) =>
      k(`${kind}: a miss, never data, then removed`, corruption(kind), corruptible),
    ),
  ],
  [
    'cancellation',
    [
      k(
        'an aborted signal rejects contains, get and put with KVT_ABORTED',
        abortedBefore(() => undefined, 'KVT_ABORTED'),
      ),
      k(
        "the breaker's abort reason (KvtierError KVT_TIMEOUT) rejects them with KVT_TIMEOUT",
        abortedBefore(
          () => new KvtierError('KVT_TIMEOUT', 'tier call took over 1 ms'),
          'KVT_TIMEOUT',
        ),
      ),
      k(
        'a signal that fires during a call settles it promptly; the store stays consistent',
        abortedDuring,
      ),
      k(
        'under a breaker, a stalled service costs a call at most timeoutMs',
        stalledUnderBreaker,
        stallable,
      ),
    ],
  ],
  [
    'release',
    [
      k('a released chunk gives way to later gets, which stay byte-exact', reuseAfterRelease),
      k('a chunk not released is never overwritten by later gets', heldIsNeverReused),
      k('a corrupt object read after a release is never served', corruptNeverServed, corruptible),
    ],
  ],
  [
    'lifecycle',
    [
      k('close twice (also concurrently) resolves', closeTwice),
      k('calls after close reject with KVT_CLOSED', callsAfterClose),
    ],
  ],
  ['outage', [k('while down every call settles as a miss; after up it serves', outage, downable)]],
  [
    'persistence',
    [
      k(
        'chunks written by one instance are read by a fresh one',
        persistence,
        reopenable('persistent'),
      ),
      k("a shared store shows each instance the other's writes", sharing, reopenable('shared')),
    ],
  ],
];
