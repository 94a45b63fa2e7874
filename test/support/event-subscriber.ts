/**
 * A subscriber of the sidecar's event stream for tests (docs/events.md): a SUB socket that keeps
 * every message, a DEALER for replays and snapshots, and a follower that applies the stream to
 * a per-tier picture of what the sidecar holds, repairing gaps from the replay window and
 * resynchronising from a snapshot when the sidecar restarts or the window no longer covers a gap.
 */
import { decode } from '@msgpack/msgpack';
import * as zmq from 'zeromq';
import type { PayloadValue } from '../../src/event-stream/payload.ts';

/** One decoded message of the stream. */
export interface StreamMessage {
  readonly seq: number;
  readonly ts: number;
  readonly instance: string;
  /** The events, as decoded (tagged arrays). */
  readonly events: readonly (readonly PayloadValue[])[];
}

/** Decodes `[topic, seq, payload]` (or a replay's `[seq, payload]`). */
export function decodeStreamMessage(seqFrame: Buffer, payload: Buffer): StreamMessage {
  const seq = Number(seqFrame.readBigUInt64BE(0));
  const [ts, events, instance] = decode(payload) as [number, PayloadValue[][], string];
  return { seq, ts, instance, events };
}

const END = 0xffff_ffff_ffff_ffffn;

/** A DEALER on a replay endpoint: replays and snapshots, each read to its end marker. */
export class ReplayClient {
  readonly #sock: zmq.Dealer;

  constructor(endpoint: string) {
    this.#sock = new zmq.Dealer({ linger: 0, receiveTimeout: 60_000 });
    this.#sock.connect(endpoint);
  }

  /** The kept batches from `seq` on. */
  async replay(seq: number): Promise<StreamMessage[]> {
    const b = Buffer.alloc(8);
    b.writeBigUInt64BE(BigInt(seq));
    await this.#sock.send([b]);
    return (await this.#collect()).messages;
  }

  /** A snapshot (of one namespace when given): its batches, and the end marker's count. */
  async snapshot(ns?: string): Promise<{ messages: StreamMessage[]; end: PayloadValue }> {
    await this.#sock.send(
      ns === undefined
        ? [Buffer.from('snapshot')]
        : [Buffer.from('snapshot'), Buffer.from(ns, 'hex')],
    );
    return this.#collect();
  }

  /** Sends raw frames; returns the end marker's payload, decoded (empty: undefined). */
  async raw(frames: Buffer[]): Promise<PayloadValue | undefined> {
    await this.#sock.send(frames);
    const { end } = await this.#collect();
    return end;
  }

  async #collect(): Promise<{ messages: StreamMessage[]; end: PayloadValue }> {
    const messages: StreamMessage[] = [];
    for (;;) {
      const [seq, payload] = await this.#sock.receive();
      if (seq!.readBigUInt64BE(0) === END)
        return { messages, end: payload!.length === 0 ? null : (decode(payload!) as PayloadValue) };
      messages.push(decodeStreamMessage(seq!, payload!));
    }
  }

  close(): void {
    this.#sock.close();
  }
}

/** Chunks per tier, as a subscriber pictures one namespace from the stream. */
export type TierPicture = Map<string, Set<string>>;

/** A follower's saved state: its picture and the instance and sequence number it reflects. */
export interface FollowerCheckpoint {
  readonly state: ReadonlyMap<string, TierPicture>;
  readonly instance: string | undefined;
  readonly lastSeq: number;
}

/**
 * Follows a stream: the state of every namespace (tier name → chunk hashes), kept right across
 * gaps (replay) and restarts (snapshot). `pump()` applies what arrived; tests call it until the
 * picture matches what they expect.
 */
export class StreamFollower {
  readonly sub: zmq.Subscriber;
  readonly replay: ReplayClient;
  /** ns → tier → hashes (hex). */
  readonly state = new Map<string, TierPicture>();
  instance: string | undefined;
  lastSeq = 0;
  /** Counters of what the follower had to do. */
  readonly counts = { messages: 0, heartbeats: 0, replays: 0, snapshots: 0, gapsRepaired: 0 };
  readonly #queue: StreamMessage[] = [];
  #waiter: (() => void) | undefined;
  readonly #loop: Promise<void>;
  /** Resolved while reading; a pending promise while paused. */
  #gate: Promise<void> = Promise.resolve();
  #open: (() => void) | undefined;

  constructor(
    endpoint: string,
    replayEndpoint: string,
    opts: { receiveHighWaterMark?: number } = {},
  ) {
    this.sub = new zmq.Subscriber({
      linger: 0,
      ...(opts.receiveHighWaterMark !== undefined
        ? { receiveHighWaterMark: opts.receiveHighWaterMark }
        : {}),
    });
    this.sub.connect(endpoint);
    this.sub.subscribe();
    this.replay = new ReplayClient(replayEndpoint);
    this.#loop = this.#receive();
  }

  /**
   * Stops reading from the socket (a subscriber that fell behind: ZMQ and the kernel queue its
   * messages up to their bounds, then drop them) until {@link resume}.
   */
  pause(): void {
    if (this.#open !== undefined) return;
    this.#gate = new Promise((r) => {
      this.#open = r;
    });
  }

  /** Reads again. */
  resume(): void {
    const open = this.#open;
    this.#open = undefined;
    this.#gate = Promise.resolve();
    open?.();
  }

  async #receive(): Promise<void> {
    try {
      for (;;) {
        await this.#gate;
        const [, seq, payload] = await this.sub.receive();
        this.#queue.push(decodeStreamMessage(seq!, payload!));
        const w = this.#waiter;
        this.#waiter = undefined;
        w?.();
      }
    } catch {
      // closed
    }
  }

  /** Resolves when at least one message waits. */
  async next(): Promise<void> {
    if (this.#queue.length > 0) return;
    await new Promise<void>((r) => {
      this.#waiter = r;
    });
  }

  /** Applies every message that arrived (replaying or resynchronising as needed). */
  async pump(): Promise<void> {
    while (this.#queue.length > 0) {
      const m = this.#queue.shift()!;
      this.counts.messages++;
      if (m.instance !== this.instance) {
        await this.resync();
        if (m.seq <= this.lastSeq) continue;
      }
      if (m.events.length === 0) {
        this.counts.heartbeats++;
        if (m.seq > this.lastSeq) await this.#repair(m.seq + 1);
        continue;
      }
      if (m.seq <= this.lastSeq) continue;
      if (m.seq > this.lastSeq + 1) await this.#repair(m.seq);
      this.#apply(m);
    }
  }

  /** Asks for the batches after `lastSeq` up to (not including) `until`. */
  async #repair(until: number): Promise<void> {
    this.counts.replays++;
    const got = await this.replay.replay(this.lastSeq + 1);
    const first = got[0];
    if (first === undefined || first.seq > this.lastSeq + 1 || first.instance !== this.instance) {
      await this.resync();
      return;
    }
    for (const m of got) if (m.seq < until && m.seq === this.lastSeq + 1) this.#apply(m);
    this.counts.gapsRepaired++;
  }

  /** Replaces the picture with a snapshot. */
  async resync(): Promise<void> {
    this.counts.snapshots++;
    const { messages, end } = await this.replay.snapshot();
    const [, count, instance, seq] = end as [string, number, string, number];
    if (count !== messages.length)
      throw new Error(`snapshot: ${messages.length} of ${count} batches`);
    this.state.clear();
    for (const m of messages) this.#applyEvents(m.events);
    this.instance = instance;
    this.lastSeq = seq;
  }

  #apply(m: StreamMessage): void {
    this.lastSeq = m.seq;
    this.#applyEvents(m.events);
  }

  #applyEvents(events: readonly (readonly PayloadValue[])[]): void {
    for (const ev of events) {
      const kind = ev[0] as string;
      if (kind === 'cleared') {
        const nss = (ev[1] as Uint8Array[]).map((b) => Buffer.from(b).toString('hex'));
        if (nss.length === 0) this.state.clear();
        else for (const ns of nss) this.state.delete(ns);
        continue;
      }
      const ns = Buffer.from(ev[1] as Uint8Array).toString('hex');
      const tier = ev[2] as string;
      const hashes = ev[4] as Uint8Array;
      let pic = this.state.get(ns);
      if (pic === undefined) {
        pic = new Map();
        this.state.set(ns, pic);
      }
      let set = pic.get(tier);
      if (set === undefined) {
        set = new Set();
        pic.set(tier, set);
      }
      for (let i = 0; i < hashes.length; i += 32) {
        const h = Buffer.from(hashes.subarray(i, i + 32)).toString('hex');
        if (kind === 'stored') set.add(h);
        else set.delete(h);
      }
    }
  }

  /** What a follower saves to resume after its own restart: its picture, instance and seq. */
  checkpoint(): FollowerCheckpoint {
    const state = new Map<string, TierPicture>();
    for (const [ns, pic] of this.state)
      state.set(ns, new Map([...pic].map(([tier, set]) => [tier, new Set(set)])));
    return { state, instance: this.instance, lastSeq: this.lastSeq };
  }

  /**
   * Takes up a checkpoint instead of a snapshot (docs/events.md, "Resuming from a checkpoint"):
   * the next message shows whether it is still good — a batch or heartbeat past `lastSeq` of the
   * same instance is replayed from `lastSeq + 1`, a window that moved on or another instance
   * means a snapshot — so {@link pump} does the rest.
   */
  resumeFrom(c: FollowerCheckpoint): void {
    this.state.clear();
    for (const [ns, pic] of c.state)
      this.state.set(ns, new Map([...pic].map(([tier, set]) => [tier, new Set(set)])));
    this.instance = c.instance;
    this.lastSeq = c.lastSeq;
  }

  /** The hashes of `ns` held by at least one tier. */
  reachable(ns: string): Set<string> {
    const out = new Set<string>();
    for (const set of this.state.get(ns)?.values() ?? []) for (const h of set) out.add(h);
    return out;
  }

  /** The hashes of `ns` in `tier`. */
  inTier(ns: string, tier: string): Set<string> {
    return this.state.get(ns)?.get(tier) ?? new Set();
  }

  async close(): Promise<void> {
    this.resume();
    this.sub.close();
    this.replay.close();
    await this.#loop;
  }
}
