import type { Histogram } from 'prom-client';
import { reportOf } from './prom-helpers.ts';

/** One labelled child of a {@link HistogramTally}: `observe` records into plain numbers. */
export interface HistogramChild {
  /**
   * Records one value (seconds, for kvtier's latency histograms).
   * @throws TypeError for a value that is not a finite number, as prom-client's `observe`.
   */
  observe(value: number): void;
}

/** A histogram entry as prom-client 15 keeps it (`hashMap` values). */
interface Entry {
  labels: Record<string, string | number>;
  bucketValues: Record<string, number>;
  sum: number;
  count: number;
}

/** The parts of a prom-client 15 histogram the tally writes into when it is read. */
interface Internals {
  hashMap: Record<string, Entry>;
  upperBounds: readonly number[];
  enableExemplars: boolean;
  zero(labels: Record<string, string | number>): void;
}

class Child implements HistogramChild {
  /** Observations per bucket: index i counts values in (bound[i-1], bound[i]]; the last, above every bound. */
  readonly counts: Float64Array;
  sum = 0;
  count = 0;
  readonly #bounds: readonly number[];
  readonly #report: ((value: number) => void) | undefined;

  constructor(
    readonly labels: Record<string, string>,
    bounds: readonly number[],
    report: ((value: number) => void) | undefined,
  ) {
    this.#bounds = bounds;
    this.counts = new Float64Array(bounds.length + 1);
    this.#report = report;
  }

  observe(value: number): void {
    if (!Number.isFinite(value))
      throw new TypeError(`Value is not a valid number: ${String(value)}`);
    const b = this.#bounds;
    let i = 0;
    while (i < b.length && value > b[i]!) i++;
    this.counts[i]!++;
    this.sum += value;
    this.count++;
    this.#report?.(value);
  }
}

/**
 * Observations of a prom-client histogram summed in plain numbers on the hot path (a bucket
 * count, the sum and the count per labelled child) and added to the histogram whenever it is read
 * (its `collect`, which every scrape and `get()` runs first), so that a lookup does not build and
 * hash a label object per observation as `histogram.labels(...).observe` does. Readers see the
 * same buckets, sums and counts. A value reported through `onObserve` (prom-helpers.ts) is still
 * reported at once. Relies on prom-client 15's histogram layout; where that is not found (or
 * exemplars are on), children observe through the histogram itself.
 */
export class HistogramTally<T extends string> {
  readonly #histogram: Histogram<T>;
  readonly #internals: Internals | undefined;
  readonly #children = new Map<string, Child>();

  constructor(histogram: Histogram<T>) {
    this.#histogram = histogram;
    const h = histogram as unknown as Partial<Internals> & { collect?: () => unknown };
    const usable =
      typeof h.hashMap === 'object' &&
      h.hashMap !== null &&
      Array.isArray(h.upperBounds) &&
      h.enableExemplars !== true &&
      typeof h.zero === 'function';
    this.#internals = usable ? (h as Internals) : undefined;
    if (this.#internals === undefined) return;
    const before = h.collect;
    h.collect = () => {
      this.flush();
      return before?.call(histogram);
    };
  }

  /** The child with these labels (made once per label set). */
  child(labels: Partial<Record<T, string>>): HistogramChild {
    const key = JSON.stringify(labels);
    const h = this.#histogram;
    if (this.#internals === undefined) {
      // With exemplars on, prom-client's observe takes one object.
      const exemplars = (h as { enableExemplars?: boolean }).enableExemplars === true;
      return exemplars
        ? { observe: (v) => h.observe({ labels, value: v } as never) }
        : { observe: (v) => h.observe(labels as never, v) };
    }
    let c = this.#children.get(key);
    if (c === undefined) {
      c = new Child(labels as Record<string, string>, this.#internals.upperBounds, reportOf(h));
      this.#children.set(key, c);
    }
    return c;
  }

  /** Adds what was tallied to the histogram. */
  flush(): void {
    const h = this.#internals;
    if (h === undefined) return;
    for (const c of this.#children.values()) {
      if (c.count === 0) continue;
      let entry = entryOf(h, c.labels);
      if (entry === undefined) {
        h.zero(c.labels);
        entry = entryOf(h, c.labels)!;
      }
      const bounds = h.upperBounds;
      for (let i = 0; i < bounds.length; i++) {
        const k = String(bounds[i]);
        entry.bucketValues[k] = (entry.bucketValues[k] ?? 0) + c.counts[i]!;
      }
      entry.sum += c.sum;
      entry.count += c.count;
      c.counts.fill(0);
      c.sum = 0;
      c.count = 0;
    }
  }
}

/** The histogram's entry with exactly these labels, if it has one. */
function entryOf(h: Internals, labels: Record<string, string>): Entry | undefined {
  const keys = Object.keys(labels);
  for (const e of Object.values(h.hashMap)) {
    const have = Object.keys(e.labels);
    if (have.length !== keys.length) continue;
    if (keys.every((k) => String(e.labels[k]) === labels[k])) return e;
  }
  return undefined;
}

const TALLIES = new WeakMap<Histogram<string>, HistogramTally<string>>();

/** The one tally of `histogram` (made on first use, shared by every caller). */
export function histogramTallyOf<T extends string>(histogram: Histogram<T>): HistogramTally<T> {
  const h = histogram as unknown as Histogram<string>;
  let t = TALLIES.get(h);
  if (t === undefined) {
    t = new HistogramTally(h);
    TALLIES.set(h, t);
  }
  return t as unknown as HistogramTally<T>;
}
