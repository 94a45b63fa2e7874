/**
 * The sidecar's audit lines (component `kvtier.server.audit`): every request refused for who sent
 * it (KVT_UNAUTHENTICATED, KVT_FORBIDDEN) at warn, and every CLEAR at info, each naming the
 * client (its allow-list name; null without CurveZMQ, where the server knows no names).
 */
import { KvtierError } from '../errors.ts';
import type { Request } from '../protocol/messages.ts';
import type { Logger } from '../util/log.ts';
import type { ServerAuth } from './auth.ts';

/** Error codes that refuse a request for who sent it. */
const ACCESS_CODES = new Set(['KVT_UNAUTHENTICATED', 'KVT_FORBIDDEN']);

/** Writes the audit lines of one server. */
export class AuditLog {
  readonly #log: Logger;
  readonly #auth: ServerAuth | undefined;

  constructor(log: Logger, auth: ServerAuth | undefined) {
    this.#log = log;
    this.#auth = auth;
  }

  #client(routingId: Buffer | undefined): string | null {
    if (this.#auth === undefined || routingId === undefined) return null;
    return this.#auth.principalOf(routingId)?.name ?? null;
  }

  /** A request the auth layer refused (`err` is what was sent back); other errors are not audit events. */
  refused(routingId: Buffer | undefined, req: Request, err: unknown): void {
    if (!(err instanceof KvtierError) || !ACCESS_CODES.has(err.code)) return;
    this.#log.warn('request refused', {
      client: this.#client(routingId),
      type: req.type,
      code: err.code,
      reason: err.message,
      ...('lookupId' in req ? { lookupId: req.lookupId } : {}),
    });
  }

  /** A CLEAR that ran: what it cleared (`all` or the namespaces) and the epoch it set. */
  cleared(routingId: Buffer | undefined, namespaces: readonly string[], epoch: number): void {
    this.#log.info('clear', {
      client: this.#client(routingId),
      namespaces: namespaces.length === 0 ? 'all' : namespaces,
      epoch,
    });
  }

  /** A CLEAR that failed. */
  clearFailed(routingId: Buffer | undefined, namespaces: readonly string[], err: unknown): void {
    this.#log.warn('clear failed', {
      client: this.#client(routingId),
      namespaces: namespaces.length === 0 ? 'all' : namespaces,
      err,
    });
  }
}
