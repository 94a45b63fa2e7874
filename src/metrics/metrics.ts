import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from 'prom-client';
import type { BackendHealth, BackendStats, NamespaceUsage } from '../backends/core/types.ts';
import { KvtierError } from '../errors.ts';
import { guard, onObserve } from './prom-helpers.ts';

/**
 * Every kvtier metric, in one module over a registry of its own (never prom-client's global
 * one), so two sidecars in one process, or a test beside a server, never share series.
 * Names are `kvtier_*`; label names are typed through prom-client's generics.
 */

/** Values of the `result` label of `kvtier_lookups_total`. */
export type LookupResult = 'hit' | 'partial' | 'miss' | 'canceled' | 'timeout' | 'error' | 'stale';

/** Values of the `decision` label of `kvtier_lookup_tier_decisions_total`. */
export type TierDecisionLabel = 'load' | 'decline';

/** Values of the `op` label of `kvtier_backend_op_duration_seconds` and `kvtier_backend_errors_total`. */
export type BackendOp = 'contains' | 'get' | 'put' | 'remove' | 'clear';

/**
 * Latency buckets in seconds: 50 µs to 10 s, log-spaced in 1-2.5-5 steps (17 buckets). The low
 * end resolves in-memory tier hits, the high end remote tiers under load.
 */
export const LATENCY_BUCKETS_SECONDS: readonly number[] = [
  0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
  5, 10,
];

/** Health as a number for `kvtier_backend_health`. */
export const HEALTH_VALUE: Readonly<Record<BackendHealth, number>> = {
  up: 1,
  degraded: 0.5,
  down: 0,
};

/** A tier as the metrics module reads it at scrape time. */
export interface MetricBackendSource {
  readonly name: string;
  stats(): BackendStats;
  health(): BackendHealth;
}

/**
 * Callbacks read at scrape time for the gauges and the totals other components own. Each is
 * optional; an unbound source produces no samples. A source that throws loses its samples for
 * that scrape and is counted in `kvtier_metric_source_errors_total{source}`; the scrape goes on.
 */
export interface MetricSources {
  /** The tiers, in config order. */
  backends?: () => readonly MetricBackendSource[];
  /** Serializer occupancy, in chunks. */
  serializer?: () => { capacity: number; inUse: number; waiters: number };
  /** Event-manager entries now, and entries expired since start. */
  events?: () => { ongoing: number; done: number; expiredTotal: number };
  /** Lookups currently holding pins. */
  pinnedLookups?: () => number;
  /** Chunks waiting in the write-through queue. */
  writeQueueDepth?: () => number;
  /** The server's epoch (bumps on restart or clear). */
  epoch?: () => number;
  /** Whether the sidecar can serve lookups, and whether it serves with a lower tier not up. */
  serving?: () => { ready: boolean; degraded: boolean };
  /**
   * Each tier's read rate as lookups use it: bandwidth in bytes/s and latency in seconds,
   * undefined while not measured.
   */
  tierRates?: () => readonly MetricTierRate[];
}

/** One tier's read rate, as `kvtier_tier_read_*` report it. */
export interface MetricTierRate {
  readonly tier: string;
  readonly readBytesPerSec: number | undefined;
  readonly latencySeconds: number | undefined;
}

/** Options of {@link KvtierMetrics}. */
export interface KvtierMetricsOptions {
  /** Registry to register into; a fresh one when omitted. Never prom-client's global registry. */
  registry?: Registry;
  /** Also collect Node process metrics, prefixed `kvtier_`. Default true. */
  defaultMetrics?: boolean;
  /**
   * The engines' lookup deadline in seconds: a lookup answered later than this is counted in
   * `kvtier_lookups_past_deadline_total` (the engine had already taken it as a miss). Default
   * 2, the default `lookupTimeoutMs` of the TypeScript and Python lookup clients.
   */
  lookupDeadlineSeconds?: number;
  /**
   * Labels of `kvtier_build_info` (value 1), e.g. `{ version, node }`; default none (the
   * metric is left out).
   */
  buildInfo?: Readonly<Record<string, string>>;
}

/** Defaults of {@link KvtierMetricsOptions}. */
export const METRICS_DEFAULTS = { defaultMetrics: true, lookupDeadlineSeconds: 2 } as const;

/** Values of the `direction` label of `kvtier_dataplane_bytes_total`. */
export type DataPlaneDirection = 'save' | 'load';

type SourceName = keyof MetricSources;

/** prom-client default gauges named like counters; left out of the registry. */
const NON_COUNTER_TOTALS = [
  'kvtier_nodejs_active_handles_total',
  'kvtier_nodejs_active_requests_total',
  'kvtier_nodejs_active_resources_total',
] as const;

interface BackendSnapshot {
  readonly name: string;
  readonly stats: BackendStats | undefined;
  readonly health: BackendHealth | undefined;
}

interface ScrapeSnapshot {
  readonly backends: readonly BackendSnapshot[];
  readonly serializer: ReturnType<NonNullable<MetricSources['serializer']>> | undefined;
  readonly events: ReturnType<NonNullable<MetricSources['events']>> | undefined;
  readonly pinnedLookups: number | undefined;
  readonly writeQueueDepth: number | undefined;
  readonly epoch: number | undefined;
  readonly serving: { ready: boolean; degraded: boolean } | undefined;
  readonly tierRates: readonly MetricTierRate[] | undefined;
}

type Kind = 'gauge' | 'counter';
type Read<S> = (s: S) => number | null | undefined;

/** Per-tier metrics read from backend stats at scrape time: name, help, kind, reader. */
const PER_TIER: ReadonlyArray<readonly [string, string, Kind, Read<BackendSnapshot>]> = [
  ['kvtier_backend_chunks', 'Chunks held, by tier.', 'gauge', (b) => b.stats?.chunks],
  ['kvtier_backend_bytes', 'Payload bytes held, by tier.', 'gauge', (b) => b.stats?.bytesUsed],
  [
    'kvtier_backend_capacity_bytes',
    'Capacity bound in bytes, by tier (absent where the tier has none).',
    'gauge',
    (b) => b.stats?.capacityBytes,
  ],
  ['kvtier_backend_pinned_chunks', 'Chunks pinned.', 'gauge', (b) => b.stats?.pinnedChunks],
  ['kvtier_backend_evictions_total', 'Chunks evicted.', 'counter', (b) => b.stats?.evictions],
  [
    'kvtier_backend_dropped_puts_total',
    'Puts dropped for lack of room, by tier.',
    'counter',
    (b) => b.stats?.droppedPuts,
  ],
  [
    'kvtier_backend_corrupt_chunks_total',
    'Stored chunks that failed verification on read and were removed, by tier.',
    'counter',
    (b) => b.stats?.corruptObjects,
  ],
  [
    'kvtier_backend_health',
    'Tier health: 1 up, 0.5 degraded, 0 down.',
    'gauge',
    (b) => (b.health === undefined ? undefined : HEALTH_VALUE[b.health]),
  ],
];

/** Unlabeled metrics read from the other sources at scrape time: name, help, kind, reader. */
const SINGLE: ReadonlyArray<readonly [string, string, Kind, Read<ScrapeSnapshot>]> = [
  [
    'kvtier_serializer_capacity_chunks',
    'Serializer budget.',
    'gauge',
    (s) => s.serializer?.capacity,
  ],
  [
    'kvtier_serializer_in_use_chunks',
    'Serializer budget in use.',
    'gauge',
    (s) => s.serializer?.inUse,
  ],
  ['kvtier_serializer_waiters', 'Serializer waiters.', 'gauge', (s) => s.serializer?.waiters],
  ['kvtier_events_expired_total', 'Events expired.', 'counter', (s) => s.events?.expiredTotal],
  ['kvtier_pinned_lookups', 'Lookups holding pins.', 'gauge', (s) => s.pinnedLookups],
  ['kvtier_writethrough_queue_depth', 'Write-through queue.', 'gauge', (s) => s.writeQueueDepth],
  ['kvtier_epoch', 'Server epoch.', 'gauge', (s) => s.epoch],
  [
    'kvtier_ready',
    'Whether the sidecar can serve lookups (its host-memory tier is up): 1 or 0, as /readyz.',
    'gauge',
    (s) => (s.serving === undefined ? undefined : s.serving.ready ? 1 : 0),
  ],
  [
    'kvtier_degraded',
    'Whether a tier below host memory is down or degraded (lookups served with fewer hits): 1 or 0.',
    'gauge',
    (s) => (s.serving === undefined ? undefined : s.serving.degraded ? 1 : 0),
  ],
];

/**
 * Owns every kvtier metric. Components record into the typed fields; gauges and totals that
 * other components own are read at scrape time from sources bound with {@link bindSources}.
 * Running totals kept by a source (`kvtier_backend_evictions_total`,
 * `kvtier_backend_dropped_puts_total`, `kvtier_events_expired_total`) are Counters whose
 * collect() resets and adds the source's total, so the sample always equals the source rather
 * than drifting through deltas; a replaced backend shows as a counter reset, which rate() handles.
 *
 * @throws KvtierError `KVT_INVALID_ARGUMENT` from the constructor when the registry already holds
 *   a `kvtier_*` metric of the same name (two instances on one registry).
 */
export class KvtierMetrics {
  /** The registry every metric here is registered in. */
  readonly registry: Registry;

  /** kvtier_lookups_total{result}: lookups answered, by {@link LookupResult}. */
  readonly lookups: Counter<'result'>;
  /** kvtier_lookup_requested_tokens_total: tokens asked about by lookups. */
  readonly lookupRequestedTokens: Counter;
  /** kvtier_lookup_hit_tokens_total{tier}: tokens answered as ready, by the tier that held them. */
  readonly lookupHitTokens: Counter<'tier'>;
  /**
   * kvtier_lookup_duration_seconds: from request to final answer. An observation above the
   * lookup deadline also counts in `kvtier_lookups_past_deadline_total`.
   */
  readonly lookupDuration: Histogram;
  /** kvtier_lookups_past_deadline_total: lookups answered later than `lookupDeadlineSeconds`. */
  readonly lookupsPastDeadline: Counter;
  /** The deadline `lookupsPastDeadline` compares against, seconds. */
  readonly lookupDeadlineSeconds: number;
  /**
   * kvtier_dataplane_bytes_total{direction}: bytes copied between the engine's KV memory and
   * host memory (`save`: engine to host; `load`: host to engine). rate() is the data-plane GB/s.
   */
  readonly dataPlaneBytes: Counter<'direction'>;
  /** kvtier_prefetch_duration_seconds: one prefetch from lower tiers into host memory. */
  readonly prefetchDuration: Histogram;
  /** kvtier_prefetch_chunks_total{tier}: chunks prefetched, by source tier. */
  readonly prefetchChunks: Counter<'tier'>;
  /** kvtier_requests_total{type}: protocol messages received, by message type. */
  readonly requests: Counter<'type'>;
  /** kvtier_protocol_errors_total{code}: error replies sent, by error code. */
  readonly protocolErrors: Counter<'code'>;
  /** kvtier_backend_op_duration_seconds{tier,op}: backend call latency (failed calls included). */
  readonly backendOpDuration: Histogram<'tier' | 'op'>;
  /** kvtier_backend_hits_total{tier}: chunks found. */
  readonly backendHits: Counter<'tier'>;
  /** kvtier_backend_misses_total{tier}: chunks missed (see instrumentBackend for contains). */
  readonly backendMisses: Counter<'tier'>;
  /** kvtier_backend_bytes_read_total{tier}: payload bytes returned by gets. */
  readonly backendBytesRead: Counter<'tier'>;
  /** kvtier_backend_bytes_written_total{tier}: payload bytes of puts that stored. */
  readonly backendBytesWritten: Counter<'tier'>;
  /** kvtier_backend_errors_total{tier,op,code}: backend calls that threw, by KvtierError code. */
  readonly backendErrors: Counter<'tier' | 'op' | 'code'>;
  /** kvtier_writethrough_dropped_total{tier,reason}: write-through puts dropped. */
  readonly writeThroughDropped: Counter<'tier' | 'reason'>;
  /** kvtier_pins_expired_total: pins released by TTL rather than by the client. */
  readonly pinsExpired: Counter;
  /**
   * kvtier_lookup_tier_decisions_total{tier,decision}: lookups that named the engine's prefill
   * rate, by what they decided about a tier below host memory (`load`: its hits claimed;
   * `decline`: fetching them could not beat computing them, so they were not claimed or the tier
   * not asked). One per lookup and tier decided.
   */
  readonly lookupTierDecisions: Counter<'tier' | 'decision'>;
  /**
   * kvtier_lookup_awaits_total{outcome}: lookups that waited for chunks whose save was in flight
   * elsewhere (LOOKUP `awaitChunks`, disaggregated prefill), by how the wait ended: `ready`,
   * `arrived`, `timed_out` (answered with what was there), `canceled`.
   */
  readonly lookupAwaits: Counter<'outcome'>;

  #sources: MetricSources = {};
  #scrape: ScrapeSnapshot | undefined;
  readonly #sourceErrors: Counter<'source'>;

  constructor(options: KvtierMetricsOptions = {}) {
    const registry = options.registry ?? new Registry();
    if (!(registry instanceof Registry)) {
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        'options.registry must be a prom-client Registry',
      );
    }
    const defaultMetrics = options.defaultMetrics ?? METRICS_DEFAULTS.defaultMetrics;
    if (typeof defaultMetrics !== 'boolean') {
      throw new KvtierError('KVT_INVALID_ARGUMENT', 'options.defaultMetrics must be a boolean');
    }
    const deadline = options.lookupDeadlineSeconds ?? METRICS_DEFAULTS.lookupDeadlineSeconds;
    if (typeof deadline !== 'number' || !Number.isFinite(deadline) || deadline <= 0) {
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        'options.lookupDeadlineSeconds must be a positive finite number of seconds',
      );
    }
    this.lookupDeadlineSeconds = deadline;
    this.registry = registry;
    const registers = [registry];
    const buckets = [...LATENCY_BUCKETS_SECONDS];
    const counter = <T extends string>(name: string, help: string, labelNames: readonly T[] = []) =>
      guard(name, () => new Counter<T>({ name, help, labelNames, registers }));
    const histogram = <T extends string>(
      name: string,
      help: string,
      labelNames: readonly T[] = [],
    ) => guard(name, () => new Histogram<T>({ name, help, labelNames, buckets, registers }));

    this.lookups = counter('kvtier_lookups_total', 'Lookups answered, by result.', ['result']);
    this.lookupRequestedTokens = counter(
      'kvtier_lookup_requested_tokens_total',
      'Tokens asked about by lookups.',
    );
    this.lookupHitTokens = counter(
      'kvtier_lookup_hit_tokens_total',
      'Tokens answered as ready in host memory, by the tier that held them.',
      ['tier'],
    );
    this.lookupsPastDeadline = counter(
      'kvtier_lookups_past_deadline_total',
      `Lookups answered later than the engines' lookup deadline (${deadline} s): already taken as misses.`,
    );
    const past = this.lookupsPastDeadline;
    this.lookupDuration = onObserve(
      histogram(
        'kvtier_lookup_duration_seconds',
        'Time from lookup request to final answer, in seconds.',
      ),
      (seconds) => {
        if (seconds > deadline) past.inc();
      },
    );
    this.prefetchDuration = histogram(
      'kvtier_prefetch_duration_seconds',
      'Time one prefetch into host memory took, in seconds.',
    );
    this.prefetchChunks = counter(
      'kvtier_prefetch_chunks_total',
      'Chunks prefetched into host memory, by source tier.',
      ['tier'],
    );
    this.requests = counter('kvtier_requests_total', 'Protocol messages received, by type.', [
      'type',
    ]);
    this.protocolErrors = counter(
      'kvtier_protocol_errors_total',
      'Protocol error replies sent, by error code.',
      ['code'],
    );
    this.backendOpDuration = histogram(
      'kvtier_backend_op_duration_seconds',
      'Storage backend call latency in seconds, by tier and operation.',
      ['tier', 'op'],
    );
    this.backendHits = counter('kvtier_backend_hits_total', 'Chunks found, by tier.', ['tier']);
    this.backendMisses = counter('kvtier_backend_misses_total', 'Chunks missed, by tier.', [
      'tier',
    ]);
    this.backendBytesRead = counter(
      'kvtier_backend_bytes_read_total',
      'Payload bytes read from a tier.',
      ['tier'],
    );
    this.backendBytesWritten = counter(
      'kvtier_backend_bytes_written_total',
      'Payload bytes stored in a tier.',
      ['tier'],
    );
    this.backendErrors = counter(
      'kvtier_backend_errors_total',
      'Storage backend calls that failed, by tier, operation and error code.',
      ['tier', 'op', 'code'],
    );
    this.writeThroughDropped = counter(
      'kvtier_writethrough_dropped_total',
      'Write-through puts dropped, by tier and reason.',
      ['tier', 'reason'],
    );
    this.dataPlaneBytes = counter(
      'kvtier_dataplane_bytes_total',
      "Bytes copied between the engine's KV memory and host memory, by direction (save, load).",
      ['direction'],
    );
    this.pinsExpired = counter(
      'kvtier_pins_expired_total',
      'Pins released because their TTL ran out rather than by the client.',
    );
    this.lookupTierDecisions = counter(
      'kvtier_lookup_tier_decisions_total',
      "Lookups that named the engine's prefill rate, by tier and decision: load (fetching beat computing) or decline.",
      ['tier', 'decision'],
    );
    this.lookupAwaits = counter(
      'kvtier_lookup_awaits_total',
      'Lookups that waited for chunks whose save was in flight elsewhere, by outcome: ready, arrived, timed_out, canceled.',
      ['outcome'],
    );
    this.#registerScrapeMetrics(registers);
    // Registered after the scrape-time metrics so a scrape reports its own source failures.
    this.#sourceErrors = counter(
      'kvtier_metric_source_errors_total',
      'Scrape-time metric sources that threw; their samples were skipped for that scrape.',
      ['source'],
    );

    const build = options.buildInfo;
    if (build !== undefined)
      guard('kvtier_build_info', () => {
        const g = new Gauge({
          name: 'kvtier_build_info',
          help: 'Always 1; the labels say which kvtier runs (version, Node.js, native addon, CUDA).',
          labelNames: Object.keys(build),
          registers: [registry],
        });
        g.set({ ...build }, 1);
        return g;
      });
    if (defaultMetrics) {
      collectDefaultMetrics({ register: registry, prefix: 'kvtier_' });
      // prom-client exports these three gauges with a `_total` suffix, which Prometheus reserves
      // for counters (`promtool check metrics` rejects them); the per-type gauges beside them
      // carry the same numbers (`sum(kvtier_nodejs_active_handles)`).
      for (const name of NON_COUNTER_TOTALS) registry.removeSingleMetric(name);
    }
  }

  /** Content type of {@link text}: Prometheus text exposition 0.0.4. */
  get contentType(): string {
    return this.registry.contentType;
  }

  /**
   * Binds scrape-time sources. Merges into what is bound: a key given replaces the earlier
   * source, a key given as `undefined` unbinds it, keys left out stay as they were.
   */
  bindSources(sources: MetricSources): void {
    this.#sources = { ...this.#sources, ...sources };
  }

  /** The registry rendered in Prometheus text format; reads bound sources. */
  text(): Promise<string> {
    return this.registry.metrics();
  }

  #registerScrapeMetrics(registers: Registry[]): void {
    const self = this;
    for (const [name, help, kind, read] of PER_TIER) {
      // Counters fed from a source's running total: reset, then add the total, so the sample
      // equals the source (a replaced backend shows as a counter reset, which rate() handles).
      const collect = function (this: Gauge<'tier'> | Counter<'tier'>) {
        this.reset();
        for (const b of self.#snapshot().backends) {
          const v = read(b);
          if (v === null || v === undefined || !Number.isFinite(v)) continue;
          if (this instanceof Gauge) this.set({ tier: b.name }, v);
          else if (v >= 0) this.inc({ tier: b.name }, v);
        }
      };
      const labelNames = ['tier'] as const;
      guard(name, () =>
        kind === 'gauge'
          ? new Gauge({ name, help, labelNames, registers, collect })
          : new Counter({ name, help, labelNames, registers, collect }),
      );
    }
    for (const [name, help, kind, read] of SINGLE) {
      const collect = function (this: Gauge | Counter) {
        this.reset();
        const v = read(self.#snapshot());
        // reset() leaves an unlabeled series at 0; removing it is how an unbound source shows
        // no sample at all rather than a misleading zero.
        if (v == null || !Number.isFinite(v) || (kind === 'counter' && v < 0)) this.remove();
        else if (this instanceof Gauge) this.set(v);
        else this.inc(v);
      };
      guard(name, () =>
        kind === 'gauge'
          ? new Gauge({ name, help, registers, collect })
          : new Counter({ name, help, registers, collect }),
      );
    }
    const rate = (name: string, help: string, read: (r: MetricTierRate) => number | undefined) =>
      guard(
        name,
        () =>
          new Gauge<'tier'>({
            name,
            help,
            labelNames: ['tier'],
            registers,
            collect() {
              this.reset();
              for (const r of self.#snapshot().tierRates ?? []) {
                const v = read(r);
                if (v !== undefined && Number.isFinite(v)) this.set({ tier: r.tier }, v);
              }
            },
          }),
      );
    rate(
      'kvtier_tier_read_bandwidth_bytes_per_second',
      'Read bandwidth of a tier as lookups measure it (decayed mean of recent prefetch gets); absent while not measured.',
      (r) => r.readBytesPerSec,
    );
    rate(
      'kvtier_tier_read_latency_seconds',
      'Per-request latency of a tier as lookups measure it (decayed mean of recent probes); absent while not measured.',
      (r) => r.latencySeconds,
    );
    // Per namespace and tier: at most NAMESPACE_USAGE_LIMIT namespaces per tier (the largest),
    // the rest summed under namespace="other", so the label count stays bounded.
    const usage = (name: string, help: string, read: (u: NamespaceUsage) => number) =>
      guard(
        name,
        () =>
          new Gauge<'tier' | 'namespace'>({
            name,
            help,
            labelNames: ['tier', 'namespace'],
            registers,
            collect() {
              this.reset();
              for (const b of self.#snapshot().backends) {
                for (const [ns, u] of Object.entries(b.stats?.namespaces ?? {}))
                  this.set({ tier: b.name, namespace: ns }, read(u));
                const rest = b.stats?.namespacesOmitted;
                if (rest !== undefined) this.set({ tier: b.name, namespace: 'other' }, read(rest));
              }
            },
          }),
      );
    usage(
      'kvtier_namespace_chunks',
      'Chunks held per namespace and tier (the largest namespaces of a tier; the rest as namespace="other").',
      (u) => u.chunks,
    );
    usage(
      'kvtier_namespace_bytes',
      'Bytes held per namespace and tier (the largest namespaces of a tier; the rest as namespace="other").',
      (u) => u.bytes,
    );
    guard(
      'kvtier_events',
      () =>
        new Gauge<'state'>({
          name: 'kvtier_events',
          help: 'Event-manager entries, by state.',
          labelNames: ['state'],
          registers,
          collect() {
            this.reset();
            const e = self.#snapshot().events;
            if (e === undefined) return;
            if (Number.isFinite(e.ongoing)) this.set({ state: 'ongoing' }, e.ongoing);
            if (Number.isFinite(e.done)) this.set({ state: 'done' }, e.done);
          },
        }),
    );
  }

  /**
   * Every source read once per scrape: the scrape-time metrics collect synchronously one after
   * another, so the snapshot is shared until the next microtask.
   */
  #snapshot(): ScrapeSnapshot {
    if (this.#scrape !== undefined) return this.#scrape;
    const src = this.#sources;
    const backends: BackendSnapshot[] = [];
    for (const b of this.#read('backends', src.backends) ?? []) {
      backends.push({
        name: b.name,
        stats: this.#read('backends', () => b.stats()),
        health: this.#read('backends', () => b.health()),
      });
    }
    const snapshot: ScrapeSnapshot = {
      backends,
      serializer: this.#read('serializer', src.serializer),
      events: this.#read('events', src.events),
      pinnedLookups: this.#read('pinnedLookups', src.pinnedLookups),
      writeQueueDepth: this.#read('writeQueueDepth', src.writeQueueDepth),
      epoch: this.#read('epoch', src.epoch),
      serving: this.#read('serving', src.serving),
      tierRates: this.#read('tierRates', src.tierRates),
    };
    this.#scrape = snapshot;
    queueMicrotask(() => {
      this.#scrape = undefined;
    });
    return snapshot;
  }

  /** Calls a bound source; undefined when unbound or when it threw (counted). */
  #read<R>(source: SourceName, fn: (() => R) | undefined): R | undefined {
    if (fn === undefined) return undefined;
    try {
      return fn();
    } catch {
      this.#sourceErrors.inc({ source });
      return undefined;
    }
  }
}
