/**
 * The `kvtier` command. This module loads only the command definitions and the flag parser:
 * each command's code is imported when that command runs, so `kvtier version` and `--help` start
 * in about the time of node itself, and a client command loads the client, not the server
 * (bench/startup.ts measures both; test/integration/cli-startup.test.ts checks what loads).
 */
import { isKvtierError } from '../errors.ts';
import { KVTIER_VERSION } from '../version.ts';
import type { CliIo } from './client-io.ts';
import {
  CLEAR,
  GET,
  LOOKUP,
  LS,
  PING,
  PUT,
  SERVE,
  STATS,
  topLevelHelp,
  VERSION,
} from './commands.ts';
import { type CommandSpec, helpText, type ParsedCommand, parseCommand } from './options.ts';

type Parsed = ParsedCommand & { help: false };
type Body = (parsed: Parsed, io: CliIo) => Promise<number>;

/** The commands parsed from their definition in commands.ts, with what runs them. */
const SPEC_COMMANDS: ReadonlyMap<string, readonly [CommandSpec, Body]> = new Map<
  string,
  readonly [CommandSpec, Body]
>([
  ['serve', [SERVE, async (p, io) => (await import('./serve-command.ts')).runServe(p, io)]],
  ['lookup', [LOOKUP, async (p, io) => (await import('./client-commands.ts')).runLookup(p, io)]],
  [
    'stats',
    [STATS, async (p, io) => (await import('./client-commands.ts')).runQuery('stats', p, io)],
  ],
  ['ping', [PING, async (p, io) => (await import('./client-commands.ts')).runQuery('ping', p, io)]],
  ['put', [PUT, async (p, io) => (await import('./data-commands.ts')).runPut(p, io)]],
  ['get', [GET, async (p, io) => (await import('./data-commands.ts')).runGet(p, io)]],
  ['clear', [CLEAR, async (p, io) => (await import('./data-commands.ts')).runClear(p, io)]],
  ['ls', [LS, async (p, io) => (await import('./data-commands.ts')).runLs(p, io)]],
  [
    'version',
    [
      VERSION,
      async (_p, io) => {
        io.out(KVTIER_VERSION);
        return 0;
      },
    ],
  ],
]);

/** The process's own stdin, stdout and stderr (client-io.ts, loaded when first needed). */
async function defaultIo(): Promise<CliIo> {
  return (await import('./client-io.ts')).processIo();
}

/**
 * Runs the CLI; resolves the process exit code. Every failure is one line on stderr
 * (`kvtier CMD: what went wrong`): 2 for bad flags, arguments or config, 1 otherwise. A stack
 * trace is printed only for an unexpected error with KVTIER_DEBUG=1.
 */
export async function main(argv: string[], given?: CliIo): Promise<number> {
  const [cmd, ...rest] = argv;
  const out = (line: string) =>
    given !== undefined ? given.out(line) : process.stdout.write(`${line}\n`);
  const err = (line: string) =>
    given !== undefined ? given.err(line) : process.stderr.write(`${line}\n`);
  try {
    const spec = cmd === undefined ? undefined : SPEC_COMMANDS.get(cmd);
    if (spec !== undefined) {
      const parsed = parseCommand(spec[0], rest);
      if (parsed.help) {
        out(helpText(spec[0]));
        return 0;
      }
      if (cmd === 'version') {
        out(KVTIER_VERSION);
        return 0;
      }
      return await spec[1](parsed, given ?? (await defaultIo()));
    }
    switch (cmd) {
      case 'hash': {
        const io = given ?? (await defaultIo());
        const { readFile } = await import('node:fs/promises');
        return await (await import('./hash-command.ts')).runHashCommand(rest, {
          out,
          err,
          stdin: async () => (await io.stdin()).toString('utf8'),
          readFile: (p) => readFile(p, 'utf8'),
        });
      }
      case 'config':
        return await (await import('./config-command.ts')).runConfigCommand(rest, {
          out,
          err,
          env: given?.env ?? process.env,
        });
      case 'keygen':
        return await (await import('./keygen-command.ts')).runKeygenCommand(rest, { out });
      case 'simulate': {
        const sim = await import('./simulate-command.ts');
        return await sim.runSimulateCommand(rest, sim.processSimulateIo());
      }
      case '--version':
        out(KVTIER_VERSION);
        return 0;
      case undefined:
      case 'help':
      case '--help':
      case '-h':
        if (cmd === 'help' && rest[0] !== undefined) return await main([rest[0], '--help'], given);
        out(topLevelHelp());
        return cmd === undefined ? 2 : 0;
      default:
        err(`kvtier: unknown command "${cmd}"`);
        err(topLevelHelp());
        return 2;
    }
  } catch (e) {
    if (isKvtierError(e)) {
      err(`kvtier ${cmd}: ${e.message}`);
      return e.code === 'KVT_CONFIG' || e.code === 'KVT_INVALID_ARGUMENT' ? 2 : 1;
    }
    const x = e instanceof Error ? e : new Error(String(e));
    err(`kvtier ${cmd}: unexpected error: ${x.message}`);
    if ((given?.env ?? process.env).KVTIER_DEBUG === '1') err(x.stack ?? '');
    else err('(KVTIER_DEBUG=1 prints the stack trace)');
    return 1;
  }
}
