/**
 * From the config's `security` section to the sidecar server's {@link ServerAuth}, and the rule
 * for binds beyond this machine: a non-loopback TCP endpoint without keys is refused unless
 * `security.allowUnauthenticated` (or KVTIER_ALLOW_UNAUTHENTICATED=1) says so, and then served
 * with a warning. See docs/security.md for why.
 */
import { resolve } from 'node:path';
import { KvtierError } from '../errors.ts';
import { type ClientGrant, ServerAuth, type ServerAuthOptions } from '../lookup-server/auth.ts';
import { isLocalEndpoint } from '../protocol/endpoint.ts';
import { readKeyFile } from '../security/curve-keys.ts';
import type { Logger } from '../util/log.ts';
import type { KvtierConfig } from './config.ts';

/**
 * Test fault, read from the environment only (not a config key): the first N handshakes of each
 * allow-listed key mint no routing id ({@link ServerAuthOptions.failFirstHandshakes}), so that
 * tests of other processes (the Python client's) can make a sidecar refuse connections as
 * unauthenticated.
 */
export const TEST_FAIL_FIRST_HANDSHAKES_ENV = 'KVTIER_TEST_FAIL_FIRST_HANDSHAKES';

/**
 * Builds the server's authentication from config, reading the key files (relative paths against
 * `config.baseDir`); undefined when CurveZMQ is off. `env` is read only for the test fault
 * {@link TEST_FAIL_FIRST_HANDSHAKES_ENV}.
 * @throws KvtierError KVT_CONFIG for an unreadable or malformed key file, a secret key file
 *   readable by others, a bad allow-list, or a non-loopback endpoint without keys (unless
 *   allowed).
 */
export async function serverAuthFromConfig(
  config: KvtierConfig,
  log: Logger,
  env: Readonly<Record<string, string | undefined>> = process.env,
): Promise<ServerAuth | undefined> {
  const sec = config.security;
  const local = isLocalEndpoint(config.listen);
  if (sec.serverSecretKeyFile === null) {
    if (local) return undefined;
    if (!sec.allowUnauthenticated)
      throw new KvtierError(
        'KVT_CONFIG',
        `refusing to serve ${config.listen} without CurveZMQ keys: anyone who can reach it could write KV that engines load. ` +
          'Set security.serverSecretKeyFile and security.clients (kvtier keygen; docs/security.md), bind to loopback, ' +
          'or set security.allowUnauthenticated (KVTIER_ALLOW_UNAUTHENTICATED=1) on a network only trusted clients reach',
      );
    log.warn('serving a non-loopback endpoint without authentication', {
      endpoint: config.listen,
      see: 'docs/security.md',
    });
    return undefined;
  }
  const secretKey = await readKeyFile(
    resolve(config.baseDir, sec.serverSecretKeyFile),
    'security.serverSecretKeyFile',
    true,
  );
  const clients = await serverClientGrants(config);
  const fault = env[TEST_FAIL_FIRST_HANDSHAKES_ENV];
  let failFirstHandshakes = 0;
  if (fault !== undefined && fault !== '') {
    failFirstHandshakes = Number(fault);
    if (!Number.isInteger(failFirstHandshakes) || failFirstHandshakes < 0)
      throw new KvtierError(
        'KVT_CONFIG',
        `${TEST_FAIL_FIRST_HANDSHAKES_ENV} must be a non-negative integer, got ${JSON.stringify(fault)}`,
      );
    log.warn('test fault on: the first handshakes of each key mint no routing id', {
      [TEST_FAIL_FIRST_HANDSHAKES_ENV]: failFirstHandshakes,
    });
  }
  let auth: ServerAuth;
  try {
    auth = new ServerAuth({ secretKey, clients, log, failFirstHandshakes });
  } catch (err) {
    throw new KvtierError('KVT_CONFIG', `security: ${(err as Error).message}`, { cause: err });
  }
  log.info('CurveZMQ on', { serverPublicKey: auth.publicKey, clients: clients.length });
  return auth;
}

/**
 * The allow-list of `config.security.clients`, key files read (relative paths against
 * `config.baseDir`). @throws KvtierError KVT_CONFIG for a key file that cannot be read or holds
 * no key.
 */
export async function serverClientGrants(config: KvtierConfig): Promise<ClientGrant[]> {
  const clients: ClientGrant[] = [];
  for (const [i, c] of config.security.clients.entries()) {
    const publicKey =
      c.publicKey ??
      (await readKeyFile(
        resolve(config.baseDir, c.publicKeyFile!),
        `security.clients[${i}].publicKeyFile`,
        false,
      ));
    clients.push({
      publicKey,
      role: c.role,
      ...(c.name !== undefined ? { name: c.name } : {}),
      ...(c.namespaces !== undefined ? { namespaces: c.namespaces } : {}),
    });
  }
  return clients;
}
