import { closedError, KvtierError } from '../errors.ts';
import { asPackedHashes, type HashesInput } from '../lookup-client/lookup-client.ts';
import type { RequestEndKindName } from '../protocol/data-plane-messages.ts';
import type { Reply, Request } from '../protocol/messages.ts';
import { RequestSocket, unexpectedReply } from '../protocol/request-socket.ts';
import type { ClientCurveKeys } from '../security/curve-client.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import { requireInt, requireOneOf, requireString } from '../util/validate.ts';
import type { KvRegistration } from './kv-layout.ts';

/** Options of {@link DataPlaneClient}. */
export interface DataPlaneClientOptions {
  /** The sidecar's endpoint, e.g. 'tcp://127.0.0.1:5555'. */
  endpoint: string;
  /** Deadline of every request, ms; default 30 000. */
  requestTimeoutMs?: number;
  /**
   * How often a registered client sends HEARTBEAT, ms; 0 turns heartbeats off. Default 5000.
   * The sidecar releases an engine silent for its `heartbeatTimeoutMs` (default 30 000).
   */
  heartbeatIntervalMs?: number;
  /**
   * How long `close()` waits for the reply to the UNREGISTER it sends for a registered engine,
   * ms; 0 sends none (the sidecar then releases the engine after its heartbeat timeout).
   * Default 1000.
   */
  unregisterTimeoutMs?: number;
  log?: Logger /** CurveZMQ keys, for a server with CurveZMQ on (docs/security.md); default none. */;
  curve?: ClientCurveKeys;
  /**
   * Liveness, ms (see `RequestSocketOptions.livenessTimeoutMs`): a sidecar silent for this long
   * with requests in flight is probed, and found down when the probe is not answered within this
   * long again; then every request in flight fails with `KVT_TIMEOUT` and the connection is
   * replaced. 0 turns it off. Default 5000 (a sidecar event loop busy for seconds is not down).
   */
  livenessTimeoutMs?: number;
}

/** What the sidecar answered to a registration. */
export interface RegisteredEngine {
  engineId: string;
  /** Namespace id derived from the registration (32 hex digits): what lookups must name. */
  namespace: string;
  /** Tokens per stored chunk. */
  chunkSize: number;
  /** Tokens per engine block. */
  blockSize: number;
  /** The in-block order the sidecar copies (`NHD` or `HND`); absent from older sidecars. */
  blockLayout?: string;
}

/** Per-call options. */
export interface DataPlaneCallOptions {
  signal?: AbortSignal;
}

const DEFAULTS = {
  requestTimeoutMs: 30_000,
  heartbeatIntervalMs: 5000,
  unregisterTimeoutMs: 1000,
  livenessTimeoutMs: 5000,
};
const U32_MAX = 0xffffffff;
/** The sidecar's LOAD deadline when a load names none, ms (docs/protocol.md 4.9). */
const SERVER_LOAD_DEADLINE_MS = 20_000;
/**
 * How long past a LOAD's not-after time a load that got no reply keeps failing back: a chunk
 * copy the sidecar started just before that time completes within it.
 */
export const LOAD_GRACE_MS = 1000;

/** Not-after time `ms` from now on the host's monotonic clock (docs/protocol.md 4.9). */
function notAfterIn(ms: number): bigint {
  return process.hrtime.bigint() + BigInt(Math.ceil(ms)) * 1_000_000n;
}

/**
 * Rethrows a transfer's error, once the host's monotonic clock has passed `untilNs` when no
 * reply came (the sidecar may still copy until then): callers reuse the blocks only after.
 */
async function failAfter(err: unknown, untilNs: bigint): Promise<never> {
  const noReply =
    err instanceof KvtierError && (err.code === 'KVT_TIMEOUT' || err.code === 'KVT_ABORTED');
  if (noReply) {
    // A timer can fire a little before its delay by this clock (the event loop's cached time
    // lags it): wait again until the clock itself has passed `untilNs`.
    for (;;) {
      const left = Number(untilNs - process.hrtime.bigint()) / 1e6;
      if (left <= 0) break;
      await new Promise((r) => setTimeout(r, Math.ceil(left)));
    }
  }
  throw err;
}

function blockIdArray(name: string, ids: readonly number[]): Uint32Array {
  if (!Array.isArray(ids))
    throw new KvtierError('KVT_INVALID_ARGUMENT', `${name} must be an array`);
  const out = new Uint32Array(ids.length);
  for (let i = 0; i < ids.length; i++) out[i] = requireInt(`${name}[${i}]`, ids[i], 0, U32_MAX);
  return out;
}

/**
 * The engine worker's side of the data plane (docs/protocol.md section 4.9): registers the
 * worker's KV caches with the sidecar once, then saves blocks after a forward pass and loads
 * looked-up chunks into blocks before one. While registered it sends a HEARTBEAT every
 * `heartbeatIntervalMs`, because the sidecar cannot see a DEALER disconnect: an engine that
 * stops heartbeating is released (pins and mappings) by the sidecar's sweep.
 */
export class DataPlaneClient {
  readonly #rs: RequestSocket;
  readonly #requestTimeoutMs: number;
  readonly #heartbeatIntervalMs: number;
  readonly #unregisterTimeoutMs: number;
  readonly #log: Logger;
  #engineId: string | undefined;
  #timer: ReturnType<typeof setInterval> | undefined;
  #beating = false;
  #closing: Promise<void> | undefined;

  /**
   * Connects at once (ZMQ connects in the background and reconnects on its own).
   * @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options.
   */
  constructor(opts: DataPlaneClientOptions) {
    const endpoint = requireString('endpoint', opts.endpoint, { nonEmpty: true });
    const requestTimeoutMs = requireInt(
      'requestTimeoutMs',
      opts.requestTimeoutMs ?? DEFAULTS.requestTimeoutMs,
      1,
    );
    this.#requestTimeoutMs = requestTimeoutMs;
    this.#heartbeatIntervalMs = requireInt(
      'heartbeatIntervalMs',
      opts.heartbeatIntervalMs ?? DEFAULTS.heartbeatIntervalMs,
      0,
      2 ** 31 - 1,
    );
    this.#unregisterTimeoutMs = requireInt(
      'unregisterTimeoutMs',
      opts.unregisterTimeoutMs ?? DEFAULTS.unregisterTimeoutMs,
      0,
      2 ** 31 - 1,
    );
    this.#log = opts.log ?? silentLogger;
    this.#rs = new RequestSocket({
      endpoint,
      ...(opts.curve !== undefined ? { curve: opts.curve } : {}),
      requestTimeoutMs,
      livenessTimeoutMs: opts.livenessTimeoutMs ?? DEFAULTS.livenessTimeoutMs,
      name: 'data plane client',
      log: this.#log,
    });
  }

  /**
   * Fresh connections opened because the sidecar refused a request as unauthenticated (with
   * Curve keys; the refused requests are sent again on them, docs/security.md).
   */
  get authReconnects(): number {
    return this.#rs.authReconnects;
  }

  /** The registered engine id; undefined before `register` resolves and after `unregister` or `close`. */
  get engineId(): string | undefined {
    return this.#engineId;
  }

  /**
   * Registers the worker's KV caches (the sidecar opens and checks every region) and starts the
   * heartbeats. Registering again replaces the registration on the sidecar.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` from the sidecar for a bad registration (its
   *   message names the field); `KVT_TIMEOUT`, `KVT_ABORTED`, `KVT_CLOSED`.
   */
  async register(reg: KvRegistration, opts: DataPlaneCallOptions = {}): Promise<RegisteredEngine> {
    if (typeof reg !== 'object' || reg === null)
      throw new KvtierError('KVT_INVALID_ARGUMENT', 'registration must be an object');
    const rep = await this.#call(
      {
        type: 'register',
        requestId: 0,
        registration: reg as unknown as Record<string, unknown>,
      },
      opts,
    );
    if (rep.type !== 'register-result') throw unexpectedReply(rep);
    if (this.#closing !== undefined) throw closedError('data plane client');
    if (reg.blockLayout === 'HND' && rep.blockLayout !== 'HND') {
      // An older sidecar would store the HND blocks unreordered, where NHD engines read them.
      await this.#call({ type: 'unregister', requestId: 0, engineId: rep.engineId }, opts).catch(
        () => {},
      );
      throw new KvtierError(
        'KVT_CONFIG',
        `the sidecar did not confirm blockLayout HND (it answered ${JSON.stringify(rep.blockLayout ?? null)}): it is older than this client and would store these HND blocks without reordering them; upgrade the sidecar`,
      );
    }
    this.#engineId = rep.engineId;
    this.#startHeartbeats();
    return {
      engineId: rep.engineId,
      namespace: rep.namespace,
      chunkSize: rep.chunkSize,
      blockSize: rep.blockSize,
      ...(rep.blockLayout === undefined ? {} : { blockLayout: rep.blockLayout }),
    };
  }

  /**
   * Gathers the blocks of the chunks into the sidecar's CPU tier (and on to lower tiers in the
   * background). Chunk `i` owns `blockIds[i * blocksPerChunk ...]`; only the last may be short.
   * Resolves when the blocks may be reused; the counts add up to the number of chunks. The SAVE
   * carries its reply deadline as its not-after time: without a reply it fails only once that
   * time has passed, after which the sidecar copies nothing (docs/protocol.md 4.9), so the
   * blocks may be reused whatever the outcome.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` (before `register`, or bad ids/hashes),
   *   `KVT_NOT_FOUND` (the sidecar does not know the engine), `KVT_TOO_LARGE`, `KVT_TIMEOUT`,
   *   `KVT_CLOSED`.
   */
  async save(
    a: {
      requestId: string;
      blockIds: readonly number[];
      chunkHashes: HashesInput;
      skipChunks?: number;
      /**
       * A CUDA interprocess event (64-byte handle) recorded after the blocks were written: the
       * sidecar's copies wait for it on the GPU instead of the engine synchronizing first.
       */
      cudaEvent?: Uint8Array;
    },
    opts: DataPlaneCallOptions = {},
  ): Promise<{ saved: number; skipped: number; dropped: number }> {
    const notAfterNs = notAfterIn(this.#requestTimeoutMs);
    const rep = await this.#call(
      {
        type: 'save',
        requestId: 0,
        engineId: this.#registered(),
        engineRequestId: a.requestId,
        skipChunks: requireInt('skipChunks', a.skipChunks ?? 0, 0, U32_MAX),
        blockIds: blockIdArray('blockIds', a.blockIds),
        chunkHashes: asPackedHashes(a.chunkHashes),
        notAfterNs,
        ...(a.cudaEvent !== undefined ? { cudaEvent: a.cudaEvent } : {}),
      },
      opts,
    ).catch((err: unknown) => failAfter(err, notAfterNs));
    if (rep.type !== 'save-result') throw unexpectedReply(rep);
    return { saved: rep.saved, skipped: rep.skipped, dropped: rep.dropped };
  }

  /**
   * Scatters the chunks pinned by lookup `lookupId` into the blocks. A chunk that could not be
   * loaded (evicted, not pinned, past the deadline) and every chunk after it come back as
   * `invalidBlockIds`; they hold no valid KV and must be recomputed.
   * The LOAD's not-after time is its deadline (the sidecar's default, or the reply deadline when
   * shorter): no chunk starts past it; without a reply the load fails only
   * {@link LOAD_GRACE_MS} after it, so nothing is written into the blocks afterwards.
   * @param a.deadlineMs relative to the sidecar's receipt, ms; default (or 0) the sidecar's.
   * @param a.stateSlot slot of the registered state file the sidecar sets on completion.
   * @param a.skipBlocks leading blocks of the first chunk the engine already holds (its prefix
   *   cache ended inside that chunk): they are not written and `blockIds` leaves them out, so it
   *   holds `chunks * blocksPerChunk - skipBlocks` ids (the last chunk may be short). Must be
   *   below `blocksPerChunk`; default 0 (then the field is not sent at all). `loadedTokens` counts
   *   only the blocks written.
   * @param a.progressSlot a layer-wise load (only to a sidecar whose PONG lists `layerwiseLoad`):
   *   the sidecar copies layer by layer and keeps the count of layers in place in this slot of
   *   the state file (docs/protocol.md 4.9).
   * @throws KvtierError as {@link save}.
   */
  async load(
    a: {
      requestId: string;
      lookupId: string;
      blockIds: readonly number[];
      chunkHashes: HashesInput;
      deadlineMs?: number;
      stateSlot?: number;
      skipBlocks?: number;
      progressSlot?: number;
    },
    opts: DataPlaneCallOptions = {},
  ): Promise<{ loadedTokens: number; invalidBlockIds: number[] }> {
    const skipBlocks = requireInt('skipBlocks', a.skipBlocks ?? 0, 0, U32_MAX);
    const deadlineMs = requireInt('deadlineMs', a.deadlineMs ?? 0, 0, U32_MAX);
    const notAfterNs = notAfterIn(
      Math.min(deadlineMs || SERVER_LOAD_DEADLINE_MS, this.#requestTimeoutMs),
    );
    const rep = await this.#call(
      {
        type: 'load',
        requestId: 0,
        engineId: this.#registered(),
        engineRequestId: a.requestId,
        lookupId: a.lookupId,
        deadlineMs,
        stateSlot: requireInt('stateSlot', a.stateSlot ?? -1, -1, 2 ** 31 - 1),
        blockIds: blockIdArray('blockIds', a.blockIds),
        chunkHashes: asPackedHashes(a.chunkHashes),
        skipBlocks,
        notAfterNs,
        ...(a.progressSlot !== undefined
          ? { progressSlot: requireInt('progressSlot', a.progressSlot, 0, U32_MAX) }
          : {}),
      },
      opts,
    ).catch((err: unknown) => failAfter(err, notAfterNs + BigInt(LOAD_GRACE_MS) * 1_000_000n));
    if (rep.type !== 'load-result') throw unexpectedReply(rep);
    return { loadedTokens: rep.loadedTokens, invalidBlockIds: Array.from(rep.invalidBlockIds) };
  }

  /**
   * Moves lookup `lookupId`'s pins to engine request `requestId`, where preemption keeps them
   * until the load or the request's terminal end. Resolves the chunks held (0 when the lookup
   * was unknown, still running or expired).
   * @throws KvtierError as {@link save}.
   */
  async hold(
    requestId: string,
    lookupId: string,
    opts: DataPlaneCallOptions = {},
  ): Promise<number> {
    const rep = await this.#call(
      {
        type: 'hold',
        requestId: 0,
        engineId: this.#registered(),
        engineRequestId: requestId,
        lookupId,
      },
      opts,
    );
    if (rep.type !== 'hold-result') throw unexpectedReply(rep);
    return rep.heldChunks;
  }

  /**
   * Reports how an engine request ended. `finished` and `aborted` release its pins and state and
   * resolve true (false when the sidecar no longer knows the engine); `preempted` keeps
   * everything (the request will ask again) and resolves false.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` (before `register`, bad kind), `KVT_TIMEOUT`,
   *   `KVT_CLOSED`.
   */
  async requestFinished(
    requestId: string,
    kind: RequestEndKindName,
    opts: DataPlaneCallOptions = {},
  ): Promise<boolean> {
    const rep = await this.#call(
      {
        type: 'request-finished',
        requestId: 0,
        engineId: this.#registered(),
        engineRequestId: requestId,
        kind: requireOneOf('kind', kind, ['finished', 'aborted', 'preempted'] as const),
      },
      opts,
    );
    if (rep.type !== 'request-finished-result') throw unexpectedReply(rep);
    return rep.released;
  }

  /**
   * Sends one HEARTBEAT now (the timer does this on its own); resolves whether the sidecar knows
   * the engine. False means it restarted or released the engine: register again.
   * @throws KvtierError as {@link requestFinished}.
   */
  async heartbeat(opts: DataPlaneCallOptions = {}): Promise<boolean> {
    const rep = await this.#call(
      { type: 'heartbeat', requestId: 0, engineId: this.#registered() },
      opts,
    );
    if (rep.type !== 'heartbeat-result') throw unexpectedReply(rep);
    return rep.known;
  }

  /**
   * Tells the sidecar the worker is going away (UNREGISTER): it releases the engine's pins,
   * request state and KV mappings at once instead of after its heartbeat timeout, and stops the
   * engine's running loads before their next chunk. Stops the heartbeats and forgets the
   * engine id here first, so the client must `register` again to be used. Resolves whether the
   * sidecar had the engine; false without sending anything when no engine is registered.
   * @throws KvtierError `KVT_TIMEOUT`, `KVT_ABORTED`, `KVT_CLOSED`.
   */
  async unregister(opts: DataPlaneCallOptions = {}): Promise<boolean> {
    if (this.#closing !== undefined) throw closedError('data plane client');
    const engineId = this.#forgetEngine();
    if (engineId === undefined) return false;
    const rep = await this.#call({ type: 'unregister', requestId: 0, engineId }, opts);
    if (rep.type !== 'unregister-result') throw unexpectedReply(rep);
    return rep.released;
  }

  /**
   * Stops the heartbeats; when an engine is registered, sends UNREGISTER and waits for its reply
   * at most `unregisterTimeoutMs` (best effort: a failure is logged, never thrown, and close never
   * waits longer); then rejects pending requests with `KVT_CLOSED` and closes the socket.
   * Idempotent.
   */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      const engineId = this.#forgetEngine();
      if (engineId !== undefined && this.#unregisterTimeoutMs > 0) {
        try {
          await this.#rs.request(
            { type: 'unregister', requestId: 0, engineId },
            { timeoutMs: this.#unregisterTimeoutMs },
          );
        } catch (err) {
          this.#log.debug('unregister on close failed; the sidecar releases the engine later', {
            engineId,
            err,
          });
        }
      }
      await this.#rs.close();
    })();
    return this.#closing;
  }

  #forgetEngine(): string | undefined {
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
    const id = this.#engineId;
    this.#engineId = undefined;
    return id;
  }

  #registered(): string {
    if (this.#closing !== undefined) throw closedError('data plane client');
    if (this.#engineId === undefined)
      throw new KvtierError('KVT_INVALID_ARGUMENT', 'register() the KV caches first');
    return this.#engineId;
  }

  #call(req: Request, opts: DataPlaneCallOptions): Promise<Reply> {
    if (this.#closing !== undefined) return Promise.reject(closedError('data plane client'));
    return this.#rs.request(req, { signal: opts.signal });
  }

  #startHeartbeats(): void {
    if (this.#heartbeatIntervalMs === 0 || this.#timer !== undefined) return;
    this.#timer = setInterval(() => {
      // One heartbeat at a time: a slow sidecar must not pile them up.
      if (this.#beating) return;
      this.#beating = true;
      this.heartbeat()
        .then(
          (known) => {
            if (!known)
              this.#log.warn('the sidecar does not know this engine; register again', {
                engineId: this.#engineId,
              });
          },
          (err: unknown) => this.#log.debug('heartbeat failed', { err }),
        )
        .finally(() => {
          this.#beating = false;
        });
    }, this.#heartbeatIntervalMs);
    this.#timer.unref();
  }
}
