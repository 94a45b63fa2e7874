import { existsSync, statfsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { homedir, totalmem } from 'node:os';
import { dirname, join, resolve as resolvePath } from 'node:path';
import { resolveCircuitBreakerOptions } from '../backends/circuit-breaker.ts';
import type { TierConfig } from '../backends/registry.ts';
import { KvtierError } from '../errors.ts';
import type { ProtocolLimits } from '../protocol/messages.ts';
import type { LogLevel } from '../util/log.ts';
import { describe } from '../util/validate.ts';
import { parseBytes } from './bytes.ts';

/** The sidecar's whole configuration after defaults, file, environment and flags. */
export interface KvtierConfig {
  /** ZMQ endpoint of the lookup server. */
  listen: string;
  /** Ops HTTP endpoint (/metrics, /healthz, /readyz); port 0 picks a free one, null disables it. */
  metrics: { host: string; port: number } | null;
  /** Tiers, fastest first; the first must be a host-memory tier (local-cpu). */
  tiers: TierConfig[];
  storage: {
    prefetchBudgetChunks: number;
    pinTtlMs: number;
    maxLookups: number;
    writeThrough: { maxChunks: number; maxBytes: number; concurrency: number };
  };
  limits: ProtocolLimits;
  logLevel: LogLevel;
  /** Directory relative paths in the config (plug-in modules) are resolved against. */
  baseDir: string;
}

const LOG_LEVELS: readonly LogLevel[] = ['debug', 'info', 'warn', 'error', 'silent'];

/** Default host-memory budget: a quarter of the machine's memory, at most 8 GiB, at least 64 MiB. */
export function defaultCpuCapacityBytes(): number {
  const quarter = Math.floor(totalmem() / 4);
  const mib = 1024 ** 2;
  return Math.max(64 * mib, Math.floor(Math.min(quarter, 8 * 1024 ** 3) / mib) * mib);
}

/** Where the default disk tier lives: `$XDG_CACHE_HOME/kvtier/chunks`, else `~/.cache/kvtier/chunks`. */
export function defaultDiskPath(env: NodeJS.ProcessEnv = process.env): string {
  const base =
    env.XDG_CACHE_HOME !== undefined && env.XDG_CACHE_HOME !== ''
      ? env.XDG_CACHE_HOME
      : join(homedir(), '.cache');
  return join(base, 'kvtier', 'chunks');
}

/**
 * Default disk budget: a quarter of the free space of the filesystem that will hold `path`,
 * at most 32 GiB, at least 256 MiB.
 */
export function defaultDiskCapacityBytes(path: string): number {
  const mib = 1024 ** 2;
  let dir = path;
  while (!existsSync(dir) && dir !== join(dir, '..')) dir = join(dir, '..');
  let free = 0;
  try {
    const st = statfsSync(dir);
    free = st.bavail * st.bsize;
  } catch {
    free = 0;
  }
  return Math.max(256 * mib, Math.floor(Math.min(free / 4, 32 * 1024 ** 3) / mib) * mib);
}

/**
 * The embedded default: a LocalCPU tier sized for the machine over a LocalDisk tier in the
 * user's cache directory, loopback-only endpoints.
 */
export function defaultConfig(env: NodeJS.ProcessEnv = process.env): KvtierConfig {
  const diskPath = defaultDiskPath(env);
  return {
    listen: 'tcp://127.0.0.1:5555',
    metrics: { host: '127.0.0.1', port: 9464 },
    tiers: [
      { name: 'cpu', type: 'local-cpu', options: { capacityBytes: defaultCpuCapacityBytes() } },
      {
        name: 'disk',
        type: 'local-disk',
        options: { path: diskPath, capacityBytes: defaultDiskCapacityBytes(diskPath) },
      },
    ],
    storage: {
      prefetchBudgetChunks: 1024,
      pinTtlMs: 60_000,
      maxLookups: 4096,
      writeThrough: { maxChunks: 1024, maxBytes: 1024 ** 3, concurrency: 4 },
    },
    limits: {
      maxChunksPerLookup: 8192,
      maxPayloadBytes: 128 * 1024 ** 2,
      maxTokensPerChunk: 65536,
    },
    logLevel: 'info',
    baseDir: process.cwd(),
  };
}

/** Command-line overrides; they win over the environment and the file. */
export interface ConfigOverrides {
  configPath?: string;
  listen?: string;
  metricsPort?: number;
}

function fail(path: string, msg: string): never {
  throw new KvtierError('KVT_CONFIG', `config ${path}: ${msg}`);
}

function obj(path: string, v: unknown): Record<string, unknown> {
  if (typeof v !== 'object' || v === null || Array.isArray(v))
    fail(path, `must be an object, got ${describe(v)}`);
  return v as Record<string, unknown>;
}

function int(path: string, v: unknown, min: number, max = Number.MAX_SAFE_INTEGER): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max)
    fail(path, `must be an integer in [${min}, ${max}], got ${describe(v)}`);
  return v;
}

function onlyKeys(path: string, o: Record<string, unknown>, allowed: readonly string[]): void {
  for (const k of Object.keys(o))
    if (!allowed.includes(k)) fail(`${path}.${k}`, `unknown key; allowed: ${allowed.join(', ')}`);
}

/** Turns size strings ("4GiB") into numbers for every option whose name ends in "Bytes". */
function normalizeSizes(path: string, o: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(o))
    out[k] = k.endsWith('Bytes') && typeof v === 'string' ? parseBytes(`${path}.${k}`, v) : v;
  return out;
}

/**
 * Validates a parsed config file and merges it over the defaults.
 * @throws KvtierError KVT_CONFIG naming the bad key and what is allowed.
 */
export function resolveConfig(raw: unknown, base: KvtierConfig = defaultConfig()): KvtierConfig {
  const o = obj('(root)', raw);
  onlyKeys('', o, ['listen', 'metrics', 'tiers', 'storage', 'limits', 'logLevel']);
  const cfg = structuredClone(base);
  if (o.listen !== undefined) {
    if (typeof o.listen !== 'string' || !/^(tcp|ipc|inproc):\/\/.+/.test(o.listen))
      fail(
        'listen',
        `must be a ZMQ endpoint like "tcp://127.0.0.1:5555", got ${describe(o.listen)}`,
      );
    cfg.listen = o.listen;
  }
  if (o.metrics === null) cfg.metrics = null;
  else if (o.metrics !== undefined) {
    const m = obj('metrics', o.metrics);
    onlyKeys('metrics', m, ['host', 'port']);
    const host = m.host ?? cfg.metrics?.host ?? '127.0.0.1';
    if (typeof host !== 'string' || host.length === 0)
      fail('metrics.host', 'must be a non-empty string');
    cfg.metrics = {
      host,
      port:
        m.port === undefined ? (cfg.metrics?.port ?? 9464) : int('metrics.port', m.port, 0, 65535),
    };
  }
  if (o.tiers !== undefined) {
    if (!Array.isArray(o.tiers) || o.tiers.length === 0)
      fail('tiers', 'must be a non-empty array of { name, type, ...options }');
    const names = new Set<string>();
    cfg.tiers = o.tiers.map((t, i) => {
      const to = obj(`tiers[${i}]`, t);
      const { name, type, health, ...options } = to;
      if (typeof type !== 'string' || type.length === 0)
        fail(`tiers[${i}].type`, `must be a backend type name, got ${describe(type)}`);
      const tierName = name ?? type;
      if (typeof tierName !== 'string' || !/^[a-zA-Z0-9_.-]{1,64}$/.test(tierName))
        fail(`tiers[${i}].name`, `must match [a-zA-Z0-9_.-]{1,64}, got ${describe(name)}`);
      if (names.has(tierName))
        fail(`tiers[${i}].name`, `"${tierName}" is used twice; tier names must be unique`);
      names.add(tierName);
      const tier: TierConfig = {
        name: tierName,
        type,
        options: normalizeSizes(`tiers[${i}]`, options),
      };
      if (health === false) tier.health = false;
      else if (health !== undefined) {
        const h = obj(`tiers[${i}].health`, health);
        onlyKeys(`tiers[${i}].health`, h, ['timeoutMs', 'failureThreshold', 'probeIntervalMs']);
        try {
          tier.health = resolveCircuitBreakerOptions(h as Record<string, number>);
        } catch (err) {
          fail(`tiers[${i}].health`, (err as Error).message);
        }
      }
      return tier;
    });
  }
  if (o.storage !== undefined) {
    const s = obj('storage', o.storage);
    onlyKeys('storage', s, ['prefetchBudgetChunks', 'pinTtlMs', 'maxLookups', 'writeThrough']);
    if (s.prefetchBudgetChunks !== undefined)
      cfg.storage.prefetchBudgetChunks = int(
        'storage.prefetchBudgetChunks',
        s.prefetchBudgetChunks,
        1,
      );
    if (s.pinTtlMs !== undefined) cfg.storage.pinTtlMs = int('storage.pinTtlMs', s.pinTtlMs, 1);
    if (s.maxLookups !== undefined)
      cfg.storage.maxLookups = int('storage.maxLookups', s.maxLookups, 1);
    if (s.writeThrough !== undefined) {
      const w = normalizeSizes('storage.writeThrough', obj('storage.writeThrough', s.writeThrough));
      onlyKeys('storage.writeThrough', w, ['maxChunks', 'maxBytes', 'concurrency']);
      if (w.maxChunks !== undefined)
        cfg.storage.writeThrough.maxChunks = int('storage.writeThrough.maxChunks', w.maxChunks, 1);
      if (w.maxBytes !== undefined)
        cfg.storage.writeThrough.maxBytes = int('storage.writeThrough.maxBytes', w.maxBytes, 1);
      if (w.concurrency !== undefined)
        cfg.storage.writeThrough.concurrency = int(
          'storage.writeThrough.concurrency',
          w.concurrency,
          1,
          256,
        );
    }
  }
  if (o.limits !== undefined) {
    const l = normalizeSizes('limits', obj('limits', o.limits));
    onlyKeys('limits', l, ['maxChunksPerLookup', 'maxPayloadBytes', 'maxTokensPerChunk']);
    if (l.maxChunksPerLookup !== undefined)
      cfg.limits.maxChunksPerLookup = int(
        'limits.maxChunksPerLookup',
        l.maxChunksPerLookup,
        1,
        65536,
      );
    if (l.maxPayloadBytes !== undefined)
      cfg.limits.maxPayloadBytes = int('limits.maxPayloadBytes', l.maxPayloadBytes, 1, 2 ** 32 - 1);
    if (l.maxTokensPerChunk !== undefined)
      cfg.limits.maxTokensPerChunk = int(
        'limits.maxTokensPerChunk',
        l.maxTokensPerChunk,
        1,
        2 ** 32 - 1,
      );
  }
  if (o.logLevel !== undefined) {
    if (typeof o.logLevel !== 'string' || !LOG_LEVELS.includes(o.logLevel as LogLevel))
      fail('logLevel', `must be one of ${LOG_LEVELS.join(', ')}`);
    cfg.logLevel = o.logLevel as LogLevel;
  }
  return cfg;
}

/**
 * The default config adjusted by the variables that only make sense without a config file:
 * KVTIER_DISK_PATH and KVTIER_DISK_BYTES move or resize the default disk tier, KVTIER_DISK=off
 * drops it (host memory only).
 */
function embeddedDefault(env: NodeJS.ProcessEnv): KvtierConfig {
  const cfg = defaultConfig(env);
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
 * Builds the effective config: defaults (with KVTIER_DISK*, see above), then the JSON file (`overrides.configPath` or
 * KVTIER_CONFIG), then the environment (KVTIER_LISTEN, KVTIER_METRICS_PORT, KVTIER_METRICS_HOST,
 * KVTIER_CPU_BYTES for the first tier's capacity, KVTIER_LOG_LEVEL), then command-line flags.
 * @throws KvtierError KVT_CONFIG for an unreadable file, bad JSON or a bad value.
 */
export async function loadConfig(
  overrides: ConfigOverrides = {},
  env: NodeJS.ProcessEnv = process.env,
): Promise<KvtierConfig> {
  let cfg = embeddedDefault(env);
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
        `config file ${path} is not valid JSON: ${(err as Error).message}`,
        { cause: err },
      );
    }
    cfg = resolveConfig(parsed, cfg);
    cfg.baseDir = dirname(resolvePath(path));
  }
  const patch: Record<string, unknown> = {};
  if (env.KVTIER_LISTEN) patch.listen = env.KVTIER_LISTEN;
  if (env.KVTIER_METRICS_PORT || env.KVTIER_METRICS_HOST) {
    patch.metrics = {
      ...(env.KVTIER_METRICS_HOST ? { host: env.KVTIER_METRICS_HOST } : {}),
      ...(env.KVTIER_METRICS_PORT ? { port: Number(env.KVTIER_METRICS_PORT) } : {}),
    };
  }
  if (env.KVTIER_LOG_LEVEL) patch.logLevel = env.KVTIER_LOG_LEVEL;
  if (overrides.listen !== undefined) patch.listen = overrides.listen;
  if (overrides.metricsPort !== undefined)
    patch.metrics = { ...(patch.metrics as object | undefined), port: overrides.metricsPort };
  if (Object.keys(patch).length > 0) cfg = resolveConfig(patch, cfg);
  if (env.KVTIER_CPU_BYTES) {
    const first = cfg.tiers[0]!;
    first.options = {
      ...first.options,
      capacityBytes: parseBytes('KVTIER_CPU_BYTES', env.KVTIER_CPU_BYTES),
    };
  }
  return cfg;
}
