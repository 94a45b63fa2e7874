/**
 * The sidecar's event stream on the wire (docs/events.md): a ZMQ PUB socket that sends every
 * batch of the {@link EventLog} as `[topic, seq (u64 BE), payload]` plus a heartbeat, and a
 * ROUTER socket where a subscriber asks for the batches it missed (by sequence number) or for a
 * snapshot of what the sidecar's tiers hold. Sends never wait: a subscriber that does not keep
 * up loses messages at its high-water mark (ZMQ drops them for that subscriber only), sees the
 * gap in the sequence numbers and asks the replay socket for the rest.
 */
import * as zmq from 'zeromq';
import { KvtierError } from '../errors.ts';
import type { EventMetrics } from '../metrics/event-metrics.ts';
import { SocketSendQueue } from '../protocol/send-queue.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import { EventLog } from './event-log.ts';
import type { SnapshotGroup, SnapshotScan } from './event-types.ts';
import type { ResolvedEventsOptions } from './events-options.ts';
import { encodePayload } from './payload.ts';

/** The sequence number that ends a replay or a snapshot (all ones: -1 as a signed u64). */
export const END_SEQ = Buffer.alloc(8, 0xff);

/** Options of {@link EventPublisher}. */
export interface EventPublisherOptions extends ResolvedEventsOptions {
  /** What the tiers hold, for snapshots; `ns` limits it to one namespace. */
  snapshot?: (ns: string | undefined) => Iterable<SnapshotGroup>;
  /** The tiers a snapshot then lists from their stores (shared tiers); `ns` as above. */
  snapshotScans?: (ns: string | undefined) => readonly SnapshotScan[];
  /** Socket options that make both sockets CurveZMQ servers (the sidecar's `ServerAuth`). */
  socketOptions?: Partial<zmq.SocketOptions<zmq.Router>> & { context?: zmq.Context };
  metrics?: EventMetrics;
  log?: Logger;
}

/** Snapshots waiting for the one being answered; past it a request is refused as busy. */
export const SNAPSHOT_QUEUE = 8;

function seqBytes(seq: number): Buffer {
  const b = Buffer.allocUnsafe(8);
  b.writeBigUInt64BE(BigInt(seq));
  return b;
}

/**
 * Binds the stream's sockets and publishes what its {@link EventLog} seals. Own the log through
 * {@link EventPublisher.log} (report chunk events into it); `close()` flushes it and closes both
 * sockets.
 */
export class EventPublisher {
  readonly log: EventLog;
  readonly topic: Buffer;
  readonly #pub: zmq.Publisher;
  readonly #pubQueue: SocketSendQueue;
  readonly #replay: zmq.Router | undefined;
  readonly #replayQueue: SocketSendQueue | undefined;
  readonly #snapshot: (ns: string | undefined) => Iterable<SnapshotGroup>;
  readonly #scans: (ns: string | undefined) => readonly SnapshotScan[];
  readonly #scanMaxChunks: number;
  /** Aborted by close: stops the listings of snapshots under way. */
  readonly #stop = new AbortController();
  /** The snapshot being answered and those queued behind it (one listing at a time). */
  #snapshots: Promise<void> = Promise.resolve();
  #snapshotsQueued = 0;
  readonly #metrics: EventMetrics | undefined;
  readonly #logger: Logger;
  readonly #heartbeat: NodeJS.Timeout | undefined;
  #endpoint = '';
  #replayEndpoint: string | null = null;
  #loop: Promise<void> | undefined;
  #closing: Promise<void> | undefined;

  private constructor(opts: EventPublisherOptions) {
    this.#metrics = opts.metrics;
    this.#logger = opts.log ?? silentLogger;
    this.#snapshot = opts.snapshot ?? (() => []);
    this.#scans = opts.snapshotScans ?? (() => []);
    this.#scanMaxChunks = opts.snapshotScanMaxChunks;
    this.topic = Buffer.from(opts.topic, 'utf8');
    const { context, ...curve } = opts.socketOptions ?? {};
    const common = { linger: 0, sendTimeout: 0, ...(context !== undefined ? { context } : {}) };
    this.#pub = new zmq.Publisher({
      ...common,
      ...(curve as Partial<zmq.SocketOptions<zmq.Publisher>>),
      sendHighWaterMark: opts.sendHighWaterMark,
      // The last batches (sealed by close) get this long to leave; a subscriber that missed
      // them learns of the restart from the next instance anyway.
      linger: 200,
    });
    this.#pubQueue = new SocketSendQueue(this.#pub, { immediate: true, log: this.#logger });
    if (opts.replayEndpoint !== null) {
      this.#replay = new zmq.Router({
        ...common,
        ...curve,
        // A replay answers with up to the whole window at once.
        sendHighWaterMark: opts.bufferBatches + 1024,
        receiveHighWaterMark: 1000,
        maxMessageSize: 1024,
      });
      this.#replayQueue = new SocketSendQueue(this.#replay, { immediate: true, log: this.#logger });
    }
    this.log = new EventLog({
      bufferBatches: opts.bufferBatches,
      bufferBytes: opts.bufferBytes,
      onBatch: (seq, payload) => this.#publish(seq, payload),
    });
    if (opts.heartbeatMs > 0) {
      this.#heartbeat = setInterval(() => this.#beat(), opts.heartbeatMs);
      this.#heartbeat.unref();
    }
    this.#metrics?.bind(this);
  }

  /**
   * Binds the sockets and starts serving replays.
   * @throws KvtierError `KVT_CONFIG` when an endpoint cannot be bound.
   */
  static async start(opts: EventPublisherOptions): Promise<EventPublisher> {
    const p = new EventPublisher(opts);
    try {
      p.#endpoint = await bind(p.#pub, opts.endpoint, 'event stream');
      if (p.#replay !== undefined && opts.replayEndpoint !== null) {
        p.#replayEndpoint = await bind(p.#replay, opts.replayEndpoint, 'event replay');
        p.#loop = p.#serve(p.#replay);
      }
    } catch (err) {
      await p.close();
      throw err;
    }
    p.#logger.info('event stream publishing', {
      endpoint: p.#endpoint,
      replayEndpoint: p.#replayEndpoint,
      instance: p.log.instance,
    });
    return p;
  }

  /** The PUB socket's bound endpoint (the real port when `*` was asked for). */
  get endpoint(): string {
    return this.#endpoint;
  }

  /** The replay socket's bound endpoint, or null when replay is off. */
  get replayEndpoint(): string | null {
    return this.#replayEndpoint;
  }

  /** Batches the PUB socket refused (closed, or a send error); they stay replayable. */
  get sendDropped(): number {
    return this.#pubQueue.dropped;
  }

  /** What PING reports about the stream. */
  info(): Record<string, unknown> {
    return {
      endpoint: this.#endpoint,
      replayEndpoint: this.#replayEndpoint,
      topic: this.topic.toString('utf8'),
      instance: this.log.instance,
    };
  }

  #publish(seq: number, payload: Buffer): void {
    this.#pubQueue.send([this.topic, seqBytes(seq), payload]);
  }

  #beat(): void {
    this.log.flush();
    this.#pubQueue.send([this.topic, seqBytes(this.log.lastSeq), this.log.heartbeat()]);
  }

  async #serve(router: zmq.Router): Promise<void> {
    try {
      for await (const frames of router) this.#onRequest(frames);
    } catch (err) {
      if (!router.closed) this.#logger.error('event replay loop failed', { err });
    }
  }

  /** `[id, seq]` or `[id, 'snapshot', ns?]`, each optionally with REQ's empty delimiter. */
  #onRequest(frames: Buffer[]): void {
    const delimited = frames.length > 1 && frames[1]!.length === 0;
    const envelope = delimited ? frames.slice(0, 2) : frames.slice(0, 1);
    const body = frames.slice(envelope.length);
    const send = (seq: Buffer, payload: Buffer) =>
      this.#replayQueue!.send([...envelope, seq, payload]);
    const first = body[0];
    // "snapshot" is 8 bytes too: it is read as the command, never as a sequence number.
    if (first !== undefined && first.toString('latin1') === 'snapshot' && body.length <= 2) {
      const ns = body[1];
      if (ns === undefined || ns.length === 16) {
        if (this.#snapshotsQueued >= SNAPSHOT_QUEUE) {
          this.#metrics?.replays.inc({ kind: 'bad' });
          send(END_SEQ, encodePayload(['error', 'busy: too many snapshots queued; ask again']));
          return;
        }
        this.#metrics?.replays.inc({ kind: 'snapshot' });
        this.#snapshotsQueued++;
        this.#snapshots = this.#snapshots
          .then(() => this.#answerSnapshot(ns?.toString('hex'), send))
          .catch((err: unknown) => this.#logger.error('event snapshot failed', { err }))
          .finally(() => this.#snapshotsQueued--);
        return;
      }
    }
    if (body.length === 1 && first!.length === 8) {
      const from = Number(first!.readBigUInt64BE(0));
      const behind = from < this.log.oldestSeq && from <= this.log.lastSeq;
      this.#metrics?.replays.inc({ kind: behind ? 'behind' : 'replay' });
      for (const [seq, payload] of this.log.replay(from)) send(seqBytes(seq), payload);
      send(END_SEQ, Buffer.alloc(0));
      return;
    }
    this.#metrics?.replays.inc({ kind: 'bad' });
    send(END_SEQ, encodePayload(['error', 'expected [u64 seq] or ["snapshot", ns?]']));
  }

  /**
   * Answers a snapshot: the tiers with an index in memory at once (their batches sealed first),
   * then each scanned tier's listing as it comes, at most `snapshotScanMaxChunks` chunks in all;
   * every batch carries the sequence number sealed at the start. The end marker names the
   * scanned tiers that were not listed whole (cannot be listed now, failed, or cut short).
   */
  async #answerSnapshot(
    ns: string | undefined,
    send: (seq: Buffer, payload: Buffer) => void,
  ): Promise<void> {
    const local = this.log.snapshot(this.#snapshot(ns));
    const last = this.log.lastSeq;
    const seq = seqBytes(last);
    for (const payload of local) send(seq, payload);
    let batches = local.length;
    let budget = this.#scanMaxChunks;
    const partial: string[] = [];
    for (const { tier, scan } of budget > 0 ? this.#scans(ns) : []) {
      let whole = false;
      try {
        const pages = scan(this.#stop.signal);
        if (pages !== null) {
          whole = true;
          for await (const page of pages) {
            const hashes = page.hashes.slice(0, budget);
            for (const payload of this.log.encodeStored([{ tier, ns: page.ns, hashes }])) {
              send(seq, payload);
              batches++;
            }
            budget -= hashes.length;
            if (budget === 0 || this.#stop.signal.aborted) {
              whole = false;
              break;
            }
          }
        }
      } catch (err) {
        whole = false;
        this.#logger.warn('event snapshot: a tier could not be listed', { tier: tier.name, err });
      }
      if (!whole) partial.push(tier.name);
    }
    send(END_SEQ, encodePayload(['end', batches, this.log.instance, last, partial]));
  }

  /** Seals what is pending, publishes it, and closes both sockets. Idempotent. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      clearInterval(this.#heartbeat);
      this.#stop.abort();
      this.log.close();
      this.#pub.close();
      this.#replay?.close();
      await this.#loop;
    })();
    return this.#closing;
  }
}

async function bind(socket: zmq.Socket, endpoint: string, what: string): Promise<string> {
  try {
    await socket.bind(endpoint);
  } catch (err) {
    throw new KvtierError(
      'KVT_CONFIG',
      `cannot bind ${what} to ${endpoint}: ${(err as Error).message}`,
      { cause: err },
    );
  }
  return socket.lastEndpoint ?? endpoint;
}
