/**
 * JSON-lines logger over pino: one object per line on stderr with `level`, `time` (ISO 8601),
 * `component`, any fields given and `msg`. Level from the config or `KVTIER_LOG_LEVEL`
 * (debug|info|warn|error|silent; default info). Credentials never reach a line: fields named like
 * a secret (password, secretAccessKey, sessionToken, ...) and the userinfo of URLs
 * (`redis://user:pass@host`) are replaced by `[redacted]`, in fields and messages alike.
 */
import { pino } from 'pino';

export type LogLevel = 'debug' | 'info' | 'warn' | 'error' | 'silent';

const LEVELS: readonly LogLevel[] = ['debug', 'info', 'warn', 'error', 'silent'];

/** What every component logs through; `child` names a sub-component (`parent.child`). */
export interface Logger {
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
  child(component: string): Logger;
}

export interface LoggerOptions {
  /** Lowest level written; default `KVTIER_LOG_LEVEL`, else 'info'. */
  level?: LogLevel;
  /** Where lines go, each ending in a newline, synchronously; defaults to process.stderr. */
  write?: (line: string) => void;
}

function levelFromEnv(): LogLevel {
  const v = process.env.KVTIER_LOG_LEVEL;
  return v !== undefined && (LEVELS as readonly string[]).includes(v) ? (v as LogLevel) : 'info';
}

/** The level every logger of one {@link createLogger} tree writes at; shared by its children. */
interface LevelState {
  level: LogLevel;
}

const LEVEL_RANK: Readonly<Record<LogLevel, number>> = {
  debug: 20,
  info: 30,
  warn: 40,
  error: 50,
  silent: Number.POSITIVE_INFINITY,
};

const states = new WeakMap<Logger, LevelState>();

/**
 * Changes the level of `log`'s whole tree (the logger {@link createLogger} made, every child made
 * from it before or after), as a SIGHUP reload does. A logger not made by createLogger is left
 * as it is. @returns the level before.
 */
export function setLogLevel(log: Logger, level: LogLevel): LogLevel | undefined {
  const state = states.get(log);
  if (state === undefined) return undefined;
  const was = state.level;
  state.level = level;
  return was;
}

/** The level `log`'s tree writes at, or undefined for a logger not made by createLogger. */
export function logLevelOf(log: Logger): LogLevel | undefined {
  return states.get(log)?.level;
}

/** Creates a logger for `component`. */
export function createLogger(component: string, opts: LoggerOptions = {}): Logger {
  const write = opts.write ?? ((line: string) => process.stderr.write(line));
  const state: LevelState = { level: opts.level ?? levelFromEnv() };
  const root = pino(
    {
      // Every line reaches pino; the tree's shared level (setLogLevel) decides what is written.
      level: 'debug',
      base: null,
      timestamp: pino.stdTimeFunctions.isoTime,
      // Errors are rendered by redactSecrets as { name, message, code }, without stacks.
      serializers: { err: (e: unknown) => e },
      formatters: {
        level: (label) => ({ level: label }),
        log: (fields) => redactSecrets(fields) as Record<string, unknown>,
      },
    },
    { write },
  );
  return wrap(root, component, state);
}

function wrap(root: pino.Logger, component: string, state: LevelState): Logger {
  const log = root.child({ component });
  const emit =
    (level: Exclude<LogLevel, 'silent'>) => (msg: string, fields?: Record<string, unknown>) => {
      if (LEVEL_RANK[level] < LEVEL_RANK[state.level]) return;
      const text = msg.includes('://') ? redactUrls(msg) : msg;
      if (fields === undefined) log[level](text);
      else log[level](fields, text);
    };
  const logger: Logger = {
    debug: emit('debug'),
    info: emit('info'),
    warn: emit('warn'),
    error: emit('error'),
    child: (c) => wrap(root, `${component}.${c}`, state),
  };
  states.set(logger, state);
  return logger;
}

/** Keys whose values are credentials, wherever they appear. */
const SECRET_KEY =
  /^(password|passphrase|pfx|secret|secretAccessKey|sessionToken|token|accessToken|apiKey|authorization|credentials?)$/i;
const URL_USERINFO = /([a-z][a-z0-9+.-]*:\/\/)[^/@\s]+@/gi;
const REDACTED = '[redacted]';

function redactUrls(s: string): string {
  return s.replace(URL_USERINFO, `$1${REDACTED}@`);
}

/**
 * A copy of `value` without credentials: values of secret-named keys (and a TLS `key`) become
 * `[redacted]`, URLs lose their userinfo, errors become `{ name, message, code }`. Plain objects
 * and arrays are walked a few levels deep.
 */
export function redactSecrets(value: unknown, depth = 6, parentKey = ''): unknown {
  if (typeof value === 'string') return value.includes('://') ? redactUrls(value) : value;
  if (value instanceof Error) return redactSecrets(errorFields(value), depth, parentKey);
  if (typeof value !== 'object' || value === null || depth === 0) return value;
  if (Array.isArray(value)) return value.map((v) => redactSecrets(v, depth - 1, parentKey));
  const proto = Object.getPrototypeOf(value) as unknown;
  if (proto !== Object.prototype && proto !== null) return value;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) {
    const secret = SECRET_KEY.test(k) || (parentKey === 'tls' && k === 'key');
    out[k] = secret && v !== undefined && v !== null ? REDACTED : redactSecrets(v, depth - 1, k);
  }
  return out;
}

function errorFields(err: Error): Record<string, unknown> {
  const code = (err as { code?: unknown }).code;
  return { name: err.name, message: err.message, ...(code !== undefined ? { code } : {}) };
}

/** A logger that drops everything (tests, embedded use). */
export const silentLogger: Logger = createLogger('silent', { level: 'silent' });
