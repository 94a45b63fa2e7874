/**
 * A LOOKUP's walk through the tiers (design decision 3), read top to bottom. The storage manager
 * builds one {@link LookupWalk} over what it owns and hands every lookup to it:
 *
 * 1. admission: the input is checked, the lookup's memory held (lookup-budget.ts) and its entry
 *    registered with the event manager, before any pin is taken;
 * 2. `lookupNow`: the host tier's packed index answers the lookup in the same turn when host
 *    memory holds every chunk or there is nothing below it to ask;
 * 3. `lookup`: for each namespace, contiguous hits tier by tier, each tier continuing where the
 *    last stopped, pinned into the lookup's {@link PinLedger}; the ready prefix trimmed to the
 *    prefetch budget; the lower-tier hits brought into host memory under the serializer
 *    (prefetch.ts); only the host-memory pins of the ready prefix kept;
 * 4. settling: the answer goes to its event-manager entry, where it holds its pins until a LOAD
 *    or HOLD takes it, a CANCEL or CLEAR releases it or the pin TTL expires; it is recorded in
 *    the metrics (lookup-metrics.ts).
 */
import type {
  ChunkHash,
  HostMemoryTier,
  NamespaceId,
  StorageBackend,
} from '../backends/core/types.ts';
import { abortedError, closedError, KvtierError } from '../errors.ts';
import type {
  EventManager,
  PendingPrefetch,
  PrefetchHooks,
} from '../event-manager/event-manager.ts';
import { ClaimRule, ratesOnly } from './claim-rule.ts';
import { LazyAbort } from './lazy-abort.ts';
import {
  estimateLookupBytes,
  type LookupByteBudget,
  type LookupBytesHold,
} from './lookup-budget.ts';
import { AnsweredLookup, LookupHooks, outcomeOf } from './lookup-entry.ts';
import { LookupHashes } from './lookup-hashes.ts';
import { LookupRecorder } from './lookup-metrics.ts';
import { breakdown, fitBudget, tokensOf } from './lookup-prefix.ts';
import { PinLedger } from './pin-ledger.ts';
import { type PrefetchParts, prefetchIntoHost, type Segment } from './prefetch.ts';
import type { LookupInput, LookupOutcome, LookupRates, PinnedLookup } from './storage-types.ts';

/** What host memory holds of a lookup, asked first (`LookupWalk.#probeHost`). */
interface HostProbe {
  /** The pins of `hits`. */
  readonly ledger: PinLedger;
  /** Leading chunks host memory holds (pinned), per namespace in the input's order. */
  readonly hits: number[];
  /** The fewest of them. */
  readonly ready: number;
  /** Whether host memory answers the lookup alone. */
  readonly complete: boolean;
}

/** What a {@link LookupWalk} reads and writes; all owned by the storage manager. */
export interface LookupWalkParts extends PrefetchParts {
  readonly events: EventManager<PinnedLookup>;
  readonly lookupBytes: LookupByteBudget;
  /** The epoch now (a CLEAR bumps it: an answer computed across one is stale). */
  readonly epoch: () => number;
  /** Whether the storage manager is closing. */
  readonly closed: () => boolean;
}

/**
 * The LOOKUP path of the storage manager: runs each lookup over the tiers and keeps the answered
 * ones that hold pins, so that `release` and a CLEAR (`releaseCleared`) let go of them.
 */
export class LookupWalk {
  readonly #tiers: readonly StorageBackend[];
  readonly #host: HostMemoryTier;
  readonly #events: EventManager<PinnedLookup>;
  readonly #lookupBytes: LookupByteBudget;
  readonly #parts: LookupWalkParts;
  readonly #epoch: () => number;
  readonly #recorder: LookupRecorder;
  /** Answered lookups that hold pins (in the event manager or taken), for CLEAR to release. */
  readonly #answered = new Set<PinnedLookup>();
  /** `release`, bound once for every lookup's dispose hook. */
  readonly #release = (p: PinnedLookup): void => this.release(p);
  /** The hooks of every lookup `lookupNow` answers: its entry is done as soon as it is made, so
   * there is no work to abort, only pins to release. */
  readonly #answeredHooks: PrefetchHooks<PinnedLookup> = {
    abort: () => {},
    dispose: this.#release,
  };

  constructor(parts: LookupWalkParts) {
    this.#parts = parts;
    this.#tiers = parts.tiers;
    this.#host = parts.host;
    this.#events = parts.events;
    this.#lookupBytes = parts.lookupBytes;
    this.#epoch = parts.epoch;
    this.#recorder = new LookupRecorder(parts.metrics);
  }

  /**
   * See `StorageManager.lookup`: host memory is asked first, once; when it answers the lookup
   * alone the outcome is returned at once, else the walk goes on below it from what host memory
   * holds (its pins kept, not asked again). Errors always come as a rejected promise.
   */
  lookup(
    input: LookupInput,
    opts: { signal?: AbortSignal } = {},
  ): LookupOutcome | Promise<LookupOutcome> {
    const started = performance.now();
    let hashes: LookupHashes;
    let host: HostProbe | undefined;
    try {
      hashes = this.#admit(input);
      if (opts.signal?.aborted !== true) host = this.#probeHost(input, hashes);
      if (host?.complete === true) return this.#answerNow(input, hashes, host, started);
    } catch (err) {
      return Promise.reject(err);
    }
    return this.#lookupLater(input, hashes, opts, started, host);
  }

  async #lookupLater(
    input: LookupInput,
    hashes: LookupHashes,
    opts: { signal?: AbortSignal },
    started: number,
    host: HostProbe | undefined,
  ): Promise<LookupOutcome> {
    const events = this.#events;
    events.cancel(input.lookupId);

    const abort = new LazyAbort();
    const outer = opts.signal;
    let onAbort: (() => void) | undefined;
    if (outer !== undefined) {
      onAbort = () => abort.abort(outer.reason);
      if (outer.aborted) onAbort();
      else outer.addEventListener('abort', onAbort, { once: true });
    }
    // Admitted and registered before any pin is taken, so a full budget or event manager
    // refuses the lookup cleanly.
    let memory: LookupBytesHold | undefined;
    let entry: PendingPrefetch;
    try {
      memory = this.#lookupBytes.hold(estimateLookupBytes(hashes.length, input.lookupId.length));
      entry = events.addPending(
        input.lookupId,
        new LookupHooks(abort, this.#release, input.namespaces),
      );
    } catch (err) {
      memory?.release();
      host?.ledger.releaseAll();
      if (onAbort !== undefined) outer!.removeEventListener('abort', onAbort);
      throw err;
    }
    let recorded = false;
    try {
      const stamp = this.#parts.fence.stamp();
      const pinned = await this.#walk(input, hashes, abort, memory, stamp, host);
      if (abort.aborted) {
        pinned.ledger.releaseAll();
        throw abortedError(abort.signal, 'lookup');
      }
      recorded = true;
      return this.#settle(input, hashes, entry, pinned, started);
    } catch (err) {
      if (recorded) throw err;
      memory.release();
      events.fail(entry, err);
      if (abort.aborted) {
        this.#recorder.ended('canceled');
        const out: LookupOutcome = {
          status: 'canceled',
          epoch: this.#epoch(),
          hitTokens: 0,
          hitChunks: 0,
          tiers: [],
        };
        if (input.computeTokensPerSec !== undefined)
          out.rates = this.#rates(input, ratesOnly(this.#tiers, this.#parts.rates));
        return out;
      }
      this.#recorder.ended('error');
      throw err;
    } finally {
      if (onAbort !== undefined) outer!.removeEventListener('abort', onAbort);
    }
  }

  /** Checks a lookup's input; returns its hashes. @throws KvtierError as `StorageManager.lookup`. */
  #admit(input: LookupInput): LookupHashes {
    if (this.#parts.closed()) throw closedError('storage manager');
    const hashes = LookupHashes.of(input.hashes);
    if (hashes.length !== input.tokenCounts.length) {
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `lookup has ${hashes.length} hashes but ${input.tokenCounts.length} token counts`,
      );
    }
    if (input.namespaces.length === 0)
      throw new KvtierError('KVT_INVALID_ARGUMENT', 'lookup needs at least one namespace');
    return hashes;
  }

  /**
   * The walk over every tier, prefetch included: returns the answer with the pins of its ready
   * prefix, stale when the epoch moved meanwhile (a CLEAR ran). Takes no pin it does not hand
   * over or release, whatever happens.
   */
  async #walk(
    input: LookupInput,
    hashes: LookupHashes,
    abort: LazyAbort,
    memory: LookupBytesHold,
    stamp: number,
    host: HostProbe | undefined,
  ): Promise<AnsweredLookup> {
    const epoch = this.#epoch();
    // Host memory's hits, when it was asked first, are pinned in its ledger already.
    const ledger = host?.ledger ?? new PinLedger();
    const rule =
      input.computeTokensPerSec === undefined
        ? undefined
        : new ClaimRule(
            this.#tiers,
            this.#parts.rates,
            this.#parts.shapes,
            input.computeTokensPerSec,
            input.tokenCounts,
            input.namespaces[0],
          );
    try {
      const n = hashes.length;
      const tierCount = input.prefetch === false ? 1 : this.#tiers.length;
      const segmentsByNs: Segment[][] = [];
      let ready = n;
      for (let i = 0; i < input.namespaces.length; i++) {
        const ns = input.namespaces[i]!;
        const known = host?.hits[i];
        const segments = await this.#probe(ns, hashes, tierCount, ledger, abort, rule, known);
        segmentsByNs.push(segments);
        ready = Math.min(ready, segments.length === 0 ? 0 : segments[segments.length - 1]!.end);
      }
      if (rule !== undefined) ready = rule.apply(input.namespaces, segmentsByNs, ready);
      ready = fitBudget(segmentsByNs, ready, this.#parts.serializer.capacity);
      ledger.releaseFrom(ready);
      if (abort.aborted) throw abortedError(abort.signal, 'lookup');
      const { namespaces, tokenCounts } = input;
      const job = { namespaces, hashes, tokenCounts, segmentsByNs, ready, ledger, abort, stamp };
      ready = await prefetchIntoHost(this.#parts, job);
      ledger.releaseAllBut(this.#host);
      ledger.releaseFrom(ready);
      const now = this.#epoch();
      const status = now !== epoch ? 'stale' : 'ok';
      if (status === 'stale') ready = 0;
      const hitTokens = tokensOf(input.tokenCounts, 0, ready);
      const tiers = breakdown(this.#tiers, segmentsByNs[0] ?? [], ready, input.tokenCounts);
      const outcome: LookupOutcome = { status, epoch: now, hitTokens, hitChunks: ready, tiers };
      if (rule !== undefined) {
        outcome.rates = this.#rates(input, rule.report());
        this.#recorder.decided(outcome.rates.tiers);
      }
      // The ledger refers to `hashes` as well (compacted if the answer stays).
      return new AnsweredLookup(outcome, input.lookupId, input.namespaces, hashes, ledger, memory);
    } catch (err) {
      ledger.releaseAll();
      throw err;
    }
  }

  /**
   * One namespace's hits: contiguous per tier, each tier continuing where the last stopped. With
   * a claim rule, a tier that could not beat computing even every chunk left is not asked.
   */
  async #probe(
    ns: NamespaceId,
    hashes: LookupHashes,
    tierCount: number,
    ledger: PinLedger,
    abort: LazyAbort,
    rule: ClaimRule | undefined,
    hostHits?: number,
  ): Promise<Segment[]> {
    const segments: Segment[] = [];
    let pos = 0;
    const n = hashes.length;
    for (let ti = 0; ti < tierCount && pos < n; ti++) {
      if (ti === 0 && hostHits !== undefined) {
        // Host memory was asked first (`#probeHost`): its hits are pinned in the ledger.
        if (hostHits > 0) segments.push({ tierIndex: 0, start: 0, end: hostHits });
        pos = hostHits;
        continue;
      }
      const tier = this.#tiers[ti]!;
      if (tier.health() === 'down') continue;
      if (rule !== undefined && !rule.worthProbing(ti, ns, pos, n)) continue;
      // The host tier's packed index, when it has one, needs no hex strings.
      const packed = ti === 0 ? this.#host.packedIndex : undefined;
      let rest: ChunkHash[] | undefined;
      let k = 0;
      try {
        if (packed !== undefined) k = packed.contains(ns, hashes.packed, pos, n - pos, true);
        else {
          rest = hashes.hexSlice(pos);
          // Host memory answers at once; only slower tiers get a signal to abort on, and their
          // probe, a round trip with no payload, is their latency.
          const started = performance.now();
          k = await tier.batchedContains(
            ns,
            rest,
            ti === 0 ? { pin: true } : { pin: true, signal: abort.signal },
          );
          if (ti > 0)
            this.#parts.rates.recordProbe(tier.name, (performance.now() - started) / 1000);
        }
      } catch (err) {
        if (abort.aborted) throw abortedError(abort.signal, 'lookup');
        this.#parts.log.warn('tier contains failed; treated as a miss', { tier: tier.name, err });
        continue;
      }
      k = Math.max(0, Math.min(k, n - pos));
      if (k === 0) continue;
      if (rest === undefined) ledger.addPacked(tier, packed!, ns, pos, hashes, pos, k);
      else ledger.add(tier, ns, pos, rest, 0, k);
      segments.push({ tierIndex: ti, start: pos, end: pos + k });
      pos += k;
    }
    return segments;
  }

  /** What a lookup that named the engine's rate reports: its tiers and their bytes per token. */
  #rates(input: LookupInput, tiers: LookupRates['tiers']): LookupRates {
    const ns = input.namespaces[0];
    const bpt = ns === undefined ? undefined : this.#parts.shapes.bytesPerToken(ns);
    return { bytesPerToken: Math.round(bpt ?? 0), tiers };
  }

  /**
   * Hands an answered lookup to its event-manager entry, keeps what stays (pins, the answer to
   * take) or releases it, records it, and returns its outcome.
   */
  #settle(
    input: LookupInput,
    hashes: LookupHashes,
    entry: PendingPrefetch,
    pinned: PinnedLookup,
    started: number,
  ): LookupOutcome {
    const events = this.#events;
    const memory = pinned.memory;
    events.fulfil(entry, pinned);
    // A CLEAR that ran after the walk (while this resumed) makes the answer stale too.
    if (pinned.status === 'ok' && pinned.epoch !== this.#epoch()) this.#invalidate(pinned);
    if (
      (pinned.status !== 'ok' || input.pin === false) &&
      events.result(input.lookupId) === pinned
    ) {
      events.take(input.lookupId);
      pinned.ledger.releaseAll();
    } else {
      if (pinned.status === 'ok' && pinned.hitChunks > 0) this.#answered.add(pinned);
      // It stays (pins, or an answer to take): let go of the request's buffer.
      hashes.compact(pinned.hitChunks);
    }
    // What stays is the answer and its hits' pins (a no-op once released above).
    memory.resize(estimateLookupBytes(pinned.hitChunks, input.lookupId.length));
    if (!this.#answered.has(pinned) && events.result(input.lookupId) !== pinned) memory.release();
    this.#recorder.answered(
      pinned.status,
      input.tokenCounts,
      pinned.hitChunks,
      pinned.tiers,
      started,
    );
    return outcomeOf(pinned);
  }

  /** Answers a lookup host memory answered alone (`#probeHost`): no promise, no walk. */
  #answerNow(
    input: LookupInput,
    hashes: LookupHashes,
    host: HostProbe,
    started: number,
  ): LookupOutcome {
    const { ledger, ready } = host;
    ledger.releaseFrom(ready);
    const events = this.#events;
    let memory: LookupBytesHold | undefined;
    let entry: PendingPrefetch;
    try {
      events.cancel(input.lookupId);
      memory = this.#lookupBytes.hold(estimateLookupBytes(hashes.length, input.lookupId.length));
      entry = events.addPending(input.lookupId, this.#answeredHooks);
    } catch (err) {
      memory?.release();
      ledger.releaseAll();
      throw err;
    }
    const hitTokens = tokensOf(input.tokenCounts, 0, ready);
    const tiers = ready > 0 ? [{ tier: this.#host.name, tokens: hitTokens }] : [];
    const outcome: LookupOutcome = {
      status: 'ok',
      epoch: this.#epoch(),
      hitTokens,
      hitChunks: ready,
      tiers,
    };
    if (input.computeTokensPerSec !== undefined)
      outcome.rates = this.#rates(input, ratesOnly(this.#tiers, this.#parts.rates));
    const { lookupId, namespaces } = input;
    const answer = new AnsweredLookup(outcome, lookupId, namespaces, hashes, ledger, memory);
    return this.#settle(input, hashes, entry, answer, started);
  }

  /**
   * Asks host memory first, through its packed index: finds and pins each namespace's hits into a
   * new ledger. `complete` when host memory answers the lookup alone (every chunk there, or
   * nothing below it to ask); else the walk goes on from `hits` (kept pinned). Undefined, holding
   * no pin, without a packed index, with host memory down, or when the index failed (the walk
   * then asks host memory as any tier).
   */
  #probeHost(input: LookupInput, hashes: LookupHashes): HostProbe | undefined {
    const index = this.#host.packedIndex;
    if (index === undefined || this.#host.health() === 'down') return undefined;
    const ledger = new PinLedger();
    const hits: number[] = [];
    const n = hashes.length;
    const askLower = this.#tiers.length > 1 && input.prefetch !== false;
    let ready = n;
    let complete = true;
    const packed = hashes.packed;
    for (const ns of input.namespaces) {
      let k = 0;
      // The pinned chunks' handles, when the index gives them: their pins are then released
      // without finding each hash again.
      const handles: unknown[] | undefined = index.containsPinned === undefined ? undefined : [];
      if (n > 0) {
        try {
          k =
            handles === undefined
              ? index.contains(ns, packed, 0, n, true)
              : index.containsPinned!(ns, packed, 0, n, handles);
        } catch {
          ledger.releaseAll();
          return undefined;
        }
      }
      k = Math.max(0, Math.min(k, n));
      if (k > 0)
        ledger.addPacked(
          this.#host,
          index,
          ns,
          0,
          hashes,
          0,
          k,
          handles?.length === k ? handles : undefined,
        );
      hits.push(k);
      if (k < n && askLower) complete = false;
      ready = Math.min(ready, k);
    }
    return { ledger, hits, ready, complete };
  }

  /** Releases the pins and memory of an answered lookup. Idempotent. */
  release(p: PinnedLookup): void {
    this.#answered.delete(p);
    p.ledger.releaseAll();
    p.memory.release();
    if (p instanceof AnsweredLookup) p.freeHashes();
  }

  /**
   * For a CLEAR: answered lookups naming a cleared namespace leave the event manager (if still
   * there) and are made stale, releasing their pins (a LOAD of one: every block invalid).
   */
  releaseCleared(cleared: (ns: NamespaceId) => boolean): void {
    for (const p of [...this.#answered])
      if (p.namespaces.some(cleared)) {
        if (this.#events.result(p.lookupId) === p) this.#events.take(p.lookupId);
        this.#invalidate(p);
      }
  }

  /** Marks an answered lookup stale (a CLEAR overtook it) and releases its pins. */
  #invalidate(p: PinnedLookup): void {
    p.status = 'stale';
    p.epoch = this.#epoch();
    p.hitTokens = 0;
    p.hitChunks = 0;
    p.tiers = [];
    this.release(p);
  }

  /** The namespaces of lookup `id` while it is tracked (running or answered), else undefined. */
  namespacesOf(id: string): readonly NamespaceId[] | undefined {
    const done = this.#events.result(id);
    if (done !== undefined) return done.namespaces;
    const hooks = this.#events.hooksOf(id);
    return hooks instanceof LookupHooks ? hooks.namespaces : undefined;
  }
}
