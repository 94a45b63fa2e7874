/**
 * `kvtier serve`: the sidecar as a process. Signals: SIGTERM and SIGINT shut it down gracefully
 * (exit 0; 1 past a 10 s deadline); SIGHUP reads the config again and applies what can change
 * without a restart (the log level, the client keys), keeping everything in host memory;
 * SIGUSR1, which would open Node's inspector to every local user, is refused with a log line.
 * Every line it writes is a JSON log line, the one saying where it serves included.
 */
import {
  ConfigError,
  type ConfigOverrides,
  type KvtierConfig,
  loadConfig,
} from '../config/config.ts';
import { configDocumentOf } from '../config/config-output.ts';
import { hostSizeProblems } from '../config/host-limits.ts';
import { KVTIER_VERSION, Sidecar } from '../sidecar.ts';
import { createLogger, type Logger } from '../util/log.ts';
import type { CliIo } from './client-io.ts';
import { type ParsedCommand, parseIntFlag, stringOption } from './options.ts';

type Parsed = ParsedCommand & { help: false };

/** How long a graceful shutdown may take before the process exits 1, ms. */
const SHUTDOWN_DEADLINE_MS = 10_000;

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

/** Where the config came from, as the start-up line and PING say it. */
export function configSourceOf(overrides: ConfigOverrides, env: NodeJS.ProcessEnv): string {
  if (overrides.configPath !== undefined) return `--config ${overrides.configPath}`;
  if (env.KVTIER_CONFIG !== undefined && env.KVTIER_CONFIG !== '')
    return `KVTIER_CONFIG ${env.KVTIER_CONFIG}`;
  return 'defaults (no config file)';
}

/** Runs `kvtier serve` until a signal stops it; resolves the exit code. */
export async function runServe(parsed: Parsed, io: CliIo): Promise<number> {
  // Before anything that can take time: a SIGUSR1 during start-up would open the inspector.
  let log: Logger | undefined;
  const usr1 = () =>
    log?.warn('SIGUSR1 ignored: the inspector is off (start node with --inspect to debug)', {
      signal: 'SIGUSR1',
    });
  process.on('SIGUSR1', usr1);
  const rawPort = stringOption(parsed, 'metrics-port');
  const metricsPort =
    rawPort === undefined ? undefined : parseIntFlag('--metrics-port', rawPort, 0, 65535);
  const configPath = stringOption(parsed, 'config');
  const listen = stringOption(parsed, 'listen');
  const events = stringOption(parsed, 'events');
  const overrides: ConfigOverrides = {
    ...(configPath !== undefined ? { configPath } : {}),
    ...(listen !== undefined ? { listen } : {}),
    ...(metricsPort !== undefined ? { metricsPort } : {}),
    ...(events !== undefined ? { events } : {}),
  };
  const config = await loadConfig(overrides, io.env);
  // Sizes beyond the host: refused here, where a person configured them (config check does the
  // same); a program that embeds Sidecar.start sizes its tiers itself.
  const tooBig = await hostSizeProblems(config);
  if (tooBig.length > 0) throw new ConfigError(tooBig);
  const source = configSourceOf(overrides, io.env);
  log = createLogger('kvtier', { level: config.logLevel });
  logProcessWarnings(log.child('process'));
  log.debug('config resolved', { source, config: configDocumentOf(config) });
  // Signal handlers come first: a SIGTERM that lands while the sidecar starts (or right as the
  // "serving on" line is read) must shut it down gracefully, not kill the process.
  let signalled: string | undefined;
  let onSignal: (signal: string) => void = (signal) => {
    signalled ??= signal;
  };
  let reload: () => void = () => log?.warn('SIGHUP ignored: the sidecar is still starting');
  const sigterm = () => onSignal('SIGTERM');
  const sigint = () => onSignal('SIGINT');
  const sighup = () => reload();
  process.on('SIGTERM', sigterm);
  process.on('SIGINT', sigint);
  process.on('SIGHUP', sighup);
  const offSignals = () => {
    process.off('SIGTERM', sigterm);
    process.off('SIGINT', sigint);
    process.off('SIGHUP', sighup);
    process.off('SIGUSR1', usr1);
  };
  let sidecar: Sidecar;
  try {
    sidecar = await Sidecar.start({ config, log, configSource: source });
  } catch (err) {
    offSignals();
    throw err;
  }
  serving(sidecar, source);
  let reloading = false;
  reload = () => {
    if (reloading) return;
    reloading = true;
    void reloadConfig(sidecar, overrides, io.env, log!).finally(() => {
      reloading = false;
    });
  };
  return await new Promise<number>((resolve) => {
    let stopping = false;
    const stop = (signal: string) => {
      if (stopping) return;
      stopping = true;
      offSignals();
      const deadline = setTimeout(() => {
        log?.error(`graceful shutdown after ${signal} took over 10 s; exiting`, { signal });
        resolve(1);
      }, SHUTDOWN_DEADLINE_MS);
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

/**
 * The start-up line, `serving on ENDPOINT`, with where each tier keeps its chunks and where the
 * config came from. Written whatever the log level but `silent`: scripts wait for it.
 */
function serving(sidecar: Sidecar, source: string): void {
  const config = sidecar.config;
  const line = createLogger('kvtier', {
    level: config.logLevel === 'silent' ? 'silent' : 'info',
  });
  const metrics = sidecar.opsUrl === undefined ? '' : `, metrics at ${sidecar.opsUrl}/metrics`;
  line.info(`serving on ${sidecar.server.endpoint}${metrics}`, {
    version: KVTIER_VERSION,
    endpoint: sidecar.server.endpoint,
    metrics: sidecar.opsUrl === undefined ? null : `${sidecar.opsUrl}/metrics`,
    config: source,
    tiers: sidecar.tierSummary(),
    epochFile: sidecar.epochFilePath ?? null,
    pid: process.pid,
  });
}

/** SIGHUP: the config read again, what can change applied, the rest named. Never throws. */
async function reloadConfig(
  sidecar: Sidecar,
  overrides: ConfigOverrides,
  env: NodeJS.ProcessEnv,
  log: Logger,
): Promise<void> {
  let next: KvtierConfig;
  try {
    next = await loadConfig(overrides, env);
  } catch (err) {
    log.error('SIGHUP: the config was not reloaded; serving on with the one before', { err });
    return;
  }
  try {
    const r = await sidecar.reload(next);
    log.info('SIGHUP: config reloaded', {
      applied: r.applied,
      ...(r.restartNeeded.length > 0 ? { restartNeeded: r.restartNeeded } : {}),
    });
    if (r.restartNeeded.length > 0)
      log.warn('SIGHUP: these settings changed and take effect at the next start', {
        keys: r.restartNeeded,
      });
  } catch (err) {
    log.error('SIGHUP: the config was not reloaded; serving on with the one before', { err });
  }
}
