/**
 * The event stream's memory: reports gathered into batches (one per turn of the event loop, or
 * sooner when a batch is full), each numbered, encoded once and kept in a replay window bounded
 * by batch count and bytes. No sockets here (event-publisher.ts sends what this makes).
 */
import { randomBytes } from 'node:crypto';
import type { ChunkHash, NamespaceId } from '../backends/core/types.ts';
import { requireInt } from '../util/validate.ts';
import type { ChunkEventSink, EventTier, RemovalReason, SnapshotGroup } from './event-types.ts';
import { encodePayload, type PayloadValue } from './payload.ts';

/** Options of {@link EventLog}. */
export interface EventLogOptions {
  /** Batches kept for replay; default 10 000. */
  bufferBatches?: number;
  /** Bytes of encoded batches kept for replay; default 16 MiB. */
  bufferBytes?: number;
  /** Chunk hashes in one batch before it is sealed early; default 4096. */
  maxBatchHashes?: number;
  /** Called with every sealed batch, in sequence order. */
  onBatch?: (seq: number, payload: Buffer) => void;
  /** Wall clock in seconds for the batches' timestamps; default `Date.now() / 1000`. */
  now?: () => number;
  /** Defers the seal of a batch to the end of this turn; default `setImmediate`. */
  defer?: (fn: () => void) => void;
  /** This process's instance id (16 hex digits); default random. */
  instance?: string;
}

interface Pending {
  readonly kind: 'stored' | 'removed' | 'cleared';
  readonly ns: string;
  readonly tier: EventTier | undefined;
  readonly reason: RemovalReason | undefined;
  hashes: Buffer[];
  namespaces?: readonly NamespaceId[];
  epoch?: number;
}

/** Hashes of one snapshot message. */
const SNAPSHOT_HASHES = 4096;

/**
 * Numbers and keeps the stream's batches (see the module doc). A batch is `[ts, events,
 * instance]` in msgpack; sequence numbers start at 1 in every process, so a subscriber that sees
 * a new `instance` knows the sidecar restarted. Implements {@link ChunkEventSink}: reports never
 * throw and never wait.
 */
export class EventLog implements ChunkEventSink {
  /** 16 hex digits, new in every process. */
  readonly instance: string;
  readonly #bufferBatches: number;
  readonly #bufferBytes: number;
  readonly #maxBatchHashes: number;
  readonly #onBatch: (seq: number, payload: Buffer) => void;
  readonly #now: () => number;
  readonly #defer: (fn: () => void) => void;
  readonly #seal = (): void => this.flush();
  #pending: Pending[] = [];
  #pendingHashes = 0;
  #scheduled = false;
  /** The replay window: [seq, payload] oldest first, from #head on. */
  #ring: [number, Buffer][] = [];
  #head = 0;
  #ringBytes = 0;
  #seq = 0;
  #eventsTotal = 0;
  #chunksTotal = 0;
  #closed = false;

  /** @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options. */
  constructor(opts: EventLogOptions = {}) {
    this.#bufferBatches = requireInt('events.bufferBatches', opts.bufferBatches ?? 10_000, 1);
    this.#bufferBytes = requireInt('events.bufferBytes', opts.bufferBytes ?? 16 * 1024 ** 2, 1024);
    this.#maxBatchHashes = requireInt('maxBatchHashes', opts.maxBatchHashes ?? 4096, 1);
    this.#onBatch = opts.onBatch ?? (() => {});
    this.#now = opts.now ?? (() => Date.now() / 1000);
    this.#defer = opts.defer ?? ((fn) => setImmediate(fn));
    this.instance = opts.instance ?? randomBytes(8).toString('hex');
  }

  /** Sequence number of the last sealed batch; 0 before the first. */
  get lastSeq(): number {
    return this.#seq;
  }

  /** Sequence number of the oldest batch still kept for replay; lastSeq + 1 when none is. */
  get oldestSeq(): number {
    return this.#head < this.#ring.length ? this.#ring[this.#head]![0] : this.#seq + 1;
  }

  /** Batches kept for replay. */
  get bufferedBatches(): number {
    return this.#ring.length - this.#head;
  }

  /** Bytes of the batches kept for replay. */
  get bufferedBytes(): number {
    return this.#ringBytes;
  }

  /** Events (each naming one tier and namespace) and chunk hashes sealed since start. */
  get totals(): { batches: number; events: number; chunks: number } {
    return { batches: this.#seq, events: this.#eventsTotal, chunks: this.#chunksTotal };
  }

  stored(tier: EventTier, ns: NamespaceId, hash: ChunkHash): void {
    this.#add('stored', ns, tier, undefined, [hash]);
  }

  removed(
    tier: EventTier,
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    reason: RemovalReason,
  ): void {
    if (hashes.length > 0) this.#add('removed', ns, tier, reason, hashes);
  }

  cleared(namespaces: readonly NamespaceId[], epoch: number): void {
    if (this.#closed) return;
    this.#pending.push({
      kind: 'cleared',
      ns: '',
      tier: undefined,
      reason: undefined,
      hashes: [],
      namespaces: [...namespaces],
      epoch,
    });
    this.#schedule();
  }

  #add(
    kind: 'stored' | 'removed',
    ns: NamespaceId,
    tier: EventTier,
    reason: RemovalReason | undefined,
    hashes: readonly ChunkHash[],
  ): void {
    if (this.#closed) return;
    // Same kind, namespace, tier and reason as the last event: one event, order kept.
    const last = this.#pending[this.#pending.length - 1];
    let ev: Pending;
    if (
      last !== undefined &&
      last.kind === kind &&
      last.ns === ns &&
      last.tier === tier &&
      last.reason === reason
    )
      ev = last;
    else {
      ev = { kind, ns, tier, reason, hashes: [] };
      this.#pending.push(ev);
    }
    for (const h of hashes) ev.hashes.push(Buffer.from(h, 'hex'));
    this.#pendingHashes += hashes.length;
    if (this.#pendingHashes >= this.#maxBatchHashes) this.flush();
    else this.#schedule();
  }

  #schedule(): void {
    if (this.#scheduled) return;
    this.#scheduled = true;
    this.#defer(this.#seal);
  }

  /** Seals what was reported into a batch now (nothing when nothing was). */
  flush(): void {
    this.#scheduled = false;
    if (this.#pending.length === 0) return;
    const events = this.#pending.map(encodeEvent);
    for (const p of this.#pending) this.#chunksTotal += p.hashes.length;
    this.#eventsTotal += events.length;
    this.#pending = [];
    this.#pendingHashes = 0;
    const seq = ++this.#seq;
    const payload = encodePayload([this.#now(), events, this.instance]);
    this.#keep(seq, payload);
    this.#onBatch(seq, payload);
  }

  #keep(seq: number, payload: Buffer): void {
    this.#ring.push([seq, payload]);
    this.#ringBytes += payload.length;
    while (
      this.bufferedBatches > this.#bufferBatches ||
      (this.#ringBytes > this.#bufferBytes && this.bufferedBatches > 1)
    ) {
      this.#ringBytes -= this.#ring[this.#head]![1].length;
      this.#ring[this.#head] = undefined as unknown as [number, Buffer];
      this.#head++;
    }
    if (this.#head > 1024 && this.#head * 2 > this.#ring.length) {
      this.#ring = this.#ring.slice(this.#head);
      this.#head = 0;
    }
  }

  /** The kept batches from `seq` on, oldest first (none when `seq` is past the last). */
  *replay(seq: number): Generator<readonly [number, Buffer]> {
    const ring = this.#ring;
    const end = ring.length;
    // Sequence numbers are consecutive in the ring: index arithmetic, no search.
    const first = this.#head < end ? ring[this.#head]![0] : this.#seq + 1;
    for (let i = this.#head + Math.max(0, seq - first); i < end; i++) yield ring[i]!;
  }

  /** A heartbeat's payload: no events, this instance (its sequence number is {@link lastSeq}). */
  heartbeat(): Buffer {
    return encodePayload([this.#now(), [], this.instance]);
  }

  /**
   * A snapshot as batch payloads of `stored` events (at most 4096 hashes each), all belonging
   * to sequence number {@link lastSeq}: what was reported is sealed first, so the snapshot
   * follows every batch up to it.
   */
  snapshot(groups: Iterable<SnapshotGroup>): Buffer[] {
    this.flush();
    return this.encodeStored(groups);
  }

  /**
   * `groups` as batch payloads of `stored` events (at most 4096 hashes each), sealing nothing: the
   * rest of a snapshot that {@link snapshot} began.
   */
  encodeStored(groups: Iterable<SnapshotGroup>): Buffer[] {
    const out: Buffer[] = [];
    let events: PayloadValue[] = [];
    let count = 0;
    const seal = () => {
      out.push(encodePayload([this.#now(), events, this.instance]));
      events = [];
      count = 0;
    };
    for (const g of groups) {
      for (let i = 0; i < g.hashes.length; ) {
        const take = Math.min(g.hashes.length - i, SNAPSHOT_HASHES - count);
        const packed = Buffer.allocUnsafe(take * 32);
        for (let k = 0; k < take; k++) packed.write(g.hashes[i + k]!, k * 32, 'hex');
        events.push(['stored', Buffer.from(g.ns, 'hex'), g.tier.name, g.tier.medium, packed]);
        i += take;
        count += take;
        if (count >= SNAPSHOT_HASHES) seal();
      }
    }
    if (events.length > 0) seal();
    return out;
  }

  /** Seals what is pending and stops taking reports (later ones are ignored). */
  close(): void {
    if (this.#closed) return;
    this.flush();
    this.#closed = true;
  }
}

function encodeEvent(p: Pending): PayloadValue {
  if (p.kind === 'cleared')
    return ['cleared', (p.namespaces ?? []).map((ns) => Buffer.from(ns, 'hex')), p.epoch ?? 0];
  const ns = Buffer.from(p.ns, 'hex');
  const hashes = Buffer.concat(p.hashes);
  const tier = p.tier!;
  return p.kind === 'stored'
    ? ['stored', ns, tier.name, tier.medium, hashes]
    : ['removed', ns, tier.name, tier.medium, hashes, p.reason!];
}
