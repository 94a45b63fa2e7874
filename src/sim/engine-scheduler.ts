import type { LoadIntent, ScheduledRequest } from '../connector/types.ts';
import { KvtierError } from '../errors.ts';
import {
  attribute,
  computedChunks,
  crossNodeTokens,
  discardAdmission,
  emptyAdmission,
  finishedTiming,
  newCounters,
  prefillCompleted,
} from './engine-accounting.ts';
import {
  type FastForwardLimits,
  fastForwardDecode,
  fullBlocks,
  headAdmits,
  quietWaiting,
} from './engine-fast-forward.ts';
import { KvChecker, verifyLoad } from './engine-kv.ts';
import { newReq, publishPrompt } from './engine-request.ts';
import type {
  Req,
  SchedulerCounters,
  SimEvent,
  SimRequestStatus,
  SimSchedulerDeps,
} from './engine-scheduler-types.ts';
import type { SimRequest } from './types.ts';

export type {
  LoadAllocInfo,
  SchedulerConnectorLike,
  SchedulerCounters,
  SimEvent,
  SimRequestStatus,
  SimSchedulerDeps,
} from './engine-scheduler-types.ts';

/**
 * The simulator's scheduler (vLLM v1's `Scheduler`, simplified where the connector is not
 * involved): a waiting queue and a running list, a token budget per step, chunked prefill, one
 * token per decode step, preemption by recompute, finishing and aborting, with kvtier driven
 * only through `KvtierSchedulerConnector`. I/O-free: the engine loop carries the metadata to the
 * worker connector and the worker's output back.
 */

/** The scheduler state machine; see the module comment. */
export class SimScheduler {
  readonly #d: SimSchedulerDeps;
  readonly #reqs = new Map<string, Req>();
  #waiting: Req[] = [];
  #running: Req[] = [];
  readonly #awaitingFree = new Map<string, Req>();
  /** Requests ended while loading, whose blocks wait for the worker's `finishedRecving`. */
  readonly #awaitingRecv = new Map<string, Req>();
  readonly #pendingInvalid = new Set<number>();
  readonly #kv: KvChecker | undefined;
  step = 0;
  /** Modeled start and end of the step being run (ms), set by the engine before `schedule`. */
  readonly clock = { startMs: 0, endMs: 0 };
  readonly counters: SchedulerCounters;

  constructor(deps: SimSchedulerDeps, tierNames: readonly string[]) {
    this.#d = deps;
    this.#kv = deps.kv === undefined ? undefined : new KvChecker(deps.kv, deps.blockSize);
    this.counters = newCounters(tierNames);
  }

  /** Requests neither terminal nor waiting for a delayed free. */
  get liveRequests(): number {
    return this.#waiting.length + this.#running.length;
  }

  /** Terminal requests whose blocks wait for the worker (`finishedSending` or `finishedRecving`). */
  get delayedFrees(): number {
    return this.#awaitingFree.size + this.#awaitingRecv.size;
  }

  /** Requests waiting for a kvtier load. */
  get loading(): number {
    return this.#waiting.filter((r) => r.status === 'waiting_for_remote_kvs').length;
  }

  /** The status of a request, or undefined when it never arrived. */
  status(requestId: string): SimRequestStatus | undefined {
    return this.#reqs.get(requestId)?.status;
  }

  /**
   * Queues an arrived request. A request that could never fit in the GPU fails at once.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` for a duplicate id or an empty prompt.
   */
  admit(sim: SimRequest): void {
    if (this.#reqs.has(sim.id))
      throw new KvtierError('KVT_INVALID_ARGUMENT', `duplicate request id ${sim.id}`);
    if (sim.promptTokens.length === 0)
      throw new KvtierError('KVT_INVALID_ARGUMENT', `request ${sim.id} has an empty prompt`);
    const bs = this.#d.blockSize;
    const r = newReq(sim);
    this.#reqs.set(r.id, r);
    this.#emit({ type: 'status', step: this.step, requestId: r.id, from: 'new', to: 'waiting' });
    if (Math.ceil((r.promptLen + r.outputTarget) / bs) > this.#d.allocator.numBlocks) {
      this.#setStatus(r, 'failed');
      this.counters.failedTooLarge++;
      this.counters.unserved += r.promptLen;
      return;
    }
    this.#waiting.push(r);
  }

  /**
   * vLLM `update_from_output`, connector part: frees delayed requests the worker reports in
   * `finishedSending`, and settles loads in `finishedRecving` (verify the valid blocks, roll
   * back to the last valid prefix or fail the request).
   */
  processWorkerOutput(
    sending: ReadonlySet<string>,
    recving: ReadonlySet<string>,
    invalid: Iterable<number>,
  ): void {
    for (const b of invalid) this.#pendingInvalid.add(b);
    for (const id of recving) {
      const r = this.#reqs.get(id);
      if (r === undefined) continue;
      if (r.status !== 'waiting_for_remote_kvs' || r.load === null) {
        // Ended while loading: the engine kept its blocks until now (as vLLM does), frees them.
        if (r.load !== null) for (const b of r.load.blocks) this.#pendingInvalid.delete(b);
        r.load = null;
        if (this.#awaitingRecv.delete(id)) this.#freeBlocks(r, true);
        continue;
      }
      this.#settleLoad(r, r.load);
    }
    for (const id of sending) {
      const r = this.#awaitingFree.get(id);
      // vLLM asserts the request is still known: a free the connector delayed, not one it freed.
      if (r === undefined)
        throw new Error(`finishedSending names ${id}, which the engine no longer holds`);
      this.#awaitingFree.delete(id);
      this.#freeBlocks(r, true);
    }
  }

  /**
   * One scheduling pass: running requests first (decode or the rest of a chunked prefill,
   * preempting the newest running request when blocks run out), then waiting ones (local prefix
   * cache, then the connector). Returns what runs this step.
   */
  schedule(): { scheduled: { r: Req; numNew: number }[]; preempted: string[] } {
    const d = this.#d;
    let budget = d.maxTokensPerStep;
    const scheduled: { r: Req; numNew: number }[] = [];
    const preempted: string[] = [];
    for (let i = 0; i < this.#running.length && budget > 0; i++) {
      const r = this.#running[i]!;
      const numNew = Math.min(r.promptLen + r.numOutput - r.numComputed, budget);
      if (numNew <= 0) continue;
      let ok = true;
      while (!this.#ensureBlocks(r, r.numComputed + numNew)) {
        const victim = this.#running[this.#running.length - 1]!;
        this.#preempt(victim);
        preempted.push(victim.id);
        if (victim === r) {
          ok = false;
          break;
        }
      }
      if (!ok) break;
      scheduled.push({ r, numNew });
      budget -= numNew;
    }
    // As vLLM: no new admissions in a step that had to preempt.
    if (preempted.length === 0) this.#scheduleWaiting(budget, scheduled);
    if (scheduled.length === 0 && this.#running.length === 0 && this.loading === 0) {
      // Nothing runs and nothing loads, yet waiting requests hold blocks the head needs: give
      // back the newest holder's blocks (a preemption of a waiting request), or none can move.
      const holder = this.#waiting.findLast((r) => r.blocks.length > 0);
      if (holder !== undefined && this.#waiting.length > 1) {
        this.#preempt(holder);
        preempted.push(holder.id);
      }
    }
    return { scheduled, preempted };
  }

  /** The connector's view of this step's scheduled requests (before the forward pass). */
  connectorStep(scheduled: readonly { r: Req; numNew: number }[]): ScheduledRequest[] {
    return scheduled.map(({ r, numNew }) => ({
      request: r.conn,
      blockIds: r.blocks,
      numComputedTokens: r.numComputed,
      numScheduledTokens: numNew,
    }));
  }

  /** Matches the metadata's loads to their requests (the lookup id names the pins). */
  noteLoads(loads: readonly LoadIntent[]): void {
    for (const l of loads) {
      const r = this.#reqs.get(l.requestId);
      if (r?.load != null) r.load.lookupId = l.lookupId;
    }
  }

  /**
   * The forward pass: writes the KV of every scheduled prompt token into its block, advances
   * the requests, publishes full prompt blocks to the prefix cache, samples a token for each
   * request that caught up, and finishes those that are done. Returns the tokens computed.
   */
  forward(scheduled: readonly { r: Req; numNew: number }[]): number {
    let tokens = 0;
    for (const { r, numNew } of scheduled) {
      if (r.status !== 'running') continue;
      const start = r.numComputed;
      const end = start + numNew;
      const promptEnd = Math.min(end, r.promptLen);
      if (start < promptEnd) {
        this.#kv?.write(r.hashes, r.blocks, start, promptEnd);
        r.adm.recomputed += promptEnd - start;
        computedChunks(r, this.#d, start, promptEnd);
        if (promptEnd === r.promptLen) prefillCompleted(this.counters, r);
      }
      tokens += numNew;
      r.numComputed = end;
      publishPrompt(r, this.#d.allocator, this.#d.blockSize);
      if (r.numComputed >= r.promptLen + r.numOutput) {
        if (r.numOutput === 0) r.firstTokenMs ??= this.clock.endMs;
        r.numOutput++;
        if (r.numOutput >= r.outputTarget) this.#end(r, 'finished');
      }
    }
    return tokens;
  }

  /** Aborts a request wherever it is. Returns false when it is unknown or already ended. */
  abort(requestId: string): boolean {
    const r = this.#reqs.get(requestId);
    if (
      r === undefined ||
      !['waiting', 'waiting_for_remote_kvs', 'running', 'preempted'].includes(r.status)
    )
      return false;
    this.#end(r, 'aborted');
    return true;
  }

  /** vLLM `reset_prefix_cache`: the engine's cache keys and the connector's cached answers. */
  resetPrefixCache(): boolean {
    this.#d.allocator.reset();
    for (const r of this.#reqs.values()) r.cachedBlocks = 0;
    return this.#d.connector.resetPrefixCache();
  }

  /** The waiting queue and the running list, in order (read-only views for the engine). */
  get waitingRequests(): readonly Req[] {
    return this.#waiting;
  }
  get runningRequests(): readonly Req[] {
    return this.#running;
  }

  /** A request's state, or undefined when it never arrived. */
  request(requestId: string): Readonly<Req> | undefined {
    return this.#reqs.get(requestId);
  }

  /**
   * Decode-only steps from `clock.startMs` in a tight loop (see `engine-fast-forward.ts`), when no
   * free is delayed and nothing waits, or (`withWaiting`: the connector answers every lookup at
   * once, with nothing to load) when no waiting request holds blocks or awaits an answer; the
   * caller checks that nothing is in flight.
   */
  fastForwardDecode(o: Omit<FastForwardLimits, 'nowMs' | 'admits'> & { withWaiting?: boolean }): {
    steps: number;
    endMs: number;
  } {
    const d = this.#d;
    const none = { steps: 0, endMs: this.clock.startMs };
    const run = this.#running;
    if (this.delayedFrees > 0 || run.length === 0 || run.length > d.maxTokensPerStep) return none;
    const w = this.#waiting;
    if (w.length > 0 && (o.withWaiting !== true || !w.every(quietWaiting))) return none;
    const admits = w.length > 0 ? () => headAdmits(w[0] as Req, run.length, d) : undefined;
    const r = fastForwardDecode(run, d.allocator, d.blockSize, {
      ...o,
      nowMs: this.clock.startMs,
      admits,
    });
    this.step += r.steps;
    return r;
  }

  #scheduleWaiting(budgetIn: number, scheduled: { r: Req; numNew: number }[]): void {
    const d = this.#d;
    const bs = d.blockSize;
    let budget = budgetIn;
    const stillWaiting: Req[] = [];
    let stop = false;
    for (const r of this.#waiting) {
      // A request back from its load holds the blocks it loaded into (vLLM serves these first,
      // from its skipped queue): a head that cannot get blocks must not hold it back.
      const holds = r.blocks.length > 0 && r.status !== 'waiting_for_remote_kvs';
      if ((stop && !holds) || r.status === 'waiting_for_remote_kvs') {
        stillWaiting.push(r);
        continue;
      }
      if (budget <= 0 || this.#running.length >= d.maxRunning) {
        stop = true;
        stillWaiting.push(r);
        continue;
      }
      let computed = r.numComputed;
      let hits: number[] = [];
      // A request that holds blocks came back from a load: it asks nothing again.
      if (r.blocks.length === 0) {
        hits = d.allocator.findCached(r.hashes, Math.floor((r.promptLen - 1) / bs), bs);
        const local = hits.length * bs;
        const [ext, loadAsync] = d.connector.getNumNewMatchedTokens(r.conn, local);
        if (ext === null) {
          if (!r.pendingLookup) this.counters.pendingLookups++;
          r.pendingLookup = true;
          this.counters.stepsWaited++;
          stillWaiting.push(r);
          continue;
        }
        // An answer after a pending lookup is kept by the connector; an immediate 0 may have
        // sent no lookup at all, and a later ask might.
        r.answered ||= r.pendingLookup;
        r.pendingLookup = false;
        if (loadAsync && ext > 0) {
          // As vLLM (`scheduler_reserve_full_isl`): admitted only when the whole sequence
          // fits, but blocks are taken for the tokens the load fills, not for the prefill after.
          if (!d.allocator.canAllocate(hits, fullBlocks(r, bs) - hits.length)) {
            stop = true;
            stillWaiting.push(r);
            continue;
          }
          this.#takeHits(r, hits);
          this.#ensureBlocks(r, local + ext);
          const tokens = this.#allocIntent(r, ext);
          r.firstHitTokens ??= local + tokens;
          if (tokens > 0) {
            r.load = {
              firstToken: local,
              tokens,
              blocks: r.blocks.slice(local / bs, (local + tokens) / bs),
              lookupId: '',
            };
            this.#setStatus(r, 'waiting_for_remote_kvs');
            r.firstScheduledMs ??= this.clock.startMs;
            stillWaiting.push(r);
            continue;
          }
          hits = [];
        }
        computed = local;
        r.firstHitTokens ??= local;
      }
      const numNew = Math.min(r.promptLen + r.numOutput - computed, budget);
      // vLLM's admission gate: blocks for the whole sequence must be free (prefix hits that
      // sit in the free queue count against them), though only this step's are taken.
      const need = Math.max(0, fullBlocks(r, bs) - Math.max(r.blocks.length, hits.length));
      if (!d.allocator.canAllocate(hits, need)) {
        stop = true;
        stillWaiting.push(r);
        continue;
      }
      if (hits.length > 0) this.#takeHits(r, hits);
      this.#ensureBlocks(r, computed + numNew);
      // As vLLM, after every admission's allocation: here with nothing to load.
      d.connector.updateStateAfterAlloc(r.conn, r.blocks, 0);
      r.numComputed = computed;
      this.#running.push(r);
      this.#setStatus(r, 'running');
      r.firstScheduledMs ??= this.clock.startMs;
      scheduled.push({ r, numNew });
      budget -= numNew;
    }
    this.#waiting = stillWaiting;
  }

  /** `updateStateAfterAlloc`, and again when the test hook asks for it; returns the final tokens. */
  #allocIntent(r: Req, ext: number): number {
    const d = this.#d;
    d.connector.updateStateAfterAlloc(r.conn, r.blocks, ext);
    this.#emit({ type: 'alloc-intent', step: this.step, requestId: r.id, externalTokens: ext });
    const again = d.onLoadAlloc?.({ requestId: r.id, blockIds: r.blocks, externalTokens: ext });
    if (again === undefined) return ext;
    d.connector.updateStateAfterAlloc(r.conn, r.blocks, again);
    this.#emit({ type: 'alloc-intent', step: this.step, requestId: r.id, externalTokens: again });
    return again;
  }

  #takeHits(r: Req, hits: readonly number[]): void {
    this.#d.allocator.touch(hits);
    r.blocks = [...hits];
    r.cachedBlocks = hits.length;
    r.adm.gpu += hits.length * this.#d.blockSize;
  }

  /** Grows the block table to hold `tokens`; false (taking nothing) when blocks run out. */
  #ensureBlocks(r: Req, tokens: number): boolean {
    const need = Math.ceil(tokens / this.#d.blockSize) - r.blocks.length;
    if (need <= 0) return true;
    const got = this.#d.allocator.allocate(need);
    if (got === null) return false;
    r.blocks.push(...got);
    return true;
  }

  #preempt(r: Req): void {
    r.ownProgress = Math.max(r.ownProgress, r.ownComputedEnd);
    r.answered = false;
    this.#running = this.#running.filter((x) => x !== r);
    this.#waiting = this.#waiting.filter((x) => x !== r);
    this.#d.allocator.free(r.blocks);
    r.blocks = [];
    r.numComputed = 0;
    r.cachedBlocks = 0;
    r.numPreemptions++;
    this.counters.preemptions++;
    discardAdmission(this.counters, r);
    this.#d.connector.requestPreempted(r.conn);
    this.#setStatus(r, 'preempted');
    this.#waiting.unshift(r);
  }

  #settleLoad(r: Req, load: NonNullable<Req['load']>): void {
    const d = this.#d;
    const bs = d.blockSize;
    const valid = verifyLoad(this.#kv, this.counters, r, load, this.#pendingInvalid);
    const validTokens = valid * bs;
    attribute(r, d.tiersOf(load.lookupId), load.firstToken, validTokens);
    if (d.ownChunks !== undefined)
      r.adm.crossNode += crossNodeTokens(r, d.ownChunks, load.firstToken, validTokens, d.chunkSize);
    r.load = null;
    this.#emit({
      type: 'load-done',
      step: this.step,
      requestId: r.id,
      tokens: load.tokens,
      validTokens,
    });
    r.numComputed = load.firstToken + validTokens;
    publishPrompt(r, this.#d.allocator, this.#d.blockSize);
    if (valid < load.blocks.length) {
      this.counters.invalidBlocks += load.blocks.length - valid;
      if (d.kvLoadFailurePolicy === 'fail') {
        this.counters.failedRequests++;
        this.#end(r, 'failed');
        return;
      }
      this.counters.recomputedAfterFailure += load.tokens - validTokens;
    }
    this.#setStatus(r, r.numPreemptions > 0 ? 'preempted' : 'waiting');
  }

  /** Terminal end: the connector decides whether the blocks wait for the worker. */
  #end(r: Req, to: 'finished' | 'failed' | 'aborted'): void {
    this.#running = this.#running.filter((x) => x !== r);
    this.#waiting = this.#waiting.filter((x) => x !== r);
    if (to === 'finished') finishedTiming(this.counters, r, this.clock.endMs);
    if (to === 'aborted') this.counters.aborted++;
    if (!r.prefillDone) this.counters.unserved += r.promptLen;
    r.adm = emptyAdmission();
    r.conn = { ...r.conn, aborted: to !== 'finished' };
    // Ended while loading: the blocks wait for the load's report (vLLM's finish_requests).
    const loading = r.status === 'waiting_for_remote_kvs' && r.load !== null;
    const [delayFree] = this.#d.connector.requestFinished(r.conn, r.blocks);
    this.#setStatus(r, to);
    r.pendingLookup = false;
    if (loading && delayFree) throw new Error(`${r.id}: ended while loading, and its free delayed`);
    if (loading) {
      r.delayedFree = true;
      this.#awaitingRecv.set(r.id, r);
    } else if (delayFree) {
      r.delayedFree = true;
      this.#awaitingFree.set(r.id, r);
    } else this.#freeBlocks(r, false);
  }

  #freeBlocks(r: Req, delayed: boolean): void {
    this.#d.allocator.free(r.blocks);
    r.blocks = [];
    r.delayedFree = false;
    this.#emit({ type: 'freed', step: this.step, requestId: r.id, delayed });
  }

  #setStatus(r: Req, to: SimRequestStatus): void {
    const from = r.status;
    r.status = to;
    if (from !== to) this.#emit({ type: 'status', step: this.step, requestId: r.id, from, to });
  }

  #emit(e: SimEvent): void {
    this.#d.onEvent?.(e);
  }
}
