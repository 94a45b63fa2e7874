/**
 * The client commands that move chunks or drop them: `put`, `get`, `clear`, `ls` (flags in
 * commands.ts). They speak the protocol's PUT, GET and CLEAR (docs/protocol.md 4.3, 4.6, 4.7),
 * so the sidecar's roles apply: PUT and CLEAR need an admin key, GET a worker key.
 */
import { readFile, writeFile } from 'node:fs/promises';
import type { LookupClient } from '../lookup-client/lookup-client.ts';
import {
  type CliIo,
  EXIT_NOT_THERE,
  hashArg,
  namespaceArg,
  openClient,
  requestFailure,
} from './client-io.ts';
import { type ParsedCommand, parseIntFlag, stringOption, UsageError } from './options.ts';

type Parsed = ParsedCommand & { help: false };

/** Runs `body` with a client for the command's flags; a failed request prints one line, exits 1. */
async function withClient(
  cmd: string,
  parsed: Parsed,
  io: CliIo,
  timeoutMs: number,
  body: (client: LookupClient) => Promise<number>,
): Promise<number> {
  const opened = await openClient(parsed, io, timeoutMs);
  try {
    return await body(opened.client);
  } catch (err) {
    if (err instanceof UsageError) throw err;
    io.err(requestFailure(cmd, opened.endpoint, opened.timeoutMs, err));
    return 1;
  } finally {
    await opened.client.close();
  }
}

/** `kvtier put`. Resolves the exit code: 0 stored or exists, 3 dropped. */
export async function runPut(parsed: Parsed, io: CliIo): Promise<number> {
  const namespace = namespaceArg(stringOption(parsed, 'namespace'));
  const hash = hashArg('--hash', stringOption(parsed, 'hash'));
  const rawTokens = stringOption(parsed, 'token-count');
  if (rawTokens === undefined) throw new UsageError('--token-count N is required (see --help)');
  const tokens = parseIntFlag('--token-count', rawTokens, 1, 2 ** 32 - 1);
  const file = parsed.positionals[0];
  let payload: Buffer;
  try {
    payload = file === undefined || file === '-' ? await io.stdin() : await readFile(file);
  } catch (err) {
    throw new UsageError(`cannot read ${file}: ${(err as Error).message}`);
  }
  if (payload.length === 0)
    throw new UsageError(
      `${file === undefined || file === '-' ? 'stdin' : file} is empty: a chunk has at least one byte`,
    );
  return withClient('put', parsed, io, 10_000, async (client) => {
    const outcome = await client.put(namespace, hash, tokens, payload);
    if (parsed.values.json === true)
      io.out(JSON.stringify({ namespace, hash, tokens, bytes: payload.length, outcome }));
    else io.out(`${outcome} ${hash} (${tokens} tokens, ${payload.length} bytes)`);
    return outcome === 'dropped' ? EXIT_NOT_THERE : 0;
  });
}

/** `kvtier get`. Resolves the exit code: 0 found, 3 not found. */
export async function runGet(parsed: Parsed, io: CliIo): Promise<number> {
  const namespace = namespaceArg(stringOption(parsed, 'namespace'));
  const hash = hashArg('--hash', stringOption(parsed, 'hash'));
  const out = stringOption(parsed, 'out');
  const json = parsed.values.json === true;
  if (out === undefined && !json && io.stdoutIsTTY)
    throw new UsageError(
      'refusing to write a chunk’s bytes to a terminal: give --out FILE, redirect stdout, or use --json',
    );
  return withClient('get', parsed, io, 10_000, async (client) => {
    const chunk = await client.get(namespace, hash);
    if (chunk !== null && out !== undefined) await writeFile(out, chunk.payload);
    if (json) {
      io.out(
        JSON.stringify({
          namespace,
          hash,
          found: chunk !== null,
          ...(chunk !== null ? { tokens: chunk.tokens, bytes: chunk.payload.length } : {}),
          ...(chunk !== null && out !== undefined ? { out } : {}),
        }),
      );
    } else if (chunk === null) {
      io.err(`kvtier get: no tier holds ${hash} in namespace ${namespace}`);
    } else if (out === undefined) {
      await io.write(chunk.payload);
    }
    return chunk === null ? EXIT_NOT_THERE : 0;
  });
}

/** `kvtier clear`. Resolves the exit code. */
export async function runClear(parsed: Parsed, io: CliIo): Promise<number> {
  const given = (parsed.values.namespace as string[] | undefined) ?? [];
  const all = parsed.values.all === true;
  if (all === given.length > 0)
    throw new UsageError(
      all
        ? 'give either --all or --namespace, not both'
        : 'give --namespace ID (repeatable) or --all to clear every namespace (see --help)',
    );
  const namespaces = [...new Set(given.map((ns) => namespaceArg(ns)))];
  return withClient('clear', parsed, io, 60_000, async (client) => {
    const epoch = await client.clear(namespaces);
    if (parsed.values.json === true)
      io.out(JSON.stringify({ cleared: all ? 'all' : namespaces, epoch }));
    else io.out(`cleared ${all ? 'every namespace' : namespaces.join(', ')}; epoch ${epoch}`);
    return 0;
  });
}

/** `kvtier ls`. Resolves the exit code: 0 every chunk there, 3 some missing. */
export async function runLs(parsed: Parsed, io: CliIo): Promise<number> {
  const namespace = namespaceArg(stringOption(parsed, 'namespace'));
  let lines: readonly string[] = parsed.positionals;
  let from = 'argument';
  if (lines.length === 0) {
    lines = (await io.stdin())
      .toString('utf8')
      .split('\n')
      .filter((l) => l.trim() !== '');
    from = 'stdin line';
  }
  const hashes = lines.map((l, i) => hashArg(`${from} ${i + 1}`, l));
  return withClient('ls', parsed, io, 10_000, async (client) => {
    const found: { hash: string; found: boolean; tokens?: number; bytes?: number }[] = [];
    for (const hash of hashes) {
      const chunk = await client.get(namespace, hash);
      found.push(
        chunk === null
          ? { hash, found: false }
          : { hash, found: true, tokens: chunk.tokens, bytes: chunk.payload.length },
      );
    }
    if (parsed.values.json === true) io.out(JSON.stringify({ namespace, chunks: found }));
    else
      for (const c of found)
        io.out(c.found ? `${c.hash} ${c.tokens} ${c.bytes}` : `${c.hash} missing`);
    return found.every((c) => c.found) ? 0 : EXIT_NOT_THERE;
  });
}
