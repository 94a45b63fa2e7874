/**
 * Options of the peer tier, declared once ({@link PEER_OPTIONS}): {@link PeerBackendOptions},
 * their defaults, the resolver that validates them and the reader of a tier's config object.
 */
import * as v from 'valibot';
import { DEFAULT_LIMITS, WIRE_LIMITS } from '../../protocol/limits.ts';
import { isZ85Key, Z85_KEY_PATTERN, Z85_KEY_RULE } from '../../security/curve-keys.ts';
import { bytes, int, pattern, str, strict } from '../../util/schema-kit.ts';
import { describe } from '../../util/validate.ts';
import {
  defineTierOptions,
  type OptionsOf,
  optional,
  type ResolvedOf,
  required,
  withDefault,
} from '../core/tier-options.ts';

const MAX_MS = 600_000;
const NAME_RULE = 'must be 1 to 64 letters, digits, ".", "_" or "-"';
const PEERS_RULE = 'must be a non-empty array of { name, endpoint, publicKey | publicKeyFile }';
/** tcp://HOST:PORT (port 1..65535), ipc://PATH or inproc://NAME, as a client connects to it. */
const CLIENT_ENDPOINT =
  /^(tcp:\/\/(\[[0-9A-Fa-f:.]+\]|[^\s:/[\]]+):([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])|(ipc|inproc):\/\/\S+)$/;

const peerSchema = strict({
  name: pattern(/^[A-Za-z0-9_.-]{1,64}$/, NAME_RULE),
  endpoint: pattern(
    CLIENT_ENDPOINT,
    'must be a ZMQ endpoint: tcp://HOST:PORT (port 1..65535), ipc://PATH or inproc://NAME',
  ),
  publicKey: v.optional(
    v.pipe(
      pattern(Z85_KEY_PATTERN, Z85_KEY_RULE),
      v.check((k: string) => isZ85Key(k), `${Z85_KEY_RULE} (its value overflows 32 bytes)`),
    ),
  ),
  publicKeyFile: v.optional(str({ nonEmpty: true })),
});

/** One sidecar of the fleet, as the `peers` option lists it. */
export type PeerConfig = v.InferOutput<typeof peerSchema>;

const ENTRIES = {
  self: required(
    pattern(/^[A-Za-z0-9_.-]{1,64}$/, NAME_RULE),
    "This sidecar's name in `peers`: every sidecar lists the same peers and names itself here.",
  ),
  peers: required(
    v.pipe(
      v.array(peerSchema, (i) => `${PEERS_RULE}, got ${describe(i.input)}`),
      v.minLength(1, (i) => `${PEERS_RULE}, got ${describe(i.input)}`),
    ),
    'Every sidecar of the fleet, this one included: `{ name, endpoint, publicKey | publicKeyFile }`, the endpoint its server listens on and, with CurveZMQ, its server public key.',
  ),
  secretKeyFile: optional(
    str({ nonEmpty: true }),
    "This sidecar's CurveZMQ secret key (use its server key, security.serverSecretKeyFile): the peers allow-list its public key with role `peer`. Required when the peers have keys.",
  ),
  replicas: withDefault(
    int(1, 16),
    1,
    'Homes of each chunk (rendezvous hashing over `peers`): a save is sent to them, a miss asked of them.',
  ),
  timeoutMs: withDefault(
    int(1, MAX_MS),
    1000,
    "Deadline of one request to a peer, ms: a dead or frozen peer is a miss after it. Keep it below the engines' lookup deadline.",
  ),
  maxChunksPerRequest: withDefault(
    int(1, WIRE_LIMITS.maxChunksPerPeerGet),
    16,
    'Chunks one PEER_GET asks for; a larger read is split into requests sent at once.',
  ),
  failureThreshold: withDefault(
    int(1, 1000),
    3,
    'Requests in a row a peer must fail (time out, or no connection) before it is left out until it answers a PING again.',
  ),
  probeIntervalMs: withDefault(
    int(1, MAX_MS),
    1000,
    'How often a peer that is left out is sent a PING, ms.',
  ),
  maxChunkBytes: withDefault(
    bytes(1, 2 ** 32 - 1),
    DEFAULT_LIMITS.maxPayloadBytes,
    "Largest chunk payload sent or accepted, bytes (the peers' maxPayloadBytes, 128 MiB by default).",
  ),
  logIntervalMs: withDefault(
    int(1, 3_600_000),
    10_000,
    'Refused answers and failures are logged at most once per peer per this many ms, with a count of those left out.',
  ),
};

/** Peer tier options after defaults and validation. */
export type ResolvedPeerBackendOptions = ResolvedOf<typeof ENTRIES>;

function duplicate(values: readonly string[]): string | undefined {
  const seen = new Set<string>();
  for (const x of values) {
    if (seen.has(x)) return x;
    seen.add(x);
  }
  return undefined;
}

/** The peer tier's options: names, types, bounds, defaults and descriptions. */
export const PEER_OPTIONS = defineTierOptions({
  type: 'peer',
  description:
    "The other sidecars of the fleet (docs/fleet.md, Peers): a miss here is asked of the chunk's home sidecars, and a save is sent to them.",
  options: ENTRIES,
  example: {
    self: 'node-a',
    peers: [
      { name: 'node-a', endpoint: 'tcp://10.0.0.1:5555' },
      { name: 'node-b', endpoint: 'tcp://10.0.0.2:5555' },
    ],
  },
  checks: [
    (o) => {
      const name = duplicate(o.peers.map((p) => p.name));
      return name === undefined
        ? undefined
        : { key: 'peers', message: `must name each sidecar once, "${name}" appears twice` };
    },
    (o) => {
      const ep = duplicate(o.peers.map((p) => p.endpoint));
      return ep === undefined
        ? undefined
        : { key: 'peers', message: `must list each endpoint once, "${ep}" appears twice` };
    },
    (o) =>
      o.peers.some((p) => p.name === o.self)
        ? undefined
        : {
            key: 'self',
            message: `must name one of peers (${o.peers.map((p) => JSON.stringify(p.name)).join(', ')}), got "${o.self}"`,
          },
    (o) => {
      const i = o.peers.findIndex(
        (p) => p.publicKey !== undefined && p.publicKeyFile !== undefined,
      );
      return i < 0
        ? undefined
        : { key: 'peers', message: `must give peers[${i}] publicKey or publicKeyFile, not both` };
    },
    (o) => {
      const others = o.peers.filter((p) => p.name !== o.self);
      const keyed = others.filter(
        (p) => p.publicKey !== undefined || p.publicKeyFile !== undefined,
      );
      if (keyed.length === 0 && o.secretKeyFile === undefined) return undefined;
      const bare = others.find((p) => p.publicKey === undefined && p.publicKeyFile === undefined);
      if (bare !== undefined)
        return {
          key: 'peers',
          message: `must give every peer a public key when any has one or secretKeyFile is set (CurveZMQ to all or none); "${bare.name}" has none`,
        };
      return o.secretKeyFile === undefined
        ? {
            key: 'secretKeyFile',
            message:
              'is required when the peers have public keys (the peers authenticate this sidecar by it)',
          }
        : undefined;
    },
    (o) =>
      o.replicas !== undefined && o.replicas > o.peers.length
        ? {
            key: 'replicas',
            message: `must be at most the number of peers (${o.peers.length}), got ${o.replicas}`,
          }
        : undefined,
  ],
});

/** Options of the peer tier: the keys of {@link PEER_OPTIONS}. */
export type PeerBackendOptions = OptionsOf<typeof ENTRIES>;

/** Defaults of {@link PeerBackendOptions}. */
export const PEER_BACKEND_DEFAULTS = PEER_OPTIONS.defaults;

/**
 * Applies defaults and validates.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the bad option and what is allowed.
 */
export function resolvePeerBackendOptions(options: PeerBackendOptions): ResolvedPeerBackendOptions {
  return PEER_OPTIONS.resolve(options);
}

/**
 * Reads peer tier options from a plain config object (the keys of {@link PEER_OPTIONS}).
 * @throws KvtierError `KVT_CONFIG` naming the tier and the bad or unknown option.
 */
export function peerOptionsFromConfig(
  raw: Record<string, unknown>,
  tier = 'peer',
): PeerBackendOptions {
  return PEER_OPTIONS.fromConfig(raw, tier);
}
