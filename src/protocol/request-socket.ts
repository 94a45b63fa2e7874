import * as zmq from 'zeromq';
import { closedError, KvtierError } from '../errors.ts';
import { Deadline, type DeadlineTimers } from '../util/deadline.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import { requireInt, requireString } from '../util/validate.ts';
import { decodeReply, encodeRequest } from './codec.ts';
import { type ClientCurveKeys, curveClientOptions } from './curve-client.ts';
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
}

/** Per-call options of {@link RequestSocket.request}. */
export interface RequestCallOptions {
  signal?: AbortSignal | undefined;
  /** Overrides the socket's `requestTimeoutMs` for this call. */
  timeoutMs?: number | undefined;
}

interface Pending {
  resolve: (r: Reply) => void;
  reject: (e: unknown) => void;
}

/**
 * The request/response core shared by the protocol clients: one DEALER socket (its sends owned
 * by a {@link SocketSendQueue}), request ids 1..2^32-1 wrapping to 1, replies matched by id,
 * a deadline per request (the deadline helper: `KVT_TIMEOUT`, or the caller's abort). It survives server restarts: ZMQ reconnects on its own and requests
 * lost with the old server run into their deadline.
 */
export class RequestSocket {
  readonly #socket: zmq.Dealer;
  readonly #sendQueue: SocketSendQueue;
  readonly #pending = new Map<number, Pending>();
  readonly #requestTimeoutMs: number;
  readonly #name: string;
  readonly #onReply: ((rep: Reply) => void) | undefined;
  readonly #log: Logger;
  readonly #timers: DeadlineTimers | undefined;
  readonly #loop: Promise<void>;
  #nextId = 1;
  #closed = false;

  /**
   * Connects at once (ZMQ connects in the background and reconnects on its own).
   * @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options.
   */
  constructor(opts: RequestSocketOptions) {
    const endpoint = requireString('endpoint', opts.endpoint, { nonEmpty: true });
    this.#requestTimeoutMs = requireInt('requestTimeoutMs', opts.requestTimeoutMs ?? 10_000, 1);
    this.#name = opts.name ?? 'client';
    this.#onReply = opts.onReply;
    this.#log = opts.log ?? silentLogger;
    this.#timers = opts.timers;
    this.#socket = new zmq.Dealer({
      ...curveClientOptions(opts.curve),
      linger: 0,
      reconnectInterval: 100,
      reconnectMaxInterval: 1000,
      sendHighWaterMark: 100_000,
      receiveHighWaterMark: 100_000,
    });
    this.#socket.connect(endpoint);
    this.#sendQueue = new SocketSendQueue(this.#socket, { log: this.#log });
    this.#loop = this.#receiveLoop();
  }

  /** Requests waiting for a reply. */
  get pending(): number {
    return this.#pending.size;
  }

  /** True once `close()` was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /**
   * Sends `req` (its `requestId` is assigned here) and resolves with the matching reply.
   * @throws KvtierError the code of an ERROR reply; `KVT_TIMEOUT` past the deadline;
   *   `KVT_ABORTED` (or the signal's reason) when aborted; `KVT_CAPACITY` when the send queue is
   *   full; `KVT_CLOSED` after close; the encoder's errors for values the wire cannot carry.
   */
  async request(req: Request, opts: RequestCallOptions = {}): Promise<Reply> {
    if (this.#closed) throw closedError(this.#name);
    const what = `${req.type} request`;
    const d = new Deadline({
      what,
      timeoutMs: opts.timeoutMs ?? this.#requestTimeoutMs,
      signal: opts.signal,
      timers: this.#timers,
    });
    try {
      d.throwIfEnded();
      const requestId = this.#nextId;
      this.#nextId = this.#nextId >= 0xffffffff ? 1 : this.#nextId + 1;
      req.requestId = requestId;
      const frame = encodeRequest(req);
      const reply = new Promise<Reply>((resolve, reject) => {
        this.#pending.set(requestId, { resolve, reject });
      });
      try {
        if (!this.#sendQueue.send(frame))
          throw new KvtierError('KVT_CAPACITY', 'send queue is full');
        return await d.race(reply);
      } finally {
        this.#pending.delete(requestId);
      }
    } finally {
      d.dispose();
    }
  }

  async #receiveLoop(): Promise<void> {
    try {
      for await (const frames of this.#socket) {
        const frame = frames[frames.length - 1];
        if (frame === undefined) continue;
        let rep: Reply;
        try {
          rep = decodeReply(frame);
        } catch (err) {
          this.#log.warn('malformed reply dropped', { err });
          continue;
        }
        this.#onReply?.(rep);
        const p = this.#pending.get(rep.requestId);
        if (p === undefined) continue;
        if (rep.type === 'error') p.reject(new KvtierError(rep.code, `server: ${rep.message}`));
        else p.resolve(rep);
      }
    } catch (err) {
      if (!this.#socket.closed) this.#log.error('client receive loop failed', { err });
    }
  }

  /** Rejects pending requests with `KVT_CLOSED` and closes the socket. Idempotent. */
  close(): Promise<void> {
    if (!this.#closed) {
      this.#closed = true;
      for (const p of [...this.#pending.values()]) p.reject(closedError(this.#name));
      this.#socket.close();
    }
    return this.#loop;
  }
}

/** The error for a reply of the wrong type (a server bug or a mismatched peer). */
export function unexpectedReply(rep: Reply): KvtierError {
  return new KvtierError('KVT_PROTOCOL', `unexpected reply type ${rep.type}`);
}
