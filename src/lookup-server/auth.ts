/**
 * CurveZMQ authentication and authorisation for the sidecar server (docs/security.md).
 *
 * libzmq authenticates each connection's Curve key through a ZAP handler (RFC 27) that this
 * class runs on `inproc://zeromq.zap.01` in a ZMQ context of its own (one handler per context,
 * so every server has its own). zeromq.js exposes no per-message metadata (the ZAP "User-Id"
 * cannot be read from a received message), so the handler instead names the connection: its
 * reply carries an `Identity` metadata property, which libzmq makes the connection's routing id
 * on the ROUTER. The id is minted per handshake as
 * `0x4b | client public key (32) | counter (8) | HMAC-SHA256(process secret, key | counter)[0..16)`,
 * so the server reads which key sent a message from the ROUTER's first frame and checks the MAC:
 * a routing id the handler did not mint (a client-chosen one) names no one and is refused with
 * KVT_UNAUTHENTICATED. Keys not on the allow-list fail the handshake and never reach the server.
 * A ZAP reply that wins the race against libzmq's peek (see #serveZap) leaves its connection
 * unnamed, so refused too; the clients then reconnect and send again (request-socket.ts).
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import * as zmq from 'zeromq';
import type { KvRegistration } from '../data-plane/kv-layout.ts';
import { resolveKvRegistration } from '../data-plane/kv-layout.ts';
import { KvtierError } from '../errors.ts';
import type { Request } from '../protocol/messages.ts';
import { curvePublicKey, isZ85Key, z85Encode } from '../security/curve-keys.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import { RateLimitedLog } from '../util/rate-limited-log.ts';
import { describe, requireInt, requireOneOf } from '../util/validate.ts';
import {
  checkLookup,
  checkNamespaces,
  checkRole,
  namespacesOf,
  type Principal,
  ROLES,
  type Role,
} from './policy.ts';

/** One allow-listed client key. */
export interface ClientGrant {
  /** For logs and error messages; default the key's first 8 characters. */
  name?: string;
  /** The client's Curve public key, Z85 (40 characters). */
  publicKey: string;
  role: Role;
  /** Namespace ids (32 hex digits) the key may touch; left out: every namespace. */
  namespaces?: readonly string[];
}

/** Options of {@link ServerAuth}. */
export interface ServerAuthOptions {
  /** The server's Curve secret key, Z85; its public key is derived from it. */
  secretKey: string;
  /** The allow-list: only these keys complete the handshake. */
  clients: readonly ClientGrant[];
  log?: Logger;
  /**
   * Test hook, not a config key: the wait before each ZAP reply, ms; default 5 (see
   * #serveZap). 0 lets the reply race libzmq's peek, which tests use to provoke the race.
   */
  zapReplyDelayMs?: number;
  /**
   * Test fault, not a config key: the first `n` handshakes of each allow-listed key are accepted
   * with a reply that mints no routing id, as when the reply loses the race, so every request
   * on those connections is refused with KVT_UNAUTHENTICATED. Default 0. The sidecar sets it
   * from `KVTIER_TEST_FAIL_FIRST_HANDSHAKES` (config/server-auth.ts).
   */
  failFirstHandshakes?: number;
  /**
   * Refused handshakes are logged at most once per this many ms per reason, with a count of the
   * ones left out; default 10 000.
   */
  refusalLogIntervalMs?: number;
}

/** ZAP domain of the sidecar server's ROUTER. */
export const ZAP_DOMAIN = 'kvtier';
const ZAP_ENDPOINT = 'inproc://zeromq.zap.01';
const ID_TAG = 0x4b;
const ID_BYTES = 1 + 32 + 8 + 16;
/** Wait before each ZAP reply, ms (see #serveZap): handshakes are serialised through it. */
const ZAP_REPLY_DELAY_MS = 5;
const MAX_DELAY_MS = 1000;
/** Routing ids verified and remembered; past this the memo starts over (it only saves MACs). */
const MEMO_MAX = 4096;

/** The namespace of an engine id the data plane has registered, or undefined. */
export type EngineNamespaceOf = (engineId: string) => string | undefined;

/** The namespaces of a lookup the server tracks, or undefined when it knows no such lookup. */
export type LookupNamespacesOf = (lookupId: string) => readonly string[] | undefined;

/**
 * The allow-list, the ZAP handler and the per-request checks. Owns its ZMQ context and handler
 * socket; `close()` after the ROUTER is closed.
 */
export class ServerAuth {
  /** The server's public key (Z85): what clients set as their `serverKey`. */
  readonly publicKey: string;
  readonly #secretKey: string;
  readonly #grants = new Map<string, Principal>();
  readonly #macKey = randomBytes(32);
  readonly #memo = new Map<string, Principal>();
  readonly #log: Logger;
  /** Refused handshakes: anyone who can reach the port can cause them, so rate-limited. */
  readonly #refusals: RateLimitedLog;
  readonly #context = new zmq.Context();
  #handler: zmq.Reply | undefined;
  #loop: Promise<void> | undefined;
  #counter = 0n;
  readonly #zapReplyDelayMs: number;
  readonly #failFirstHandshakes: number;
  /** Handshakes faulted per key (test fault only). */
  readonly #faulted = new Map<string, number>();

  /** @throws KvtierError KVT_INVALID_ARGUMENT for a bad key, role or namespace, or a key listed twice. */
  constructor(opts: ServerAuthOptions) {
    if (!isZ85Key(opts.secretKey))
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        'server secret key must be 40 characters of Z85',
      );
    this.#secretKey = opts.secretKey;
    this.publicKey = curvePublicKey(opts.secretKey);
    this.#log = opts.log ?? silentLogger;
    this.#refusals = new RateLimitedLog(this.#log, {
      intervalMs: opts.refusalLogIntervalMs ?? 10_000,
    });
    this.#zapReplyDelayMs = requireInt(
      'zapReplyDelayMs',
      opts.zapReplyDelayMs ?? ZAP_REPLY_DELAY_MS,
      0,
      MAX_DELAY_MS,
    );
    this.#failFirstHandshakes = requireInt('failFirstHandshakes', opts.failFirstHandshakes ?? 0, 0);
    for (const [key, p] of grantsOf(opts.clients)) this.#grants.set(key, p);
  }

  /**
   * Replaces the allow-list (SIGHUP reload): new keys complete handshakes from now on; a removed
   * key's connections are refused (KVT_UNAUTHENTICATED) from their next request, and a changed
   * role or namespace list applies to the next request of connections already open.
   * @returns how many grants were added, removed and changed.
   * @throws KvtierError KVT_INVALID_ARGUMENT as the constructor does; the old list stays then.
   */
  setClients(clients: readonly ClientGrant[]): { added: number; removed: number; changed: number } {
    const next = grantsOf(clients);
    let added = 0;
    let changed = 0;
    for (const [key, p] of next) {
      const old = this.#grants.get(key);
      if (old === undefined) added++;
      else if (!samePrincipal(old, p)) changed++;
    }
    const removed = [...this.#grants.keys()].filter((k) => !next.has(k)).length;
    this.#grants.clear();
    for (const [key, p] of next) this.#grants.set(key, p);
    this.#memo.clear();
    return { added, removed, changed };
  }

  /** Options that make a ROUTER a Curve server authenticated by this handler. */
  routerOptions(): Partial<zmq.SocketOptions<zmq.Router>> & { context: zmq.Context } {
    return {
      context: this.#context,
      curveServer: true,
      curveSecretKey: this.#secretKey,
      curvePublicKey: this.publicKey,
      zapDomain: ZAP_DOMAIN,
      // Without a handler, libzmq would let every key in; with this it refuses them all.
      zapEnforceDomain: true,
    };
  }

  /** Binds the ZAP handler; call before the ROUTER binds. */
  async start(): Promise<void> {
    if (this.#handler !== undefined) return;
    const rep = new zmq.Reply({ context: this.#context, linger: 0 });
    await rep.bind(ZAP_ENDPOINT);
    this.#handler = rep;
    this.#loop = this.#serveZap(rep);
  }

  async #serveZap(rep: zmq.Reply): Promise<void> {
    try {
      for await (const frames of rep) {
        const reply = this.#zapReply(frames);
        // libzmq peeks for the reply right after sending the request and only then applies the
        // client's own metadata; a reply already there would lose its Identity to the client's.
        if (this.#zapReplyDelayMs > 0)
          await new Promise((r) => setTimeout(r, this.#zapReplyDelayMs));
        await rep.send(reply);
      }
    } catch (err) {
      if (!rep.closed) this.#log.error('ZAP handler failed; new connections are refused', { err });
    }
  }

  /** RFC 27: version, request id, domain, address, identity, mechanism, credentials... */
  #zapReply(f: Buffer[]): Buffer[] {
    const version = f[0] ?? Buffer.from('1.0');
    const requestId = f[1] ?? Buffer.alloc(0);
    const deny = (status: string, text: string) => [
      version,
      requestId,
      Buffer.from(status),
      Buffer.from(text),
      Buffer.alloc(0),
      Buffer.alloc(0),
    ];
    if (f.length < 7 || version.toString() !== '1.0') return deny('500', 'malformed ZAP request');
    // The ZAP request's address is the connecting peer's IP address.
    const peer = f[3]!.toString();
    if (f[2]!.toString() !== ZAP_DOMAIN || f[5]!.toString() !== 'CURVE' || f[6]!.length !== 32) {
      this.#refusals.warn('handshake refused: not a CurveZMQ client', { peer });
      return deny('400', 'CURVE required');
    }
    const key = z85Encode(f[6]!);
    const p = this.#grants.get(key);
    if (p === undefined) {
      this.#refusals.warn('handshake refused: client key not on the allow-list', {
        peer,
        publicKey: key,
      });
      return deny('400', 'key not allowed');
    }
    const ok = [version, requestId, Buffer.from('200'), Buffer.from('OK'), Buffer.from(p.name)];
    const faulted = this.#faulted.get(key) ?? 0;
    if (faulted < this.#failFirstHandshakes) {
      this.#faulted.set(key, faulted + 1);
      this.#log.warn('test fault: handshake accepted without a minted routing id', {
        peer,
        client: p.name,
      });
      return [...ok, Buffer.alloc(0)];
    }
    this.#log.info('client authenticated', { peer, client: p.name, role: p.role });
    return [...ok, zmtpProperty('Identity', this.#mint(f[6]!))];
  }

  /**
   * Logs the handshakes `router` refuses before the allow-list is consulted (rate-limited): a
   * client without keys, or one that uses another server's public key. Call once, after binding.
   */
  watchHandshakes(router: zmq.Router): void {
    router.events.on('handshake:error:protocol', (e) => {
      const code = (e.error as { code?: string } | undefined)?.code;
      const msg =
        code === 'ERR_ZMTP_MECHANISM_MISMATCH'
          ? 'handshake refused: the client has no CurveZMQ keys'
          : code === 'ERR_ZMTP_CRYPTOGRAPHIC'
            ? "handshake refused: the client's server key is not this server's public key"
            : 'handshake refused: protocol error';
      // ZeroMQ reports the listening endpoint of a failed handshake, not the peer's address.
      this.#refusals.warn(msg, { endpoint: e.address, ...(code !== undefined ? { code } : {}) });
    });
  }

  #mint(rawKey: Buffer): Buffer {
    const id = Buffer.alloc(ID_BYTES);
    id[0] = ID_TAG;
    rawKey.copy(id, 1);
    id.writeBigUInt64BE(this.#counter++, 33);
    this.#mac(id.subarray(1, 41)).copy(id, 41);
    return id;
  }

  #mac(body: Buffer): Buffer {
    return createHmac('sha256', this.#macKey).update(body).digest().subarray(0, 16);
  }

  /** The client a ROUTER routing id names, or undefined when this handler did not mint it. */
  principalOf(routingId: Buffer): Principal | undefined {
    if (routingId.length !== ID_BYTES || routingId[0] !== ID_TAG) return undefined;
    const memoKey = routingId.toString('latin1');
    const known = this.#memo.get(memoKey);
    if (known !== undefined) return known;
    if (!timingSafeEqual(this.#mac(routingId.subarray(1, 41)), routingId.subarray(41)))
      return undefined;
    const p = this.#grants.get(z85Encode(routingId.subarray(1, 33)));
    if (p === undefined) return undefined;
    if (this.#memo.size >= MEMO_MAX) this.#memo.clear();
    this.#memo.set(memoKey, p);
    return p;
  }

  /**
   * Checks that the connection named by `routingId` may send `req`: its role, then every
   * namespace the request touches: the namespaces it names; for data-plane requests, the
   * engine's registered namespace (and for REGISTER also the namespace it would register); and
   * for a request that reaches a tracked lookup by its id (CANCEL, HOLD, LOAD, and LOOKUP, whose
   * reused id cancels the old lookup), that lookup's namespaces.
   * @throws KvtierError KVT_UNAUTHENTICATED for a connection without a minted id;
   *   KVT_FORBIDDEN for a wrong role or namespace (nothing is done then).
   */
  authorize(
    routingId: Buffer,
    req: Request,
    engineNamespace: EngineNamespaceOf,
    lookupNamespaces: LookupNamespacesOf = () => undefined,
  ): Principal {
    const p = this.principalOf(routingId);
    if (p === undefined)
      throw new KvtierError(
        'KVT_UNAUTHENTICATED',
        'this connection carries no identity the server issued; reconnect with an allow-listed key',
      );
    checkRole(p, req.type);
    this.#log.debug('request', {
      client: p.name,
      type: req.type,
      ...('lookupId' in req ? { lookupId: req.lookupId } : {}),
    });
    if (p.namespaces === undefined) return p;
    const named = namespacesOf(req);
    checkNamespaces(p, named);
    if ('lookupId' in req && typeof req.lookupId === 'string')
      checkLookup(p, req.lookupId, lookupNamespaces(req.lookupId));
    if ('engineId' in req) {
      const ns = engineNamespace(req.engineId);
      if (ns !== undefined) checkNamespaces(p, [ns]);
    } else if (req.type === 'register') {
      const reg = req.registration as unknown as KvRegistration;
      let ns: string | undefined;
      try {
        ns = resolveKvRegistration(reg).namespace.id;
      } catch {
        // Invalid: the data plane refuses it with the reason and registers nothing.
      }
      if (ns !== undefined) checkNamespaces(p, [ns]);
      // Registering an id again replaces the old registration: it must be the key's too.
      const old = typeof reg.engineId === 'string' ? engineNamespace(reg.engineId) : undefined;
      if (old !== undefined) checkNamespaces(p, [old]);
    }
    return p;
  }

  /** Closes the handler and the context's sockets. Idempotent; close the ROUTER first. */
  async close(): Promise<void> {
    this.#refusals.close();
    this.#handler?.close();
    await this.#loop;
  }
}

/** One ZMTP metadata property: name length (u8), name, value length (u32 BE), value. */
function zmtpProperty(name: string, value: Buffer): Buffer {
  const head = Buffer.alloc(1 + name.length + 4);
  head[0] = name.length;
  head.write(name, 1, 'latin1');
  head.writeUInt32BE(value.length, 1 + name.length);
  return Buffer.concat([head, value]);
}

/** The allow-list checked and keyed by public key. @throws KvtierError KVT_INVALID_ARGUMENT */
function grantsOf(clients: readonly ClientGrant[]): Map<string, Principal> {
  const grants = new Map<string, Principal>();
  clients.forEach((c, i) => {
    const at = `clients[${i}]`;
    if (!isZ85Key(c.publicKey))
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `${at}.publicKey must be 40 characters of Z85, got ${describe(c.publicKey)}`,
      );
    if (grants.has(c.publicKey))
      throw new KvtierError('KVT_INVALID_ARGUMENT', `${at}.publicKey is listed twice`);
    const role = requireOneOf(`${at}.role`, c.role, ROLES);
    let namespaces: Set<string> | undefined;
    if (c.namespaces !== undefined) {
      namespaces = new Set();
      for (const ns of c.namespaces) {
        if (typeof ns !== 'string' || !/^[0-9a-fA-F]{32}$/.test(ns))
          throw new KvtierError(
            'KVT_INVALID_ARGUMENT',
            `${at}.namespaces must hold namespace ids of 32 hex digits, got ${describe(ns)}`,
          );
        namespaces.add(ns.toLowerCase());
      }
    }
    grants.set(c.publicKey, {
      name: c.name ?? c.publicKey.slice(0, 8),
      publicKey: c.publicKey,
      role,
      ...(namespaces !== undefined ? { namespaces } : {}),
    });
  });
  return grants;
}

function samePrincipal(a: Principal, b: Principal): boolean {
  const ns = (p: Principal) => (p.namespaces === undefined ? '*' : [...p.namespaces].sort().join());
  return a.name === b.name && a.role === b.role && ns(a) === ns(b);
}
