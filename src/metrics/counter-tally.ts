import type { Counter } from 'prom-client';

/** One labelled child of a {@link CounterTally}: add to `n`, a plain number. */
export interface Tally {
  n: number;
}

/**
 * Increments of a prom-client counter summed in plain numbers on the hot path and added to the
 * counter whenever it is read (its `collect`, which every scrape and `get()` runs first), so a
 * lookup does not hash its label object per increment. Readers see the same totals.
 */
export class CounterTally<T extends string> {
  readonly #counter: Counter<T>;
  readonly #children = new Map<string, { labels: Partial<Record<T, string>>; tally: Tally }>();
  /** The tally of the counter without labels. */
  readonly total: Tally = { n: 0 };

  constructor(counter: Counter<T>) {
    this.#counter = counter;
    const c = counter as unknown as { collect?: () => unknown };
    const before = c.collect;
    c.collect = () => {
      this.flush();
      return before?.call(counter);
    };
  }

  /** The tally of the child with these labels (one label here: its value is the key). */
  child(labels: Partial<Record<T, string>>): Tally {
    const key = JSON.stringify(labels);
    let c = this.#children.get(key);
    if (c === undefined) {
      c = { labels, tally: { n: 0 } };
      this.#children.set(key, c);
    }
    return c.tally;
  }

  /** Adds what was tallied to the counter. */
  flush(): void {
    if (this.total.n > 0) {
      this.#counter.inc(this.total.n);
      this.total.n = 0;
    }
    for (const { labels, tally } of this.#children.values()) {
      if (tally.n === 0) continue;
      this.#counter.inc(labels, tally.n);
      tally.n = 0;
    }
  }
}

const TALLIES = new WeakMap<Counter<string>, CounterTally<string>>();

/** The one tally of `counter` (made on first use, shared by every caller). */
export function tallyOf<T extends string>(counter: Counter<T>): CounterTally<T> {
  let t = TALLIES.get(counter as unknown as Counter<string>);
  if (t === undefined) {
    t = new CounterTally(counter as unknown as Counter<string>);
    TALLIES.set(counter as unknown as Counter<string>, t);
  }
  return t as unknown as CounterTally<T>;
}
