/**
 * One peer of the peer tier: a protocol client (one DEALER, CurveZMQ with this sidecar's own key
 * pair when configured) to another sidecar's server, its health, its counters and its log. A
 * request that gets no answer within the deadline counts as a failure; after `failureThreshold`
 * of them in a row the peer is left out (its requests answered at once, as misses) until it
 * answers a PING again, sent every `probeIntervalMs`. Problems are logged at most once per
 * `logIntervalMs` for this peer, with a count of the ones left out.
 */
import type { Counter, Gauge } from 'prom-client';
import { closedError, KvtierError } from '../../errors.ts';
import type { Reply, Request } from '../../protocol/messages.ts';
import { MalformedReplyError, RequestSocket } from '../../protocol/request-socket.ts';
import type { ClientCurveKeys } from '../../security/curve-client.ts';
import type { Logger } from '../../util/log.ts';
import { RateLimitedLog } from '../../util/rate-limited-log.ts';
import type { PeerRefusal } from './peer-verify.ts';

/** What a {@link PeerLink} needs besides its peer. */
export interface PeerLinkOptions {
  /** The tier's name (the `tier` label). */
  readonly tier: string;
  readonly name: string;
  readonly endpoint: string;
  /** This sidecar's key pair and the peer's server key; none without CurveZMQ. */
  readonly curve?: ClientCurveKeys;
  readonly timeoutMs: number;
  readonly failureThreshold: number;
  readonly probeIntervalMs: number;
  readonly logIntervalMs: number;
  readonly log: Logger;
  /** `kvtier_peer_refused_total{tier, peer, reason}`. */
  readonly refusedMetric: Counter<'tier' | 'peer' | 'reason'>;
  /** `kvtier_peer_up{tier, peer}`. */
  readonly upMetric: Gauge<'tier' | 'peer'>;
}

/** The outcome of one request: the reply, or why there is none (the peer is a miss then). */
export type PeerCall<R> =
  | { readonly ok: true; readonly reply: R }
  | { readonly ok: false; readonly why: 'down' | 'timeout' | 'error' | 'malformed' };

/** A peer's counters, as the tier's stats show them. */
export interface PeerLinkStats {
  readonly state: 'up' | 'down';
  /** Requests sent. */
  readonly requests: number;
  /** Requests not sent because the peer was left out. */
  readonly skipped: number;
  /** Answers (or chunks of answers) not used, by reason. */
  readonly refused: Readonly<Partial<Record<PeerRefusal, number>>>;
}

/** One peer: see the module comment. */
export class PeerLink {
  readonly name: string;
  readonly endpoint: string;
  readonly #o: PeerLinkOptions;
  readonly #rs: RequestSocket;
  readonly #problems: RateLimitedLog;
  #up = true;
  #failures = 0;
  #requests = 0;
  #skipped = 0;
  readonly #refused: Partial<Record<PeerRefusal, number>> = {};
  #probe: NodeJS.Timeout | undefined;
  #probing = false;
  #closed = false;

  /** Connects at once (ZMQ connects in the background and reconnects on its own). */
  constructor(o: PeerLinkOptions) {
    this.#o = o;
    this.name = o.name;
    this.endpoint = o.endpoint;
    this.#rs = new RequestSocket({
      endpoint: o.endpoint,
      requestTimeoutMs: o.timeoutMs,
      // A peer silent for a deadline with requests in flight is probed, and replaced when it
      // stays silent: what was queued for it (puts) never piles up behind a dead peer.
      livenessTimeoutMs: o.timeoutMs,
      name: `peer ${o.name}`,
      log: o.log,
      ...(o.curve !== undefined ? { curve: o.curve } : {}),
    });
    this.#problems = new RateLimitedLog(o.log, { intervalMs: o.logIntervalMs });
    o.upMetric.set({ tier: o.tier, peer: o.name }, 1);
  }

  /** Whether requests are sent to the peer (false while it is left out). */
  get up(): boolean {
    return this.#up;
  }

  /**
   * Sends `req` and resolves with the reply of type `expect`, or why there is none; the peer's
   * failures and refusals are counted and logged. Rejects only when `signal` fired (the caller's
   * deadline or abort: not the peer's fault) or after close.
   */
  async call<T extends Reply['type']>(
    req: Request,
    expect: T,
    signal?: AbortSignal,
  ): Promise<PeerCall<Extract<Reply, { type: T }>>> {
    if (this.#closed) throw closedError(`peer ${this.name}`);
    if (!this.#up) {
      this.#skipped++;
      return { ok: false, why: 'down' };
    }
    this.#requests++;
    let rep: Reply;
    try {
      rep = await this.#rs.request(req, { signal, timeoutMs: this.#o.timeoutMs });
    } catch (err) {
      if (signal?.aborted === true || this.#closed) throw err;
      const code = err instanceof KvtierError ? err.code : 'KVT_INTERNAL';
      if (err instanceof MalformedReplyError) {
        this.refused('malformed', 1, { op: req.type, err: err.message });
        return { ok: false, why: 'malformed' };
      }
      if (code === 'KVT_TIMEOUT' || code === 'KVT_CAPACITY') {
        this.refused('timeout', 1, { op: req.type, err: (err as Error).message });
        this.#failed();
        return { ok: false, why: 'timeout' };
      }
      this.refused('error', 1, { op: req.type, code, err: (err as Error).message });
      return { ok: false, why: 'error' };
    }
    this.#failures = 0;
    if (rep.type !== expect) {
      this.refused('malformed', 1, { op: req.type, got: rep.type });
      return { ok: false, why: 'malformed' };
    }
    return { ok: true, reply: rep as Extract<Reply, { type: T }> };
  }

  /** Counts `n` refusals for `reason` and logs them (rate-limited per peer). */
  refused(reason: PeerRefusal, n: number, fields: Record<string, unknown> = {}): void {
    if (n <= 0) return;
    this.#refused[reason] = (this.#refused[reason] ?? 0) + n;
    this.#o.refusedMetric.inc({ tier: this.#o.tier, peer: this.name, reason }, n);
    this.#problems.warn('peer gave no usable answer; treated as a miss', {
      peer: this.name,
      endpoint: this.endpoint,
      reason,
      chunks: n,
      ...fields,
    });
  }

  /** The peer's counters. */
  stats(): PeerLinkStats {
    return {
      state: this.#up ? 'up' : 'down',
      requests: this.#requests,
      skipped: this.#skipped,
      refused: { ...this.#refused },
    };
  }

  #failed(): void {
    this.#failures++;
    if (!this.#up || this.#failures < this.#o.failureThreshold) return;
    this.#up = false;
    this.#o.upMetric.set({ tier: this.#o.tier, peer: this.name }, 0);
    this.#o.log.warn('peer left out: it did not answer; asking it again once it answers a PING', {
      peer: this.name,
      endpoint: this.endpoint,
      failures: this.#failures,
    });
    this.#probe = setInterval(() => void this.#ping(), this.#o.probeIntervalMs);
    this.#probe.unref();
  }

  /** One probe of a peer that is left out: a PONG that lists the peer messages brings it back. */
  async #ping(): Promise<void> {
    if (this.#probing || this.#closed || this.#up) return;
    this.#probing = true;
    try {
      const rep = await this.#rs.request(
        { type: 'ping', requestId: 0 },
        { timeoutMs: this.#o.timeoutMs },
      );
      if (rep.type !== 'pong' || this.#closed) return;
      const features = rep.info.features;
      if (!Array.isArray(features) || !features.includes('peer')) {
        this.#problems.warn('peer does not serve the peer messages (PONG features lack "peer")', {
          peer: this.name,
          endpoint: this.endpoint,
        });
        return;
      }
      clearInterval(this.#probe);
      this.#probe = undefined;
      this.#up = true;
      this.#failures = 0;
      this.#o.upMetric.set({ tier: this.#o.tier, peer: this.name }, 1);
      this.#o.log.info('peer answers again', { peer: this.name, endpoint: this.endpoint });
    } catch {
      // Still silent: the next probe asks again.
    } finally {
      this.#probing = false;
    }
  }

  /** Stops probing and closes the socket (requests in flight reject with `KVT_CLOSED`). */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#probe);
    this.#problems.close();
    await this.#rs.close();
  }
}
