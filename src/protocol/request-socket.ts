import * as zmq from 'zeromq';
import { abortedError, closedError, KvtierError } from '../errors.ts';
import { type ClientCurveKeys, curveClientOptions } from '../security/curve-client.ts';
import { type DeadlineTimers, MAX_DEADLINE_MS, systemTimers } from '../util/deadline.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import { requireInt, requireString } from '../util/validate.ts';
import { decodeReply, encodeRequest, peekRequestId } from './codec.ts';
import { checkClientEndpoint } from './endpoint.ts';
import type { Reply, Request } from './messages.ts';
import { SocketSendQueue } from './send-queue.ts';

/** Options of {@link RequestSocket}. */
export interface RequestSocketOptions {
  /** Server endpoint, e.g. 'tcp://127.0.0.1:5555'. */
  endpoint: string;
  /** Deadline of a request that names none, ms; default 10 000. */
  requestTimeoutMs?: number;
  /** Names the owner in errors ("lookup client is closed"); default 'client'. */
  name?: string;
  /** Sees every decoded reply, matched or not (e.g. to track the server's epoch). */
  onReply?: (rep: Reply) => void;
  log?: Logger;
  /** Timers of the request deadlines; default `setTimeout` (tests inject a clock). */
  timers?: DeadlineTimers;
  /** CurveZMQ keys, for a server with CurveZMQ on (docs/security.md); default none. */
  curve?: ClientCurveKeys;
  /**
   * Liveness, ms: with requests in flight and nothing heard from the server for this long, a
   * PING probes it; when nothing is heard within this long again, the server counts as down:
   * every request in flight fails at once with `KVT_TIMEOUT` and the connection is replaced, so
   * nothing still queued for it (a SAVE the caller has given up on) ever reaches the server.
   * Default 0: off (requests only meet their own deadlines).
   */
  livenessTimeoutMs?: number;
}

/** Per-call options of {@link RequestSocket.request}. */
export interface RequestCallOptions {
  signal?: AbortSignal | undefined;
  /** Overrides the socket's `requestTimeoutMs` for this call. */
  timeoutMs?: number | undefined;
}

/**
 * One request waiting for its reply: settled once, by the reply, its deadline, the caller's
 * abort or the socket's close or outage; settling clears its timer and listener and forgets it.
 * One object per request: no deadline object, race promise or closures beyond the abort listener.
 */
/** What a {@link Pending} asks of its socket. */
interface PendingOwner {
  /** Forgets a settled request: its slot and its share of its connection. */
  forget(p: Pending): void;
  /** A deadline error as the socket words it (see `RequestSocket`'s timeout errors). */
  timeoutError(conn: Connection, err: KvtierError): unknown;
}

class Pending {
  readonly #owner: PendingOwner;
  readonly requestId: number;
  readonly #type: string;
  readonly #resolve: (r: Reply) => void;
  readonly #reject: (e: unknown) => void;
  /** The encoded request, kept for a resend after a refusal as unauthenticated. */
  readonly frame: Buffer;
  /** The connection it was last sent on. */
  conn: Connection;
  /** Times it was sent again after a refusal as unauthenticated. */
  resends = 0;
  /** The timer (a system timer's handle, or an injected timer's disarm). */
  #timer: ReturnType<typeof setTimeout> | (() => void) | undefined;
  #signal: AbortSignal | undefined;
  #onAbort: (() => void) | undefined;
  settled = false;

  constructor(
    owner: PendingOwner,
    requestId: number,
    type: string,
    frame: Buffer,
    conn: Connection,
    resolve: (r: Reply) => void,
    reject: (e: unknown) => void,
  ) {
    this.#owner = owner;
    this.requestId = requestId;
    this.#type = type;
    this.frame = frame;
    this.conn = conn;
    this.#resolve = resolve;
    this.#reject = reject;
  }

  /** What errors call it: `ping request`. */
  get what(): string {
    return `${this.#type} request`;
  }

  /** Arms the deadline (`ms` as given, for the message) and listens to the caller's signal. */
  watch(ms: number, timers: DeadlineTimers | undefined, signal: AbortSignal | undefined): void {
    const delay = Math.min(Math.ceil(ms), MAX_DEADLINE_MS);
    this.#timer =
      timers === undefined
        ? setTimeout(expire, delay, this, ms)
        : timers.arm(delay, () => expire(this, ms));
    if (signal !== undefined) {
      this.#signal = signal;
      this.#onAbort = () => this.fail(abortedError(signal, this.what));
      signal.addEventListener('abort', this.#onAbort, { once: true });
    }
  }

  succeed(rep: Reply): void {
    if (this.#settle()) this.#resolve(rep);
  }

  fail(err: unknown): void {
    if (this.#settle()) this.#reject(err);
  }

  /** The deadline passed: `KVT_TIMEOUT`, said as the socket knows why. */
  expire(ms: number): void {
    this.#timer = undefined;
    const err = new KvtierError('KVT_TIMEOUT', `${this.what} timed out after ${ms} ms`);
    this.fail(this.#owner.timeoutError(this.conn, err));
  }

  #settle(): boolean {
    if (this.settled) return false;
    this.settled = true;
    const t = this.#timer;
    if (typeof t === 'function') t();
    else if (t !== undefined) clearTimeout(t);
    this.#timer = undefined;
    if (this.#onAbort !== undefined) this.#signal!.removeEventListener('abort', this.#onAbort);
    this.#owner.forget(this);
    return true;
  }
}

function expire(p: Pending, ms: number): void {
  p.expire(ms);
}

/** One DEALER socket, its send queue and its receive loop. */
interface Connection {
  socket: zmq.Dealer;
  sendQueue: SocketSendQueue;
  loop: Promise<void>;
  /** Requests whose reply is expected on this connection. */
  inFlight: number;
  /** Replaced after a refusal as unauthenticated: closed once nothing waits on it. */
  retired: boolean;
  /** With Curve keys: whether a CurveZMQ handshake has completed on this socket. */
  handshaken: boolean;
  /** With Curve keys: whether the server refused this client's key (ZAP). */
  keyRefused: boolean;
  /** Whether a handshake failed because one side uses CurveZMQ and the other does not. */
  mechanismMismatch: boolean;
}

/** What a request that timed out before any CurveZMQ handshake completed says. */
export const NO_HANDSHAKE_MESSAGE =
  'no CurveZMQ handshake — wrong server key, or the sidecar is down';

/** What a request without keys says when it timed out after the server asked for CurveZMQ. */
export const KEYS_REQUIRED_MESSAGE =
  'no handshake — the sidecar requires CurveZMQ keys and this client has none (docs/security.md)';

/** What a request with keys says when it timed out after the server turned CurveZMQ down. */
export const KEYS_UNUSED_MESSAGE =
  'no CurveZMQ handshake — the sidecar does not use CurveZMQ and this client has keys (docs/security.md)';

/**
 * Fresh connections opened in a row (no other reply in between) after refusals as
 * unauthenticated, and times one request is sent again, before the refusal is surfaced.
 */
export const MAX_AUTH_RECONNECTS = 3;

/**
 * The request/response core shared by the protocol clients: one DEALER socket (its sends owned
 * by a {@link SocketSendQueue}), request ids 1..2^32-1 wrapping to 1, replies matched by id,
 * a deadline per request (`KVT_TIMEOUT` as the deadline helper words it, or the caller's abort;
 * one timer per request, on the injected timers when given). It
 * survives server restarts: ZMQ reconnects on its own and requests lost with the old server run
 * into their deadline.
 *
 * With Curve keys, a request refused with `KVT_UNAUTHENTICATED` (its connection carries no
 * identity the server minted, docs/security.md; the server did nothing with it) is sent again
 * on a fresh socket, i.e. a new connection and handshake. The refused socket stays open until
 * the replies to the other requests sent on it are in (each is sent again only if it was
 * refused too). At most {@link MAX_AUTH_RECONNECTS} fresh sockets in a row (any other reply on
 * the current one starts the count again) and as many resends of one request; past that the
 * refusal is surfaced, and the count starts again for the next refusal. Without keys it is
 * surfaced at once.
 */
export class RequestSocket {
  readonly #endpoint: string;
  readonly #curve: ClientCurveKeys | undefined;
  #conn: Connection;
  readonly #conns = new Set<Connection>();
  readonly #pending = new Map<number, Pending>();
  readonly #requestTimeoutMs: number;
  readonly #name: string;
  readonly #onReply: ((rep: Reply) => void) | undefined;
  readonly #log: Logger;
  readonly #timers: DeadlineTimers | undefined;
  #nextId = 1;
  #closed = false;
  #authReconnects = 0;
  #authReconnectsInARow = 0;
  readonly #livenessMs: number;
  /** Frames heard from the server since start (liveness compares snapshots of it). */
  #heard = 0;
  #livenessDisarm: (() => void) | undefined;
  #outages = 0;
  /** What each pending request asks of this socket. */
  readonly #owner: PendingOwner = {
    forget: (p) => {
      if (this.#pending.get(p.requestId) === p) this.#pending.delete(p.requestId);
      this.#release(p.conn);
    },
    timeoutError: (conn, err) => this.#timeoutError(conn, err),
  };

  /**
   * Connects at once (ZMQ connects in the background and reconnects on its own).
   * @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options.
   */
  constructor(opts: RequestSocketOptions) {
    this.#endpoint = checkClientEndpoint(
      'endpoint',
      requireString('endpoint', opts.endpoint, { nonEmpty: true }),
    );
    this.#requestTimeoutMs = requireInt('requestTimeoutMs', opts.requestTimeoutMs ?? 10_000, 1);
    this.#name = opts.name ?? 'client';
    this.#onReply = opts.onReply;
    this.#log = opts.log ?? silentLogger;
    this.#timers = opts.timers;
    curveClientOptions(opts.curve); // validates the keys before anything is opened
    this.#curve = opts.curve;
    this.#livenessMs = requireInt('livenessTimeoutMs', opts.livenessTimeoutMs ?? 0, 0, 2 ** 31 - 1);
    this.#conn = this.#open();
  }

  #open(): Connection {
    const socket = new zmq.Dealer({
      ...curveClientOptions(this.#curve),
      linger: 0,
      reconnectInterval: 100,
      reconnectMaxInterval: 1000,
      sendHighWaterMark: 100_000,
      receiveHighWaterMark: 100_000,
    });
    const conn: Connection = {
      socket,
      sendQueue: new SocketSendQueue(socket, { log: this.#log }),
      loop: Promise.resolve(),
      inFlight: 0,
      retired: false,
      handshaken: false,
      keyRefused: false,
      mechanismMismatch: false,
    };
    // Only a monitor tells a wrong server key, a refused key, or keys on one side only, from a
    // server that is slow or not there.
    socket.events.on('handshake:error:protocol', (e) => {
      if (e.error.code === 'ERR_ZMTP_MECHANISM_MISMATCH') conn.mechanismMismatch = true;
    });
    if (this.#curve !== undefined) {
      socket.events.on('handshake', () => {
        conn.handshaken = true;
      });
      socket.events.on('handshake:error:auth', () => {
        conn.keyRefused = true;
      });
    }
    try {
      socket.connect(this.#endpoint);
    } catch (err) {
      socket.close();
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `cannot connect to ${this.#endpoint}: ${(err as Error).message}`,
        { cause: err },
      );
    }
    conn.loop = this.#receiveLoop(conn);
    this.#conns.add(conn);
    return conn;
  }

  /** Requests waiting for a reply. */
  get pending(): number {
    return this.#pending.size;
  }

  /** True once `close()` was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /** Fresh connections opened because a request was refused as unauthenticated (a counter). */
  get authReconnects(): number {
    return this.#authReconnects;
  }

  /**
   * Whether a handshake on the current connection failed because one side uses CurveZMQ and the
   * other does not (a request that then times out says which).
   */
  get keysMismatched(): boolean {
    return this.#conn.mechanismMismatch;
  }

  /** Times the server was found down by liveness (a counter; see `livenessTimeoutMs`). */
  get outages(): number {
    return this.#outages;
  }

  /**
   * Sends `req` (its `requestId` is assigned here) and resolves with the matching reply.
   * @throws KvtierError the code of an ERROR reply; `KVT_TIMEOUT` past the deadline;
   *   `KVT_ABORTED` (or the signal's reason) when aborted; `KVT_CAPACITY` when the send queue is
   *   full; `KVT_CLOSED` after close; the encoder's errors for values the wire cannot carry.
   */
  request(req: Request, opts: RequestCallOptions = {}): Promise<Reply> {
    try {
      if (this.#closed) throw closedError(this.#name);
      const signal = opts.signal;
      if (signal?.aborted === true) throw abortedError(signal, `${req.type} request`);
      const ms = opts.timeoutMs ?? this.#requestTimeoutMs;
      if (!Number.isFinite(ms) || ms < 0)
        throw new RangeError(`timeoutMs must be a finite number >= 0, got ${ms}`);
      const requestId = this.#nextId;
      this.#nextId = this.#nextId >= 0xffffffff ? 1 : this.#nextId + 1;
      req.requestId = requestId;
      const frame = encodeRequest(req);
      const conn = this.#conn;
      let entry!: Pending;
      const reply = new Promise<Reply>((resolve, reject) => {
        entry = new Pending(this.#owner, requestId, req.type, frame, conn, resolve, reject);
      });
      this.#pending.set(requestId, entry);
      conn.inFlight++;
      entry.watch(ms, this.#timers, signal);
      this.#watch();
      if (!conn.sendQueue.send(frame))
        entry.fail(new KvtierError('KVT_CAPACITY', 'send queue is full'));
      return reply;
    } catch (err) {
      return Promise.reject(err);
    }
  }

  /**
   * A request's deadline error, or, on a connection whose handshake never completed, one that
   * says what the silence means: the server wants CurveZMQ keys this client lacks (or the other
   * way round), the server key is wrong or the server is not there, or it refused this client's
   * key. Still `KVT_TIMEOUT` (the request was never served), so callers that branch on the code
   * are unaffected.
   */
  #timeoutError(conn: Connection, err: unknown): unknown {
    const where = `${this.#endpoint}, ${(err as Error).message}`;
    if (this.#curve === undefined)
      return conn.mechanismMismatch
        ? new KvtierError('KVT_TIMEOUT', `${KEYS_REQUIRED_MESSAGE} (${where})`, { cause: err })
        : err;
    if (conn.handshaken) return err;
    const msg = conn.keyRefused
      ? `CurveZMQ handshake refused: this client's key is not on the sidecar's allow-list (${where})`
      : conn.mechanismMismatch
        ? `${KEYS_UNUSED_MESSAGE} (${where})`
        : `${NO_HANDSHAKE_MESSAGE} (${where})`;
    return new KvtierError('KVT_TIMEOUT', msg, { cause: err });
  }

  async #receiveLoop(conn: Connection): Promise<void> {
    const socket = conn.socket;
    try {
      // receive() directly rather than `for await` over the socket: zeromq's async iterator
      // wraps every message in an async function's promise and a result object. It throws once
      // the socket is closed, which ends the loop.
      for (;;) {
        const frames = await socket.receive();
        const frame = frames[frames.length - 1];
        if (frame === undefined) continue;
        if (conn === this.#conn) this.#heard++;
        let rep: Reply;
        try {
          rep = decodeReply(frame);
        } catch (err) {
          // A reply that does not decode fails its request at once, when its id can be read.
          const p = this.#pending.get(peekRequestId(frame));
          if (p !== undefined && p.conn === conn) p.fail(new MalformedReplyError(err));
          else this.#log.warn('malformed reply dropped', { err });
          continue;
        }
        this.#onReply?.(rep);
        const p = this.#pending.get(rep.requestId);
        if (p === undefined || p.conn !== conn) continue;
        if (rep.type === 'error' && rep.code === 'KVT_UNAUTHENTICATED' && this.#resend(p, conn))
          continue;
        if (conn === this.#conn) this.#authReconnectsInARow = 0;
        if (rep.type === 'error') p.fail(new KvtierError(rep.code, `server: ${rep.message}`));
        else p.succeed(rep);
      }
    } catch (err) {
      if (!socket.closed) this.#log.error('client receive loop failed', { err });
    }
  }

  /**
   * Sends `p`, refused as unauthenticated on `conn`, again on a fresh connection (opened here
   * when `conn` is still the current one). False when it must be surfaced instead.
   */
  #resend(p: Pending, conn: Connection): boolean {
    if (this.#curve === undefined || this.#closed) return false;
    if (
      p.resends >= MAX_AUTH_RECONNECTS ||
      (conn === this.#conn && this.#authReconnectsInARow >= MAX_AUTH_RECONNECTS)
    ) {
      // Surfaced; the next refusal may try fresh connections again (a request never waits
      // on more than MAX_AUTH_RECONNECTS + 1 of them).
      this.#authReconnectsInARow = 0;
      return false;
    }
    if (conn === this.#conn) {
      this.#authReconnectsInARow++;
      this.#authReconnects++;
      this.#log.warn('request refused as unauthenticated; reconnecting', {
        endpoint: this.#endpoint,
        inARow: this.#authReconnectsInARow,
      });
      conn.retired = true;
      this.#conn = this.#open();
    }
    p.resends++;
    p.conn = this.#conn;
    this.#conn.inFlight++;
    this.#release(conn);
    if (!this.#conn.sendQueue.send(p.frame))
      p.fail(new KvtierError('KVT_CAPACITY', 'send queue is full'));
    return true;
  }

  /** Arms the liveness check while requests are in flight (once; it re-arms itself). */
  #watch(): void {
    if (this.#livenessMs === 0 || this.#livenessDisarm !== undefined || this.#closed) return;
    const heard = this.#heard;
    this.#livenessDisarm = (this.#timers ?? systemTimers).arm(this.#livenessMs, () => {
      this.#livenessDisarm = undefined;
      if (this.#closed || this.#pending.size === 0) return;
      if (this.#heard !== heard) {
        this.#watch();
        return;
      }
      this.#probe();
    });
  }

  /** Silent for a whole period with requests in flight: a PING; silence for another is down. */
  #probe(): void {
    const heard = this.#heard;
    const requestId = this.#nextId;
    this.#nextId = this.#nextId >= 0xffffffff ? 1 : this.#nextId + 1;
    this.#conn.sendQueue.send(encodeRequest({ type: 'ping', requestId }));
    this.#livenessDisarm = (this.#timers ?? systemTimers).arm(this.#livenessMs, () => {
      this.#livenessDisarm = undefined;
      if (this.#closed) return;
      if (this.#heard === heard && this.#pending.size > 0) this.#markDown();
      else this.#watch();
    });
  }

  #markDown(): void {
    this.#outages++;
    this.#log.warn('server did not answer a liveness PING; treated as down, connection replaced', {
      endpoint: this.#endpoint,
      livenessTimeoutMs: this.#livenessMs,
    });
    const err = new KvtierError(
      'KVT_TIMEOUT',
      `server ${this.#endpoint} did not answer a PING within ${this.#livenessMs} ms: treated as down`,
    );
    for (const p of [...this.#pending.values()]) p.fail(err);
    // A fresh connection: what the old ones still queue must never reach the server later.
    for (const c of this.#conns) {
      c.retired = true;
      if (!c.socket.closed) c.socket.close();
    }
    this.#conns.clear();
    this.#conn = this.#open();
  }

  /** One request less waits on `conn`; a retired connection is closed when none does. */
  #release(conn: Connection): void {
    conn.inFlight--;
    // After close(), close() itself closes every connection and waits for its loop.
    if (conn.retired && conn.inFlight <= 0 && !this.#closed && !conn.socket.closed) {
      conn.socket.close();
      this.#conns.delete(conn);
    }
  }

  /** Rejects pending requests with `KVT_CLOSED` and closes the socket. Idempotent. */
  close(): Promise<void> {
    if (!this.#closed) {
      this.#closed = true;
      this.#livenessDisarm?.();
      this.#livenessDisarm = undefined;
      for (const p of [...this.#pending.values()]) p.fail(closedError(this.#name));
      for (const c of this.#conns) c.socket.close();
    }
    return Promise.all([...this.#conns].map((c) => c.loop)).then(() => {});
  }
}

/**
 * A reply that did not decode (truncated, trailing bytes, a bad field): {@link RequestSocket}
 * fails the request whose id the frame names with it (`KVT_PROTOCOL`), instead of letting it run
 * into its deadline. The decoder's error is the `cause`.
 */
export class MalformedReplyError extends KvtierError {
  constructor(cause: unknown) {
    super('KVT_PROTOCOL', `malformed reply: ${(cause as Error).message}`, { cause });
    this.name = 'MalformedReplyError';
  }
}

/** The error for a reply of the wrong type (a server bug or a mismatched peer). */
export function unexpectedReply(rep: Reply): KvtierError {
  return new KvtierError('KVT_PROTOCOL', `unexpected reply type ${rep.type}`);
}
