/**
 * The server's handlers, one module per message group, as one table by request type: a request
 * type the wire table (src/protocol/wire-table.ts) adds does not compile until it has a handler.
 * LOOKUP is the server's own (answered at once from host memory when it can).
 */
import type { Request } from '../../protocol/messages.ts';
import { DATA_PLANE_HANDLERS } from './data-plane-handlers.ts';
import type { Handler, Handlers } from './handler-types.ts';
import { PEER_HANDLERS } from './peer-handlers.ts';
import { STORE_HANDLERS } from './store-handlers.ts';

export { type HandlerContext, releaseReply } from './handler-types.ts';

/** Every request type but LOOKUP. */
export type HandledType = Exclude<Request['type'], 'lookup'>;

export const HANDLERS: Handlers<HandledType> = {
  ...STORE_HANDLERS,
  ...DATA_PLANE_HANDLERS,
  ...PEER_HANDLERS,
};

/** The handler of `req`'s type. */
export function handlerOf<T extends HandledType>(req: { type: T }): Handler<T> {
  return HANDLERS[req.type] as Handler<T>;
}
