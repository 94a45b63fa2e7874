/**
 * The `events` section of the config (docs/events.md): where the event stream publishes, its
 * replay socket, and its bounds. Off (null) by default.
 */
import { KvtierError } from '../errors.ts';

/** The event stream's settings after defaults. */
export interface ResolvedEventsOptions {
  /** ZMQ endpoint of the PUB socket. */
  endpoint: string;
  /** ZMQ endpoint of the replay ROUTER; null turns replay off. */
  replayEndpoint: string | null;
  /** First frame of every message (a subscriber's prefix filter). */
  topic: string;
  /** Batches kept for replay. */
  bufferBatches: number;
  /** Bytes of batches kept for replay. */
  bufferBytes: number;
  /** Messages ZMQ queues per subscriber before it drops that subscriber's next ones. */
  sendHighWaterMark: number;
  /** Interval of the heartbeat (the last sequence number, instance); 0 turns it off. */
  heartbeatMs: number;
  /**
   * Most chunks one snapshot lists from the shared tiers' stores (what other sidecars wrote
   * included); 0 lists none (snapshots then hold the tiers with an index in memory only).
   */
  snapshotScanMaxChunks: number;
}

/** What a config file's `events` object may give. */
export type EventsDocument = Partial<ResolvedEventsOptions>;

/** Defaults of everything but the endpoints. */
export const EVENTS_DEFAULTS = Object.freeze({
  topic: 'kvtier',
  bufferBatches: 10_000,
  bufferBytes: 16 * 1024 ** 2,
  sendHighWaterMark: 10_000,
  heartbeatMs: 1000,
  snapshotScanMaxChunks: 1_000_000,
});

/**
 * The endpoint the PUB socket takes when the section names none: beside the sidecar's 5555,
 * clear of vLLM's own KV event ports (5557, 5558) on the same node.
 */
export const DEFAULT_EVENTS_ENDPOINT = 'tcp://127.0.0.1:5560';

/**
 * The replay endpoint that goes with a PUB endpoint, as vLLM pairs them: the next TCP port
 * (`*` stays `*`), or `<path>.replay` for ipc.
 * @throws KvtierError `KVT_CONFIG` for an endpoint it cannot derive from (inproc, a port at the top).
 */
export function defaultReplayEndpoint(endpoint: string): string {
  const tcp = /^(tcp:\/\/.+):(\d+|\*)$/.exec(endpoint);
  if (tcp !== null) {
    if (tcp[2] === '*') return endpoint;
    const port = Number(tcp[2]);
    if (port > 0 && port < 65535) return `${tcp[1]}:${port + 1}`;
  }
  if (endpoint.startsWith('ipc://')) return `${endpoint}.replay`;
  throw new KvtierError(
    'KVT_CONFIG',
    `events.replayEndpoint cannot be derived from ${endpoint}; set it (or null to turn replay off)`,
  );
}

/** The `events` section with defaults; `replayEndpoint` left out is derived from `endpoint`. */
export function resolveEventsOptions(doc: EventsDocument): ResolvedEventsOptions {
  const endpoint = doc.endpoint ?? DEFAULT_EVENTS_ENDPOINT;
  return {
    ...EVENTS_DEFAULTS,
    ...doc,
    endpoint,
    replayEndpoint:
      doc.replayEndpoint === undefined ? defaultReplayEndpoint(endpoint) : doc.replayEndpoint,
  };
}
