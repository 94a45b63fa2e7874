import { Registry } from 'prom-client';
import { KvtierError } from '../errors.ts';
import { Deadline } from '../util/deadline.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import {
  closeQuietly,
  isConfigFailure,
  storageBackendProblems,
  withoutTierPrefix,
} from './core/backend-check.ts';
import {
  CircuitBreakerBackend,
  type CircuitBreakerOptions,
  type ResolvedCircuitBreakerOptions,
  resolveCircuitBreakerOptions,
} from './core/circuit-breaker.ts';
import { LateStartBackend } from './core/late-start.ts';
import type { AnyTierOptions } from './core/tier-options.ts';
import type { PluginFactory, StorageBackend } from './core/types.ts';
import { createFsBackend } from './fs/fs-backend.ts';
import { FS_OPTIONS } from './fs/fs-options.ts';
import { localCpuFactory } from './local-cpu/local-cpu-backend.ts';
import { LOCAL_CPU_OPTIONS } from './local-cpu/local-cpu-options.ts';
import { localDiskFactory } from './local-disk/local-disk-backend.ts';
import { LOCAL_DISK_OPTIONS } from './local-disk/local-disk-options.ts';
import { createMemoryBackend } from './memory/memory-backend.ts';
import { MEMORY_OPTIONS } from './memory/memory-options.ts';
import { type LocalChunkSource, peerBackendFactory } from './peer/peer-backend.ts';
import { PEER_OPTIONS } from './peer/peer-options.ts';
import { createModuleBackendFactory } from './plugin/module-backend.ts';
import { MODULE_OPTIONS } from './plugin/module-options.ts';
import { createPluginContext } from './plugin/plugin-context.ts';
import { createRedisBackend } from './redis/redis-backend.ts';
import { REDIS_OPTIONS } from './redis/redis-options.ts';
import { createS3Backend } from './s3/s3-backend.ts';
import { S3_OPTIONS } from './s3/s3-options.ts';

/** One tier as the config lists it: a unique name, a backend type and that backend's options. */
export interface TierConfig {
  name: string;
  type: string;
  options: Record<string, unknown>;
  /**
   * Health and circuit-breaker settings for a tier below host memory (every such tier gets a
   * breaker with defaults); `false` turns the breaker off. Ignored for host-memory tiers.
   */
  health?: CircuitBreakerOptions | false;
}

/** Checks a tier's raw options; throws KVT_CONFIG naming the tier and the key. */
export type OptionsValidator = (options: Record<string, unknown>, tier: string) => unknown;

export interface BackendRegistryOptions {
  /** Register the built-in types (default true). */
  builtins?: boolean;
  /**
   * The config file's directory: relative plug-in paths resolve against it, and factories get it
   * as `ctx.configDir` (default: the working directory).
   */
  pluginBaseDir?: string;
  /** Parent of every tier's logger (`ctx.log` is `log.child(<tier name>)`); default silent. */
  log?: Logger;
  /**
   * The sidecar's metrics registry, handed to factories as `ctx.metrics` for a plug-in's extra
   * series; default one fresh registry per `BackendRegistry`.
   */
  metricsRegistry?: Registry;
  /**
   * Where local-cpu tiers' arenas take their slabs, and local-disk tiers their indexes' large
   * arrays; default Node buffers. The sidecar passes the native addon's page-aligned slabs (huge
   * pages advised) when it is built.
   */
  allocateHostSlab?: (bytes: number) => Uint8Array;
  /**
   * This sidecar's own tiers as a peer tier reads them for a chunk whose home is this sidecar
   * (the storage manager, once it exists); default none: such chunks are misses of the peer tier.
   */
  peerSource?: () => LocalChunkSource | undefined;
  /**
   * Told of every failed or timed-out call a tier's breaker answered as a miss or drop (see
   * {@link CircuitBreakerOptions.onFailure}), with the tier's name; the sidecar counts them.
   */
  onTierFailure?: (tier: string, op: 'contains' | 'get' | 'put', code: string) => void;
}

/** Options of {@link BackendRegistry.createTiers}. */
export interface CreateTiersOptions {
  /**
   * Position of `configs[0]` in the config's tier list; default 0. The tier at position 0 keeps
   * chunks in host memory and must start. A later tier is below it: its start is bounded by its
   * `health.timeoutMs` (5000 ms by default, also with `health: false`), and one whose start fails
   * for any reason but its config, or does not finish in time, could not be reached.
   */
  position?: number;
  /**
   * Told of each tier below host memory that could not be reached, with why. With it such a tier
   * starts down instead of failing the call: lookups skip it and its writes are dropped, one
   * warn line under its logger says why, and it tries to start again every
   * `health.probeIntervalMs` (a try still running is waited for first) until one succeeds; it
   * then serves, without a restart. Each failed try counts as a failed `contains` in
   * `onTierFailure`. Without it the call fails with `KVT_BACKEND`.
   */
  onStartDown?: (tier: TierConfig, reason: KvtierError) => void;
}

/**
 * One built-in tier type: its options, declared once in its folder (the type name is
 * `options.type`), and its factory. A new tier is a folder under src/backends/ and one entry here.
 */
export interface BuiltinTier {
  readonly options: AnyTierOptions;
  /** Makes the factory, given the registry's options (local-cpu takes its slab allocator). */
  readonly factory: (registry: BackendRegistryOptions) => PluginFactory;
  /**
   * How `kvtier config check` checks a tier of this type before serve would build it: `static`
   * (options only, and `dirOption`'s directory writable: building would touch a store a running
   * sidecar may own), `remote` (built and closed again, unless `--offline`), `build` (built and
   * closed again).
   */
  readonly check: 'static' | 'remote' | 'build';
  /** The option naming a directory that must be writable (`check: 'static'`). */
  readonly dirOption?: string;
  /** Keeps chunks in host memory: the first tier must be of such a type. */
  readonly hostMemory?: boolean;
}

/** The built-in tier types, one entry each, in the order `types()` lists them. */
export const BUILTIN_TIERS: readonly BuiltinTier[] = [
  {
    options: LOCAL_CPU_OPTIONS,
    factory: (r) => localCpuFactory(r.allocateHostSlab),
    check: 'static',
    hostMemory: true,
  },
  { options: MEMORY_OPTIONS, factory: () => createMemoryBackend, check: 'static' },
  {
    options: LOCAL_DISK_OPTIONS,
    factory: (r) => localDiskFactory(r.allocateHostSlab),
    check: 'static',
    dirOption: 'path',
  },
  { options: FS_OPTIONS, factory: () => createFsBackend, check: 'static', dirOption: 'path' },
  { options: REDIS_OPTIONS, factory: () => createRedisBackend, check: 'remote' },
  { options: S3_OPTIONS, factory: () => createS3Backend, check: 'remote' },
  { options: PEER_OPTIONS, factory: (r) => peerBackendFactory(r.peerSource), check: 'build' },
  {
    options: MODULE_OPTIONS,
    factory: (r) => createModuleBackendFactory(r.pluginBaseDir),
    check: 'build',
  },
];

/**
 * Maps backend type names to factories. Built-in types are registered at construction;
 * `register` adds more (tests, embedders, plug-ins).
 */
export class BackendRegistry {
  readonly #factories = new Map<string, PluginFactory>();
  readonly #validators = new Map<string, OptionsValidator>();
  readonly #log: Logger | undefined;
  readonly #configDir: string | undefined;
  readonly #metrics: Registry;
  readonly #onTierFailure: BackendRegistryOptions['onTierFailure'];

  constructor(opts: BackendRegistryOptions = {}) {
    this.#log = opts.log;
    this.#onTierFailure = opts.onTierFailure;
    this.#configDir = opts.pluginBaseDir;
    this.#metrics = opts.metricsRegistry ?? new Registry();
    if (opts.builtins !== false)
      for (const t of BUILTIN_TIERS)
        this.register(t.options.type, t.factory(opts), t.options.fromConfig);
  }

  /**
   * Adds a backend type. The factory is called with the tier's full `PluginContext` (a
   * `BackendFactory` that reads only `name` fits too). `validate` (optional) checks a tier's
   * options without starting anything, for `validateTiers`.
   * @throws KVT_CONFIG when the type is already registered.
   */
  register(type: string, factory: PluginFactory, validate?: OptionsValidator): void {
    if (this.#factories.has(type))
      throw new KvtierError('KVT_CONFIG', `backend type "${type}" is already registered`);
    this.#factories.set(type, factory);
    if (validate !== undefined) this.#validators.set(type, validate);
  }

  /**
   * Checks tier configs without starting anything: every type is known and every options object
   * passes its type's validator. @throws KvtierError KVT_CONFIG naming the tier.
   */
  validateTiers(configs: readonly TierConfig[]): void {
    for (const cfg of configs) {
      if (!this.#factories.has(cfg.type)) {
        throw new KvtierError(
          'KVT_CONFIG',
          `tier "${cfg.name}": unknown backend type "${cfg.type}"; known types: ${this.types().join(', ')}`,
        );
      }
      this.#validators.get(cfg.type)?.(cfg.options, cfg.name);
    }
  }

  /** Registered type names. */
  types(): string[] {
    return [...this.#factories.keys()];
  }

  /**
   * Builds the tiers in config order. A tier that fails to start on its config (a `KVT_CONFIG` or
   * `KVT_INVALID_ARGUMENT` error: bad options, a plug-in that cannot be loaded) fails the whole
   * call loudly (the tiers built so far are closed first). What a factory resolves to is checked
   * against the `StorageBackend` interface first, so a malformed backend fails here rather than
   * as internal errors later. A tier below host memory whose start fails otherwise, or does not
   * finish within its `health.timeoutMs`, could not be reached: with `opts.onStartDown` it starts
   * down (see {@link CreateTiersOptions}), else the call fails.
   * @throws KvtierError KVT_CONFIG `tier "<name>" (<type>) failed to start: <cause>`, the cause's
   *   own `tier "<name>"` prefix removed; KVT_BACKEND, with the same message, for a tier that
   *   could not be reached.
   */
  async createTiers(
    configs: readonly TierConfig[],
    opts: CreateTiersOptions = {},
  ): Promise<StorageBackend[]> {
    const built: StorageBackend[] = [];
    try {
      for (const [i, cfg] of configs.entries()) {
        const factory = this.#factories.get(cfg.type);
        if (factory === undefined) {
          throw new KvtierError(
            'KVT_CONFIG',
            `tier "${cfg.name}": unknown backend type "${cfg.type}"; known types: ${this.types().join(', ')}`,
          );
        }
        const start = () =>
          this.#start(cfg, factory).catch((err: unknown) => {
            throw startError(cfg, err);
          });
        const backend =
          (opts.position ?? 0) + i === 0
            ? await start()
            : await this.#startBelowHost(cfg, start, opts.onStartDown);
        built.push(this.#withBreaker(cfg, backend));
      }
      return built;
    } catch (err) {
      await Promise.all(built.map((b) => b.close().catch(() => {})));
      throw err;
    }
  }

  /** Calls the factory with the tier's context and checks what it resolves to. */
  async #start(cfg: TierConfig, factory: PluginFactory): Promise<StorageBackend> {
    const ctx = createPluginContext({
      name: cfg.name,
      log: (this.#log ?? silentLogger).child(cfg.name),
      ...(this.#configDir !== undefined ? { configDir: this.#configDir } : {}),
      metrics: this.#metrics,
    });
    const made: unknown = await factory(cfg.options, ctx);
    const problems = storageBackendProblems(made, cfg.name);
    if (problems.length > 0) {
      await closeQuietly(made);
      throw new KvtierError(
        'KVT_CONFIG',
        `its factory must resolve to a StorageBackend, but ${problems.join('; ')}`,
      );
    }
    return made as StorageBackend;
  }

  /**
   * Starts a tier below host memory within its `health.timeoutMs`. One that cannot be reached
   * becomes a {@link LateStartBackend} when `onStartDown` is given (a start still running is
   * handed to it), else fails; one refused on its config fails.
   */
  async #startBelowHost(
    cfg: TierConfig,
    start: () => Promise<StorageBackend>,
    onStartDown: CreateTiersOptions['onStartDown'],
  ): Promise<StorageBackend> {
    const health = resolveHealth(cfg);
    const first = start();
    const d = new Deadline({
      what: `its start (health.timeoutMs)`,
      timeoutMs: health.timeoutMs,
    });
    let reason: KvtierError;
    try {
      return await d.race(first);
    } catch (err) {
      reason = d.timedOut ? startError(cfg, d.error()) : (err as KvtierError);
    } finally {
      d.dispose();
    }
    const running = d.timedOut ? first : undefined;
    if (reason.code === 'KVT_CONFIG' || onStartDown === undefined) {
      // A start still running is closed when it lands: nothing else owns it.
      running?.then(closeQuietly, () => {});
      throw reason;
    }
    const log = (this.#log ?? silentLogger).child(cfg.name);
    const report = this.#onTierFailure;
    const late = new LateStartBackend({
      name: cfg.name,
      type: cfg.type,
      start,
      reason,
      running,
      retryIntervalMs: health.probeIntervalMs,
      closeWaitMs: health.timeoutMs,
      log,
      ...(report ? { onFailure: (code: string) => report(cfg.name, 'contains', code) } : {}),
    });
    log.warn('tier is down at start: serving without it until it answers', {
      tier: cfg.name,
      type: cfg.type,
      err: reason,
    });
    onStartDown(cfg, reason);
    return late;
  }

  /**
   * Tiers below host memory may be slow or down: a breaker bounds every call and bypasses a
   * failing tier until a probe finds it healthy again. Closes `backend` when the breaker's
   * options are refused.
   */
  #withBreaker(cfg: TierConfig, backend: StorageBackend): StorageBackend {
    if (backend.capabilities.hostMemory || cfg.health === false) return backend;
    try {
      const log = this.#log?.child(cfg.name);
      const report = this.#onTierFailure;
      const name = cfg.name;
      return new CircuitBreakerBackend(backend, {
        ...(cfg.health || {}),
        ...(log ? { log } : {}),
        ...(report ? { onFailure: (op, code) => report(name, op, code) } : {}),
      });
    } catch (err) {
      void backend.close().catch(() => {});
      throw new KvtierError('KVT_CONFIG', `tier "${cfg.name}": ${(err as Error).message}`, {
        cause: err,
      });
    }
  }
}

/** The breaker settings that bound a tier's start and its retries (the defaults with `health: false`). */
function resolveHealth(cfg: TierConfig): ResolvedCircuitBreakerOptions {
  try {
    return resolveCircuitBreakerOptions(cfg.health || {});
  } catch (err) {
    throw new KvtierError('KVT_CONFIG', `tier "${cfg.name}": ${(err as Error).message}`, {
      cause: err,
    });
  }
}

/**
 * The error of a tier that failed to start: `KVT_CONFIG` when it failed on its config, else
 * `KVT_BACKEND` (its service could not be reached).
 */
function startError(cfg: TierConfig, err: unknown): KvtierError {
  const msg = err instanceof Error ? err.message : String(err);
  return new KvtierError(
    isConfigFailure(err) ? 'KVT_CONFIG' : 'KVT_BACKEND',
    `tier "${cfg.name}" (${cfg.type}) failed to start: ${withoutTierPrefix(msg, cfg.name)}`,
    { cause: err },
  );
}
