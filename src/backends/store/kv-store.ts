/**
 * The four-method store: the smallest thing a storage tier can be built on. A {@link KvStore}
 * keeps opaque values under opaque keys (`get`, `put`, `has`, `delete`, plus optional `list`,
 * `clear`, `count` and TTLs); {@link StoreBackend} (store-backend.ts) turns one into a full
 * `StorageBackend`: the stored chunk format and its checksum, corrupt or misplaced objects as
 * misses that are deleted, stats, batched calls with bounded concurrency, deadlines, capabilities.
 * docs/backends.md §2 explains it for plug-in authors.
 */
import { KvtierError } from '../../errors.ts';
import { describe } from '../../util/validate.ts';
import type { BackendHealth, ChunkHash, NamespaceId } from '../core/types.ts';

declare const storeKeyBrand: unique symbol;

/**
 * A store key: `<ns>/<hash>`, the namespace id's 32 and the hash's 64 lowercase hex digits with
 * one `/` between them (97 characters, all ASCII). Every byte of the hash is in it, so two
 * hashes that differ in one byte are two keys, and its text is the same bytes in UTF-8, Latin-1
 * or ASCII: a store may use it as a file name, a Redis key, an S3 key or a UTF-8 database column
 * as it is. Never turn the hash back into raw bytes and decode those as text (most 32-byte hashes
 * are not valid UTF-8, and a lossy decode maps different hashes to one key). Built only by
 * {@link storeKey}; {@link storeKeyParts} takes one apart.
 */
export type StoreKey = string & { readonly [storeKeyBrand]: true };

const NS_RE = /^[0-9a-f]{32}$/;
const KEY_RE = /^([0-9a-f]{32})\/([0-9a-f]{64})$/;

/**
 * @throws KvtierError `KVT_INVALID_ARGUMENT` unless `ns` is 32 lowercase hex digits (a
 *   `ChunkHash` is valid by construction and not re-checked).
 */
export function checkNamespace(ns: NamespaceId): void {
  if (typeof ns !== 'string' || !NS_RE.test(ns))
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `namespace must be 32 lowercase hex digits, got ${describe(ns)}`,
    );
}

/** The key of (ns, hash): `<ns>/<hash>`. The caller has checked `ns` ({@link checkNamespace}). */
export function storeKey(ns: NamespaceId, hash: ChunkHash): StoreKey {
  return `${ns}/${hash}` as StoreKey;
}

/** The prefix every key of `ns` starts with (`<ns>/`), or `''` (every key) when `ns` is omitted. */
export function storeKeyPrefix(ns?: NamespaceId): string {
  return ns === undefined ? '' : `${ns}/`;
}

/** The namespace and hash of a key, or null for text that is not a {@link StoreKey}. */
export function storeKeyParts(key: string): { ns: NamespaceId; hash: ChunkHash } | null {
  const m = KEY_RE.exec(key);
  return m === null ? null : { ns: m[1]!, hash: m[2] as ChunkHash };
}

/** What every store call takes. */
export interface StoreCallOptions {
  /**
   * Fires when the caller stops waiting (its own abort, the tier's deadline, close): stop early
   * where you can. The wrapper answers the caller at once either way; work that lands later must
   * leave the store consistent. The call must still settle soon after: at once when it can stop,
   * else when the work it started ends, which its own deadline bounds (a call that never settles
   * keeps its buffers for good).
   */
  readonly signal?: AbortSignal | undefined;
}

/** Options of {@link KvStore.get}: hints a store may use, or ignore. */
export interface StoreGetOptions extends StoreCallOptions {
  /** Values longer than this are not chunk objects this tier wrote (a store may refuse to buffer them). */
  readonly maxBytes?: number | undefined;
  /**
   * A store that reads the value piece by piece may compute the CRC-32C of its bytes from this
   * offset to the end as they arrive and return it as {@link StoredValue.crc32c}, sparing a second
   * pass over the payload.
   */
  readonly crc32cFrom?: number | undefined;
}

/** Options of {@link KvStore.put}. */
export interface StorePutOptions extends StoreCallOptions {
  /** Expire the value this long after it is written (ms); given only when {@link KvStoreInfo.ttl}. */
  readonly ttlMs?: number | undefined;
}

/** A value read with extra knowledge; a store may return the bare bytes instead. */
export interface StoredValue {
  readonly bytes: Uint8Array;
  /** CRC-32C of `bytes` from `crc32cFrom` (see {@link StoreGetOptions}) to the end. */
  readonly crc32c?: number | undefined;
  /**
   * Gives `bytes` back to the store (a pooled buffer). The wrapper calls it once nothing reads
   * them: after a failed check at once, else through the returned chunk's `release`, which its
   * receiver may never call (the bytes are then garbage-collected).
   */
  readonly release?: (() => void) | undefined;
}

/** How many values and bytes: the answer of `clear` and `count`. */
export interface StoreTally {
  readonly keys: number;
  readonly bytes: number;
}

/** What a store is, as the tier's capabilities declare it. */
export interface KvStoreInfo {
  /** Values survive a restart of the sidecar. */
  readonly persistent: boolean;
  /** Several sidecars may read and write the store. */
  readonly shared: boolean;
  /** The store drops values on its own (a memory bound, a lifecycle rule). */
  readonly evicts: boolean;
  /** `put` honours {@link StorePutOptions.ttlMs}. */
  readonly ttl: boolean;
}

/**
 * A key-value store a tier is built on (see the file's comment). Keys are {@link StoreKey}s,
 * values opaque bytes (whole chunk objects: the wrapper encodes and verifies them). Every method
 * may reject; the wrapper turns a rejection into the tier's error (`KVT_BACKEND` unless it is a
 * `KvtierError` already), counts it, and answers a failed key of a batch as a miss.
 *
 * Besides the four methods a store needs `info`, `close`, and {@link list} or {@link clear}
 * (without either, clearing a namespace fails). Where several instances share the storage (two
 * sidecars), each sees the others' puts and deletes as soon as they resolved: no read cache of its
 * own. The store contract (`describeStoreContract`, test/contract/store.contract.ts) checks these
 * rules on the store itself.
 */
export interface KvStore {
  readonly info: KvStoreInfo;
  /** The value of `key`, or null when there is none. */
  get(key: StoreKey, opts: StoreGetOptions): Promise<Uint8Array | StoredValue | null>;
  /**
   * Writes `value` under `key` unless the key exists: true when written, false when it was there
   * (its value is kept). Atomic: a reader sees the whole value or none, and puts of one key from
   * several instances at once leave one value with one of them answering true (use the service's
   * own put-if-absent; a check, then a write, is not). Keep no reference to `value` once the
   * promise resolves (the wrapper reuses the buffer); after a rejection the wrapper never touches
   * it again, and the store lets go of it once the work it started has ended.
   */
  put(key: StoreKey, value: Uint8Array, opts: StorePutOptions): Promise<boolean>;
  /** Whether `key` has a value. */
  has(key: StoreKey, opts: StoreCallOptions): Promise<boolean>;
  /**
   * Deletes `key`: false when there was no value, else the bytes removed (or true when the store
   * cannot tell; the tier's `bytesUsed` then keeps them).
   */
  delete(key: StoreKey, opts: StoreCallOptions): Promise<number | boolean>;
  /**
   * Optional: every key that starts with `prefix` (`''` for all), each once, with its size when
   * known. With it (and without {@link clear}) the wrapper clears by listing and deleting; the
   * event stream's snapshots list a shared store with it. Give it even with `clear`, complete.
   */
  list?(
    prefix: string,
    opts: StoreCallOptions,
  ): AsyncIterable<{ readonly key: StoreKey; readonly bytes?: number }>;
  /** Optional: deletes every key that starts with `prefix`; what it removed. */
  clear?(prefix: string, opts: StoreCallOptions): Promise<StoreTally>;
  /** Optional: how many keys start with `prefix` and their bytes (the tier's stats at start). */
  count?(prefix: string, opts: StoreCallOptions): Promise<StoreTally>;
  /**
   * Optional: {@link put} with the value still being encoded: read `value` only once `filled`
   * resolves; when it rejects, write nothing and reject. With it the wrapper encodes the chunk
   * object while the store works (S3 asks whether the key exists meanwhile); without it the
   * wrapper calls `put` once the value is whole.
   */
  putFilling?(
    key: StoreKey,
    value: Uint8Array,
    filled: Promise<void>,
    opts: StorePutOptions,
  ): Promise<boolean>;
  /**
   * Optional: a buffer of exactly `byteLength` bytes for the value of the next `put` of `key`.
   * The wrapper encodes the chunk object into it and passes that same buffer to `put`, or drops
   * it when encoding fails. Lets a store place the value inside its own wire frame (no copy).
   */
  valueBuffer?(key: StoreKey, byteLength: number, opts: StorePutOptions): Uint8Array;
  /** Optional: connects, checks the service. Rejects to fail the tier's start. */
  start?(): Promise<void>;
  /** Optional: the store's own view of its health; 'up' when absent. Synchronous. */
  health?(): BackendHealth;
  /** Optional: counters of the store's own, added to the tier's `stats()`. Synchronous. */
  stats?(): Readonly<Record<string, number>>;
  /**
   * Releases connections and handles; calls in flight settle (they may reject), calls after it
   * reject (`KVT_CLOSED`). Called once.
   */
  close(): Promise<void>;
}

/**
 * What keeps `store` from being a tier's store: `info` with its four flags, the four methods and
 * `close`, and `list` or `clear` (without either a CLEAR of the tier cannot be done).
 */
export function kvStoreProblems(store: KvStore): string[] {
  const out: string[] = [];
  const s = store as unknown as Record<string, unknown>;
  const info = s.info as Record<string, unknown> | undefined;
  if (typeof info !== 'object' || info === null) out.push('it has no info');
  else
    for (const flag of ['persistent', 'shared', 'evicts', 'ttl'])
      if (typeof info[flag] !== 'boolean') out.push(`info.${flag} is not a boolean`);
  const missing = ['get', 'put', 'has', 'delete', 'close'].filter(
    (m) => typeof s[m] !== 'function',
  );
  if (missing.length > 0) out.push(`missing methods: ${missing.join(', ')}`);
  if (typeof s.list !== 'function' && typeof s.clear !== 'function')
    out.push('it has neither list nor clear, so the tier could not be cleared');
  return out;
}
