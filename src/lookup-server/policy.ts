/**
 * Who may send what: client roles, the message types each role may send, and the namespaces a
 * key may touch. Pure functions over decoded requests; the sidecar server's auth layer
 * (src/lookup-server/auth.ts) applies them before a request reaches storage or the data plane.
 * See docs/security.md.
 */
import { KvtierError } from '../errors.ts';
import type { Request } from '../protocol/messages.ts';
import { MESSAGES } from '../protocol/wire-table.ts';

/**
 * Client roles. `lookup`, `worker` and `admin` each may send what the one before it may;
 * `peer` (another sidecar's peer tier) stands apart: the peer messages and PING only.
 */
export const ROLES = ['lookup', 'worker', 'admin', 'peer'] as const;
/** A client role. */
export type Role = (typeof ROLES)[number];

type RequestType = Request['type'];

/**
 * What each role may send: the role it includes, and the request types it adds. `admin` also
 * gets every request type of the message table that no role lists (a message added to the table
 * is an operator's until it is given to a lower role here).
 */
const ROLE_GRANTS: Readonly<Record<Role, { includes?: Role; adds: readonly RequestType[] }>> = {
  lookup: { adds: ['lookup', 'cancel', 'ping', 'stats'] },
  worker: {
    includes: 'lookup',
    adds: [
      'register',
      'save',
      'load',
      'hold',
      'request-finished',
      'heartbeat',
      'unregister',
      'get',
    ],
  },
  admin: { includes: 'worker', adds: ['put', 'clear'] },
  peer: { adds: ['ping', 'peer-contains', 'peer-get', 'peer-put'] },
};

const ALL_TYPES = MESSAGES.flatMap((m) => (m.dir === 'request' ? [m.tag as RequestType] : []));

/** The request types `role` may send. */
export function allowedTypes(role: Role): ReadonlySet<RequestType> {
  if (role === 'admin') return new Set(ALL_TYPES);
  const out = new Set<RequestType>();
  for (let r: Role | undefined = role; r !== undefined; r = ROLE_GRANTS[r].includes)
    for (const t of ROLE_GRANTS[r].adds) out.add(t);
  return out;
}

const ALLOWED: ReadonlyMap<Role, ReadonlySet<RequestType>> = new Map(
  ROLES.map((r) => [r, allowedTypes(r)]),
);

/** The role that grants `type` (the first in {@link ROLES} that lists it), else `admin`. */
export function roleFor(type: RequestType): Role {
  return ROLES.find((r) => ROLE_GRANTS[r].adds.includes(type)) ?? 'admin';
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

/** Per request type, the keys of its namespace fields (`ns`, `nsList`) in the message table. */
const NAMESPACE_FIELDS: ReadonlyMap<string, readonly { key: string; list: boolean }[]> = new Map(
  MESSAGES.map((m) => [
    m.tag,
    m.fields.flatMap((f) =>
      f.kind === 'ns' || f.kind === 'nsList' ? [{ key: f.key, list: f.kind === 'nsList' }] : [],
    ),
  ]),
);

/**
 * The namespaces a request touches, as far as the request itself says: those its namespace
 * fields name (LOOKUP's, CLEAR's, PUT's and GET's; an empty CLEAR means every namespace: `'all'`).
 * Data-plane requests name an engine instead (its namespace is the registration's); CANCEL, PING
 * and STATS name none.
 */
export function namespacesOf(req: Request): readonly string[] | 'all' {
  if (req.type === 'clear' && req.namespaces.length === 0) return 'all';
  const fields = NAMESPACE_FIELDS.get(req.type) ?? [];
  const only = fields.length === 1 ? fields[0]! : undefined;
  if (only?.list) return (req as unknown as Record<string, string[]>)[only.key]!;
  const named: string[] = [];
  for (const { key, list } of fields) {
    const v = (req as unknown as Record<string, unknown>)[key];
    if (list) named.push(...(v as string[]));
    else named.push(v as string);
  }
  return named;
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
