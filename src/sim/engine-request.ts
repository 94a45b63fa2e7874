import type { BlockAllocator } from './block-allocator.ts';
import { emptyAdmission } from './engine-accounting.ts';
import type { Req } from './engine-scheduler-types.ts';
import { prefixHashes } from './kv-model.ts';
import type { SimRequest } from './types.ts';

/**
 * A request as the scheduler first tracks it: its prompt's prefix hashes (the engine's
 * prefix-cache keys are read from them), waiting, with nothing computed.
 */
export function newReq(sim: SimRequest): Req {
  const hashes = prefixHashes(sim.promptTokens);
  return {
    sim,
    id: sim.id,
    conn: { requestId: sim.id, promptTokenIds: sim.promptTokens },
    hashes,
    promptLen: sim.promptTokens.length,
    outputTarget: Math.max(1, sim.outputTokens),
    status: 'waiting',
    blocks: [],
    numComputed: 0,
    numOutput: 0,
    numPreemptions: 0,
    cachedBlocks: 0,
    pendingLookup: false,
    answered: false,
    load: null,
    delayedFree: false,
    adm: emptyAdmission(),
    prefillDone: false,
    firstHitTokens: undefined,
    ownComputedEnd: 0,
    ownProgress: 0,
    firstScheduledMs: undefined,
    firstTokenMs: undefined,
  };
}

/** Publishes the request's full, computed prompt blocks to the engine's prefix cache. */
export function publishPrompt(r: Req, allocator: BlockAllocator, bs: number): void {
  const full = Math.min(Math.floor(Math.min(r.numComputed, r.promptLen) / bs), r.blocks.length);
  for (let j = r.cachedBlocks; j < full; j++)
    allocator.cache(r.blocks[j]!, r.hashes, (j + 1) * bs - 1);
  r.cachedBlocks = Math.max(r.cachedBlocks, full);
}
