import { readFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import { dirname, join, resolve as resolvePath } from 'node:path';
import type { TierConfig } from '../backends/registry.ts';
import { KvtierError } from '../errors.ts';
import {
  type ResolvedEventsOptions,
  resolveEventsOptions,
} from '../event-stream/events-options.ts';
import type { ProtocolLimits } from '../protocol/messages.ts';
import { parseBytes } from '../util/bytes.ts';
import type { LogLevel } from '../util/log.ts';
import type { ConfigProblem } from '../util/schema-kit.ts';
import { filesystemSpace, type HostPaths, hostMemory } from './host-limits.ts';
import { jsonErrorOffset, lineColumn } from './json-position.ts';
import { validateConfigDocument } from './schema.ts';
import type { ClientConfig } from './security-schema.ts';

/** The sidecar's whole configuration after defaults, file, environment and flags. */
export interface KvtierConfig {
  /** ZMQ endpoint of the sidecar server. */
  listen: string;
  /** Ops HTTP endpoint (/metrics, /healthz, /readyz); port 0 picks a free one, null disables it. */
  metrics: { host: string; port: number } | null;
  /** Tiers, fastest first; the first must be a host-memory tier (local-cpu). */
  tiers: TierConfig[];
  storage: {
    prefetchBudgetChunks: number;
    pinTtlMs: number;
    maxLookups: number;
    /** Bound on the estimated bytes of lookups in flight and pinned (KVT_CAPACITY past it). */
    maxLookupBytes: number;
    /**
     * Where the epoch is kept across restarts (relative: against `baseDir`), so that a restarted
     * sidecar starts above every epoch its clients saw; null: derived from the clock alone.
     */
    epochFile: string | null;
    writeThrough: { maxChunks: number; maxBytes: number; concurrency: number };
  };
  server: {
    /** Bound on reply bytes waiting in the sidecar server's send queue. */
    maxSendQueueBytes: number;
  };
  limits: ProtocolLimits;
  logLevel: LogLevel;
  /** Start with tiers larger than the host gives (host-limits.ts) instead of refusing. */
  allowOversizedTiers: boolean;
  /** CurveZMQ and client roles (docs/security.md); relative paths are against `baseDir`. */
  security: {
    /** The server's secret key file; null: no CurveZMQ (only loopback/ipc binds, see below). */
    serverSecretKeyFile: string | null;
    /** Allow-listed client keys with their roles. */
    clients: ClientConfig[];
    /** Serve a non-loopback TCP endpoint without keys instead of refusing to start. */
    allowUnauthenticated: boolean;
  };
  /** The event stream (docs/events.md); null: off. */
  events: ResolvedEventsOptions | null;
  /** Directory relative paths in the config (plug-in modules) are resolved against. */
  baseDir: string;
}

/**
 * Default host-memory budget: a quarter of the memory this process may use (the machine's, or its
 * cgroup limit when lower, as in a container), at most 8 GiB, at least 64 MiB.
 */
export function defaultCpuCapacityBytes(paths: HostPaths = {}): number {
  const quarter = Math.floor(hostMemory(paths).bytes / 4);
  const mib = 1024 ** 2;
  return Math.max(64 * mib, Math.floor(Math.min(quarter, 8 * 1024 ** 3) / mib) * mib);
}

/** kvtier's cache directory: `$XDG_CACHE_HOME/kvtier`, else `~/.cache/kvtier`. */
function cacheDir(env: NodeJS.ProcessEnv): string {
  const base =
    env.XDG_CACHE_HOME !== undefined && env.XDG_CACHE_HOME !== ''
      ? env.XDG_CACHE_HOME
      : join(homedir(), '.cache');
  return join(base, 'kvtier');
}

/** Where the default disk tier lives: `$XDG_CACHE_HOME/kvtier/chunks`, else `~/.cache/kvtier/chunks`. */
export function defaultDiskPath(env: NodeJS.ProcessEnv = process.env): string {
  return join(cacheDir(env), 'chunks');
}

/**
 * Where a sidecar listening on `listen` keeps its epoch by default: a file per endpoint (what
 * clients know a server by) under `$XDG_CACHE_HOME/kvtier/epochs/`, else `~/.cache/kvtier/epochs/`,
 * e.g. `tcp-127.0.0.1-5555`. Sidecars on other endpoints never share it.
 */
export function defaultEpochFile(
  env: NodeJS.ProcessEnv = process.env,
  listen: string = CONFIG_DEFAULTS.listen,
): string {
  return join(cacheDir(env), 'epochs', listen.replace(/[^A-Za-z0-9._-]+/g, '-'));
}

/**
 * Default disk budget: a quarter of the free space of the filesystem that will hold `path`,
 * at most 32 GiB, at least 256 MiB.
 */
export function defaultDiskCapacityBytes(path: string): number {
  const mib = 1024 ** 2;
  const free = filesystemSpace(path).freeBytes;
  return Math.max(256 * mib, Math.floor(Math.min(free / 4, 32 * 1024 ** 3) / mib) * mib);
}

/**
 * The defaults of every setting that does not depend on the machine, in one place: the loader
 * merges files over them and the published JSON Schema reports them.
 */
export const CONFIG_DEFAULTS = deepFreeze({
  listen: 'tcp://127.0.0.1:5555',
  metrics: { host: '127.0.0.1', port: 9464 },
  storage: {
    prefetchBudgetChunks: 1024,
    pinTtlMs: 60_000,
    maxLookups: 4096,
    maxLookupBytes: 64 * 1024 ** 2,
    epochFile: null as string | null,
    writeThrough: { maxChunks: 1024, maxBytes: 1024 ** 3, concurrency: 4 },
  },
  server: { maxSendQueueBytes: 512 * 1024 ** 2 },
  limits: {
    maxChunksPerLookup: 8192,
    maxPayloadBytes: 128 * 1024 ** 2,
    maxTokensPerChunk: 65536,
  },
  logLevel: 'info' as LogLevel,
  allowOversizedTiers: false,
  security: { serverSecretKeyFile: null, clients: [], allowUnauthenticated: false },
});

/**
 * The embedded default: a LocalCPU tier sized for the machine over a LocalDisk tier in the
 * user's cache directory, loopback-only endpoints.
 */
export function defaultConfig(env: NodeJS.ProcessEnv = process.env): KvtierConfig {
  const diskPath = defaultDiskPath(env);
  const d = structuredClone(CONFIG_DEFAULTS) as typeof CONFIG_DEFAULTS;
  return {
    listen: d.listen,
    metrics: d.metrics,
    tiers: [
      { name: 'cpu', type: 'local-cpu', options: { capacityBytes: defaultCpuCapacityBytes() } },
      {
        name: 'disk',
        type: 'local-disk',
        options: { path: diskPath, capacityBytes: defaultDiskCapacityBytes(diskPath) },
      },
    ],
    storage: d.storage,
    server: d.server,
    limits: d.limits,
    logLevel: d.logLevel,
    allowOversizedTiers: d.allowOversizedTiers,
    security: {
      serverSecretKeyFile: null,
      clients: [],
      allowUnauthenticated: d.security.allowUnauthenticated,
    },
    events: null,
    baseDir: process.cwd(),
  };
}

function deepFreeze<T extends object>(o: T): Readonly<T> {
  for (const v of Object.values(o)) if (typeof v === 'object' && v !== null) deepFreeze(v);
  return Object.freeze(o);
}

/** Command-line overrides; they win over the environment and the file. */
export interface ConfigOverrides {
  configPath?: string;
  listen?: string;
  metricsPort?: number;
  /** `--events ENDPOINT` (or `off`): the event stream's PUB endpoint. */
  events?: string;
}

/**
 * A config that does not validate: `problems` lists each one with its key path; the message
 * names them all on one line.
 */
export class ConfigError extends KvtierError {
  readonly problems: readonly ConfigProblem[];

  constructor(problems: readonly ConfigProblem[]) {
    super('KVT_CONFIG', problems.map((p) => `config ${p.path}: ${p.message}`).join('; '));
    this.name = 'ConfigError';
    this.problems = problems;
  }
}

/**
 * Validates a parsed config file and merges it over `base` (the defaults).
 * @throws ConfigError (`KVT_CONFIG`) listing every problem with its key path and what is allowed.
 */
export function resolveConfig(raw: unknown, base: KvtierConfig = defaultConfig()): KvtierConfig {
  const r = validateConfigDocument(raw);
  if (!r.ok) throw new ConfigError(r.problems);
  const doc = r.value;
  const cfg = structuredClone(base);
  if (doc.listen !== undefined) cfg.listen = doc.listen;
  if (doc.metrics === null) cfg.metrics = null;
  else if (doc.metrics !== undefined)
    cfg.metrics = {
      host: doc.metrics.host ?? cfg.metrics?.host ?? CONFIG_DEFAULTS.metrics.host,
      port: doc.metrics.port ?? cfg.metrics?.port ?? CONFIG_DEFAULTS.metrics.port,
    };
  if (doc.tiers !== undefined) cfg.tiers = doc.tiers;
  const { writeThrough, ...storage } = doc.storage ?? {};
  Object.assign(cfg.storage, storage);
  Object.assign(cfg.storage.writeThrough, writeThrough);
  Object.assign(cfg.server, doc.server);
  Object.assign(cfg.limits, doc.limits);
  if (doc.logLevel !== undefined) cfg.logLevel = doc.logLevel;
  if (doc.allowOversizedTiers !== undefined) cfg.allowOversizedTiers = doc.allowOversizedTiers;
  if (doc.security !== undefined) {
    const { serverSecretKeyFile, clients, allowUnauthenticated } = doc.security;
    if (serverSecretKeyFile !== undefined) cfg.security.serverSecretKeyFile = serverSecretKeyFile;
    if (clients !== undefined) cfg.security.clients = clients;
    if (allowUnauthenticated !== undefined)
      cfg.security.allowUnauthenticated = allowUnauthenticated;
  }
  if (doc.events !== undefined)
    cfg.events = doc.events === null ? null : resolveEventsOptions(doc.events);
  return cfg;
}

/**
 * What `loadConfig` starts from: the default config with the epoch kept in the cache directory,
 * adjusted by the variables that only make sense without a config file:
 * KVTIER_DISK_PATH and KVTIER_DISK_BYTES move or resize the default disk tier, KVTIER_DISK=off
 * drops it (host memory only).
 */
function embeddedDefault(env: NodeJS.ProcessEnv): KvtierConfig {
  const cfg = defaultConfig(env);
  cfg.storage.epochFile = defaultEpochFile(env);
  const disk = cfg.tiers[1]!;
  if (env.KVTIER_DISK === 'off') {
    cfg.tiers = cfg.tiers.slice(0, 1);
    return cfg;
  }
  if (env.KVTIER_DISK !== undefined && env.KVTIER_DISK !== '' && env.KVTIER_DISK !== 'on') {
    throw new KvtierError(
      'KVT_CONFIG',
      `KVTIER_DISK must be "on" or "off", got ${JSON.stringify(env.KVTIER_DISK)}`,
    );
  }
  if (env.KVTIER_DISK_PATH) {
    disk.options = {
      ...disk.options,
      path: env.KVTIER_DISK_PATH,
      capacityBytes: defaultDiskCapacityBytes(env.KVTIER_DISK_PATH),
    };
  }
  if (env.KVTIER_DISK_BYTES)
    disk.options = {
      ...disk.options,
      capacityBytes: parseBytes('KVTIER_DISK_BYTES', env.KVTIER_DISK_BYTES),
    };
  return cfg;
}

/**
 * "is not valid JSON: unexpected "}" at line L, column C" (or "it ends early at ...") for a
 * `JSON.parse` error of `text`: Node 20 names a character position for some errors only.
 */
export function jsonErrorAt(text: string, err: Error): string {
  const offset = jsonErrorOffset(text);
  if (offset < 0) return `is not valid JSON: ${err.message.split('\n', 1)[0]}`;
  const { line, column } = lineColumn(text, offset);
  return offset >= text.length
    ? `is not valid JSON: it ends early, at line ${line}, column ${column}`
    : `is not valid JSON: unexpected ${JSON.stringify(text[offset])} at line ${line}, column ${column}`;
}

/** A variable's digits as a number; anything else as given, for the error message. */
function numeric(s: string): number | string {
  return /^\d+$/.test(s) ? Number(s) : s;
}

/**
 * Builds the effective config: defaults (with KVTIER_DISK*, see above), then the JSON file (`overrides.configPath` or
 * KVTIER_CONFIG), then the environment (KVTIER_LISTEN, KVTIER_METRICS_PORT, KVTIER_METRICS_HOST,
 * KVTIER_CPU_BYTES for the first tier's capacity, KVTIER_LOG_LEVEL), then command-line flags.
 * @throws KvtierError KVT_CONFIG for an unreadable file or bad JSON; {@link ConfigError} for bad
 *   values, naming the key path (and the variable or flag that set it).
 */
export async function loadConfig(
  overrides: ConfigOverrides = {},
  env: NodeJS.ProcessEnv = process.env,
): Promise<KvtierConfig> {
  let cfg = embeddedDefault(env);
  let epochGiven = false;
  const path = overrides.configPath ?? env.KVTIER_CONFIG;
  if (path !== undefined && path !== '') {
    let text: string;
    try {
      text = await readFile(path, 'utf8');
    } catch (err) {
      throw new KvtierError(
        'KVT_CONFIG',
        `cannot read config file ${path}: ${(err as Error).message}`,
        { cause: err },
      );
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch (err) {
      throw new KvtierError(
        'KVT_CONFIG',
        `config file ${path} ${jsonErrorAt(text, err as Error)}`,
        {
          cause: err,
        },
      );
    }
    cfg = resolveConfig(parsed, cfg);
    cfg.baseDir = dirname(resolvePath(path));
    epochGiven = (parsed as { storage?: { epochFile?: unknown } }).storage?.epochFile !== undefined;
  }
  // Environment, then flags; a problem names the variable or flag it came from.
  const patch: { listen?: unknown; metrics?: Record<string, unknown>; logLevel?: unknown } = {};
  const source = new Map<string, string>();
  const set = (path: string, value: unknown, from: string) => {
    if (path === 'listen') patch.listen = value;
    else if (path === 'logLevel') patch.logLevel = value;
    else patch.metrics = { ...patch.metrics, [path.slice('metrics.'.length)]: value };
    source.set(path, from);
  };
  if (env.KVTIER_LISTEN) set('listen', env.KVTIER_LISTEN, 'KVTIER_LISTEN');
  if (env.KVTIER_METRICS_HOST) set('metrics.host', env.KVTIER_METRICS_HOST, 'KVTIER_METRICS_HOST');
  if (env.KVTIER_METRICS_PORT)
    set('metrics.port', numeric(env.KVTIER_METRICS_PORT), 'KVTIER_METRICS_PORT');
  if (env.KVTIER_LOG_LEVEL) set('logLevel', env.KVTIER_LOG_LEVEL, 'KVTIER_LOG_LEVEL');
  if (overrides.listen !== undefined) set('listen', overrides.listen, '--listen');
  if (overrides.metricsPort !== undefined)
    set('metrics.port', overrides.metricsPort, '--metrics-port');
  if (source.size > 0) {
    try {
      cfg = resolveConfig(patch, cfg);
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err;
      throw new ConfigError(
        err.problems.map((p) => {
          const from = source.get(p.path);
          return from === undefined ? p : { path: `${p.path} (from ${from})`, message: p.message };
        }),
      );
    }
  }
  const allowUnauthenticated = envFlag(env, 'KVTIER_ALLOW_UNAUTHENTICATED');
  if (allowUnauthenticated !== undefined) cfg.security.allowUnauthenticated = allowUnauthenticated;
  const allowOversized = envFlag(env, 'KVTIER_ALLOW_OVERSIZED_TIERS');
  if (allowOversized !== undefined) cfg.allowOversizedTiers = allowOversized;
  cfg = withEventsOverride(cfg, env, overrides.events);
  // The default epoch file is the final endpoint's (set by the file, the environment or a flag).
  if (!epochGiven) cfg.storage.epochFile = defaultEpochFile(env, cfg.listen);
  if (env.KVTIER_CPU_BYTES) {
    const first = cfg.tiers[0]!;
    first.options = {
      ...first.options,
      capacityBytes: parseBytes('KVTIER_CPU_BYTES', env.KVTIER_CPU_BYTES),
    };
  }
  return cfg;
}

/** A boolean variable (`1`/`true`/`0`/`false`), undefined when unset. @throws KVT_CONFIG */
function envFlag(env: NodeJS.ProcessEnv, name: string): boolean | undefined {
  const v = env[name];
  if (v === undefined || v === '') return undefined;
  if (v !== '1' && v !== 'true' && v !== '0' && v !== 'false')
    throw new KvtierError(
      'KVT_CONFIG',
      `${name} must be "1", "true", "0" or "false", got ${JSON.stringify(v)}`,
    );
  return v === '1' || v === 'true';
}

/**
 * The event stream as KVTIER_EVENTS_ENDPOINT (then `--events`) sets it: an endpoint turns it on
 * there (the replay socket on KVTIER_EVENTS_REPLAY_ENDPOINT, else the next port), `off` turns it
 * off. The other settings keep the file's values.
 * @throws ConfigError naming the variable or flag for a bad endpoint.
 */
function withEventsOverride(
  cfg: KvtierConfig,
  env: NodeJS.ProcessEnv,
  flag: string | undefined,
): KvtierConfig {
  const from = flag !== undefined ? '--events' : 'KVTIER_EVENTS_ENDPOINT';
  const endpoint = flag ?? env.KVTIER_EVENTS_ENDPOINT;
  if (endpoint === undefined || endpoint === '') return cfg;
  if (endpoint === 'off') return { ...cfg, events: null };
  const replay = env.KVTIER_EVENTS_REPLAY_ENDPOINT;
  const { endpoint: _, replayEndpoint: __, ...rest } = cfg.events ?? {};
  const events: Record<string, unknown> = { ...rest, endpoint };
  if (replay !== undefined && replay !== '')
    events.replayEndpoint = replay === 'off' ? null : replay;
  try {
    return resolveConfig({ events }, cfg);
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    throw new ConfigError(
      err.problems.map((p) => ({ path: `${p.path} (from ${from})`, message: p.message })),
    );
  }
}
