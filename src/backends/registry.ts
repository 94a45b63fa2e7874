import { Registry } from 'prom-client';
import { KvtierError } from '../errors.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import { closeQuietly, storageBackendProblems, withoutTierPrefix } from './core/backend-check.ts';
import { CircuitBreakerBackend, type CircuitBreakerOptions } from './core/circuit-breaker.ts';
import type { PluginFactory, StorageBackend } from './core/types.ts';
import { createFsBackend, fsOptionsFromConfig } from './fs/fs-backend.ts';
import { localCpuFactory } from './local-cpu/local-cpu.ts';
import { localCpuOptionsFromConfig } from './local-cpu/local-cpu-options.ts';
import { createLocalDiskBackend } from './local-disk/local-disk.ts';
import { localDiskOptionsFromConfig } from './local-disk/local-disk-options.ts';
import { createMemoryBackend, memoryOptionsFromConfig } from './memory/memory.ts';
import { createModuleBackendFactory } from './plugin/plugin.ts';
import { createPluginContext } from './plugin/plugin-context.ts';
import { createRedisBackend, redisOptionsFromConfig } from './redis/redis-backend.ts';
import { createS3Backend, s3OptionsFromConfig } from './s3/s3-backend.ts';

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
   * Where local-cpu tiers' arenas take their slabs; default Node buffers. The sidecar passes the
   * native addon's page-aligned slabs when it is built.
   */
  allocateHostSlab?: (bytes: number) => Uint8Array;
  /**
   * Told of every failed or timed-out call a tier's breaker answered as a miss or drop (see
   * {@link CircuitBreakerOptions.onFailure}), with the tier's name; the sidecar counts them.
   */
  onTierFailure?: (tier: string, op: 'contains' | 'get' | 'put', code: string) => void;
}

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
    if (opts.builtins !== false) {
      this.register('local-cpu', localCpuFactory(opts.allocateHostSlab), localCpuOptionsFromConfig);
      this.register('memory', createMemoryBackend, memoryOptionsFromConfig);
      this.register('local-disk', createLocalDiskBackend, localDiskOptionsFromConfig);
      this.register('fs', createFsBackend, fsOptionsFromConfig);
      this.register('redis', createRedisBackend, redisOptionsFromConfig);
      this.register('s3', createS3Backend, s3OptionsFromConfig);
      this.register('module', createModuleBackendFactory(opts.pluginBaseDir));
    }
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
   * Builds the tiers in config order. A tier that fails to start fails the whole call loudly
   * (the tiers built so far are closed first): nothing is logged and skipped. What a factory
   * resolves to is checked against the `StorageBackend` interface first, so a malformed backend
   * fails here rather than as internal errors later.
   * @throws KvtierError KVT_CONFIG `tier "<name>" (<type>) failed to start: <cause>`, the cause's
   *   own `tier "<name>"` prefix removed.
   */
  async createTiers(configs: readonly TierConfig[]): Promise<StorageBackend[]> {
    const built: StorageBackend[] = [];
    try {
      for (const cfg of configs) {
        const factory = this.#factories.get(cfg.type);
        if (factory === undefined) {
          throw new KvtierError(
            'KVT_CONFIG',
            `tier "${cfg.name}": unknown backend type "${cfg.type}"; known types: ${this.types().join(', ')}`,
          );
        }
        let backend: StorageBackend;
        const ctx = createPluginContext({
          name: cfg.name,
          log: (this.#log ?? silentLogger).child(cfg.name),
          ...(this.#configDir !== undefined ? { configDir: this.#configDir } : {}),
          metrics: this.#metrics,
        });
        try {
          const made: unknown = await factory(cfg.options, ctx);
          const problems = storageBackendProblems(made, cfg.name);
          if (problems.length > 0) {
            await closeQuietly(made);
            throw new KvtierError(
              'KVT_CONFIG',
              `its factory must resolve to a StorageBackend, but ${problems.join('; ')}`,
            );
          }
          backend = made as StorageBackend;
        } catch (err) {
          const msg = err instanceof Error ? err.message : String(err);
          throw new KvtierError(
            'KVT_CONFIG',
            `tier "${cfg.name}" (${cfg.type}) failed to start: ${withoutTierPrefix(msg, cfg.name)}`,
            { cause: err },
          );
        }
        // Tiers below host memory may be slow or down: a breaker bounds every call and bypasses
        // a failing tier until a probe finds it healthy again.
        const wrap = !backend.capabilities.hostMemory && cfg.health !== false;
        if (!wrap) {
          built.push(backend);
          continue;
        }
        try {
          const log = this.#log?.child(cfg.name);
          const report = this.#onTierFailure;
          const name = cfg.name;
          built.push(
            new CircuitBreakerBackend(backend, {
              ...(cfg.health || {}),
              ...(log ? { log } : {}),
              ...(report ? { onFailure: (op, code) => report(name, op, code) } : {}),
            }),
          );
        } catch (err) {
          await backend.close().catch(() => {});
          throw new KvtierError('KVT_CONFIG', `tier "${cfg.name}": ${(err as Error).message}`, {
            cause: err,
          });
        }
      }
      return built;
    } catch (err) {
      await Promise.all(built.map((b) => b.close().catch(() => {})));
      throw err;
    }
  }
}
