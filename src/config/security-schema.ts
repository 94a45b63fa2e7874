/**
 * The config file's `security` section (CurveZMQ keys and the client allow-list, see
 * docs/security.md) and its checks across keys.
 */
import * as v from 'valibot';
import { ROLES, type Role } from '../lookup-server/policy.ts';
import { isZ85Key, Z85_KEY_PATTERN, Z85_KEY_RULE } from '../security/curve-keys.ts';
import { bool, type ConfigProblem, oneOf, pattern, str, strict } from '../util/schema-kit.ts';

const NAMESPACES_RULE = 'must be a non-empty array of namespace ids (32 hex digits)';

const clientSchema = strict({
  name: v.optional(v.pipe(str({ nonEmpty: true }), v.description('For logs and error messages.'))),
  publicKey: v.optional(
    v.pipe(
      pattern(Z85_KEY_PATTERN, Z85_KEY_RULE),
      v.check((k: string) => isZ85Key(k), `${Z85_KEY_RULE} (its value overflows 32 bytes)`),
      v.description("The client's Curve public key (Z85, 40 characters)."),
    ),
  ),
  publicKeyFile: v.optional(
    v.pipe(
      str({ nonEmpty: true }),
      v.description('A file holding the public key (kvtier keygen writes NAME.pub).'),
    ),
  ),
  role: v.pipe(
    oneOf(ROLES),
    v.description(
      "lookup: LOOKUP, CANCEL, PING, STATS; worker: also the data plane and GET; admin: also PUT and CLEAR (every message); peer: PING and the peer messages (another sidecar's peer tier).",
    ),
  ),
  namespaces: v.optional(
    v.pipe(
      v.array(
        pattern(/^[0-9a-fA-F]{32}$/, 'must be a namespace id (32 hex digits)'),
        NAMESPACES_RULE,
      ),
      v.minLength(1, NAMESPACES_RULE),
      v.description('Namespace ids the key may touch; left out: every namespace.'),
    ),
  ),
});

/** The `security` section. */
export const securitySchema = strict({
  serverSecretKeyFile: v.optional(
    v.pipe(
      str({ nonEmpty: true }),
      v.description(
        "The server's Curve secret key file (kvtier keygen writes NAME.key, mode 0600); turns CurveZMQ on.",
      ),
    ),
  ),
  clients: v.optional(
    v.pipe(
      v.array(clientSchema, 'must be an array of { publicKey | publicKeyFile, role, ... }'),
      v.description('The client keys allowed to connect, each with its role.'),
    ),
  ),
  allowUnauthenticated: v.optional(
    v.pipe(
      bool(),
      v.description(
        'Serve a non-loopback TCP endpoint without keys (refused otherwise); default false.',
      ),
    ),
  ),
});

/** One allow-listed client as the config gives it. */
export interface ClientConfig {
  name?: string;
  publicKey?: string;
  publicKeyFile?: string;
  role: Role;
  namespaces?: string[];
}

/** The `security` section after validation. */
export interface SecurityDocument {
  serverSecretKeyFile?: string;
  clients?: ClientConfig[];
  allowUnauthenticated?: boolean;
}

/** Checks across keys: one key source per client; keys and allow-list go together. */
export function checkSecurity(s: SecurityDocument | undefined, problems: ConfigProblem[]): void {
  if (s === undefined) return;
  s.clients?.forEach((c, i) => {
    if ((c.publicKey === undefined) === (c.publicKeyFile === undefined))
      problems.push({
        path: `security.clients[${i}]`,
        message: 'must give exactly one of publicKey and publicKeyFile',
      });
  });
  const hasClients = (s.clients?.length ?? 0) > 0;
  if (s.serverSecretKeyFile !== undefined && !hasClients)
    problems.push({
      path: 'security.clients',
      message:
        'must list at least one client key when serverSecretKeyFile is set (no one could connect)',
    });
  if (s.serverSecretKeyFile === undefined && s.clients !== undefined)
    problems.push({
      path: 'security.serverSecretKeyFile',
      message: 'is required when security.clients is given (the allow-list needs CurveZMQ)',
    });
}
