/**
 * A map from 53-bit integer keys (numbers) to block ids, for the engine's prefix cache: open
 * addressing with linear probing in typed arrays, deletion by backward shift (no tombstones),
 * sized for at most `maxKeys` keys at half load. A `Map` of numbers does the same with an
 * allocation per insert; this does none, which matters at millions of blocks per run.
 */
export class KeyIndex {
  readonly #keys: Float64Array;
  readonly #values: Int32Array;
  readonly #mask: number;
  #size = 0;

  /** An index for at most `maxKeys` keys at once. */
  constructor(maxKeys: number) {
    let cap = 8;
    while (cap < 2 * maxKeys) cap *= 2;
    this.#keys = new Float64Array(cap).fill(Number.NaN);
    this.#values = new Int32Array(cap);
    this.#mask = cap - 1;
  }

  /** Keys held. */
  get size(): number {
    return this.#size;
  }

  /** The value under `key`, or -1. */
  get(key: number): number {
    const keys = this.#keys;
    for (let i = this.#slot(key); ; i = (i + 1) & this.#mask) {
      const k = keys[i]!;
      if (k === key) return this.#values[i]!;
      if (Number.isNaN(k)) return -1;
    }
  }

  /** Whether `key` is held. */
  has(key: number): boolean {
    return this.get(key) >= 0;
  }

  /** Puts `value` (>= 0) under `key` when the key is absent; returns false when it was there. */
  setIfAbsent(key: number, value: number): boolean {
    const keys = this.#keys;
    let i = this.#slot(key);
    for (; ; i = (i + 1) & this.#mask) {
      const k = keys[i]!;
      if (k === key) return false;
      if (Number.isNaN(k)) break;
    }
    keys[i] = key;
    this.#values[i] = value;
    this.#size++;
    return true;
  }

  /** Removes `key`; returns whether it was held. */
  delete(key: number): boolean {
    const keys = this.#keys;
    const mask = this.#mask;
    let i = this.#slot(key);
    for (; ; i = (i + 1) & mask) {
      const k = keys[i]!;
      if (k === key) break;
      if (Number.isNaN(k)) return false;
    }
    // Backward shift: move later entries of the probe run into the hole when their home allows.
    let hole = i;
    for (let j = (i + 1) & mask; ; j = (j + 1) & mask) {
      const k = keys[j]!;
      if (Number.isNaN(k)) break;
      const home = this.#slot(k);
      // Movable when its home is not within (hole, j] cyclically.
      if (hole <= j ? home <= hole || home > j : home <= hole && home > j) {
        keys[hole] = k;
        this.#values[hole] = this.#values[j]!;
        hole = j;
      }
    }
    keys[hole] = Number.NaN;
    this.#size--;
    return true;
  }

  /** Removes every key. */
  clear(): void {
    this.#keys.fill(Number.NaN);
    this.#size = 0;
  }

  #slot(key: number): number {
    const lo = key >>> 0;
    const hi = Math.floor(key / 4294967296) >>> 0;
    return (Math.imul(lo ^ Math.imul(hi, 0x85ebca6b), 0x9e3779b1) >>> 0) & this.#mask;
  }
}
