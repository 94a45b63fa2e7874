import type { BlockAllocator } from './block-allocator.ts';
import type { Req, SimSchedulerDeps } from './engine-scheduler-types.ts';

/**
 * Decode-only steps run in a tight loop. While every running request decodes and nothing waits,
 * a step of the scheduler gives each running request one token and, every `blockSize` tokens, a
 * block: nothing else can change until a request finishes, a request arrives or blocks run out.
 * The loop does exactly that, so a long decode phase costs a few microseconds per step instead of
 * a turn of the engine loop; the scheduler's outcome is the same as stepping.
 *
 * Requests may also wait meanwhile when the caller can say, after a step has taken its blocks,
 * whether the head of the waiting queue would be admitted in that step (`admits`; the scheduler
 * answers only where no waiting request holds blocks or awaits kvtier, so a blocked head keeps
 * every other one waiting). The head's answer changes only when a running request ends (never in
 * the loop) or when a step's blocks evict a cached block (its prefix hits may shrink, which can
 * free the blocks they pinned): the loop asks again after every step that evicted, and stops before
 * a step in which the head would be admitted, with that step's blocks taken as the engine loop
 * takes them first; the engine loop then runs the step (its running requests find their blocks).
 */

/** What {@link fastForwardDecode} is allowed to run. */
export interface FastForwardLimits {
  maxSteps: number;
  /** Modeled time the first step starts at, ms. */
  nowMs: number;
  /** No step starts at or after this modeled time, ms (the next arrival). */
  untilMs: number;
  /** Modeled length of a decode step of `batch` requests whose contexts sum to `contextTokens`. */
  stepMs: (batch: number, contextTokens: number) => number;
  /** Called after each step with its length and the blocks requests then hold. */
  onStep?: (ms: number, usedBlocks: number) => void;
  /**
   * With requests waiting: whether the head of the waiting queue would be admitted in a step
   * whose running requests have taken their blocks (asked before the first step runs and after
   * any step's blocks evicted a cached block).
   */
  admits?: () => boolean;
}

/**
 * Runs decode steps for `running` (all decoding: `numComputed === promptLen + numOutput - 1`
 * is not required, only that no prompt token is left). Stops one step before the first request
 * would finish (its last step goes through the engine loop, which ends it), at the limits, or
 * when a step would need more blocks than are free (the engine loop then preempts).
 */
export function fastForwardDecode(
  running: readonly Req[],
  allocator: BlockAllocator,
  blockSize: number,
  lim: FastForwardLimits,
): { steps: number; endMs: number } {
  let left = Number.POSITIVE_INFINITY;
  for (const r of running) {
    if (r.status !== 'running' || r.numComputed < r.promptLen || r.numOutput < 1) return none();
    if (r.numComputed !== r.promptLen + r.numOutput - 1) return none();
    left = Math.min(left, r.outputTarget - r.numOutput);
  }
  const maxSteps = Math.min(lim.maxSteps, left - 1);
  let now = lim.nowMs;
  let steps = 0;
  let evictions = -1;
  while (steps < maxSteps && now < lim.untilMs) {
    let need = 0;
    let context = 0;
    for (const r of running) {
      context += r.numComputed;
      if (r.numComputed + 1 > r.blocks.length * blockSize) need++;
    }
    if (need > allocator.freeBlocks) break;
    for (const r of running) {
      if (r.numComputed + 1 > r.blocks.length * blockSize) {
        const got = allocator.allocate(1);
        if (got === null) throw new Error('fast-forward: a counted free block was not there');
        r.blocks.push(got[0] as number);
      }
    }
    if (lim.admits !== undefined && allocator.evictions !== evictions) {
      evictions = allocator.evictions;
      if (lim.admits()) break;
    }
    for (const r of running) {
      r.numComputed++;
      r.numOutput++;
    }
    const ms = lim.stepMs(running.length, context);
    now += ms;
    steps++;
    lim.onStep?.(ms, allocator.numBlocks - allocator.freeBlocks);
  }
  return { steps, endMs: now };

  function none(): { steps: number; endMs: number } {
    return { steps: 0, endMs: lim.nowMs };
  }
}

/** A waiting request that holds no blocks and awaits no lookup answer or load. */
export function quietWaiting(r: Req): boolean {
  return r.blocks.length === 0 && !r.pendingLookup && r.status !== 'waiting_for_remote_kvs';
}

/**
 * Whether the scheduler would admit `head`, the head of its waiting queue (a quiet one), in a step
 * whose `running` requests each decode one token: the same budget, running limit, local prefix
 * hits and block check, with no external tokens (asked only where the connector finds none), and
 * the same note of the first hits of a request asked for the first time.
 */
export function headAdmits(
  head: Req,
  running: number,
  d: Pick<SimSchedulerDeps, 'allocator' | 'blockSize' | 'maxTokensPerStep' | 'maxRunning'>,
): boolean {
  const budget = d.maxTokensPerStep - running;
  if (budget <= 0 || running >= d.maxRunning) return false;
  const bs = d.blockSize;
  const hits = d.allocator.findCached(head.hashes, Math.floor((head.promptLen - 1) / bs), bs);
  head.firstHitTokens ??= hits.length * bs;
  return d.allocator.canAllocate(hits, Math.max(0, fullBlocks(head, bs) - hits.length));
}

/**
 * Blocks of a request's whole sequence (prompt and the output so far): vLLM admits a waiting
 * request only when these fit (`scheduler_reserve_full_isl`, on by default), whatever part of
 * it the step computes.
 */
export function fullBlocks(r: Req, bs: number): number {
  return Math.ceil((r.promptLen + r.numOutput) / bs);
}
