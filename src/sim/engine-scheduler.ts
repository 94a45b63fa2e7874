import type { LoadIntent, ScheduledRequest } from '../connector/types.ts';
import { KvtierError } from '../errors.ts';
import { attribute, discardAdmission, prefillCompleted } from './engine-accounting.ts';
import { KvChecker } from './engine-kv.ts';
import type {
  Req,
  SchedulerCounters,
  SimEvent,
  SimRequestStatus,
  SimSchedulerDeps,
} from './engine-scheduler-types.ts';
import { blockKey, prefixHashes } from './kv-model.ts';
import type { SimRequest } from './types.ts';

export type {
  AdmissionSources,
  CompletedPrefill,
  LoadAllocInfo,
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

const MAX_MISMATCHES = 20;

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
  readonly #kv: KvChecker;
  step = 0;
  readonly counters: SchedulerCounters;

  constructor(deps: SimSchedulerDeps, tierNames: readonly string[]) {
    this.#d = deps;
    this.#kv = new KvChecker(deps.kv, deps.blockSize);
    this.counters = {
      gpuPrefixCache: 0,
      byTier: Object.fromEntries(tierNames.map((n) => [n, 0])),
      recomputed: 0,
      unserved: 0,
      preemptions: 0,
      preemptionRecomputed: 0,
      preemptionReloaded: 0,
      prefills: [],
      pendingLookups: 0,
      stepsWaited: 0,
      verifiedBlocks: 0,
      mismatchedBlocks: 0,
      mismatches: [],
      invalidBlocks: 0,
      recomputedAfterFailure: 0,
      failedRequests: 0,
      failedTooLarge: 0,
      finished: 0,
      aborted: 0,
    };
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
    let n = 0;
    for (const r of this.#waiting) if (r.status === 'waiting_for_remote_kvs') n++;
    return n;
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
    const hashes = prefixHashes(sim.promptTokens);
    const keys: string[] = [];
    for (let j = 0; (j + 1) * bs <= sim.promptTokens.length; j++)
      keys.push(blockKey(hashes, (j + 1) * bs - 1));
    const r: Req = {
      sim,
      id: sim.id,
      conn: { requestId: sim.id, promptTokenIds: sim.promptTokens },
      hashes,
      keys,
      promptLen: sim.promptTokens.length,
      outputTarget: Math.max(1, sim.outputTokens),
      status: 'waiting',
      blocks: [],
      numComputed: 0,
      numOutput: 0,
      numPreemptions: 0,
      cachedBlocks: 0,
      pendingLookup: false,
      load: null,
      delayedFree: false,
      adm: { gpu: 0, tiers: {}, recomputed: 0 },
      prefillDone: false,
    };
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
        this.#kv.write(r.hashes, r.blocks, start, promptEnd);
        r.adm.recomputed += promptEnd - start;
        if (promptEnd === r.promptLen) prefillCompleted(this.counters, r);
      }
      tokens += numNew;
      r.numComputed = end;
      this.#publish(r);
      if (r.numComputed >= r.promptLen + r.numOutput) {
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

  /** Whether any waiting request is waiting on its lookup. */
  get waitingOnLookups(): boolean {
    return this.#waiting.some((r) => r.pendingLookup);
  }

  #scheduleWaiting(budgetIn: number, scheduled: { r: Req; numNew: number }[]): void {
    const d = this.#d;
    const bs = d.blockSize;
    let budget = budgetIn;
    const stillWaiting: Req[] = [];
    let stop = false;
    for (const r of this.#waiting) {
      // A request back from its load holds its prompt's blocks already: a head that cannot get
      // blocks must not hold it back (it would be preempted to free blocks and load again, forever).
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
        hits = d.allocator.findCached(r.keys.slice(0, Math.floor((r.promptLen - 1) / bs)));
        const local = hits.length * bs;
        const [ext, loadAsync] = d.connector.getNumNewMatchedTokens(r.conn, local);
        if (ext === null) {
          if (!r.pendingLookup) this.counters.pendingLookups++;
          r.pendingLookup = true;
          this.counters.stepsWaited++;
          stillWaiting.push(r);
          continue;
        }
        r.pendingLookup = false;
        if (loadAsync && ext > 0) {
          // Blocks for the whole prompt, not just the loaded part: a loaded request that then
          // cannot get blocks for its prefill would hold its blocks while waiting for others'.
          const whole = Math.ceil(r.promptLen / bs);
          if (!d.allocator.canAllocate(hits, whole - hits.length)) {
            stop = true;
            stillWaiting.push(r);
            continue;
          }
          this.#takeHits(r, hits);
          this.#ensureBlocks(r, r.promptLen);
          const tokens = this.#allocIntent(r, ext);
          if (tokens > 0) {
            r.load = {
              firstToken: local,
              tokens,
              blocks: r.blocks.slice(local / bs, (local + tokens) / bs),
              lookupId: '',
            };
            this.#setStatus(r, 'waiting_for_remote_kvs');
            stillWaiting.push(r);
            continue;
          }
          hits = [];
        }
        computed = local;
      }
      const numNew = Math.min(r.promptLen + r.numOutput - computed, budget);
      const need = Math.ceil((computed + numNew) / bs) - Math.max(r.blocks.length, hits.length);
      if (!d.allocator.canAllocate(hits, Math.max(0, need))) {
        stop = true;
        stillWaiting.push(r);
        continue;
      }
      if (hits.length > 0) this.#takeHits(r, hits);
      this.#ensureBlocks(r, computed + numNew);
      r.numComputed = computed;
      this.#running.push(r);
      this.#setStatus(r, 'running');
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
    let valid = load.blocks.length;
    for (let i = 0; i < load.blocks.length; i++) {
      if (this.#pendingInvalid.has(load.blocks[i]!)) {
        valid = Math.min(valid, i);
        this.#pendingInvalid.delete(load.blocks[i]!);
      }
    }
    const firstBlock = load.firstToken / bs;
    for (let i = 0; i < valid; i++) {
      const layer = this.#kv.verify(r.hashes, firstBlock + i, load.blocks[i]!);
      if (layer < 0) this.counters.verifiedBlocks++;
      else {
        this.counters.mismatchedBlocks++;
        if (this.counters.mismatches.length < MAX_MISMATCHES)
          this.counters.mismatches.push({ requestId: r.id, block: firstBlock + i, layer });
      }
    }
    const validTokens = valid * bs;
    attribute(r, d.tiersOf(load.lookupId), load.firstToken, validTokens);
    r.load = null;
    this.#emit({
      type: 'load-done',
      step: this.step,
      requestId: r.id,
      tokens: load.tokens,
      validTokens,
    });
    r.numComputed = load.firstToken + validTokens;
    this.#publish(r);
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

  /** Publishes the request's full, computed prompt blocks to the prefix cache. */
  #publish(r: Req): void {
    const full = Math.min(
      Math.floor(Math.min(r.numComputed, r.promptLen) / this.#d.blockSize),
      r.blocks.length,
    );
    for (let j = r.cachedBlocks; j < full; j++) this.#d.allocator.cache(r.blocks[j]!, r.keys[j]!);
    r.cachedBlocks = Math.max(r.cachedBlocks, full);
  }

  /** Terminal end: the connector decides whether the blocks wait for the worker. */
  #end(r: Req, to: 'finished' | 'failed' | 'aborted'): void {
    this.#running = this.#running.filter((x) => x !== r);
    this.#waiting = this.#waiting.filter((x) => x !== r);
    if (to === 'finished') this.counters.finished++;
    if (to === 'aborted') this.counters.aborted++;
    if (!r.prefillDone) this.counters.unserved += r.promptLen;
    r.adm = { gpu: 0, tiers: {}, recomputed: 0 };
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
