/**
 * The data plane's messages (docs/protocol.md 4.9): REGISTER, SAVE, LOAD, HOLD,
 * REQUEST_FINISHED, HEARTBEAT and UNREGISTER; refused while the data plane is off.
 */
import type { DataPlane } from '../../data-plane/data-plane.ts';
import type { KvRegistration } from '../../data-plane/kv-layout.ts';
import { KvtierError } from '../../errors.ts';
import { hashesToHex } from '../../protocol/codec.ts';
import type { DataPlaneRequest } from '../../protocol/data-plane-messages.ts';
import { Deadline } from '../../util/deadline.ts';
import type { HandlerContext, Handlers } from './handler-types.ts';

/** Longest timer Node can arm, ms; longer load deadlines are cut to it. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

function dataPlane(ctx: HandlerContext): DataPlane {
  if (ctx.dataPlane === undefined)
    throw new KvtierError('KVT_INVALID_ARGUMENT', 'data plane not enabled');
  return ctx.dataPlane;
}

export const DATA_PLANE_HANDLERS: Handlers<DataPlaneRequest['type']> = {
  async register(ctx, req) {
    // Every field is validated by the data plane (resolveKvRegistration).
    const reg = req.registration as unknown as KvRegistration;
    const layout = await dataPlane(ctx).register(reg);
    return {
      type: 'register-result',
      requestId: req.requestId,
      engineId: layout.engineId,
      namespace: layout.namespace.id,
      chunkSize: layout.chunkSize,
      blockSize: layout.blockSize,
      // The order the registration named (validated), even where one head or one token per
      // block makes both the same bytes and the copies take the NHD path.
      blockLayout: reg.blockLayout ?? layout.blockLayout,
    };
  },
  async save(ctx, req) {
    const r = await dataPlane(ctx).save({
      engineId: req.engineId,
      requestId: req.engineRequestId,
      blockIds: req.blockIds,
      chunkHashes: hashesToHex(req.chunkHashes),
      skipChunks: req.skipChunks,
      ...(req.notAfterNs ? { notAfterNs: req.notAfterNs } : {}),
      ...(req.cudaEvent !== undefined ? { cudaEvent: req.cudaEvent } : {}),
      ...(req.fenceSlot !== undefined && req.fenceTicket !== undefined
        ? { fence: { slot: req.fenceSlot, ticket: req.fenceTicket } }
        : {}),
    });
    return { type: 'save-result', requestId: req.requestId, ...r };
  },
  async load(ctx, req) {
    const dp = dataPlane(ctx);
    // Relative deadline from receipt, as a signal only (the load is not raced): the data plane
    // checks it between copy groups and answers with what it loaded.
    const deadline = new Deadline({
      what: 'LOAD',
      timeoutMs: Math.min(req.deadlineMs === 0 ? ctx.loadDeadlineMs : req.deadlineMs, MAX_TIMER_MS),
    });
    try {
      const r = await dp.load(
        {
          engineId: req.engineId,
          requestId: req.engineRequestId,
          lookupId: req.lookupId,
          blockIds: req.blockIds,
          chunkHashes: hashesToHex(req.chunkHashes),
          ...(req.stateSlot >= 0 ? { stateSlot: req.stateSlot } : {}),
          ...(req.skipBlocks ? { skipBlocks: req.skipBlocks } : {}),
          ...(req.notAfterNs ? { notAfterNs: req.notAfterNs } : {}),
          ...(req.progressSlot !== undefined ? { progressSlot: req.progressSlot } : {}),
        },
        { signal: deadline.signal },
      );
      return {
        type: 'load-result',
        requestId: req.requestId,
        loadedTokens: r.loadedTokens,
        invalidBlockIds: Uint32Array.from(r.invalidBlockIds),
      };
    } finally {
      deadline.dispose();
    }
  },
  hold: (ctx, req) => ({
    type: 'hold-result',
    requestId: req.requestId,
    heldChunks: dataPlane(ctx).holdLookup(req.engineId, req.engineRequestId, req.lookupId),
  }),
  'request-finished'(ctx, req) {
    const dp = dataPlane(ctx);
    let released = false;
    if (req.kind === 'preempted') dp.requestPreempted(req.engineId, req.engineRequestId);
    else {
      released = dp.heartbeat(req.engineId);
      dp.requestFinished(req.engineId, req.engineRequestId);
    }
    return { type: 'request-finished-result', requestId: req.requestId, released };
  },
  heartbeat: (ctx, req) => ({
    type: 'heartbeat-result',
    requestId: req.requestId,
    known: dataPlane(ctx).heartbeat(req.engineId),
  }),
  // What a heartbeat timeout does, now: loads running for the engine stop at their next group.
  unregister: async (ctx, req) => ({
    type: 'unregister-result',
    requestId: req.requestId,
    released: await dataPlane(ctx).engineGone(req.engineId),
  }),
};
