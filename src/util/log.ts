/**
 * JSON-lines logger: one object per line on stderr with `time`, `level`, `component`, `msg` and
 * any fields given. Level from `KVTIER_LOG_LEVEL` (debug|info|warn|error|silent; default info).
 */
export type LogLevel = 'debug' | 'info' | 'warn' | 'error' | 'silent';

const ORDER: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40, silent: 100 };

export interface Logger {
  debug(msg: string, fields?: Record<string, unknown>): void;
  info(msg: string, fields?: Record<string, unknown>): void;
  warn(msg: string, fields?: Record<string, unknown>): void;
  error(msg: string, fields?: Record<string, unknown>): void;
  child(component: string): Logger;
}

export interface LoggerOptions {
  level?: LogLevel;
  /** Where lines go; defaults to process.stderr. */
  write?: (line: string) => void;
}

function levelFromEnv(): LogLevel {
  const v = process.env.KVTIER_LOG_LEVEL;
  return v !== undefined && v in ORDER ? (v as LogLevel) : 'info';
}

/** Creates a logger for `component`. */
export function createLogger(component: string, opts: LoggerOptions = {}): Logger {
  const min = ORDER[opts.level ?? levelFromEnv()];
  const write = opts.write ?? ((line: string) => process.stderr.write(line));
  const emit = (
    level: Exclude<LogLevel, 'silent'>,
    msg: string,
    fields?: Record<string, unknown>,
  ) => {
    if (ORDER[level] < min) return;
    const rec: Record<string, unknown> = { time: new Date().toISOString(), level, component, msg };
    if (fields !== undefined) {
      for (const [k, v] of Object.entries(fields)) rec[k] = v instanceof Error ? errorFields(v) : v;
    }
    write(`${JSON.stringify(rec)}\n`);
  };
  return {
    debug: (m, f) => emit('debug', m, f),
    info: (m, f) => emit('info', m, f),
    warn: (m, f) => emit('warn', m, f),
    error: (m, f) => emit('error', m, f),
    child: (c) => createLogger(`${component}.${c}`, opts),
  };
}

function errorFields(err: Error): Record<string, unknown> {
  const code = (err as { code?: unknown }).code;
  return { name: err.name, message: err.message, ...(code !== undefined ? { code } : {}) };
}

/** A logger that drops everything (tests, embedded use). */
export const silentLogger: Logger = createLogger('silent', { level: 'silent' });
