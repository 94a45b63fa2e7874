/**
 * The client commands that read: `lookup`, `stats`, `ping`. Each connects, sends one request
 * and prints the answer; see commands.ts for their flags.
 */
import { readFile } from 'node:fs/promises';
import { KvtierError } from '../errors.ts';
import { hashChunks, MAX_CHUNK_SIZE } from '../hashing/chunk-hasher.ts';
import { type CliIo, namespaceArg, openClient, requestFailure } from './client-io.ts';
import { type ParsedCommand, parseIntFlag, stringOption, UsageError } from './options.ts';

type Parsed = ParsedCommand & { help: false };

/** `kvtier lookup`. Resolves the exit code. */
export async function runLookup(parsed: Parsed, io: CliIo): Promise<number> {
  const namespace = namespaceArg(stringOption(parsed, 'namespace'));
  const chunkSize = parseIntFlag(
    '--chunk-size',
    stringOption(parsed, 'chunk-size') ?? '256',
    1,
    MAX_CHUNK_SIZE,
  );
  const file = stringOption(parsed, 'tokens');
  let text: string;
  try {
    text = file !== undefined ? await readFile(file, 'utf8') : (await io.stdin()).toString('utf8');
  } catch (err) {
    throw new UsageError(`cannot read ${file}: ${(err as Error).message}`);
  }
  let tokens: unknown;
  try {
    tokens = JSON.parse(text);
  } catch {
    tokens = undefined;
  }
  if (!Array.isArray(tokens))
    throw new UsageError(`${file ?? 'stdin'} must hold a JSON array of token ids`);
  const chunks = hashChunks(tokens as number[], {
    chunkSize,
    salt: stringOption(parsed, 'salt') ?? '',
    partial: parsed.values.partial === true,
  });
  const { client, endpoint, timeoutMs } = await openClient(parsed, io, 5000, [namespace]);
  try {
    // A ping first: a lookup that times out is answered as a miss and says nothing of why.
    await client.ping();
    const answer = await client.lookupAsync(
      `cli-${process.pid}-${Date.now()}`,
      chunks.map((c) => c.hash),
      chunks.map((c) => c.end - c.start),
      { config: { pin: false } },
    );
    if (answer.status === 'timeout') {
      io.err(requestFailure('lookup', endpoint, timeoutMs, new KvtierError('KVT_TIMEOUT', '')));
      return 1;
    }
    const total = chunks.length === 0 ? 0 : chunks[chunks.length - 1]!.end;
    if (parsed.values.json === true) {
      io.out(
        JSON.stringify({
          status: answer.status,
          epoch: answer.epoch,
          hitTokens: answer.hitTokens,
          hitChunks: answer.hitChunks,
          tokens: total,
          chunks: chunks.length,
          tiers: answer.tiers,
        }),
      );
      return 0;
    }
    io.out(
      `${answer.hitTokens} of ${total} tokens cached (${answer.hitChunks} of ${chunks.length} chunks, epoch ${answer.epoch})`,
    );
    for (const t of answer.tiers) io.out(`  ${t.tier}: ${t.tokens} tokens`);
    return 0;
  } catch (err) {
    io.err(requestFailure('lookup', endpoint, timeoutMs, err));
    return 1;
  } finally {
    await client.close();
  }
}

/**
 * `kvtier stats` and `kvtier ping`: the answer as indented JSON, `--json` one line, `stats
 * --human` a table (stats-human.ts). Resolves the exit code.
 */
export async function runQuery(cmd: 'stats' | 'ping', parsed: Parsed, io: CliIo): Promise<number> {
  const { client, endpoint, timeoutMs } = await openClient(parsed, io, 3000);
  try {
    if (cmd === 'stats' && parsed.values.human === true) {
      if (parsed.values.json === true) throw new UsageError('give --json or --human, not both');
      const [stats, ping] = await Promise.all([client.stats(), client.ping()]);
      const { humanStats } = await import('./stats-human.ts');
      for (const line of humanStats(
        stats as Record<string, unknown>,
        ping as Record<string, unknown>,
        endpoint,
      ))
        io.out(line);
      return 0;
    }
    const info = cmd === 'stats' ? await client.stats() : await client.ping();
    io.out(parsed.values.json === true ? JSON.stringify(info) : JSON.stringify(info, null, 2));
    return 0;
  } catch (err) {
    if (err instanceof UsageError) throw err;
    io.err(requestFailure(cmd, endpoint, timeoutMs, err));
    return 1;
  } finally {
    await client.close();
  }
}
