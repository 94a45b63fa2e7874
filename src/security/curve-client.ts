/** The client side of CurveZMQ (docs/security.md): the keys a DEALER needs and their socket options. */
import { KvtierError } from '../errors.ts';
import { isZ85Key } from './curve-keys.ts';

/** A client's CurveZMQ keys, each Z85 text (40 characters). */
export interface ClientCurveKeys {
  /** The server's public key (what `kvtier keygen` wrote to the server's NAME.pub). */
  serverPublicKey: string;
  /** This client's public key; the server's allow-list gives it a role. */
  publicKey: string;
  /** This client's secret key. */
  secretKey: string;
}

/**
 * Socket options for a Curve client; none without keys.
 * @throws KvtierError KVT_INVALID_ARGUMENT naming a key that is not 40 characters of Z85.
 */
export function curveClientOptions(keys: ClientCurveKeys | undefined): {
  curveServerKey?: string;
  curvePublicKey?: string;
  curveSecretKey?: string;
} {
  if (keys === undefined) return {};
  for (const k of ['serverPublicKey', 'publicKey', 'secretKey'] as const)
    if (!isZ85Key(keys[k]))
      throw new KvtierError('KVT_INVALID_ARGUMENT', `curve.${k} must be 40 characters of Z85`);
  return {
    curveServerKey: keys.serverPublicKey,
    curvePublicKey: keys.publicKey,
    curveSecretKey: keys.secretKey,
  };
}
