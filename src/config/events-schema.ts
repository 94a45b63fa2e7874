/** The config file's `events` section: the sidecar's event stream (docs/events.md). */
import * as v from 'valibot';
import { bytes, int, pattern, str, strict } from '../util/schema-kit.ts';
import { BIND_ENDPOINT, bindEndpointRule } from './endpoint-rule.ts';

const ENDPOINT_RULE = bindEndpointRule('tcp://127.0.0.1:5560');
const ENDPOINT = BIND_ENDPOINT;

/** `events`: null (the default) keeps the stream off. */
export const eventsSchema = v.nullable(
  strict({
    endpoint: v.optional(
      v.pipe(
        pattern(ENDPOINT, ENDPOINT_RULE),
        v.description('PUB endpoint of the event stream; default tcp://127.0.0.1:5560.'),
      ),
    ),
    replayEndpoint: v.optional(
      v.pipe(
        v.nullable(pattern(ENDPOINT, ENDPOINT_RULE)),
        v.description(
          'ROUTER endpoint for replays and snapshots; default the next port after endpoint; null: no replay.',
        ),
      ),
    ),
    topic: v.optional(
      v.pipe(str(), v.description('First frame of every message; default "kvtier".')),
    ),
    bufferBatches: v.optional(
      v.pipe(int(1, 10_000_000), v.description('Batches kept for replay; default 10000.')),
    ),
    bufferBytes: v.optional(
      v.pipe(bytes(1024), v.description('Bytes of batches kept for replay; default 16MiB.')),
    ),
    sendHighWaterMark: v.optional(
      v.pipe(
        int(1, 10_000_000),
        v.description(
          'Messages queued per subscriber; past it that subscriber misses messages (it replays them). Default 10000.',
        ),
      ),
    ),
    heartbeatMs: v.optional(
      v.pipe(
        int(0, 3_600_000),
        v.description(
          'Heartbeat interval (last sequence number, instance), ms; 0: none. Default 1000.',
        ),
      ),
    ),
    snapshotScanMaxChunks: v.optional(
      v.pipe(
        int(0, 1_000_000_000),
        v.description(
          "Most chunks a snapshot lists from the shared tiers' stores (Redis, S3, fs: what other sidecars wrote too); 0: none. Default 1000000.",
        ),
      ),
    ),
  }),
);
