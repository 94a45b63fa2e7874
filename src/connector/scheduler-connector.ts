import { closedError, KvtierError } from '../errors.ts';
import { CHUNK_HASHER_DEFAULTS, type HashedChunk, hashChunks } from '../hashing/chunk-hasher.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import { requireBoolean, requireInt, requireString } from '../util/validate.ts';
import { admittedTokens, lookupWaitMs } from './claim-bound.ts';
import type {
  ConnectorLookup,
  ConnectorMeta,
  ConnectorOutput,
  ConnectorRequest,
  LoadIntent,
  RequestEnd,
  SaveIntent,
  SchedulerStep,
} from './types.ts';

/** Options of {@link KvtierSchedulerConnector}. */
export interface SchedulerConnectorOptions {
  /** Owned: `close()` closes it when it has a `close` method (a `LookupClient` does). */
  lookup: ConnectorLookup;
  /** Engine block size in tokens, an integer >= 1. */
  blockSize: number;
  /** Tokens per stored chunk, a multiple of `blockSize`; default 256 (must match the worker's registration). */
  chunkSize?: number;
  /** Default cache salt of requests that carry none; default `''`. */
  salt?: string;
  /** Namespaces to look up in; default: the lookup client's own. */
  namespaces?: readonly string[];
  /**
   * Claim the rest of a chunk when the engine's own prefix cache ends inside it (at a block
   * boundary): the load then skips the blocks the engine holds (`LoadIntent.skipBlocks`). Default
   * `true`; `false` claims only from chunk boundaries, as sidecars without `skipBlocks` need.
   */
  partialChunkLoads?: boolean;
  /**
   * How long the engine's next step is expected to take, ms (e.g. its last step's duration, 0
   * while it is idle): what a request whose lookup is pending waits before it is asked again.
   * With `computeTokensPerSec`, a pending lookup is waited for only when computing the tokens it
   * could claim takes longer than that: otherwise `getNumNewMatchedTokens` answers 0 at once (the
   * request computes if the engine admits it now) and the lookup goes on; if the request is
   * asked again before it is admitted (it had to wait anyway), its answer counts. Default: none
   * (every lookup is waited for).
   */
  stepMs?: () => number;
  /**
   * The engine's prefill rate, tokens/s (a positive finite number): configured, or measured from
   * the engine's own steps. With it (and a lookup client with `lookupAnswer`), kvtier never makes
   * a request wait longer than computing would take (claim-bound.ts): every lookup carries the
   * rate, so the sidecar claims a tier's hits only where fetching them beats computing them; a
   * lookup not answered within the time computing its claimable tokens takes answers 0; only
   * what the sidecar's rule admitted is claimed. Default: none (every hit is claimed, lookups
   * wait up to the client's `lookupTimeoutMs`).
   */
  computeTokensPerSec?: number;
  log?: Logger;
  /** Monotonic clock, ms (the pause after failed loads); default `performance.now`. */
  now?: () => number;
}

/** Loads failing in a row (none succeeding in between) after which no load is offered. */
export const LOAD_FAILURES_BEFORE_PAUSE = 2;
/** The first pause, ms, doubled with every further failure in a row up to the longest. */
export const FIRST_PAUSE_MS = 1000;
export const LONGEST_PAUSE_MS = 60_000;

/**
 * `covered`: answered, with every hit inside the engine's own prefix: its pins released, its
 * number kept, so a request that waits to be admitted does not look up again every other step
 * (and lose its place in the queue while each new lookup is pending); a fresh lookup is made
 * only once the engine's prefix no longer covers the hits.
 */
type LookupState = 'none' | 'pending' | 'answered' | 'covered' | 'consumed';

interface Tracked {
  readonly requestId: string;
  readonly promptLength: number;
  /** Hashes of the prompt's full chunks. */
  readonly chunks: readonly HashedChunk[];
  attempt: number;
  lookupId: string;
  lookup: LookupState;
  hitTokens: number;
  /** What the last `getNumNewMatchedTokens` offered (`numComputed` is block-aligned). */
  offered: { numComputed: number; tokens: number } | null;
  /** Set by `updateStateAfterAlloc`, emitted by the next `buildConnectorMeta`. */
  intent: LoadIntent | null;
  /** Emitted, not yet reported in `finishedRecving`. */
  loading: LoadIntent | null;
  /** Leading chunks kvtier holds or is saving. */
  storedChunks: number;
  savedAny: boolean;
  /** First chunk a load of this request failed at: never offered to it again. */
  failedChunk: number | null;
  /** An answer kept across a new admission: its pins go once the new lookup answered. */
  staleLookupId: string;
  /** Blocks were allocated since the last ask: an ask now is a new admission. */
  admitted: boolean;
}

/**
 * Scheduler side of the kvtier connector (vLLM `KVConnectorBase_V1`, scheduler role). Pure
 * bookkeeping over a non-blocking lookup client: no method waits for I/O. Claims end at a chunk
 * boundary (kvtier stores whole chunks, and a chunk is a whole number of blocks), never include
 * the last prompt token, and start where the engine's own prefix cache ends: at a chunk boundary,
 * or inside a chunk at a block boundary, the load then skipping the blocks the engine holds.
 *
 * Loads that fail are not offered again: a request whose load failed is never offered the chunks
 * from the failed one on, and after {@link LOAD_FAILURES_BEFORE_PAUSE} failed loads in a row no
 * load is offered for {@link FIRST_PAUSE_MS} (doubling, up to {@link LONGEST_PAUSE_MS}) until one
 * succeeds: a worker that cannot load costs time, never a request that does not finish.
 */
export class KvtierSchedulerConnector {
  readonly #lookup: ConnectorLookup;
  readonly #blockSize: number;
  readonly #chunkSize: number;
  readonly #blocksPerChunk: number;
  readonly #salt: string;
  readonly #namespaces: readonly string[] | undefined;
  readonly #partialChunkLoads: boolean;
  readonly #computeTokensPerSec: number | undefined;
  readonly #stepMs: (() => number) | undefined;
  readonly #log: Logger;
  readonly #now: () => number;
  #failuresInARow = 0;
  #pausedUntil = 0;
  readonly #requests = new Map<string, Tracked>();
  #ended: RequestEnd[] = [];
  #closing: Promise<void> | undefined;

  /** @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options. */
  constructor(opts: SchedulerConnectorOptions) {
    if (typeof opts?.lookup?.lookup !== 'function')
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        'lookup must be a LookupClient or MultiLookupClient',
      );
    this.#lookup = opts.lookup;
    this.#blockSize = requireInt('blockSize', opts.blockSize, 1, 1 << 20);
    this.#chunkSize = requireInt(
      'chunkSize',
      opts.chunkSize ?? CHUNK_HASHER_DEFAULTS.chunkSize,
      1,
      1 << 20,
    );
    if (this.#chunkSize % this.#blockSize !== 0)
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `chunkSize must be a multiple of blockSize (${this.#blockSize}), got ${this.#chunkSize}`,
      );
    this.#blocksPerChunk = this.#chunkSize / this.#blockSize;
    this.#salt = requireString('salt', opts.salt ?? '');
    this.#namespaces = opts.namespaces === undefined ? undefined : [...opts.namespaces];
    this.#partialChunkLoads = requireBoolean('partialChunkLoads', opts.partialChunkLoads ?? true);
    const rate = opts.computeTokensPerSec;
    if (rate !== undefined && !(typeof rate === 'number' && Number.isFinite(rate) && rate > 0))
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `computeTokensPerSec must be a positive finite number of tokens/s, got ${String(rate)}`,
      );
    this.#computeTokensPerSec = rate;
    if (opts.stepMs !== undefined && typeof opts.stepMs !== 'function')
      throw new KvtierError('KVT_INVALID_ARGUMENT', 'stepMs must be a function returning ms');
    this.#stepMs = opts.stepMs;
    this.#log = opts.log ?? silentLogger;
    this.#now = opts.now ?? (() => performance.now());
  }

  /** Requests the connector currently tracks (for gauges and leak checks). */
  get trackedRequests(): number {
    return this.#requests.size;
  }

  /** True while no load is offered after failed loads in a row (see the class). */
  get offersPaused(): boolean {
    return this.#now() < this.#pausedUntil;
  }

  /**
   * vLLM `get_num_new_matched_tokens`. Returns `[tokens, loadAsync]`: `[null, false]` while the
   * lookup is pending ("ask again next step"), else the tokens kvtier can load beyond
   * `numComputedTokens` and whether to wait for an async load (always when tokens > 0: loads
   * never block the forward pass). The lookup covers the full chunks that end before the last
   * prompt token; the claim runs from `numComputedTokens` to the end of the last hit chunk. A
   * local prefix that ends inside a chunk at a block boundary claims the rest of that chunk (the
   * load skips the blocks the engine holds), or 0 with `partialChunkLoads: false`; one that ends
   * inside a block claims 0.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` for a bad request or count; `KVT_CLOSED`.
   */
  getNumNewMatchedTokens(
    request: ConnectorRequest,
    numComputedTokens: number,
  ): [tokens: number | null, loadAsync: boolean] {
    this.#open();
    const t = this.#track(request);
    const computed = requireInt('numComputedTokens', numComputedTokens, 0);
    // Asked again after an admission (preempted, or recomputing after a failed load): look up
    // afresh; vLLM may ask before buildConnectorMeta hears of a preemption.
    if (t.admitted && t.loading === null && t.intent === null) this.#renewLookup(t);
    t.offered = null;
    const lookupChunks = Math.min(this.#lookupChunks(t), t.failedChunk ?? Number.MAX_SAFE_INTEGER);
    const aligned = this.#partialChunkLoads ? this.#blockSize : this.#chunkSize;
    if (
      computed % aligned !== 0 ||
      computed >= lookupChunks * this.#chunkSize ||
      this.offersPaused
    ) {
      this.#releaseLookup(t);
      return [0, false];
    }
    if (t.lookup === 'covered' && this.#claim(t, lookupChunks) > computed) t.lookup = 'none';
    if (t.lookup === 'none' || t.lookup === 'consumed') {
      t.attempt++;
      t.lookupId = `${t.requestId}#${t.attempt}`;
      t.lookup = 'pending';
    }
    if (t.lookup === 'pending') {
      const answer = this.#ask(t, t.chunks.slice(0, lookupChunks), computed);
      if (answer === null)
        return this.#worthAStep(lookupChunks * this.#chunkSize - computed)
          ? [null, false]
          : [0, false];
      t.lookup = 'answered';
      t.hitTokens = answer;
      this.#dropStaleLookup(t);
      t.storedChunks = Math.max(t.storedChunks, Math.floor(answer / this.#chunkSize));
      this.#log.debug('lookup answered', { requestId: t.requestId, hitTokens: answer });
    }
    const claim = this.#claim(t, lookupChunks);
    const tokens = claim > computed ? claim - computed : 0;
    if (tokens === 0) {
      // Nothing to load: the pins would only wait for their TTL.
      if (t.hitTokens > 0 && t.lookup === 'answered') {
        this.#releaseLookup(t);
        t.lookup = 'covered';
      }
      return [0, false];
    }
    t.offered = { numComputed: computed, tokens };
    return [tokens, true];
  }

  /**
   * vLLM `update_state_after_alloc`: records which blocks receive which chunks. `blockIds` is the
   * request's whole block table; `numExternalTokens` is what `getNumNewMatchedTokens` returned
   * (0 clears the intent), or less as long as it ends at a chunk boundary. When the offer started
   * inside a chunk, the intent starts at that chunk with `skipBlocks` set and lists only the
   * blocks from `numComputedTokens` on. A second call for the same request replaces the first
   * intent.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` when the tokens were not offered or the table is
   *   too short for them; `KVT_CLOSED`.
   */
  updateStateAfterAlloc(
    request: ConnectorRequest,
    blockIds: readonly number[],
    numExternalTokens: number,
  ): void {
    this.#open();
    const tokens = requireInt('numExternalTokens', numExternalTokens, 0);
    const t = this.#requests.get(request?.requestId);
    if (t !== undefined) t.admitted = true;
    if (tokens === 0) {
      if (t === undefined) return;
      t.intent = null;
      // Admitted with nothing to load: a lookup in flight or its pins are no longer wanted.
      if (t.lookup === 'pending' || t.lookup === 'answered') this.#releaseLookup(t);
      return;
    }
    const offered = t?.offered;
    if (
      t === undefined ||
      offered == null ||
      tokens > offered.tokens ||
      (offered.numComputed + tokens) % this.#chunkSize !== 0
    )
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `updateStateAfterAlloc: ${tokens} external tokens for request ${request?.requestId} were not offered (offered ${offered?.tokens ?? 0} after ${offered?.numComputed ?? 0} computed; claims end at a chunk boundary, chunks are ${this.#chunkSize} tokens)`,
      );
    const first = Math.floor(offered.numComputed / this.#chunkSize);
    const skip = (offered.numComputed % this.#chunkSize) / this.#blockSize;
    const end = (offered.numComputed + tokens) / this.#chunkSize;
    const bpc = this.#blocksPerChunk;
    if (!Array.isArray(blockIds) || blockIds.length < end * bpc)
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `updateStateAfterAlloc: chunks ${first}..${end - 1} need ${end * bpc} blocks in the table, got ${Array.isArray(blockIds) ? blockIds.length : 'none'}`,
      );
    t.intent = {
      requestId: t.requestId,
      lookupId: t.lookupId,
      firstChunk: first,
      numTokens: tokens,
      blockIds: blockIds.slice(first * bpc + skip, end * bpc),
      chunkHashes: Buffer.concat(t.chunks.slice(first, end).map((c) => c.hash)),
      ...(skip > 0 ? { skipBlocks: skip } : {}),
    };
  }

  /**
   * vLLM `build_connector_meta`: the loads recorded since the last call, the saves of full prompt
   * chunks that `step` completes (chunks kvtier holds already are skipped), and the requests that
   * ended. Each item appears in exactly one metadata.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` for a bad step; `KVT_CLOSED`.
   */
  buildConnectorMeta(step: SchedulerStep = { scheduled: [] }): ConnectorMeta {
    this.#open();
    const loads: LoadIntent[] = [];
    for (const t of this.#requests.values()) {
      if (t.intent === null) continue;
      loads.push(t.intent);
      t.loading = t.intent;
      t.intent = null;
      // The load consumes the lookup's pins; a later ask needs a fresh lookup.
      t.lookup = 'consumed';
      t.storedChunks = Math.max(t.storedChunks, t.loading.firstChunk + this.#chunksOf(t.loading));
    }
    const saves: SaveIntent[] = [];
    for (const [i, s] of (step.scheduled ?? []).entries()) {
      const t = this.#track(s.request);
      const computed =
        requireInt(`scheduled[${i}].numComputedTokens`, s.numComputedTokens, 0) +
        requireInt(`scheduled[${i}].numScheduledTokens`, s.numScheduledTokens, 0);
      const blocks = Array.isArray(s.blockIds) ? s.blockIds : [];
      const full = Math.min(
        t.chunks.length,
        Math.floor(Math.min(computed, t.promptLength) / this.#chunkSize),
        Math.floor(blocks.length / this.#blocksPerChunk),
      );
      if (full <= t.storedChunks) continue;
      const bpc = this.#blocksPerChunk;
      saves.push({
        requestId: t.requestId,
        firstChunk: t.storedChunks,
        blockIds: blocks.slice(t.storedChunks * bpc, full * bpc),
        chunkHashes: Buffer.concat(t.chunks.slice(t.storedChunks, full).map((c) => c.hash)),
      });
      t.storedChunks = full;
      t.savedAny = true;
    }
    const finished = this.#ended;
    this.#ended = [];
    return { loads, saves, finished };
  }

  /**
   * vLLM `update_connector_output`: settles loads reported in `finishedRecving`; a failed load's
   * chunks (from the first invalid block on) are no longer counted as stored, so they are saved
   * again once the engine recomputes them, and are never offered to that request again. Loads
   * failing in a row pause all offers (see the class).
   */
  updateConnectorOutput(output: ConnectorOutput): void {
    const invalid = new Set(output.invalidBlockIds ?? []);
    const done = new Set(output.finishedRecving ?? []);
    for (const t of this.#requests.values()) {
      const l = t.loading;
      if (l === null) continue;
      if (invalid.size > 0) {
        const at = l.blockIds.findIndex((b) => invalid.has(b));
        if (at >= 0) {
          const chunk =
            l.firstChunk + Math.floor((at + (l.skipBlocks ?? 0)) / this.#blocksPerChunk);
          t.storedChunks = Math.min(t.storedChunks, chunk);
          t.failedChunk = Math.min(t.failedChunk ?? chunk, chunk);
        }
      }
      if (done.has(t.requestId)) {
        t.loading = null;
        this.#loadSettled(l.blockIds.some((b) => invalid.has(b)));
      }
    }
  }

  #loadSettled(failed: boolean): void {
    if (!failed) {
      this.#failuresInARow = 0;
      this.#pausedUntil = 0;
      return;
    }
    this.#failuresInARow++;
    const over = this.#failuresInARow - LOAD_FAILURES_BEFORE_PAUSE;
    if (over < 0) return;
    const pause = Math.min(LONGEST_PAUSE_MS, FIRST_PAUSE_MS * 2 ** Math.min(over, 16));
    this.#pausedUntil = this.#now() + pause;
    this.#log.warn('loads failed in a row; no loads are offered for a while (requests compute)', {
      failures: this.#failuresInARow,
      pauseMs: pause,
    });
  }

  /**
   * vLLM `request_finished` (terminal free: finished or aborted). Cancels a pending lookup,
   * releases unused pins, drops an unsent load, and queues the release for the workers. Returns
   * `[delayFree, null]`: `delayFree` is true while saves may still read the request's blocks;
   * the engine then frees them when a worker reports the id in `finishedSending`. Never for a
   * request whose load is in flight: vLLM keeps the blocks of a request finished while loading
   * until `finishedRecving` names it and frees them then (a delayed free as well would name a
   * request vLLM already dropped). kvtier hands vLLM no transfer parameters. `blockIds` is
   * accepted for parity with vLLM (the blocks are known from the intents).
   */
  requestFinished(
    request: ConnectorRequest,
    _blockIds?: readonly number[],
  ): [delayFree: boolean, params: null] {
    const t = this.#requests.get(request?.requestId);
    if (t === undefined) return [false, null];
    this.#requests.delete(t.requestId);
    this.#releaseLookup(t);
    t.intent = null;
    const delayFree = t.savedAny && t.loading === null;
    this.#ended.push({
      requestId: t.requestId,
      kind: request.aborted === true ? 'aborted' : 'finished',
      delayFree,
    });
    return [delayFree, null];
  }

  /**
   * Preemption (vLLM frees the blocks and requeues the request): the next ask looks up afresh
   * (the request's own chunks saved since its last answer count too); the old answer's pins stay
   * until the new one is in. An unsent load is dropped (its blocks are gone). Workers get the id
   * so they can finish saves that read those blocks before the engine reuses them.
   */
  requestPreempted(request: ConnectorRequest): void {
    const t = this.#requests.get(request?.requestId);
    if (t === undefined) return;
    t.intent = null;
    t.offered = null;
    this.#renewLookup(t);
    this.#ended.push({ requestId: t.requestId, kind: 'preempted', delayFree: false });
  }

  /**
   * vLLM `reset_prefix_cache`: forgets every cached lookup answer (releasing its pins), so
   * waiting requests look up afresh. Loads already recorded or running are kept: their requests
   * are waiting on them. kvtier's stored chunks are not touched.
   */
  resetPrefixCache(): boolean {
    for (const t of this.#requests.values()) {
      if (t.intent !== null || t.loading !== null) continue;
      this.#releaseLookup(t);
      t.offered = null;
    }
    return true;
  }

  /** Forgets every request and closes the lookup client it owns. Idempotent. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      for (const t of this.#requests.values()) this.#releaseLookup(t);
      this.#requests.clear();
      this.#ended = [];
      await this.#lookup.close?.();
    })();
    return this.#closing;
  }

  #open(): void {
    if (this.#closing !== undefined) throw closedError('scheduler connector');
  }

  #track(request: ConnectorRequest): Tracked {
    const id = requireString('request.requestId', request?.requestId, { nonEmpty: true });
    let t = this.#requests.get(id);
    if (t !== undefined) return t;
    const tokens = request.promptTokenIds;
    if (!Array.isArray(tokens) && !(tokens instanceof Uint32Array))
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `request ${id}: promptTokenIds must be an array or Uint32Array`,
      );
    const chunks = hashChunks(tokens, {
      chunkSize: this.#chunkSize,
      salt: request.cacheSalt ?? this.#salt,
    });
    t = {
      requestId: id,
      promptLength: tokens.length,
      chunks,
      attempt: 0,
      lookupId: '',
      lookup: 'none',
      hitTokens: 0,
      offered: null,
      intent: null,
      loading: null,
      storedChunks: 0,
      savedAny: false,
      failedChunk: null,
      staleLookupId: '',
      admitted: false,
    };
    this.#requests.set(id, t);
    return t;
  }

  /** Full chunks that end before the last prompt token (which the engine always computes). */
  #lookupChunks(t: Tracked): number {
    return Math.min(t.chunks.length, Math.floor(Math.max(0, t.promptLength - 1) / this.#chunkSize));
  }

  /**
   * The lookup of chunks `chunks` of `t` (non-blocking): the hit tokens, or with the engine's
   * prefill rate, the tokens the rule admits (claim-bound.ts), its wait bounded by the time
   * computing the tokens past `computed` would take.
   */
  #ask(t: Tracked, chunks: readonly HashedChunk[], computed: number): number | null {
    const hashes = Buffer.concat(chunks.map((c) => c.hash));
    const counts = chunks.map((c) => c.end - c.start);
    const ns = this.#namespaces === undefined ? {} : { namespaces: this.#namespaces };
    const rate = this.#computeTokensPerSec;
    const lookup = this.#lookup;
    if (rate === undefined || lookup.lookupAnswer === undefined)
      return lookup.lookup(t.lookupId, hashes, counts, ns);
    const claimable = Math.max(1, (chunks.at(-1)?.end ?? 0) - computed);
    const answer = lookup.lookupAnswer(t.lookupId, hashes, counts, {
      ...ns,
      config: { computeTokensPerSec: rate },
      timeoutMs: lookupWaitMs(claimable, rate),
    });
    return answer === null ? null : admittedTokens(answer);
  }

  #chunksOf(intent: LoadIntent): number {
    return (intent.blockIds.length + (intent.skipBlocks ?? 0)) / this.#blocksPerChunk;
  }

  /** The next ask starts a new lookup; an answer's pins stay until that one is in. */
  /**
   * Whether waiting a step for a lookup that could let the request claim `claimable` tokens can
   * beat computing them in that step (always, without the engine's rate and step time).
   */
  #worthAStep(claimable: number): boolean {
    const rate = this.#computeTokensPerSec;
    if (rate === undefined || this.#stepMs === undefined) return true;
    const stepMs = this.#stepMs();
    return !(Number.isFinite(stepMs) && (claimable * 1000) / rate <= stepMs);
  }

  /** Tokens the last answer lets the request claim from its start: whole chunks, not the last token. */
  #claim(t: Tracked, lookupChunks: number): number {
    let claim = Math.min(t.hitTokens, t.promptLength - 1, lookupChunks * this.#chunkSize);
    claim -= claim % this.#blockSize;
    return claim - (claim % this.#chunkSize);
  }

  #renewLookup(t: Tracked): void {
    t.admitted = false;
    if (t.lookup === 'covered') t.lookup = 'none';
    if (t.lookup !== 'answered') return;
    this.#dropStaleLookup(t);
    if (t.hitTokens > 0) t.staleLookupId = t.lookupId;
    t.lookup = 'none';
  }

  #dropStaleLookup(t: Tracked): void {
    if (t.staleLookupId === '') return;
    this.#cancel(t.staleLookupId);
    t.staleLookupId = '';
  }

  #cancel(lookupId: string): void {
    this.#lookup.cancel(lookupId).catch((err: unknown) => {
      this.#log.debug('lookup cancel failed; the pin TTL releases it', { lookupId, err });
    });
  }

  #releaseLookup(t: Tracked): void {
    this.#dropStaleLookup(t);
    if (t.lookup === 'pending') this.#lookup.forget(t.lookupId);
    else if (t.lookup === 'answered' && t.hitTokens > 0) this.#cancel(t.lookupId);
    if (t.lookup === 'pending' || t.lookup === 'answered') t.lookup = 'consumed';
  }
}
