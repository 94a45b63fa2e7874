import { KvtierError } from '../errors.ts';
import { createLocalCpuBackend } from './local-cpu.ts';
import { createMemoryBackend } from './memory.ts';
import type { BackendFactory, StorageBackend } from './types.ts';

/** One tier as the config lists it: a unique name, a backend type and that backend's options. */
export interface TierConfig {
  name: string;
  type: string;
  options: Record<string, unknown>;
}

/**
 * Maps backend type names to factories. Built-in types are registered at construction;
 * `register` adds more (tests, embedders, plug-ins).
 */
export class BackendRegistry {
  readonly #factories = new Map<string, BackendFactory>();

  constructor(opts: { builtins?: boolean } = {}) {
    if (opts.builtins !== false) {
      this.register('local-cpu', createLocalCpuBackend);
      this.register('memory', createMemoryBackend);
    }
  }

  /** Adds a backend type. @throws KVT_CONFIG when the type is already registered. */
  register(type: string, factory: BackendFactory): void {
    if (this.#factories.has(type))
      throw new KvtierError('KVT_CONFIG', `backend type "${type}" is already registered`);
    this.#factories.set(type, factory);
  }

  /** Registered type names. */
  types(): string[] {
    return [...this.#factories.keys()];
  }

  /**
   * Builds the tiers in config order. A tier that fails to start fails the whole call loudly
   * (the tiers built so far are closed first): nothing is logged and skipped.
   * @throws KvtierError KVT_CONFIG naming the tier, its type and the cause.
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
        try {
          built.push(await factory(cfg.options, { name: cfg.name }));
        } catch (err) {
          const msg = err instanceof Error ? err.message : String(err);
          throw new KvtierError(
            'KVT_CONFIG',
            `tier "${cfg.name}" (${cfg.type}) failed to start: ${msg}`,
            { cause: err },
          );
        }
      }
      return built;
    } catch (err) {
      await Promise.all(built.map((b) => b.close().catch(() => {})));
      throw err;
    }
  }
}
