/**
 * A sidecar's event stream, put together: the publisher bound where the config says (with the
 * server's CurveZMQ keys when it has them), the tier decorators that report into it, and the
 * snapshot of what the tiers with an index in memory hold.
 */
import type { Registry } from 'prom-client';
import type * as zmq from 'zeromq';
import type { HostMemoryTier, NamespaceId, StorageBackend } from '../backends/core/types.ts';
import { KvtierError } from '../errors.ts';
import { EventMetrics } from '../metrics/event-metrics.ts';
import { isLocalEndpoint } from '../protocol/endpoint.ts';
import type { Logger } from '../util/log.ts';
import { EventPublisher } from './event-publisher.ts';
import {
  type ChunkEventSink,
  mediumOf,
  type SnapshotGroup,
  type SnapshotScan,
} from './event-types.ts';
import { eventedBackend, eventedHostTier } from './evented-backend.ts';
import type { ResolvedEventsOptions } from './events-options.ts';

/** Options of {@link startSidecarEvents}. */
export interface SidecarEventsOptions {
  events: ResolvedEventsOptions;
  /** Socket options of the sidecar's CurveZMQ server (its `ServerAuth`), when it has keys. */
  curve?: Partial<zmq.SocketOptions<zmq.Router>> & { context?: zmq.Context };
  /** `security.allowUnauthenticated`: serve a non-loopback endpoint without keys. */
  allowUnauthenticated: boolean;
  registry: Registry;
  log: Logger;
  /** The tiers whose indexes a snapshot lists; read at each snapshot (bound after start). */
  tiers: () => readonly StorageBackend[];
}

/**
 * Binds the event stream. Endpoints beyond this machine need the server's CurveZMQ keys, or
 * `security.allowUnauthenticated` (the stream names which prefixes are cached: metadata a
 * tenant should not read about another).
 * @throws KvtierError `KVT_CONFIG` for such an endpoint without either, or one that cannot be bound.
 */
export async function startSidecarEvents(opts: SidecarEventsOptions): Promise<EventPublisher> {
  const { events } = opts;
  for (const ep of exposedEventEndpoints(
    events,
    opts.curve !== undefined,
    opts.allowUnauthenticated,
  ))
    opts.log.warn('publishing events on a non-loopback endpoint without authentication', {
      endpoint: ep,
    });
  return EventPublisher.start({
    ...events,
    ...(opts.curve !== undefined ? { socketOptions: opts.curve } : {}),
    snapshot: (ns) => snapshotOf(opts.tiers(), ns),
    snapshotScans: (ns) => snapshotScansOf(opts.tiers(), ns),
    metrics: new EventMetrics(opts.registry),
    log: opts.log,
  });
}

/**
 * The rule for the stream's endpoints (`kvtier serve` and `kvtier config check` alike): one
 * beyond this machine needs the server's CurveZMQ keys (`hasKeys`) or `allowUnauthenticated`.
 * Returns the endpoints served without authentication (allowed: to be warned about).
 * @throws KvtierError `KVT_CONFIG` naming the first endpoint that is not allowed.
 */
export function exposedEventEndpoints(
  events: Pick<ResolvedEventsOptions, 'endpoint' | 'replayEndpoint'>,
  hasKeys: boolean,
  allowUnauthenticated: boolean,
): string[] {
  const exposed: string[] = [];
  for (const ep of [events.endpoint, events.replayEndpoint]) {
    if (ep === null || isLocalEndpoint(ep) || hasKeys) continue;
    if (!allowUnauthenticated)
      throw new KvtierError(
        'KVT_CONFIG',
        `refusing to publish events on ${ep} without CurveZMQ keys: anyone who can reach it learns which prompts are cached. ` +
          'Bind it to loopback, set security.serverSecretKeyFile (docs/security.md), or set security.allowUnauthenticated',
      );
    exposed.push(ep);
  }
  return exposed;
}

/** The tiers, each wrapped so that it reports into `sink` (the first as the host-memory tier). */
export function withEvents(
  tiers: readonly StorageBackend[],
  sink: ChunkEventSink,
): StorageBackend[] {
  const [first, ...rest] = tiers;
  return [
    eventedHostTier(first as HostMemoryTier, sink),
    ...rest.map((t) => eventedBackend(t, sink)),
  ];
}

/** What each tier's index lists, grouped by namespace (tiers that cannot list give nothing). */
export function* snapshotOf(
  tiers: readonly StorageBackend[],
  ns: NamespaceId | undefined,
): Generator<SnapshotGroup> {
  for (const t of tiers) {
    const tier = { name: t.name, medium: mediumOf(t.capabilities) };
    const byNs = new Map<NamespaceId, SnapshotGroup['hashes'][number][]>();
    for (const [n, h] of t.listChunks?.(ns) ?? []) {
      let list = byNs.get(n);
      if (list === undefined) {
        list = [];
        byNs.set(n, list);
      }
      list.push(h);
    }
    for (const [n, hashes] of byNs) yield { tier, ns: n, hashes };
  }
}

/**
 * The shared tiers (several sidecars write them: what this one's events do not cover), each to be
 * listed from its store after the indexed tiers.
 */
export function snapshotScansOf(
  tiers: readonly StorageBackend[],
  ns: NamespaceId | undefined,
): SnapshotScan[] {
  return tiers
    .filter((t) => t.capabilities.shared)
    .map((t) => ({
      tier: { name: t.name, medium: mediumOf(t.capabilities) },
      scan: (signal) => t.scanChunks?.(ns, { signal }) ?? null,
    }));
}
