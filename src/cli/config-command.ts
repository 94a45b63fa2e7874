import { BackendRegistry } from '../backends/registry.ts';
import { ConfigError, type KvtierConfig, loadConfig } from '../config/config.ts';
import { configDocumentOf } from '../config/config-output.ts';
import { checkConfig } from '../config/preflight.ts';
import { isKvtierError } from '../errors.ts';
import type { Logger } from '../util/log.ts';
import type { ConfigProblem } from '../util/schema-kit.ts';
import { CONFIG_CHECK } from './commands.ts';
import { helpText, parseCommand, UsageError } from './options.ts';

/** Where `kvtier config` writes. */
export interface ConfigCommandIo {
  /** Writes one line of output (no trailing newline). */
  out: (line: string) => void;
  /** Writes one line to stderr (no trailing newline). */
  err: (line: string) => void;
  /** The environment the config is resolved with (as `kvtier serve` would); default none. */
  env?: NodeJS.ProcessEnv;
}

/** `kvtier config check --help`. */
export const CONFIG_COMMAND_USAGE = helpText(CONFIG_CHECK);

/**
 * Runs `kvtier config ...` (only `check` exists); resolves the exit code: 0 valid (the resolved
 * config printed, in the file format), 1 invalid (every problem on stderr), 2 on bad usage.
 * The checks are serve's own (config/preflight.ts), short of binding sockets. Tiers it could not
 * reach are listed on stderr and do not fail the check, unless `--strict`. What the tiers log at
 * warn or error while the check builds them is on stderr as `FILE: warning: ...`, as serve would
 * log it at start.
 */
export async function runConfigCommand(args: string[], io: ConfigCommandIo): Promise<number> {
  const [sub, ...rest] = args;
  if (sub === '--help' || sub === '-h') {
    io.out(CONFIG_COMMAND_USAGE);
    return 0;
  }
  if (sub !== 'check') {
    io.err(
      `kvtier config: expects "check FILE", got ${sub === undefined ? 'nothing' : JSON.stringify(sub)}`,
    );
    io.err(CONFIG_COMMAND_USAGE);
    return 2;
  }
  let file: string;
  let offline: boolean;
  let strict: boolean;
  try {
    const parsed = parseCommand(CONFIG_CHECK, rest);
    if (parsed.help) {
      io.out(CONFIG_COMMAND_USAGE);
      return 0;
    }
    file = parsed.positionals[0]!;
    offline = parsed.values.offline === true;
    strict = parsed.values.strict === true;
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    io.err(`kvtier config check: ${err.message}`);
    return 2;
  }
  const env: NodeJS.ProcessEnv = { ...(io.env ?? {}) };
  delete env.KVTIER_CONFIG;
  let cfg: KvtierConfig;
  try {
    cfg = await loadConfig({ configPath: file }, env);
  } catch (err) {
    if (err instanceof ConfigError) return report(file, err.problems, io);
    if (isKvtierError(err)) {
      io.err(`${file}: ${err.message}`);
      return 1;
    }
    throw err;
  }
  const warnings: string[] = [];
  const registry = new BackendRegistry({
    pluginBaseDir: cfg.baseDir,
    log: warningsOf('', warnings),
  });
  const { problems, unreachable } = await checkConfig(cfg, registry, { offline });
  for (const w of warnings) io.err(`${file}: warning: ${w}`);
  const down = unreachable.map((t) => ({
    path: t.path,
    message: `tier "${t.name}" (${t.type}) could not be reached: ${withoutFailedToStart(t.reason, t)}; serve starts with it down and it joins when it answers`,
  }));
  if (problems.length > 0 || (strict && down.length > 0))
    return report(file, [...problems, ...down], io);
  for (const p of down) io.err(`${file}: ${p.path}: ${p.message}`);
  io.out(JSON.stringify(configDocumentOf(cfg), null, 2));
  return 0;
}

/**
 * A logger that keeps the warn and error lines the tiers log while the check builds them (what
 * serve would log at start: a plug-in that loaded a second copy of kvtier, ...), as
 * `<component>: <message>`; other levels are dropped.
 */
function warningsOf(component: string, sink: string[]): Logger {
  const keep = (msg: string) => void sink.push(component === '' ? msg : `${component}: ${msg}`);
  return {
    debug() {},
    info() {},
    warn: keep,
    error: keep,
    child: (name) => warningsOf(component === '' ? `tier "${name}"` : `${component}.${name}`, sink),
  };
}

/** The start error's reason without its `tier "<name>" (<type>) failed to start: ` lead. */
function withoutFailedToStart(reason: string, t: { name: string; type: string }): string {
  const lead = `tier ${JSON.stringify(t.name)} (${t.type}) failed to start: `;
  return reason.startsWith(lead) ? reason.slice(lead.length) : reason;
}

function report(file: string, problems: readonly ConfigProblem[], io: ConfigCommandIo): number {
  for (const p of problems) io.err(`${file}: ${p.path}: ${p.message}`);
  return 1;
}
