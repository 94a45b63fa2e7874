import { KvtierError } from '../errors.ts';
import { chunkHash } from '../hashing/chunk-hash.ts';
import {
  HASH_BYTES,
  type LookupConfig,
  type Reply,
  type Request,
  type TierTokens,
} from '../protocol/messages.ts';
import { RequestSocket, unexpectedReply as unexpected } from '../protocol/request-socket.ts';
import type { ClientCurveKeys } from '../security/curve-client.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import { requireInt, requireString } from '../util/validate.ts';

export interface LookupClientOptions {
  /** Server endpoint, e.g. 'tcp://127.0.0.1:5555'. */
  endpoint: string;
  /** Namespaces used when a call names none (one per rank the server hosts). */
  namespaces?: readonly string[];
  /** Deadline of a lookup, ms; past it the answer is 0 (recompute) and the server work is cancelled. Default 2000. */
  lookupTimeoutMs?: number;
  /** Deadline of every other request, ms; default 10 000. */
  requestTimeoutMs?: number;
  /** Clock (ms) the non-blocking `lookup()` checks deadlines against; default Date.now. */
  now?: () => number;
  log?: Logger /** CurveZMQ keys, for a server with CurveZMQ on (docs/security.md); default none. */;
  curve?: ClientCurveKeys;
  /**
   * Liveness, ms (see `RequestSocketOptions.livenessTimeoutMs`): a server silent this long with
   * requests in flight is probed and, unanswered this long again, found down: what is in flight
   * fails at once (lookups answer 0) and the connection is replaced. 0 turns it off. Default 5000
   * (a sidecar event loop busy for seconds is not down).
   */
  livenessTimeoutMs?: number;
}

/** Packed hashes (32 bytes each) or one 32-byte array per chunk. */
export type HashesInput = Uint8Array | readonly Uint8Array[];

export interface LookupCallOptions {
  namespaces?: readonly string[];
  /**
   * Per-lookup options (docs/protocol.md 4.1): `pin`, `prefetch`, and `computeTokensPerSec`,
   * the engine's prefill rate (tokens/s): with it the server claims a tier's hits only where
   * fetching them beats computing them, and the answer carries `tierRates`.
   */
  config?: LookupConfig;
  /**
   * A shorter deadline for this non-blocking lookup, ms from the first call (an integer >= 1):
   * the smaller of it and the client's `lookupTimeoutMs` applies.
   */
  timeoutMs?: number;
}

/** One tier as a lookup that named the engine's prefill rate reports it. */
export interface LookupTierRate {
  tier: string;
  /** `load`: its hits were claimed; `decline`: fetching them could not beat computing them. */
  decision: 'none' | 'load' | 'decline';
  /** Read bandwidth the server measures, bytes/s; 0 while not measured. */
  readBytesPerSec: number;
  /** Per-request latency the server measures, ms. */
  latencyMs: number;
  /** Tokens the tier held that the server declined (0 when it did not ask the tier). */
  declinedTokens: number;
}

/** A lookup answer as the server gave it. */
export interface LookupAnswer {
  status: 'ok' | 'canceled' | 'stale' | 'timeout';
  hitTokens: number;
  hitChunks: number;
  epoch: number;
  tiers: TierTokens[];
  /** With `computeTokensPerSec` (from a server that knows it): KV bytes per token, 0 unknown. */
  bytesPerToken?: number;
  /** With `computeTokensPerSec`: every tier of the server, in order. */
  tierRates?: LookupTierRate[];
}

interface PendingLookup {
  deadline: number;
  answer: LookupAnswer | undefined;
}

const DEFAULTS = { lookupTimeoutMs: 2000, requestTimeoutMs: 10_000, livenessTimeoutMs: 5000 };

/**
 * Scheduler-side client of one lookup server. `lookup()` never blocks or sleeps: it returns
 * `null` while the answer is pending ("ask again next step") and the number once it is known,
 * or 0 once the deadline has passed. It survives server restarts: the DEALER socket reconnects,
 * and requests lost with the old server run into their deadline.
 */
export class LookupClient {
  readonly #rs: RequestSocket;
  readonly #lookups = new Map<string, PendingLookup>();
  readonly #namespaces: readonly string[];
  readonly #lookupTimeoutMs: number;
  readonly #requestTimeoutMs: number;
  readonly #now: () => number;
  #maxEpoch = 0;

  /** Connects at once (ZMQ connects in the background and reconnects on its own). */
  constructor(opts: LookupClientOptions) {
    const endpoint = requireString('endpoint', opts.endpoint, { nonEmpty: true });
    this.#namespaces = [...(opts.namespaces ?? [])];
    this.#lookupTimeoutMs = requireInt(
      'lookupTimeoutMs',
      opts.lookupTimeoutMs ?? DEFAULTS.lookupTimeoutMs,
      1,
    );
    this.#requestTimeoutMs = requireInt(
      'requestTimeoutMs',
      opts.requestTimeoutMs ?? DEFAULTS.requestTimeoutMs,
      1,
    );
    this.#now = opts.now ?? Date.now;
    this.#rs = new RequestSocket({
      endpoint,
      ...(opts.curve !== undefined ? { curve: opts.curve } : {}),
      requestTimeoutMs: this.#requestTimeoutMs,
      livenessTimeoutMs: opts.livenessTimeoutMs ?? DEFAULTS.livenessTimeoutMs,
      name: 'lookup client',
      log: opts.log ?? silentLogger,
      onReply: (rep) => {
        if ('epoch' in rep && rep.epoch > this.#maxEpoch) this.#maxEpoch = rep.epoch;
      },
    });
  }

  /** Highest epoch seen in any reply; answers from an older epoch are stale. */
  get epoch(): number {
    return this.#maxEpoch;
  }

  /** Requests waiting for a reply. */
  get pendingRequests(): number {
    return this.#rs.pending;
  }

  /**
   * Fresh connections opened because the server refused a request as unauthenticated (with Curve
   * keys; the refused requests are sent again on them, docs/security.md).
   */
  get authReconnects(): number {
    return this.#rs.authReconnects;
  }

  /**
   * Non-blocking lookup. First call for `lookupId` sends the request and returns null; later
   * calls return null until the answer arrives, then the hit tokens (once; the next call starts a
   * new lookup). Past the deadline it returns 0 and cancels the server-side work.
   */
  lookup(
    lookupId: string,
    hashes: HashesInput,
    tokenCounts: ArrayLike<number>,
    opts: LookupCallOptions = {},
  ): number | null {
    return this.lookupAnswer(lookupId, hashes, tokenCounts, opts)?.hitTokens ?? null;
  }

  /**
   * {@link lookup} with the whole answer: null while pending, then the answer once (its
   * `hitTokens` is what `lookup` returns: 0 unless the status is ok); past the deadline an
   * answer of status `timeout` (the server-side work is cancelled).
   * @throws KvtierError `KVT_INVALID_ARGUMENT` for a `timeoutMs` that is not an integer >= 1.
   */
  lookupAnswer(
    lookupId: string,
    hashes: HashesInput,
    tokenCounts: ArrayLike<number>,
    opts: LookupCallOptions = {},
  ): LookupAnswer | null {
    if (this.#rs.closed) return missed('canceled', this.#maxEpoch);
    const state = this.#lookups.get(lookupId);
    if (state === undefined) {
      const timeoutMs =
        opts.timeoutMs === undefined
          ? this.#lookupTimeoutMs
          : Math.min(this.#lookupTimeoutMs, requireInt('timeoutMs', opts.timeoutMs, 1));
      const entry: PendingLookup = { deadline: this.#now() + timeoutMs, answer: undefined };
      this.#lookups.set(lookupId, entry);
      // The request's own timer is only a backstop (the client's deadline, not a shorter one of
      // this call, so that a slow answer still arrives to be asked for); the deadline above is
      // what lookup() enforces.
      const { timeoutMs: _own, ...call } = opts;
      this.lookupAsync(lookupId, hashes, tokenCounts, {
        ...call,
        timeoutMs: this.#lookupTimeoutMs * 2 + 1000,
      }).then(
        (a) => {
          entry.answer = a.status === 'ok' ? a : { ...a, hitTokens: 0, hitChunks: 0 };
        },
        () => {
          entry.answer = missed('canceled', this.#maxEpoch);
        },
      );
      return null;
    }
    if (state.answer !== undefined) {
      this.#lookups.delete(lookupId);
      return state.answer;
    }
    if (this.#now() >= state.deadline) {
      this.#lookups.delete(lookupId);
      this.#abandon(lookupId);
      return missed('timeout', this.#maxEpoch);
    }
    return null;
  }

  /** Forgets a non-blocking lookup (e.g. the request was aborted) and cancels it on the server. */
  forget(lookupId: string): void {
    if (this.#lookups.delete(lookupId)) this.#abandon(lookupId);
  }

  /**
   * Promise variant: resolves with the server's answer, or `{ status: 'timeout', hitTokens: 0 }`
   * past the deadline (the server-side work is then cancelled). Rejects only on bad arguments,
   * an error reply, or after close (KVT_CLOSED).
   */
  async lookupAsync(
    lookupId: string,
    hashes: HashesInput,
    tokenCounts: ArrayLike<number>,
    opts: LookupCallOptions & { signal?: AbortSignal; timeoutMs?: number } = {},
  ): Promise<LookupAnswer> {
    const packed = asPackedHashes(hashes);
    // Encoded before the request is under way, so the caller's arrays are read, not copied.
    const counts =
      tokenCounts instanceof Uint32Array
        ? tokenCounts
        : Uint32Array.from(tokenCounts as ArrayLike<number>);
    const namespaces = (opts.namespaces ?? this.#namespaces) as string[];
    if (namespaces.length === 0)
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        'lookup needs a namespace: pass namespaces in the client options or the call',
      );
    try {
      const rep = await this.#request(
        {
          type: 'lookup',
          requestId: 0,
          lookupId,
          namespaces,
          hashes: packed,
          tokenCounts: counts,
          config: opts.config ?? {},
        },
        { signal: opts.signal, timeoutMs: opts.timeoutMs ?? this.#lookupTimeoutMs },
      );
      if (rep.type !== 'lookup-result') throw unexpected(rep);
      const stale = rep.status === 'stale' || rep.epoch < this.#maxEpoch;
      const answer: LookupAnswer = {
        status: stale ? 'stale' : rep.status,
        hitTokens: stale || rep.status !== 'ok' ? 0 : rep.hitTokens,
        hitChunks: stale || rep.status !== 'ok' ? 0 : rep.hitChunks,
        epoch: rep.epoch,
        tiers: rep.tiers,
      };
      if (rep.bytesPerToken !== undefined) answer.bytesPerToken = rep.bytesPerToken;
      if (rep.tierRates !== undefined)
        answer.tierRates = rep.tierRates.map((t) => ({
          tier: t.tier,
          decision: t.decision,
          readBytesPerSec: Number(t.readBytesPerSec),
          latencyMs: t.latencyUs / 1000,
          declinedTokens: t.declinedTokens,
        }));
      return answer;
    } catch (err) {
      if (err instanceof KvtierError && err.code === 'KVT_TIMEOUT') {
        this.#abandon(lookupId);
        return missed('timeout', this.#maxEpoch);
      }
      throw err;
    }
  }

  /** Releases the server's pins for a lookup (cleanup) or stops its prefetch. Resolves whether the server knew it. */
  async cancel(lookupId: string, opts: { signal?: AbortSignal } = {}): Promise<boolean> {
    this.#lookups.delete(lookupId);
    const rep = await this.#request({ type: 'cancel', requestId: 0, lookupId }, opts);
    if (rep.type !== 'cancel-result') throw unexpected(rep);
    return rep.found;
  }

  /** Clears the namespaces (all when empty) on the server; resolves the new epoch. */
  async clear(
    namespaces: readonly string[] = [],
    opts: { signal?: AbortSignal } = {},
  ): Promise<number> {
    const rep = await this.#request(
      { type: 'clear', requestId: 0, namespaces: [...namespaces] },
      opts,
    );
    if (rep.type !== 'clear-result') throw unexpected(rep);
    return rep.epoch;
  }

  /** Health check; resolves the server's info (protocol version, epoch, tiers, limits). */
  async ping(
    opts: { signal?: AbortSignal; timeoutMs?: number } = {},
  ): Promise<Record<string, unknown>> {
    const rep = await this.#request({ type: 'ping', requestId: 0 }, opts);
    if (rep.type !== 'pong') throw unexpected(rep);
    return rep.info;
  }

  async stats(opts: { signal?: AbortSignal } = {}): Promise<Record<string, unknown>> {
    const rep = await this.#request({ type: 'stats', requestId: 0 }, opts);
    if (rep.type !== 'stats-result') throw unexpected(rep);
    return rep.stats;
  }

  /**
   * Stores one chunk's bytes on the server.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` unless `hash` is 64 lowercase hex digits.
   */
  async put(
    namespace: string,
    hash: string,
    tokens: number,
    payload: Uint8Array,
    opts: { signal?: AbortSignal } = {},
  ): Promise<'stored' | 'exists' | 'dropped'> {
    const data = Buffer.isBuffer(payload)
      ? payload
      : Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength);
    const rep = await this.#request(
      { type: 'put', requestId: 0, namespace, hash: chunkHash(hash), tokens, payload: data },
      opts,
    );
    if (rep.type !== 'put-result') throw unexpected(rep);
    return rep.outcome;
  }

  /**
   * Reads one chunk's bytes from the server; null when no tier has it.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` unless `hash` is 64 lowercase hex digits.
   */
  async get(
    namespace: string,
    hash: string,
    opts: { signal?: AbortSignal } = {},
  ): Promise<{ tokens: number; payload: Buffer } | null> {
    const rep = await this.#request(
      { type: 'get', requestId: 0, namespace, hash: chunkHash(hash) },
      opts,
    );
    if (rep.type !== 'get-result') throw unexpected(rep);
    return rep.found ? { tokens: rep.tokens, payload: rep.payload } : null;
  }

  #abandon(lookupId: string): void {
    if (this.#rs.closed) return;
    this.#request({ type: 'cancel', requestId: 0, lookupId }, {}).catch(() => {});
  }

  #request(
    req: Request,
    opts: { signal?: AbortSignal | undefined; timeoutMs?: number | undefined },
  ): Promise<Reply> {
    return this.#rs.request(req, opts);
  }

  /** Rejects pending requests with KVT_CLOSED and closes the socket. Idempotent. */
  async close(): Promise<void> {
    this.#lookups.clear();
    return this.#rs.close();
  }
}

/** An answer with no hit: a timeout, or a lookup that could not be made. */
function missed(status: 'timeout' | 'canceled', epoch: number): LookupAnswer {
  return { status, hitTokens: 0, hitChunks: 0, epoch, tiers: [] };
}

/**
 * The hashes as one buffer of 32-byte entries: a packed input is viewed without copying, a list
 * is packed.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` when a size is not a multiple of 32 bytes.
 */
export function asPackedHashes(hashes: HashesInput): Buffer {
  if (hashes instanceof Uint8Array) {
    if (hashes.length % HASH_BYTES !== 0)
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `packed hashes must be a multiple of ${HASH_BYTES} bytes, got ${hashes.length}`,
      );
    return Buffer.isBuffer(hashes)
      ? hashes
      : Buffer.from(hashes.buffer, hashes.byteOffset, hashes.byteLength);
  }
  const out = Buffer.allocUnsafe(hashes.length * HASH_BYTES);
  hashes.forEach((h, i) => {
    if (h.length !== HASH_BYTES)
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `hash ${i} is ${h.length} bytes, expected ${HASH_BYTES}`,
      );
    out.set(h, i * HASH_BYTES);
  });
  return out;
}
