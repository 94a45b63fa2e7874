/**
 * What a request handler of the server gets and gives: the server's parts it may use, and the
 * reply it returns (the server sends it, or an error reply when the handler throws).
 */
import type { DataPlane } from '../../data-plane/data-plane.ts';
import type { Reply, Request } from '../../protocol/messages.ts';
import type { LookupAwaiter } from '../../storage-manager/lookup-await.ts';
import type { StorageManager } from '../../storage-manager/storage-manager.ts';
import type { AuditLog } from '../audit.ts';

/** The server's parts a handler uses; one per server, the peer's identity per request. */
export interface HandlerContext {
  readonly storage: StorageManager;
  /** The lookups waiting for chunks saved elsewhere (LOOKUP `awaitChunks`). */
  readonly lookupAwaits: LookupAwaiter;
  /** Absent when the data plane is off: its messages are refused. */
  readonly dataPlane: DataPlane | undefined;
  /** Deadline of a LOAD that asks for the default (deadlineMs 0), ms. */
  readonly loadDeadlineMs: number;
  readonly audit: AuditLog;
  /** PONG's `info`. */
  pingInfo(): Record<string, unknown>;
  /** STATS' `server` part, this request not counted. */
  serverStats(): Record<string, number>;
}

/** The request of type `T`. */
export type RequestOf<T extends Request['type']> = Extract<Request, { type: T }>;

/**
 * The key of a reply's release hook: a reply built from borrowed bytes (chunks pinned in host
 * memory) carries one, and the server calls it once the reply has been encoded (the frame holds
 * its own copy then) or could not be. See {@link withRelease}.
 */
export const RELEASE_AFTER_REPLY: unique symbol = Symbol('kvtier.releaseAfterReply');

/** `rep` with a hook the server calls once it has encoded the reply (see {@link RELEASE_AFTER_REPLY}). */
export function withRelease<R extends Reply>(rep: R, release: () => void): R {
  return Object.assign(rep, { [RELEASE_AFTER_REPLY]: release });
}

/** Calls `rep`'s release hook, if it has one. */
export function releaseReply(rep: Reply): void {
  (rep as { [RELEASE_AFTER_REPLY]?: () => void })[RELEASE_AFTER_REPLY]?.();
}

/** Answers one request of type `T`; throws (a `KvtierError`) for an error reply. */
export type Handler<T extends Request['type']> = (
  ctx: HandlerContext,
  req: RequestOf<T>,
  peer: Buffer | undefined,
) => Reply | Promise<Reply>;

/** A handler for each of the given request types. */
export type Handlers<T extends Request['type']> = { readonly [K in T]: Handler<K> };
