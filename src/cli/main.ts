import { readFile } from 'node:fs/promises';
import { loadConfig } from '../config/config.ts';
import { isKvtierError } from '../errors.ts';
import { KVTIER_VERSION, Sidecar } from '../sidecar.ts';
import { formatBytes } from '../util/bytes.ts';
import { createLogger, type Logger } from '../util/log.ts';
import { runLookup, runQuery } from './client-commands.ts';
import { type CliIo, processIo } from './client-io.ts';
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
import { runConfigCommand } from './config-command.ts';
import { runClear, runGet, runLs, runPut } from './data-commands.ts';
import { runHashCommand } from './hash-command.ts';
import { runKeygenCommand } from './keygen-command.ts';
import {
  type CommandSpec,
  helpText,
  type ParsedCommand,
  parseCommand,
  parseIntFlag,
  stringOption,
  UsageError,
} from './options.ts';
import { processSimulateIo, runSimulateCommand } from './simulate-command.ts';

type Parsed = ParsedCommand & { help: false };
type Body = (parsed: Parsed, io: CliIo) => Promise<number>;

/** The commands parsed from their definition in commands.ts, with what runs them. */
const SPEC_COMMANDS: ReadonlyMap<string, readonly [CommandSpec, Body]> = new Map([
  ['serve', [SERVE, (p, io) => serve(p, io)]],
  ['lookup', [LOOKUP, runLookup]],
  ['stats', [STATS, (p, io) => runQuery('stats', p, io)]],
  ['ping', [PING, (p, io) => runQuery('ping', p, io)]],
  ['put', [PUT, runPut]],
  ['get', [GET, runGet]],
  ['clear', [CLEAR, runClear]],
  ['ls', [LS, runLs]],
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

/**
 * Runs the CLI; resolves the process exit code. Every failure is one line on stderr
 * (`kvtier CMD: what went wrong`): 2 for bad flags, arguments or config, 1 otherwise. A stack
 * trace is printed only for an unexpected error with KVTIER_DEBUG=1.
 */
export async function main(argv: string[], io: CliIo = processIo()): Promise<number> {
  const [cmd, ...rest] = argv;
  try {
    const spec = cmd === undefined ? undefined : SPEC_COMMANDS.get(cmd);
    if (spec !== undefined) {
      const parsed = parseCommand(spec[0], rest);
      if (parsed.help) {
        io.out(helpText(spec[0]));
        return 0;
      }
      return await spec[1](parsed, io);
    }
    const lines = { out: (l: string) => io.out(l), err: (l: string) => io.err(l) };
    switch (cmd) {
      case 'hash':
        return await runHashCommand(rest, {
          ...lines,
          stdin: async () => (await io.stdin()).toString('utf8'),
          readFile: (p) => readFile(p, 'utf8'),
        });
      case 'config':
        return await runConfigCommand(rest, { ...lines, env: io.env });
      case 'keygen':
        return await runKeygenCommand(rest, lines);
      case 'simulate':
        return await runSimulateCommand(rest, processSimulateIo());
      case '--version':
        io.out(KVTIER_VERSION);
        return 0;
      case undefined:
      case 'help':
      case '--help':
      case '-h':
        if (cmd === 'help' && rest[0] !== undefined) return await main([rest[0], '--help'], io);
        io.out(topLevelHelp());
        return cmd === undefined ? 2 : 0;
      default:
        io.err(`kvtier: unknown command "${cmd}"`);
        io.err(topLevelHelp());
        return 2;
    }
  } catch (err) {
    if (err instanceof UsageError) {
      io.err(`kvtier ${cmd}: ${err.message}`);
      return 2;
    }
    if (isKvtierError(err)) {
      io.err(`kvtier ${cmd}: ${err.message}`);
      return err.code === 'KVT_CONFIG' || err.code === 'KVT_INVALID_ARGUMENT' ? 2 : 1;
    }
    const e = err instanceof Error ? err : new Error(String(err));
    io.err(`kvtier ${cmd}: unexpected error: ${e.message}`);
    if (io.env.KVTIER_DEBUG === '1') io.err(e.stack ?? '');
    else io.err('(KVTIER_DEBUG=1 prints the stack trace)');
    return 1;
  }
}

/**
 * Node's process warnings (deprecations, the AWS SDK's notice about Node versions) as JSON log
 * lines instead of Node's own multi-line text on stderr.
 */
function logProcessWarnings(log: Logger): void {
  process.removeAllListeners('warning');
  process.on('warning', (w: Error & { code?: string }) => {
    const [first, ...more] = w.message.split('\n');
    log.warn(first ?? w.name, {
      warning: w.name,
      ...(w.code !== undefined ? { code: w.code } : {}),
      ...(more.length > 0 ? { detail: more.join('\n').trim() } : {}),
    });
  });
}

async function serve(parsed: Parsed, io: CliIo): Promise<number> {
  const rawPort = stringOption(parsed, 'metrics-port');
  const metricsPort =
    rawPort === undefined ? undefined : parseIntFlag('--metrics-port', rawPort, 0, 65535);
  const configPath = stringOption(parsed, 'config');
  const listen = stringOption(parsed, 'listen');
  const events = stringOption(parsed, 'events');
  const config = await loadConfig(
    {
      ...(configPath !== undefined ? { configPath } : {}),
      ...(listen !== undefined ? { listen } : {}),
      ...(metricsPort !== undefined ? { metricsPort } : {}),
      ...(events !== undefined ? { events } : {}),
    },
    io.env,
  );
  const log = createLogger('kvtier', { level: config.logLevel });
  logProcessWarnings(log.child('process'));
  // Signal handlers come first: a SIGTERM that lands while the sidecar starts (or right as the
  // "serving on" line is read) must shut it down gracefully, not kill the process.
  let signalled: string | undefined;
  let onSignal: (signal: string) => void = (signal) => {
    signalled ??= signal;
  };
  const sigterm = () => onSignal('SIGTERM');
  const sigint = () => onSignal('SIGINT');
  process.on('SIGTERM', sigterm);
  process.on('SIGINT', sigint);
  let sidecar: Sidecar;
  try {
    sidecar = await Sidecar.start({ config, log });
  } catch (err) {
    process.off('SIGTERM', sigterm);
    process.off('SIGINT', sigint);
    throw err;
  }
  const cpu = config.tiers[0]!;
  if (typeof cpu.options.capacityBytes === 'number') {
    io.err(
      `kvtier: serving on ${sidecar.server.endpoint}, ${cpu.name} tier ${formatBytes(cpu.options.capacityBytes)}${sidecar.opsUrl ? `, metrics at ${sidecar.opsUrl}/metrics` : ''}`,
    );
  }
  return await new Promise<number>((resolve) => {
    let stopping = false;
    const stop = (signal: string) => {
      if (stopping) return;
      stopping = true;
      process.off('SIGTERM', sigterm);
      process.off('SIGINT', sigint);
      const deadline = setTimeout(() => {
        io.err(`kvtier: graceful shutdown after ${signal} took over 10 s; exiting`);
        resolve(1);
      }, 10_000);
      deadline.unref();
      sidecar.close().then(
        () => {
          clearTimeout(deadline);
          resolve(0);
        },
        () => resolve(1),
      );
    };
    onSignal = stop;
    if (signalled !== undefined) stop(signalled);
  });
}
