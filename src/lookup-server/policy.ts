/**
 * Who may send what: client roles, the message types each role may send, and the namespaces a
 * key may touch. Pure functions over decoded requests; the sidecar server's auth layer
 * (src/lookup-server/auth.ts) applies them before a request reaches storage or the data plane.
 * See docs/security.md.
 */
import { KvtierError } from '../errors.ts';
import type { Request } from '../protocol/messages.ts';

/** Client roles, least privileged first; each may send what the ones before it may. */
export const ROLES = ['lookup', 'worker', 'admin'] as const;
/** A client role. */
export type Role = (typeof ROLES)[number];

type RequestType = Request['type'];

/** The request types each role adds to the roles before it. */
const ROLE_ADDS: Readonly<Record<Role, readonly RequestType[]>> = {
  lookup: ['lookup', 'cancel', 'ping', 'stats'],
  worker: [
    'register',
    'save',
    'load',
    'hold',
    'request-finished',
    'heartbeat',
    'unregister',
    'get',
  ],
  admin: ['put', 'clear'],
};

/** The request types `role` may send. */
export function allowedTypes(role: Role): ReadonlySet<RequestType> {
  const out = new Set<RequestType>();
  for (const r of ROLES) {
    for (const t of ROLE_ADDS[r]) out.add(t);
    if (r === role) break;
  }
  return out;
}

const ALLOWED: ReadonlyMap<Role, ReadonlySet<RequestType>> = new Map(
  ROLES.map((r) => [r, allowedTypes(r)]),
);

/** The least privileged role that may send `type`. */
export function roleFor(type: RequestType): Role {
  return ROLES.find((r) => ALLOWED.get(r)!.has(type)) ?? 'admin';
}

/** An authenticated client: what its key may do. */
export interface Principal {
  /** The allow-list entry's name (for logs and errors); the key itself when it has none. */
  name: string;
  /** The client's public key, Z85. */
  publicKey: string;
  role: Role;
  /** Namespace ids (32 lowercase hex digits) the key may touch; undefined: every namespace. */
  namespaces?: ReadonlySet<string>;
}

/**
 * The namespaces a request touches, as far as the request itself says: LOOKUP's and CLEAR's
 * (an empty CLEAR means every namespace: `'all'`), PUT's and GET's. Data-plane requests name an
 * engine instead (its namespace is the registration's); CANCEL, PING and STATS name none.
 */
export function namespacesOf(req: Request): readonly string[] | 'all' {
  switch (req.type) {
    case 'lookup':
      return req.namespaces;
    case 'clear':
      return req.namespaces.length === 0 ? 'all' : req.namespaces;
    case 'put':
    case 'get':
      return [req.namespace];
    default:
      return [];
  }
}

function forbidden(p: Principal, what: string): KvtierError {
  return new KvtierError('KVT_FORBIDDEN', `client "${p.name}" (role ${p.role}) ${what}`);
}

/** Refuses a request type the principal's role does not include. @throws KvtierError KVT_FORBIDDEN */
export function checkRole(p: Principal, type: RequestType): void {
  if (!ALLOWED.get(p.role)!.has(type))
    throw forbidden(p, `may not send ${type.toUpperCase()} (needs role ${roleFor(type)})`);
}

/**
 * Refuses a request that would touch lookup `lookupId` (CANCEL, HOLD, LOAD, or a LOOKUP reusing
 * its id, which cancels it) when the lookup names a namespace outside the principal's
 * restriction. `namespaces`: the lookup's, undefined when the server does not know it.
 * @throws KvtierError KVT_FORBIDDEN naming the lookup and the namespace.
 */
export function checkLookup(
  p: Principal,
  lookupId: string,
  namespaces: readonly string[] | undefined,
): void {
  const allowed = p.namespaces;
  if (allowed === undefined || namespaces === undefined) return;
  for (const ns of namespaces)
    if (!allowed.has(ns))
      throw forbidden(
        p,
        `may not touch lookup ${JSON.stringify(lookupId)}: it names namespace ${ns}`,
      );
}

/**
 * Refuses namespaces outside the principal's restriction; `'all'` is refused for any restricted
 * key. @throws KvtierError KVT_FORBIDDEN naming the first namespace refused.
 */
export function checkNamespaces(p: Principal, namespaces: readonly string[] | 'all'): void {
  const allowed = p.namespaces;
  if (allowed === undefined) return;
  if (namespaces === 'all') throw forbidden(p, 'may not clear every namespace');
  for (const ns of namespaces)
    if (!allowed.has(ns)) throw forbidden(p, `may not use namespace ${ns}`);
}
