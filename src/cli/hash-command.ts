import { isKvtierError } from '../errors.ts';
import {
  CHUNK_HASHER_DEFAULTS,
  type ChunkHasherOptions,
  hashChunks,
  hashToHex,
  MAX_CHUNK_SIZE,
} from '../hashing/chunk-hasher.ts';
import type { MultiModalSpan } from '../hashing/mm-spans.ts';
import { HASH } from './commands.ts';
import { helpText, parseCommand } from './options.ts';

/** What `kvtier hash` reads from and writes to; injected so tests need no process or files. */
export interface HashCommandIo {
  /** Whole standard input as text. */
  stdin: () => Promise<string>;
  /** Whole file at path `p` as UTF-8 text. */
  readFile: (p: string) => Promise<string>;
  /** Writes one line of output (no trailing newline). */
  out: (line: string) => void;
  /** Writes one line of diagnostics (no trailing newline). */
  err: (line: string) => void;
}

/** Exit code for bad flags or bad input. */
export const EXIT_USAGE = 2;

/** Usage text of `kvtier hash` (from its definition in commands.ts). */
export const HASH_COMMAND_USAGE = helpText(HASH);

/**
 * Runs `kvtier hash` with `argv` (the arguments after `hash`). Never throws for bad flags or
 * input: it prints one `kvtier hash: ...` line to `io.err` and resolves {@link EXIT_USAGE}.
 * @returns the exit code: 0 on success (also for `--help`), 2 on bad flags or input.
 * @throws only what `io` itself throws outside reading input (e.g. a failing `out`).
 */
export async function runHashCommand(argv: string[], io: HashCommandIo): Promise<number> {
  const fail = (msg: string): number => {
    io.err(`kvtier hash: ${msg}`);
    return EXIT_USAGE;
  };

  let values: {
    tokens?: string;
    'chunk-size'?: string;
    salt?: string;
    lora?: string;
    mm?: string[];
    partial?: boolean;
  };
  try {
    const parsed = parseCommand(HASH, argv);
    if (parsed.help) {
      for (const line of HASH_COMMAND_USAGE.split('\n')) io.out(line);
      return 0;
    }
    values = parsed.values as typeof values;
  } catch (err) {
    return fail(err instanceof Error ? err.message : String(err));
  }

  const opts: ChunkHasherOptions = {
    salt: values.salt ?? CHUNK_HASHER_DEFAULTS.salt,
    partial: values.partial ?? false,
    lora: values.lora ?? CHUNK_HASHER_DEFAULTS.lora,
  };
  const mm: MultiModalSpan[] = [];
  for (const raw of values.mm ?? []) {
    const m = /^(.+):([0-9]+):([0-9]+)$/s.exec(raw);
    if (m === null) {
      return fail(
        `--mm must be ID:OFFSET:LENGTH with decimal OFFSET and LENGTH, got ${JSON.stringify(raw)}`,
      );
    }
    mm.push({ id: m[1] as string, offset: Number(m[2]), length: Number(m[3]) });
  }
  if (mm.length > 0) opts.mm = mm;
  const rawChunkSize = values['chunk-size'];
  if (rawChunkSize !== undefined) {
    if (!/^[0-9]+$/.test(rawChunkSize)) {
      return fail(
        `--chunk-size must be an integer in [1, ${MAX_CHUNK_SIZE}], got ${JSON.stringify(rawChunkSize)}`,
      );
    }
    opts.chunkSize = Number(rawChunkSize);
  }

  const source = values.tokens === undefined ? 'stdin' : values.tokens;
  let text: string;
  try {
    text = values.tokens === undefined ? await io.stdin() : await io.readFile(values.tokens);
  } catch (err) {
    return fail(`cannot read ${source}: ${firstLine(err)}`);
  }

  let tokens: unknown;
  try {
    tokens = JSON.parse(text);
  } catch (err) {
    return fail(`${source} is not valid JSON: ${firstLine(err)}`);
  }
  if (!Array.isArray(tokens)) {
    return fail(`${source} must hold a JSON array of token ids, got ${jsonKind(tokens)}`);
  }

  let lines: string[];
  try {
    lines = hashChunks(tokens as number[], opts).map(
      (c) => `${c.start} ${c.end} ${hashToHex(c.hash)}`,
    );
  } catch (err) {
    if (isKvtierError(err, 'KVT_INVALID_ARGUMENT')) {
      return fail(asFlagMessage(firstLine(err)));
    }
    throw err;
  }
  for (const line of lines) io.out(line);
  if (lines.length === 0) {
    // Nothing to print is not an error, but says nothing of why: say it.
    const size = opts.chunkSize ?? CHUNK_HASHER_DEFAULTS.chunkSize;
    const n = (tokens as unknown[]).length;
    io.err(
      n === 0
        ? `kvtier hash: ${source} holds no tokens: no chunk to hash`
        : `kvtier hash: ${n} token${n === 1 ? '' : 's'} make no whole chunk of ${size}: nothing to hash (--partial hashes a trailing chunk shorter than ${size}; --chunk-size N sets the chunk size)`,
    );
  }
  return 0;
}

// Option errors name the hasher's option; the user typed the flag.
function asFlagMessage(msg: string): string {
  for (const [option, flag] of [
    ['chunkSize', '--chunk-size'],
    ['salt', '--salt'],
    ['lora', '--lora'],
  ] as const) {
    if (msg.startsWith(`${option} `)) return `${flag}${msg.slice(option.length)}`;
  }
  // `mm[2].id must be ...` -> `--mm #3: id must be ...`
  const span = /^mm\[(\d+)\]\.(.*)$/.exec(msg);
  if (span !== null) return `--mm #${Number(span[1]) + 1}: ${span[2]}`;
  return msg;
}

function firstLine(err: unknown): string {
  const msg = err instanceof Error ? err.message : String(err);
  return msg.split('\n', 1)[0] ?? msg;
}

function jsonKind(v: unknown): string {
  if (v === null) return 'null';
  return typeof v === 'object' ? 'an object' : `a ${typeof v}`;
}
