/**
 * `kvtier keygen`: a CurveZMQ key pair for the server or a client (docs/security.md), and the
 * keys the client commands (lookup, stats, ping) connect with.
 */
import { KvtierError } from '../errors.ts';
import type { ClientCurveKeys } from '../security/curve-client.ts';
import {
  curvePublicKey,
  generateCurveKeyPair,
  isZ85Key,
  readKeyFile,
  writeKeyPair,
} from '../security/curve-keys.ts';
import { KEYGEN } from './commands.ts';
import { helpText, parseCommand, stringOption } from './options.ts';

/** Where `kvtier keygen` writes. */
export interface KeygenIo {
  out: (line: string) => void;
}

/**
 * `kvtier keygen [--out DIR] [--name NAME]`: without --out, prints the pair as JSON
 * (`{"publicKey","secretKey"}`); with it, creates DIR when missing (mode 0700), writes
 * DIR/NAME.key (secret, mode 0600, never overwritten) and DIR/NAME.pub and prints the public key.
 * Resolves the exit code.
 * @throws UsageError on bad flags; KvtierError KVT_CONFIG when a file exists or cannot be written.
 */
export async function runKeygenCommand(args: string[], io: KeygenIo): Promise<number> {
  const parsed = parseCommand(KEYGEN, args);
  if (parsed.help) {
    io.out(helpText(KEYGEN));
    return 0;
  }
  const out = stringOption(parsed, 'out');
  const pair = generateCurveKeyPair();
  if (out === undefined) {
    io.out(JSON.stringify(pair));
    return 0;
  }
  const { secretPath, publicPath } = await writeKeyPair(
    out,
    stringOption(parsed, 'name') ?? 'kvtier',
    pair,
  );
  io.out(`wrote ${secretPath} (secret, mode 0600) and ${publicPath}`);
  io.out(`public key: ${pair.publicKey}`);
  return 0;
}

/**
 * The keys of a client command: `--key-file FILE` (or KVTIER_KEY_FILE), the client's secret key
 * (its public key is derived), and `--server-key KEY` (or KVTIER_SERVER_KEY), the server's public
 * key as Z85 text or a .pub file. Undefined when neither is given.
 * @throws KvtierError KVT_CONFIG when only one is given or a key is unreadable.
 */
export async function clientCurveKeys(
  flags: { 'key-file'?: string | undefined; 'server-key'?: string | undefined },
  env: NodeJS.ProcessEnv,
): Promise<ClientCurveKeys | undefined> {
  const keyFile = flags['key-file'] ?? env.KVTIER_KEY_FILE;
  const serverKey = flags['server-key'] ?? env.KVTIER_SERVER_KEY;
  if (!keyFile && !serverKey) return undefined;
  if (!keyFile || !serverKey)
    throw new KvtierError(
      'KVT_CONFIG',
      'CurveZMQ needs both --key-file (KVTIER_KEY_FILE) and --server-key (KVTIER_SERVER_KEY)',
    );
  // A public key file has the same form as a secret one; its name tells them apart.
  if (/\.pub$/i.test(keyFile))
    throw new KvtierError(
      'KVT_CONFIG',
      `--key-file ${keyFile} is a public key file (.pub): give this client's secret key file (NAME.key from kvtier keygen); its .pub goes in the sidecar's security.clients`,
    );
  if (!isZ85Key(serverKey) && /\.key$/i.test(serverKey))
    throw new KvtierError(
      'KVT_CONFIG',
      `--server-key ${serverKey} is a secret key file (.key): give the sidecar's public key, its .pub file or the Z85 text`,
    );
  const secretKey = await readKeyFile(keyFile, 'client secret key file', true);
  const serverPublicKey = isZ85Key(serverKey)
    ? serverKey
    : await readKeyFile(serverKey, 'server public key file', false);
  return { serverPublicKey, publicKey: curvePublicKey(secretKey), secretKey };
}
