/**
 * The storage manager's messages other than LOOKUP (docs/protocol.md 4.2-4.8): CANCEL, CLEAR,
 * PING, STATS, PUT and GET.
 */
import { asBuffer } from '../../protocol/frame.ts';
import type { Handlers } from './handler-types.ts';

export const STORE_HANDLERS: Handlers<'cancel' | 'clear' | 'ping' | 'stats' | 'put' | 'get'> = {
  cancel: (ctx, req) => ({
    type: 'cancel-result',
    requestId: req.requestId,
    // A lookup waiting for chunks saved elsewhere is between tries, or in one: end both.
    found: ctx.lookupAwaits.cancel(req.lookupId) || ctx.storage.cancel(req.lookupId),
  }),
  async clear(ctx, req, peer) {
    let epoch: number;
    try {
      epoch = await ctx.storage.clear(req.namespaces);
    } catch (err) {
      ctx.audit.clearFailed(peer, req.namespaces, err);
      throw err;
    }
    ctx.audit.cleared(peer, req.namespaces, epoch);
    return { type: 'clear-result', requestId: req.requestId, epoch };
  },
  ping: (ctx, req) => ({ type: 'pong', requestId: req.requestId, info: ctx.pingInfo() }),
  stats: (ctx, req) => ({
    type: 'stats-result',
    requestId: req.requestId,
    stats: {
      ...ctx.storage.stats(),
      lookupAwaits: ctx.lookupAwaits.stats(),
      ...(ctx.dataPlane === undefined ? {} : { dataPlane: ctx.dataPlane.stats() }),
      server: ctx.serverStats(),
    },
  }),
  async put(ctx, req) {
    const outcome = await ctx.storage.put(req.namespace, req.hash, {
      tokens: req.tokens,
      data: req.payload,
    });
    return { type: 'put-result', requestId: req.requestId, outcome };
  },
  async get(ctx, req) {
    const chunk = await ctx.storage.get(req.namespace, req.hash);
    return {
      type: 'get-result',
      requestId: req.requestId,
      found: chunk !== null,
      tokens: chunk?.tokens ?? 0,
      payload: chunk === null ? Buffer.alloc(0) : asBuffer(chunk.data),
    };
  },
};
