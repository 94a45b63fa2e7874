/**
 * The event stream's metrics (docs/events.md), over the sidecar's registry: counters the stream
 * increments, and gauges and totals read from it at scrape time.
 */
import { Counter, Gauge, type Registry } from 'prom-client';

/** What the metrics read from the stream at scrape time. */
export interface EventStreamSource {
  readonly log: {
    readonly lastSeq: number;
    readonly bufferedBatches: number;
    readonly bufferedBytes: number;
    readonly totals: { batches: number; events: number; chunks: number };
  };
  /** Batches the PUB socket refused (still replayable). */
  readonly sendDropped: number;
}

/** Values of the `kind` label of `kvtier_events_replay_requests_total`. */
export type ReplayKind = 'replay' | 'behind' | 'snapshot' | 'bad';

/** The stream's series; build once per registry and bind the stream with {@link bind}. */
export class EventMetrics {
  /** Requests on the replay socket: a replay, one for batches already gone, a snapshot, or malformed. */
  readonly replays: Counter<'kind'>;
  #source: EventStreamSource | undefined;

  constructor(registry: Registry) {
    const read = (f: (s: EventStreamSource) => number) =>
      function (this: Gauge | Counter) {
        const s = metrics.#source;
        if (s === undefined) return;
        this.reset();
        if (this instanceof Gauge) this.set(f(s));
        else this.inc(f(s));
      };
    const metrics = this;
    const registers = [registry];
    this.replays = new Counter({
      name: 'kvtier_events_replay_requests_total',
      help: 'Requests on the event replay socket, by kind (replay, behind: asked for batches no longer kept, snapshot, bad)',
      labelNames: ['kind'],
      registers,
    });
    new Counter({
      name: 'kvtier_events_batches_total',
      help: 'Event batches published (each one sequence number)',
      registers,
      collect: read((s) => s.log.totals.batches),
    });
    new Counter({
      name: 'kvtier_events_chunks_total',
      help: 'Chunk hashes named by published stored and removed events',
      registers,
      collect: read((s) => s.log.totals.chunks),
    });
    new Counter({
      name: 'kvtier_events_send_dropped_total',
      help: 'Event batches the PUB socket refused; subscribers get them from the replay window',
      registers,
      collect: read((s) => s.sendDropped),
    });
    new Gauge({
      name: 'kvtier_events_buffer_batches',
      help: 'Event batches kept for replay',
      registers,
      collect: read((s) => s.log.bufferedBatches),
    });
    new Gauge({
      name: 'kvtier_events_buffer_bytes',
      help: 'Bytes of the event batches kept for replay',
      registers,
      collect: read((s) => s.log.bufferedBytes),
    });
    new Gauge({
      name: 'kvtier_events_last_seq',
      help: 'Sequence number of the last published event batch (restarts at 1 with the process)',
      registers,
      collect: read((s) => s.log.lastSeq),
    });
  }

  /** The stream the gauges and totals read. */
  bind(source: EventStreamSource): void {
    this.#source = source;
  }
}
