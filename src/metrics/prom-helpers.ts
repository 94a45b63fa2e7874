/** Small helpers over prom-client for the metrics module. */
import type { Histogram } from 'prom-client';
import { KvtierError } from '../errors.ts';

const REPORTS = new WeakMap<Histogram<string>, (value: number) => void>();

/**
 * Makes `histogram.observe` also report every observed value to a callback. prom-client assigns
 * `observe` per instance in its constructor (it picks the exemplar variant there), so the
 * instance's function is wrapped rather than the class's method overridden. `startTimer()` does
 * not go through `observe` and is not reported.
 */
export function onObserve<T extends string>(
  histogram: Histogram<T>,
  report: (value: number) => void,
) {
  REPORTS.set(histogram as unknown as Histogram<string>, report);
  const observe = histogram.observe.bind(histogram) as (...args: unknown[]) => void;
  histogram.observe = ((a: unknown, b?: unknown) => {
    if (b === undefined) observe(a);
    else observe(a, b);
    const value =
      typeof a === 'number' ? a : typeof b === 'number' ? b : (a as { value?: unknown }).value;
    if (typeof value === 'number') report(value);
  }) as Histogram<T>['observe'];
  return histogram;
}

/** The callback {@link onObserve} gave `histogram`, if any (a histogram tally reports to it too). */
export function reportOf<T extends string>(
  histogram: Histogram<T>,
): ((value: number) => void) | undefined {
  return REPORTS.get(histogram as unknown as Histogram<string>);
}

/** Turns prom-client's duplicate-name Error into a KvtierError with a useful message. */
export function guard<M>(name: string, make: () => M): M {
  try {
    return make();
  } catch (err) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `metric ${name} could not be registered (is another KvtierMetrics using this registry?)`,
      { cause: err },
    );
  }
}
