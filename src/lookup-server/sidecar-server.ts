/**
 * The lookup server (the design card's `src/lookup-server`): the storage manager's caller over
 * ZMQ. It decodes and authorizes each request, answers LOOKUP itself and hands every other
 * message to its handler (handlers/: the storage manager's messages, the data plane's); it owns
 * its socket, send queue and auth, not the storage manager or the data plane (the sidecar builds
 * and closes both).
 */
import { randomUUID } from 'node:crypto';
import * as zmq from 'zeromq';
import type { DataPlane } from '../data-plane/data-plane.ts';
import { closedError, KvtierError } from '../errors.ts';
import { type Tally, tallyOf } from '../metrics/counter-tally.ts';
import type { KvtierMetrics } from '../metrics/metrics.ts';
import { decodeRequest, encodeReply, peekRequestId } from '../protocol/codec.ts';
import { DATA_PLANE_LIMITS } from '../protocol/data-plane-messages.ts';
import {
  type LookupRequest,
  PROTOCOL_VERSION,
  type ProtocolLimits,
  type Reply,
  type Request,
} from '../protocol/messages.ts';
import { SocketSendQueue } from '../protocol/send-queue.ts';
import { ratesOnWire } from '../storage-manager/claim-rule.ts';
import { LookupAwaiter } from '../storage-manager/lookup-await.ts';
import type { StorageManager } from '../storage-manager/storage-manager.ts';
import type { LookupInput, LookupOutcome } from '../storage-manager/storage-types.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import { requireInt, requireString } from '../util/validate.ts';
import { AuditLog } from './audit.ts';
import type { ServerAuth } from './auth.ts';
import { MAX_TIMER_MS } from './handlers/data-plane-handlers.ts';
import { type HandlerContext, handlerOf, releaseReply } from './handlers/handler-table.ts';
import { waitForPortFree } from './port-free.ts';
import { resolveLimits } from './protocol-limits.ts';

export interface SidecarServerOptions {
  /** ZMQ endpoint to bind; default 'tcp://127.0.0.1:5555'. `tcp://127.0.0.1:*` picks a free port. */
  endpoint?: string;
  storage: StorageManager;
  /** Limits enforced on requests; defaults in DEFAULT_LIMITS. */
  limits?: Partial<ProtocolLimits>;
  metrics?: KvtierMetrics;
  log?: Logger;
  /** Extra fields for the PING reply (version, config summary...). */
  info?: () => Record<string, unknown>;
  /**
   * Serves the data-plane messages (REGISTER, SAVE, LOAD, HOLD, REQUEST_FINISHED, HEARTBEAT,
   * UNREGISTER) when given; without it they are refused with `KVT_INVALID_ARGUMENT`. Not owned: the server
   * neither starts nor closes it.
   */
  dataPlane?: DataPlane;
  /** Deadline of a LOAD that asks for the default (deadlineMs 0), ms; default 20 000. */
  loadDeadlineMs?: number;
  /**
   * CurveZMQ keys, allow-list and roles (docs/security.md); without it the socket is open to
   * anyone who can reach it. Owned: started by `start` and closed by `close`.
   */
  auth?: ServerAuth;
  /** Reply bytes the send queue holds at once; later replies are dropped. Default 512 MiB. */
  maxSendQueueBytes?: number;
}

/** Largest data-plane frame the limits allow (3 MiB of ids and hashes), with room to spare. */
const DATA_PLANE_FRAME_BYTES = 4 * 1024 * 1024;

/**
 * The sidecar's server: one ROUTER socket speaking protocol v1 (docs/protocol.md) for lookups,
 * CANCEL, PUT/GET/CLEAR/STATS/PING and, with a data plane, its messages (REGISTER, SAVE, LOAD...).
 * Many requests are in flight at once, matched by request id. Malformed input gets an error
 * reply with a code and the server keeps serving. Sends go through one queue (one owner).
 */
export class SidecarServer {
  readonly #storage: StorageManager;
  readonly #limits: ProtocolLimits;
  readonly #metrics: KvtierMetrics | undefined;
  readonly #log: Logger;
  readonly #info: () => Record<string, unknown>;
  readonly #requestedEndpoint: string;
  readonly #dataPlane: DataPlane | undefined;
  readonly #loadDeadlineMs: number;
  readonly #auth: ServerAuth | undefined;
  readonly #maxSendQueueBytes: number | undefined;
  #router: zmq.Router | undefined;
  #sendQueue: SocketSendQueue | undefined;
  #endpoint = '';
  #loop: Promise<void> | undefined;
  #closing: Promise<void> | undefined;
  readonly #startedAt = Date.now();
  /** Names this server process: a worker that sees it change knows the old one is gone. */
  readonly #instanceId = randomUUID();
  /** `kvtier_requests_total` by request type, tallied (counter-tally.ts). */
  readonly #requestTallies = new Map<string, Tally>();
  /** Requests decoded and not yet answered (STATS `server.inflight`). */
  #inflight = 0;
  readonly #audit: AuditLog;
  /** What the handlers (handlers/) use of this server. */
  readonly #context: HandlerContext;
  readonly #awaits: LookupAwaiter;

  constructor(opts: SidecarServerOptions) {
    this.#requestedEndpoint = requireString('endpoint', opts.endpoint ?? 'tcp://127.0.0.1:5555', {
      nonEmpty: true,
    });
    this.#storage = opts.storage;
    this.#limits = resolveLimits(opts.limits);
    this.#metrics = opts.metrics;
    this.#log = opts.log ?? silentLogger;
    this.#info = opts.info ?? (() => ({}));
    this.#dataPlane = opts.dataPlane;
    this.#auth = opts.auth;
    this.#audit = new AuditLog(this.#log.child('audit'), opts.auth);
    this.#maxSendQueueBytes = opts.maxSendQueueBytes;
    this.#loadDeadlineMs = requireInt(
      'loadDeadlineMs',
      opts.loadDeadlineMs ?? 20_000,
      1,
      MAX_TIMER_MS,
    );
    const awaited = this.#metrics?.lookupAwaits;
    this.#awaits = new LookupAwaiter(this.#storage, {
      onOutcome: awaited === undefined ? undefined : (outcome) => awaited.inc({ outcome }),
    });
    this.#context = {
      storage: this.#storage,
      lookupAwaits: this.#awaits,
      dataPlane: this.#dataPlane,
      loadDeadlineMs: this.#loadDeadlineMs,
      audit: this.#audit,
      pingInfo: () => this.#pingInfo(),
      serverStats: () => ({
        inflight: this.#inflight - 1, // not counting the STATS request itself
        sendQueueDepth: this.#sendQueue?.depth ?? 0,
        sendQueueBytes: this.#sendQueue?.bytes ?? 0,
        sendDropped: this.#sendQueue?.dropped ?? 0,
      }),
    };
  }

  /** The bound endpoint (with the real port when `*` was asked for); empty before start. */
  get endpoint(): string {
    return this.#endpoint;
  }

  get limits(): Readonly<ProtocolLimits> {
    return this.#limits;
  }

  /** Binds the socket and starts serving. Throws KVT_CONFIG when the endpoint cannot be bound. */
  async start(): Promise<void> {
    if (this.#closing !== undefined) throw closedError('lookup server');
    if (this.#router !== undefined) return;
    await this.#auth?.start();
    const router = new zmq.Router({
      ...this.#auth?.routerOptions(),
      linger: 0,
      maxMessageSize: Math.max(
        2 * this.#limits.maxPayloadBytes + 1024 * 1024,
        DATA_PLANE_FRAME_BYTES,
      ),
      sendHighWaterMark: 100_000,
      receiveHighWaterMark: 100_000,
      // A ROUTER send never blocks (a full or unknown peer's message is dropped): 0 skips
      // zeromq's writability query (a syscall) before every reply.
      sendTimeout: 0,
    });
    try {
      await router.bind(this.#requestedEndpoint);
    } catch (err) {
      router.close();
      await this.#auth?.close();
      throw new KvtierError(
        'KVT_CONFIG',
        `cannot bind lookup server to ${this.#requestedEndpoint}: ${(err as Error).message}`,
        { cause: err },
      );
    }
    this.#router = router;
    this.#auth?.watchHandshakes(router);
    this.#endpoint = router.lastEndpoint ?? this.#requestedEndpoint;
    this.#sendQueue = new SocketSendQueue(router, {
      log: this.#log,
      // sendTimeout 0: each send completes within its call, so replies go out as they are made.
      immediate: true,
      ...(this.#maxSendQueueBytes !== undefined ? { maxBytes: this.#maxSendQueueBytes } : {}),
    });
    this.#loop = this.#receiveLoop(router);
    this.#log.info('lookup server listening', { endpoint: this.#endpoint });
  }

  async #receiveLoop(router: zmq.Router): Promise<void> {
    try {
      for await (const frames of router) this.#onMessage(frames);
    } catch (err) {
      if (!router.closed) this.#log.error('receive loop failed', { err });
    }
  }

  #onMessage(frames: Buffer[]): void {
    // DEALER peers send [identity, msg]; REQ peers add an empty delimiter: [identity, '', msg].
    let envelope: Buffer[];
    let msg: Buffer | undefined;
    if (frames.length === 2) {
      envelope = [frames[0]!];
      msg = frames[1];
    } else if (frames.length === 3 && frames[1]!.length === 0) {
      envelope = [frames[0]!, frames[1]!];
      msg = frames[2];
    } else {
      envelope = frames.length > 0 ? [frames[0]!] : [];
      this.#replyError(
        envelope,
        frames.length > 1 ? peekRequestId(frames[frames.length - 1]!) : 0,
        new KvtierError('KVT_PROTOCOL', `expected one frame per message, got ${frames.length - 1}`),
      );
      return;
    }
    let req: Request;
    try {
      req = decodeRequest(msg!, this.#limits);
    } catch (err) {
      this.#replyError(envelope, peekRequestId(msg!), err);
      return;
    }
    try {
      this.#auth?.authorize(
        envelope[0]!,
        req,
        (id) => this.#dataPlane?.namespaceOf(id),
        (id) => this.#storage.lookupNamespaces(id),
      );
    } catch (err) {
      this.#audit.refused(envelope[0], req, err);
      this.#replyError(envelope, req.requestId, err);
      return;
    }
    if (this.#metrics !== undefined) this.#requestTally(req.type).n++;
    if (req.type === 'lookup') {
      // Answered before this returns when host memory alone answers it (no promise, no turn of
      // the event loop); else the walk below host memory runs as any request.
      const { awaitChunks, awaitMs } = req.config;
      const answer =
        awaitChunks !== undefined && awaitMs !== undefined
          ? this.#awaits.lookup(lookupInput(req), awaitChunks, awaitMs)
          : this.#storage.lookup(lookupInput(req));
      if (!(answer instanceof Promise)) {
        this.#replyLookup(envelope, req, answer);
        return;
      }
      this.#inflight++;
      void this.#handle(envelope, req, answer);
      return;
    }
    this.#inflight++;
    void this.#handle(envelope, req);
  }

  #requestTally(type: string): Tally {
    let t = this.#requestTallies.get(type);
    if (t === undefined) {
      t = tallyOf(this.#metrics!.requests).child({ type });
      this.#requestTallies.set(type, t);
    }
    return t;
  }

  /**
   * Runs one request to its reply (an error reply when it fails); never rejects. A LOOKUP comes
   * with its answer under way (CANCEL and close reach it through the storage manager).
   */
  async #handle(envelope: Buffer[], req: Request, lookup?: Promise<LookupOutcome>): Promise<void> {
    const t0 = performance.now();
    try {
      if (req.type === 'lookup')
        this.#replyLookup(envelope, req, await (lookup ?? this.#storage.lookup(lookupInput(req))));
      else {
        const rep = await handlerOf(req)(this.#context, req, envelope[0]);
        try {
          this.#reply(envelope, rep);
        } finally {
          // A reply built from pinned chunks holds them until its frame is encoded.
          releaseReply(rep);
        }
      }
    } catch (err) {
      this.#replyError(envelope, req.requestId, err);
    } finally {
      this.#inflight--;
      this.#log.debug('request', { type: req.type, ms: performance.now() - t0 });
    }
  }

  #replyLookup(envelope: Buffer[], req: LookupRequest, outcome: LookupOutcome): void {
    this.#reply(envelope, {
      type: 'lookup-result',
      requestId: req.requestId,
      lookupId: req.lookupId,
      status: outcome.status,
      epoch: outcome.epoch,
      hitTokens: outcome.hitTokens,
      hitChunks: outcome.hitChunks,
      tiers: outcome.tiers,
      ...(outcome.rates === undefined ? {} : ratesOnWire(outcome.rates)),
    });
  }

  #pingInfo(): Record<string, unknown> {
    return {
      protocolVersion: PROTOCOL_VERSION,
      epoch: this.#storage.epoch,
      uptimeMs: Date.now() - this.#startedAt,
      instanceId: this.#instanceId,
      limits: this.#limits,
      dataPlane: this.#dataPlane === undefined ? null : DATA_PLANE_LIMITS,
      // What a client may use beyond protocol v1's first release: SAVE's fence fields, LOAD's
      // progress slot, the peer messages.
      features: this.#dataPlane === undefined ? ['peer'] : ['saveFence', 'layerwiseLoad', 'peer'],
      tiers: this.#storage.tiers.map((t) => ({ name: t.name, kind: t.kind, health: t.health() })),
      ...this.#info(),
    };
  }

  #reply(envelope: Buffer[], rep: Reply): void {
    const msg = encodeReply(rep);
    // DEALER peers (one envelope frame) are the common case: no spread.
    this.#sendQueue?.send(envelope.length === 1 ? [envelope[0]!, msg] : [...envelope, msg]);
  }

  #replyError(envelope: Buffer[], requestId: number, err: unknown): void {
    const e =
      err instanceof KvtierError
        ? err
        : new KvtierError('KVT_INTERNAL', 'internal error', { cause: err });
    if (e.code === 'KVT_INTERNAL') this.#log.error('request failed', { err });
    else this.#log.debug('request refused', { err: e });
    this.#metrics?.protocolErrors.inc({ code: e.code });
    if (envelope.length > 0)
      this.#reply(envelope, { type: 'error', requestId, code: e.code, message: e.message });
  }

  /** Stops receiving and closes the socket. Idempotent. The storage (and its lookups) is not closed. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      const router = this.#router;
      router?.close();
      this.#awaits.close();
      await this.#loop;
      await this.#auth?.close();
      // ZMQ closes the listener on its I/O thread; resolve once the port is free so a restart
      // on it does not race (unbinding first can trip a libzmq assertion on a reconnect).
      if (this.#endpoint.startsWith('tcp://')) await waitForPortFree(this.#endpoint);
    })();
    return this.#closing;
  }
}

/** What the storage manager is asked for a LOOKUP request. */
function lookupInput(req: LookupRequest): LookupInput {
  const input: LookupInput = {
    lookupId: req.lookupId,
    namespaces: req.namespaces,
    // Packed, as received: no string per chunk (the message buffer is not reused).
    hashes: req.hashes,
    tokenCounts: req.tokenCounts,
  };
  if (req.config.pin !== undefined) input.pin = req.config.pin;
  if (req.config.prefetch !== undefined) input.prefetch = req.config.prefetch;
  const rate = req.config.computeTokensPerSec;
  if (rate !== undefined) input.computeTokensPerSec = rate;
  return input;
}
