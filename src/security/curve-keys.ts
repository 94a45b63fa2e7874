/**
 * CurveZMQ keys: Z85 text (ZeroMQ RFC 32) for 32-byte Curve25519 keys, the public key derived
 * from a secret one, key files, and key-pair generation for `kvtier keygen`.
 */
import { createPrivateKey, createPublicKey } from 'node:crypto';
import { chmod, mkdir, readFile, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import * as zmq from 'zeromq';
import { KvtierError } from '../errors.ts';
import { describe } from '../util/validate.ts';

const Z85_ALPHABET =
  '0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#';
const Z85_VALUE = new Map([...Z85_ALPHABET].map((c, i) => [c, i]));

/** A Z85 Curve key: 40 characters of the Z85 alphabet (32 bytes). */
export const Z85_KEY_PATTERN = /^[0-9a-zA-Z.\-:+=^!/*?&<>()[\]{}@%$#]{40}$/;

/** What a Z85 key must look like, for error messages. */
export const Z85_KEY_RULE = 'must be a CurveZMQ key: 40 characters of Z85 text (kvtier keygen)';

/** A CurveZMQ key pair in Z85 text. */
export interface CurveKeyPair {
  publicKey: string;
  secretKey: string;
}

/** True when `s` is a 40-character Z85 key whose value fits 32 bytes. */
export function isZ85Key(s: unknown): boolean {
  if (typeof s !== 'string' || !Z85_KEY_PATTERN.test(s)) return false;
  for (let i = 0; i < 40; i += 5) {
    let v = 0;
    for (let j = i; j < i + 5; j++) v = v * 85 + Z85_VALUE.get((s as string)[j]!)!;
    if (v > 0xffffffff) return false;
  }
  return true;
}

/** Decodes a Z85 key to its 32 bytes. @throws KvtierError KVT_INVALID_ARGUMENT when it is not one. */
export function z85Decode(s: string, name = 'key'): Buffer {
  if (!isZ85Key(s)) throw new KvtierError('KVT_INVALID_ARGUMENT', `${name} ${Z85_KEY_RULE}`);
  const out = Buffer.alloc(32);
  for (let i = 0; i < 8; i++) {
    let v = 0;
    for (let j = i * 5; j < i * 5 + 5; j++) v = v * 85 + Z85_VALUE.get(s[j]!)!;
    out.writeUInt32BE(v, i * 4);
  }
  return out;
}

/** Encodes bytes (a multiple of 4 long) as Z85. */
export function z85Encode(bytes: Uint8Array): string {
  if (bytes.length % 4 !== 0)
    throw new KvtierError('KVT_INVALID_ARGUMENT', 'Z85 encodes a multiple of 4 bytes');
  const view = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  let out = '';
  for (let i = 0; i < view.length; i += 4) {
    let v = view.readUInt32BE(i);
    const group: string[] = [];
    for (let j = 0; j < 5; j++) {
      group.push(Z85_ALPHABET[v % 85]!);
      v = Math.floor(v / 85);
    }
    out += group.reverse().join('');
  }
  return out;
}

/** PKCS#8 DER prefix of a raw X25519 private key (RFC 8410). */
const X25519_PKCS8_PREFIX = Buffer.from('302e020100300506032b656e04220420', 'hex');

/** The Curve25519 public key of a secret key (both Z85), as libzmq's zmq_curve_public computes it. */
export function curvePublicKey(secretKey: string): string {
  const raw = z85Decode(secretKey, 'secret key');
  const priv = createPrivateKey({
    key: Buffer.concat([X25519_PKCS8_PREFIX, raw]),
    format: 'der',
    type: 'pkcs8',
  });
  const spki = createPublicKey(priv).export({ format: 'der', type: 'spki' });
  return z85Encode(spki.subarray(spki.length - 32));
}

/** A new key pair from libzmq (libsodium's random source). */
export function generateCurveKeyPair(): CurveKeyPair {
  return zmq.curveKeyPair();
}

/**
 * Reads a key file: Z85 text, surrounding whitespace ignored. With `secret`, a file that group or
 * others may read is refused (as ssh refuses such private keys).
 * @throws KvtierError KVT_CONFIG naming the file and what is wrong.
 */
export async function readKeyFile(path: string, what: string, secret: boolean): Promise<string> {
  let text: string;
  try {
    if (secret && process.platform !== 'win32') {
      const mode = (await stat(path)).mode & 0o777;
      if ((mode & 0o077) !== 0)
        throw new KvtierError(
          'KVT_CONFIG',
          `${what} ${path} is readable by group or others (mode ${mode.toString(8).padStart(4, '0')}); chmod 600 it`,
        );
    }
    text = (await readFile(path, 'utf8')).trim();
  } catch (err) {
    if (err instanceof KvtierError) throw err;
    throw new KvtierError('KVT_CONFIG', `cannot read ${what} ${path}: ${(err as Error).message}`, {
      cause: err,
    });
  }
  if (isZ85Key(text)) return text;
  const shown = text.length > 60 ? `${text.slice(0, 60)}...` : text;
  throw new KvtierError(
    'KVT_CONFIG',
    `${what} ${path} ${Z85_KEY_RULE}, got ${secret ? `${text.length} characters` : describe(shown)}`,
  );
}

/**
 * Writes `<dir>/<name>.key` (the secret key, mode 0600, never overwritten) and `<dir>/<name>.pub`,
 * creating `dir` (and its parents, mode 0700) when missing.
 * @returns the two paths.
 * @throws KvtierError KVT_CONFIG when a file exists or cannot be written.
 */
export async function writeKeyPair(
  dir: string,
  name: string,
  pair: CurveKeyPair,
): Promise<{ secretPath: string; publicPath: string }> {
  if (!/^[A-Za-z0-9._-]+$/.test(name) || name.startsWith('.'))
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `key name must be letters, digits, ".", "_" or "-" (not starting with "."), got ${describe(name)}`,
    );
  const secretPath = join(dir, `${name}.key`);
  const publicPath = join(dir, `${name}.pub`);
  try {
    await mkdir(dir, { recursive: true, mode: 0o700 });
    // 'wx': refuse to replace a key someone may still use.
    await writeFile(secretPath, `${pair.secretKey}\n`, { mode: 0o600, flag: 'wx' });
    await chmod(secretPath, 0o600);
    await writeFile(publicPath, `${pair.publicKey}\n`, { mode: 0o644, flag: 'wx' });
  } catch (err) {
    throw new KvtierError('KVT_CONFIG', `cannot write key pair: ${(err as Error).message}`, {
      cause: err,
    });
  }
  return { secretPath, publicPath };
}
