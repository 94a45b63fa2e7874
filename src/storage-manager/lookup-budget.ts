import { KvtierError } from '../errors.ts';
import { requireInt } from '../util/validate.ts';

/**
 * Estimated heap bytes of one tracked lookup, measured on Node 20 (test/unit/lookup-budget.test.ts
 * checks the estimate is not below what a pinned lookup really costs):
 *
 * - `fixed`: the event-manager entry, the work promise and its closures, the abort handle, the
 *   pin ledger and the answer's objects;
 * - `perHash`: one 64-digit hex hash string (~80 bytes), its slots in the input, answer and
 *   ledger arrays, and the host tier's pin bookkeeping for it;
 * - `perIdByte`: the lookup id, stored as a string and a map key.
 */
export const LOOKUP_COST = Object.freeze({ fixed: 2048, perHash: 160, perIdByte: 4 });

/** Default of {@link LookupByteBudget}'s capacity: 64 MiB, about 400 000 pinned chunk hashes. */
export const DEFAULT_MAX_LOOKUP_BYTES = 64 * 1024 * 1024;

/** Estimated bytes the server keeps for a lookup naming `hashes` chunks (see {@link LOOKUP_COST}). */
export function estimateLookupBytes(hashes: number, lookupIdLength: number): number {
  return LOOKUP_COST.fixed + hashes * LOOKUP_COST.perHash + lookupIdLength * LOOKUP_COST.perIdByte;
}

/** One lookup's share of the budget. `resize` and `release` after `release` do nothing. */
export interface LookupBytesHold {
  /** Bytes held now (0 once released). */
  readonly bytes: number;
  /** Sets the share to `bytes` (an answered lookup keeps only its hits). Never refused. */
  resize(bytes: number): void;
  /** Gives the share back. Idempotent. */
  release(): void;
}

/**
 * Bounds, in estimated bytes, the state the storage manager keeps for lookups: running ones
 * (their hashes) and answered ones that hold pins until a LOAD, HOLD, CANCEL or the pin TTL.
 * A lookup that would go over the bound is refused at once with `KVT_CAPACITY`; nothing already
 * admitted is dropped to make room (an answered lookup's pins stay while a LOAD may still come).
 */
export class LookupByteBudget {
  readonly capacity: number;
  #used = 0;
  #refused = 0;

  /** @throws KvtierError `KVT_INVALID_ARGUMENT` unless `capacityBytes` is an integer ≥ 1. */
  constructor(capacityBytes: number = DEFAULT_MAX_LOOKUP_BYTES) {
    this.capacity = requireInt('maxLookupBytes', capacityBytes, 1);
  }

  /** Estimated bytes held by admitted lookups. */
  get used(): number {
    return this.#used;
  }

  /** Lookups refused because the budget was full, since construction. */
  get refused(): number {
    return this.#refused;
  }

  /**
   * Admits a lookup of `bytes` estimated bytes.
   * @throws KvtierError `KVT_CAPACITY` when it does not fit beside the lookups already held.
   */
  hold(bytes: number): LookupBytesHold {
    if (this.#used + bytes > this.capacity) {
      this.#refused++;
      throw new KvtierError(
        'KVT_CAPACITY',
        `lookup memory is full: ${this.#used} of ${this.capacity} bytes (storage.maxLookupBytes) held by lookups in flight or pinned; a lookup of ~${bytes} bytes is refused until pins are released (LOAD, HOLD, CANCEL or the pin TTL)`,
      );
    }
    this.#used += bytes;
    return new Hold(this, bytes);
  }

  /** Adds `delta` (may be negative) to the bytes held; for {@link Hold} only. */
  adjust(delta: number): void {
    this.#used += delta;
  }
}

/** One admitted lookup's share: a plain object (no closures) on the lookup hot path. */
class Hold implements LookupBytesHold {
  readonly #budget: LookupByteBudget;
  #held: number;

  constructor(budget: LookupByteBudget, bytes: number) {
    this.#budget = budget;
    this.#held = bytes;
  }

  get bytes(): number {
    return this.#held;
  }

  resize(n: number): void {
    if (this.#held === 0) return;
    this.#budget.adjust(n - this.#held);
    this.#held = n;
  }

  release(): void {
    this.#budget.adjust(-this.#held);
    this.#held = 0;
  }
}
