/**
 * What the client commands share: where they write, how they reach the sidecar (endpoint, keys,
 * timeout from flags or the environment), and how their arguments (namespaces, chunk hashes)
 * are checked.
 */
import { isKvtierError } from '../errors.ts';
import type { LookupClient } from '../lookup-client/lookup-client.ts';
import { checkClientEndpoint } from '../protocol/endpoint.ts';
import { DEFAULT_ENDPOINT } from './commands.ts';
import { type ParsedCommand, parseIntFlag, stringOption, UsageError } from './options.ts';

/** Where a client command reads and writes; injected so tests run commands in-process. */
export interface CliIo {
  /** Writes one line to stdout (the newline is added). */
  out(line: string): void;
  /** Writes bytes to stdout as they are. */
  write(data: Uint8Array): Promise<void>;
  /** Writes one line to stderr (the newline is added). */
  err(line: string): void;
  /** All of stdin. */
  stdin(): Promise<Buffer>;
  /** Whether stdout is a terminal (binary output is refused there). */
  readonly stdoutIsTTY: boolean;
  readonly env: NodeJS.ProcessEnv;
}

/** The process's own stdin, stdout and stderr. */
export function processIo(): CliIo {
  return {
    out: (line) => process.stdout.write(`${line}\n`),
    write: (data) =>
      new Promise<void>((resolve, reject) =>
        process.stdout.write(data, (err) => (err ? reject(err) : resolve())),
      ),
    err: (line) => process.stderr.write(`${line}\n`),
    stdin: async () => {
      const parts: Buffer[] = [];
      for await (const chunk of process.stdin) parts.push(chunk as Buffer);
      return Buffer.concat(parts);
    },
    stdoutIsTTY: process.stdout.isTTY === true,
    env: process.env,
  };
}

/** Exit code of a command that ran but whose chunk is missing or was not stored. */
export const EXIT_NOT_THERE = 3;

type Parsed = ParsedCommand & { help: false };

/** The endpoint from `--endpoint`, else KVTIER_ENDPOINT, else the default; checked. */
export function endpointOf(parsed: Parsed, env: NodeJS.ProcessEnv): string {
  const flag = stringOption(parsed, 'endpoint');
  const fromEnv = env.KVTIER_ENDPOINT;
  const [what, endpoint] =
    flag !== undefined
      ? ['--endpoint', flag]
      : fromEnv !== undefined && fromEnv !== ''
        ? ['KVTIER_ENDPOINT', fromEnv]
        : ['--endpoint', DEFAULT_ENDPOINT];
  try {
    return checkClientEndpoint(what, endpoint);
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}

/** A connected client for a command's flags: endpoint, CurveZMQ keys, `--timeout-ms`. */
export async function openClient(
  parsed: Parsed,
  io: CliIo,
  defaultTimeoutMs: number,
  namespaces?: readonly string[],
): Promise<{ client: LookupClient; endpoint: string; timeoutMs: number }> {
  const endpoint = endpointOf(parsed, io.env);
  const raw = stringOption(parsed, 'timeout-ms');
  const timeoutMs =
    raw === undefined ? defaultTimeoutMs : parseIntFlag('--timeout-ms', raw, 1, 2 ** 31 - 1);
  // Loaded here, not at the top: `kvtier --help` and `version` need neither (cli/main.ts).
  const [{ clientCurveKeys }, { LookupClient }] = await Promise.all([
    import('./keygen-command.ts'),
    import('../lookup-client/lookup-client.ts'),
  ]);
  const curve = await clientCurveKeys(
    {
      'key-file': stringOption(parsed, 'key-file'),
      'server-key': stringOption(parsed, 'server-key'),
    },
    io.env,
  );
  const client = new LookupClient({
    endpoint,
    requestTimeoutMs: timeoutMs,
    lookupTimeoutMs: timeoutMs,
    ...(namespaces !== undefined ? { namespaces } : {}),
    ...(curve !== undefined ? { curve } : {}),
  });
  return { client, endpoint, timeoutMs };
}

/**
 * What a failed request says: a timeout names the endpoint and the wait (or, with CurveZMQ, that
 * no handshake completed, or why); a refusal gives the sidecar's code and message.
 */
export function requestFailure(
  cmd: string,
  endpoint: string,
  timeoutMs: number,
  err: unknown,
): string {
  if (isKvtierError(err, 'KVT_TIMEOUT') && !err.message.includes('handshake'))
    return `kvtier ${cmd}: no answer from ${endpoint} within ${timeoutMs} ms (is the sidecar running there?)`;
  if (isKvtierError(err))
    return `kvtier ${cmd}: ${err.code}: ${err.message.replace(/^server: /, '')}`;
  return `kvtier ${cmd}: ${err instanceof Error ? err.message : String(err)}`;
}

/** `--namespace`'s value: 32 hex digits, lowercased. @throws UsageError */
export function namespaceArg(value: string | undefined, required = true): string {
  if (value === undefined) {
    if (required) throw new UsageError('--namespace ID (32 hex digits) is required (see --help)');
    return '';
  }
  if (!/^[0-9a-fA-F]{32}$/.test(value))
    throw new UsageError(`--namespace must be 32 hex digits, got ${JSON.stringify(value)}`);
  return value.toLowerCase();
}

/**
 * A chunk hash given by a user: 64 hex digits, or a `kvtier hash` line (`<start> <end> <hash>`).
 * @returns the hash, lowercase. @throws UsageError naming `what`.
 */
export function hashArg(what: string, text: string | undefined): string {
  if (text === undefined) throw new UsageError(`${what} (64 hex digits) is required (see --help)`);
  const t = text.trim();
  const m = /^(?:\d+\s+\d+\s+)?([0-9a-fA-F]{64})$/.exec(t);
  if (m === null)
    throw new UsageError(
      `${what} must be a chunk hash of 64 hex digits (or a "<start> <end> <hash>" line of kvtier hash), got ${JSON.stringify(t.length > 80 ? `${t.slice(0, 80)}...` : t)}`,
    );
  return m[1]!.toLowerCase();
}
