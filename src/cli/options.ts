/**
 * One definition per `kvtier` subcommand: its synopsis, what it does and its options. The
 * parser (node's `parseArgs`), the `--help` text of each command and the top-level help are all
 * made from it, so an option cannot be accepted without being documented or the reverse.
 */
import { parseArgs } from 'node:util';
import { KvtierError } from '../errors.ts';

/** One `--name` option of a command. */
export interface OptionSpec {
  /** The flag without its dashes, e.g. `endpoint`. */
  readonly name: string;
  readonly type: 'string' | 'boolean';
  /** The value's placeholder in help, e.g. `FILE` (string options). */
  readonly value?: string;
  /** What it does; may span lines (wrapped as given). */
  readonly help: string;
  /** Default shown in help, when there is one. */
  readonly default?: string;
  /** May be given more than once. */
  readonly multiple?: boolean;
  /** Environment variable read when the flag is absent. */
  readonly env?: string;
  /** Must be given: shown without brackets, and its absence is a usage error. */
  readonly required?: boolean;
}

/** One subcommand. */
export interface CommandSpec {
  /** As typed after `kvtier`, e.g. `serve` or `config check`. */
  readonly name: string;
  /** Positional arguments in the synopsis, e.g. `FILE`. */
  readonly args?: string;
  /** One line for the top-level help. */
  readonly summary: string;
  /** Paragraphs after the synopsis. */
  readonly description?: string;
  readonly options: readonly OptionSpec[];
  /** Positional arguments allowed; default none. */
  readonly positionals?: { readonly min: number; readonly max: number };
  /** The "Exit status" paragraph. */
  readonly exit?: string;
}

/** The option every command has. */
const HELP_OPTION: OptionSpec = { name: 'help', type: 'boolean', help: 'print this text' };

/** A bad flag or argument: the command prints the message and exits 2. */
export class UsageError extends KvtierError {
  constructor(message: string) {
    super('KVT_INVALID_ARGUMENT', message);
    this.name = 'UsageError';
  }
}

/** What {@link parseCommand} found. */
export type ParsedCommand =
  | { readonly help: true }
  | {
      readonly help: false;
      readonly values: Readonly<Record<string, string | boolean | string[] | undefined>>;
      readonly positionals: readonly string[];
    };

/**
 * Parses `argv` (the arguments after the command name) against `spec`. `--help` anywhere wins.
 * @throws UsageError naming the flag and what is allowed, on one line, ending in "(see --help)".
 */
export function parseCommand(spec: CommandSpec, argv: readonly string[]): ParsedCommand {
  const options: Record<string, { type: 'string' | 'boolean'; multiple?: boolean }> = {};
  for (const o of [...spec.options, HELP_OPTION])
    options[o.name] = { type: o.type, ...(o.multiple === true ? { multiple: true } : {}) };
  if (argv.includes('--help') || argv.includes('-h')) return { help: true };
  let parsed: ReturnType<typeof parseArgs>;
  try {
    parsed = parseArgs({ args: [...argv], options, allowPositionals: true, strict: true });
  } catch (err) {
    // parseArgs spreads its hint over several lines; keep it, on one line.
    const msg = err instanceof Error ? err.message.replace(/\s*\n\s*/g, ' ') : String(err);
    throw new UsageError(`${msg} (see --help)`);
  }
  for (const o of spec.options)
    if (o.required === true && parsed.values[o.name] === undefined)
      throw new UsageError(
        `--${o.name}${o.value !== undefined ? ` ${o.value}` : ''} is required (see --help)`,
      );
  const { min, max } = spec.positionals ?? { min: 0, max: 0 };
  const n = parsed.positionals.length;
  if (n < min || n > max) {
    const want = spec.args ?? 'no arguments';
    throw new UsageError(
      n > max && max === 0
        ? `takes no positional arguments, got ${JSON.stringify(parsed.positionals[0])} (see --help)`
        : `expects ${want}, got ${n} argument${n === 1 ? '' : 's'} (see --help)`,
    );
  }
  return {
    help: false,
    values: parsed.values as Record<string, string | boolean | string[] | undefined>,
    positionals: parsed.positionals,
  };
}

/** The synopsis line: `kvtier NAME [--a X] [--b] ARGS`. */
export function synopsis(spec: CommandSpec): string {
  return synopsisParts(spec).join(' ');
}

function synopsisParts(spec: CommandSpec): string[] {
  const flags = spec.options.map((o) => {
    const f = o.type === 'boolean' ? `--${o.name}` : `--${o.name} ${o.value ?? 'X'}`;
    if (o.required === true) return f;
    return o.multiple === true ? `[${f}]...` : `[${f}]`;
  });
  return [`kvtier ${spec.name}`, ...flags, ...(spec.args !== undefined ? [spec.args] : [])];
}

/** `kvtier NAME --help`: synopsis, description, every option with its default and variable. */
export function helpText(spec: CommandSpec): string {
  const lines = [`Usage: ${wrapUnits(synopsisParts(spec), 92, '         ')}`, ''];
  if (spec.description !== undefined) lines.push(spec.description, '');
  lines.push('Options:');
  const rows = [...spec.options, HELP_OPTION].map((o) => {
    const flag = o.type === 'boolean' ? `--${o.name}` : `--${o.name} ${o.value ?? 'X'}`;
    const notes: string[] = [];
    if (o.default !== undefined) notes.push(`default ${o.default}`);
    if (o.env !== undefined) notes.push(`or ${o.env}`);
    if (o.multiple === true) notes.push('repeatable');
    const help = notes.length > 0 ? `${o.help} (${notes.join('; ')})` : o.help;
    return { flag, help };
  });
  const width = Math.min(26, Math.max(...rows.map((r) => r.flag.length)) + 2);
  for (const { flag, help } of rows) {
    const text = help.split('\n').flatMap((l) => wrap(l, 98 - width, '').split('\n'));
    if (flag.length + 2 > width) {
      lines.push(`  ${flag}`);
      for (const t of text) lines.push(`  ${' '.repeat(width)}${t}`);
    } else {
      lines.push(`  ${flag.padEnd(width)}${text[0]}`);
      for (const t of text.slice(1)) lines.push(`  ${' '.repeat(width)}${t}`);
    }
  }
  if (spec.exit !== undefined) lines.push('', `Exit status: ${spec.exit}`);
  return lines.join('\n');
}

function wrap(text: string, width: number, indent: string): string {
  return wrapUnits(text.split(' '), width, indent);
}

/** Joins `units` with spaces into lines of at most `width` characters (a unit is never split). */
function wrapUnits(units: readonly string[], width: number, indent: string): string {
  const out: string[] = [];
  let line = '';
  for (const word of units) {
    if (line !== '' && line.length + 1 + word.length > width) {
      out.push(line);
      line = indent + word;
    } else line = line === '' ? word : `${line} ${word}`;
  }
  if (line !== '') out.push(line);
  return out.join('\n');
}

/**
 * A string option as an integer in `[min, max]`; undefined when absent.
 * @throws UsageError `--NAME must be an integer in [min, max], got "TEXT"`.
 */
export function intOption(
  parsed: ParsedCommand & { help: false },
  name: string,
  min: number,
  max: number,
): number | undefined {
  const raw = parsed.values[name];
  if (raw === undefined) return undefined;
  return parseIntFlag(`--${name}`, String(raw), min, max);
}

/**
 * `text` as a decimal integer in `[min, max]`.
 * @throws UsageError `FLAG must be an integer in [min, max], got "TEXT"`.
 */
export function parseIntFlag(flag: string, text: string, min: number, max: number): number {
  const n = /^\s*-?\d+\s*$/.test(text) ? Number(text) : Number.NaN;
  if (!Number.isSafeInteger(n) || n < min || n > max)
    throw new UsageError(
      `${flag} must be an integer in [${min}, ${max}], got ${JSON.stringify(text)}`,
    );
  return n;
}

/** A string option's value, or undefined. */
export function stringOption(
  parsed: ParsedCommand & { help: false },
  name: string,
): string | undefined {
  const v = parsed.values[name];
  return typeof v === 'string' ? v : undefined;
}
