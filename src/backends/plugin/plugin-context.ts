import { isAbsolute, resolve } from 'node:path';
import { Counter, Gauge, Histogram, type Metric, Registry } from 'prom-client';
import { abortedError, KvtierError } from '../../errors.ts';
import { type Logger, silentLogger } from '../../util/log.ts';
import type {
  AbortHelpers,
  PluginContext,
  PluginMetricConfig,
  PluginMetrics,
} from '../core/types.ts';

/**
 * Throws the documented error for an aborted call (`abortedError(signal, what)`: the signal's
 * `KvtierError` reason as is, `KVT_TIMEOUT` for a `TimeoutError`, `KVT_ABORTED` otherwise) when
 * `signal` has already fired. Call it before starting work, and again before each step that
 * cannot be undone cheaply.
 * @throws KvtierError `KVT_ABORTED` or `KVT_TIMEOUT`.
 */
export function throwIfAborted(signal: AbortSignal | undefined, what: string): void {
  if (signal?.aborted === true) throw abortedError(signal, what);
}

/**
 * Settles like `work`, or rejects with `abortedError(signal, what)` as soon as `signal` fires,
 * whichever comes first. The abort listener is removed once either happens, and a rejection of
 * `work` after the signal won is handled (never an unhandled rejection). `work` itself keeps
 * running: when it lands late it must still leave the store consistent.
 * @throws KvtierError `KVT_ABORTED` or `KVT_TIMEOUT` when the signal wins.
 */
export function raceAbort<T>(
  work: Promise<T>,
  signal: AbortSignal | undefined,
  what: string,
): Promise<T> {
  if (signal === undefined) return work;
  if (signal.aborted) {
    work.catch(() => {});
    return Promise.reject(abortedError(signal, what));
  }
  return new Promise<T>((resolvePromise, reject) => {
    const onAbort = () => reject(abortedError(signal, what));
    signal.addEventListener('abort', onAbort, { once: true });
    work.then(resolvePromise, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}

/** The abort helpers every {@link PluginContext} carries. */
export const ABORT_HELPERS: AbortHelpers = Object.freeze({
  error: abortedError,
  throwIfAborted,
  race: raceAbort,
});

/** What {@link createPluginContext} needs; everything but `name` has a default. */
export interface PluginContextOptions {
  /** The tier's name. */
  name: string;
  /** Directory relative paths resolve against; default the working directory. Made absolute. */
  configDir?: string;
  /** The tier's logger; default a logger that drops everything. */
  log?: Logger;
  /** Registry for a plug-in's extra series; default a fresh registry of its own. */
  metrics?: Registry;
}

/**
 * Builds the context a factory is called with. The registry builds one per tier; call it yourself
 * to call a plug-in factory directly (unit tests, embedders).
 */
export function createPluginContext(o: PluginContextOptions): PluginContext {
  const configDir = resolve(o.configDir ?? process.cwd());
  return Object.freeze({
    name: o.name,
    log: o.log ?? silentLogger,
    configDir,
    resolvePath: (path: string) => (isAbsolute(path) ? path : resolve(configDir, path)),
    abort: ABORT_HELPERS,
    metrics: pluginMetrics(o.metrics ?? new Registry()),
  });
}

/** {@link PluginMetrics} over `registry`: get-or-register by name, refusing a type clash. */
export function pluginMetrics(registry: Registry): PluginMetrics {
  function reuse<M>(name: string, type: abstract new (...args: never[]) => M): M | undefined {
    const existing: Metric | undefined = registry.getSingleMetric(name);
    if (existing === undefined) return undefined;
    if (existing instanceof type) return existing as M;
    throw new KvtierError(
      'KVT_CONFIG',
      `metric ${name} is already registered as another type; pick another name`,
    );
  }
  const base = <L extends string>(c: PluginMetricConfig<L>) => ({
    name: c.name,
    help: c.help,
    labelNames: [...(c.labelNames ?? [])] as L[],
    registers: [registry],
  });
  return Object.freeze({
    registry,
    counter: <L extends string = never>(c: PluginMetricConfig<L>) =>
      reuse<Counter<L>>(c.name, Counter) ?? new Counter<L>(base(c)),
    gauge: <L extends string = never>(c: PluginMetricConfig<L>) =>
      reuse<Gauge<L>>(c.name, Gauge) ?? new Gauge<L>(base(c)),
    histogram: <L extends string = never>(
      c: PluginMetricConfig<L> & { readonly buckets?: readonly number[] },
    ) =>
      reuse<Histogram<L>>(c.name, Histogram) ??
      new Histogram<L>({ ...base(c), ...(c.buckets ? { buckets: [...c.buckets] } : {}) }),
  });
}
