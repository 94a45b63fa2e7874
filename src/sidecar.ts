import { resolve } from 'node:path';
import type { StorageBackend } from './backends/core/types.ts';
import { BackendRegistry } from './backends/registry.ts';
import { ConfigError, type KvtierConfig } from './config/config.ts';
import { staticConfigProblems } from './config/preflight.ts';
import { serverAuthFromConfig, serverClientGrants } from './config/server-auth.ts';
import { copyGroupingFromEnv } from './data-plane/copy-groups.ts';
import { DataPlane } from './data-plane/data-plane.ts';
import { createFsCopyEngine } from './data-plane/fs-copy-engine.ts';
import { instrumentCopyEngine } from './data-plane/instrumented-copy-engine.ts';
import { createNativeCopyEngine } from './data-plane/native-copy-engine.ts';
import { KvtierError } from './errors.ts';
import type { EventPublisher } from './event-stream/event-publisher.ts';
import { startSidecarEvents, withEvents } from './event-stream/sidecar-events.ts';
import type { ServerAuth } from './lookup-server/auth.ts';
import { SidecarServer } from './lookup-server/sidecar-server.ts';
import { TierWatch } from './lookup-server/tier-watch.ts';
import { OpsHttpServer } from './metrics/http-server.ts';
import { instrumentBackend, instrumentHostTier } from './metrics/instrumented-backend.ts';
import { KvtierMetrics } from './metrics/metrics.ts';
import { nativeSlabAllocator } from './native/host-slabs.ts';
import { HitCounts, type TierSummary, tierSummaries } from './sidecar-info.ts';
import { EpochFile, startEpoch } from './storage-manager/epoch-file.ts';
import { asHostMemoryTier, StorageManager } from './storage-manager/storage-manager.ts';
import { createLogger, type Logger, setLogLevel } from './util/log.ts';
import { KVTIER_VERSION } from './version.ts';

export interface SidecarOptions {
  config: KvtierConfig;
  /** Backend types; default: the built-in ones. */
  registry?: BackendRegistry;
  log?: Logger;
  /** Collect process metrics (CPU, memory, event loop); default true. */
  processMetrics?: boolean;
  /** Where the config came from, for the start-up line and PING; default none given. */
  configSource?: string;
}

/** What {@link Sidecar.reload} did. */
export interface ReloadResult {
  /** Settings now in effect: `logLevel`, `security.clients`. */
  applied: string[];
  /** Top-level keys that differ from the running config and need a restart. */
  restartNeeded: string[];
}

export type { TierSummary };
/** Package version reported by PING and /healthz (defined in version.ts). */
export { KVTIER_VERSION };

/**
 * A running kvtier sidecar: tiers built from config (instrumented), the storage manager, the
 * data plane (host files through the fs copy engine), the ZMQ sidecar server that also serves the
 * data-plane messages, and the ops HTTP endpoint. `start` builds and binds everything or fails
 * loudly (closing what it built); `close` shuts down in reverse order.
 */
export class Sidecar {
  readonly config: KvtierConfig;
  readonly metrics: KvtierMetrics;
  readonly storage: StorageManager;
  /** Engines' KV registrations, saves and loads, served by `server` (owned: closed by `close`). */
  readonly dataPlane: DataPlane;
  readonly server: SidecarServer;
  readonly ops: OpsHttpServer | undefined;
  readonly #log: Logger;
  #events: EventPublisher | undefined;
  readonly #watch: TierWatch;
  #closing: Promise<void> | undefined;
  #auth: ServerAuth | undefined;
  #hitCounts: HitCounts | undefined;
  /** The config reloads are compared with (the running one, with reloaded settings applied). */
  #current: KvtierConfig;

  private constructor(
    config: KvtierConfig,
    metrics: KvtierMetrics,
    storage: StorageManager,
    dataPlane: DataPlane,
    server: SidecarServer,
    ops: OpsHttpServer | undefined,
    log: Logger,
    watch: TierWatch,
  ) {
    this.#watch = watch;
    this.config = config;
    this.#current = structuredClone(config);
    this.metrics = metrics;
    this.storage = storage;
    this.dataPlane = dataPlane;
    this.server = server;
    this.ops = ops;
    this.#log = log;
  }

  /**
   * Builds and starts a sidecar. A tier below host memory that cannot be reached at start does not
   * fail it: the tier starts down and joins when it answers (`BackendRegistry.createTiers`).
   * @throws KvtierError KVT_CONFIG when the config is refused (a tier's options, an endpoint,
   *   keys); another code when something else fails (the host-memory tier's start, a bind).
   */
  static async start(opts: SidecarOptions): Promise<Sidecar> {
    const { config } = opts;
    const log = opts.log ?? createLogger('kvtier', { level: config.logLevel });
    // Keys (or the refusal of an open non-loopback bind) before anything is built.
    const auth = await serverAuthFromConfig(config, log.child('auth'));
    const metrics = new KvtierMetrics({
      defaultMetrics: opts.processMetrics ?? true,
      buildInfo: { version: KVTIER_VERSION, node: process.version },
    });
    let storageRef: StorageManager | undefined;
    const registry =
      opts.registry ??
      new BackendRegistry({
        pluginBaseDir: config.baseDir,
        log: log.child('tier'),
        metricsRegistry: metrics.registry,
        onTierFailure: (tier, op, code) => metrics.backendErrors.inc({ tier, op, code }),
        // A peer tier reads chunks whose home is this sidecar from its own tiers.
        peerSource: () => storageRef,
        ...hostSlabs(),
      });
    // What `kvtier config check` checks too, before anything is built.
    const problems = await staticConfigProblems(config, registry);
    if (problems.length > 0) throw new ConfigError(problems);
    const epochFile =
      config.storage.epochFile === null
        ? undefined
        : new EpochFile(resolve(config.baseDir, config.storage.epochFile), log.child('epoch'));
    const initialEpoch = startEpoch(await epochFile?.read());
    // Recorded in the background (an fsync can take seconds on a busy disk); CLEARs' records
    // queue behind it and are awaited.
    void epochFile?.write(initialEpoch);
    // A tier below host memory that cannot be reached starts down (its start logs why) and joins
    // when it answers; one refused on its config fails the start.
    const downAtStart = new Set<string>();
    const raw: StorageBackend[] = await registry.createTiers(config.tiers, {
      onStartDown: (tier) => downAtStart.add(tier.name),
    });
    let tiers: StorageBackend[];
    let events: EventPublisher | undefined;
    try {
      // The host-memory tier keeps its port (in-place saves) through the metrics decorator.
      const [first, ...rest] = raw;
      tiers = [
        instrumentHostTier(asHostMemoryTier(first!), metrics),
        ...rest.map((b) => instrumentBackend(b, metrics)),
      ];
      if (config.events !== null) {
        // The event sockets are CurveZMQ servers too when the server has keys.
        await auth?.start();
        events = await startSidecarEvents({
          events: config.events,
          ...(auth !== undefined ? { curve: auth.routerOptions() } : {}),
          allowUnauthenticated: config.security.allowUnauthenticated,
          registry: metrics.registry,
          log: log.child('events'),
          // Not storage.tiers: a snapshot may be asked for before the storage manager exists.
          tiers: () => tiers,
        });
        tiers = withEvents(tiers, events.log);
      }
    } catch (err) {
      await events?.close();
      await auth?.close();
      await Promise.all(raw.map((b) => b.close().catch(() => {})));
      throw err;
    }
    const eventLog = events?.log;
    const storage = new StorageManager({
      tiers,
      prefetchBudgetChunks: config.storage.prefetchBudgetChunks,
      pinTtlMs: config.storage.pinTtlMs,
      maxLookups: config.storage.maxLookups,
      maxLookupBytes: config.storage.maxLookupBytes,
      writeThrough: config.storage.writeThrough,
      metrics,
      log: log.child('storage'),
      ...(eventLog !== undefined ? { onCleared: eventLog.cleared.bind(eventLog) } : {}),
      initialEpoch,
      ...(epochFile !== undefined ? { onEpoch: (e: number) => epochFile.write(e) } : {}),
    });
    storageRef = storage;
    // The addon maps the engine's KV file and copies on worker threads; without a build, the
    // data plane still works through positional file I/O.
    const native = createNativeCopyEngine();
    if (native.engine === null)
      log.warn('native addon unavailable; data plane uses file I/O', { reason: native.reason });
    const dataPlane = new DataPlane({
      storage,
      copyEngine: instrumentCopyEngine(native.engine ?? createFsCopyEngine(), metrics),
      ...copyGroupingFromEnv(),
      log: log.child('data-plane'),
    });
    const hitCounts = new HitCounts(metrics);
    const server = new SidecarServer({
      endpoint: config.listen,
      storage,
      dataPlane,
      limits: config.limits,
      maxSendQueueBytes: config.server.maxSendQueueBytes,
      metrics,
      log: log.child('server'),
      info: () => ({
        version: KVTIER_VERSION,
        copyEngine: dataPlane.copyEngineInfo(),
        events: events?.info() ?? null,
        config: opts.configSource ?? null,
        tiers: tierSummaries(config).map((t, i) => ({
          name: t.name,
          kind: storage.tiers[i]?.kind ?? t.type,
          health: storage.tiers[i]?.health() ?? 'down',
          ...(t.path !== undefined ? { path: t.path } : {}),
          ...(t.capacityBytes !== undefined ? { capacityBytes: t.capacityBytes } : {}),
          ...hitCounts.of(t.name),
        })),
      }),
      ...(auth !== undefined ? { auth } : {}),
    });
    // Tier state changes in each tier's log; readiness is being able to answer lookups.
    const watch = new TierWatch({ tiers: storage.tiers, log: log.child('tier'), downAtStart });
    let ops: OpsHttpServer | undefined;
    try {
      await server.start();
      if (config.metrics !== null) {
        ops = new OpsHttpServer({
          host: config.metrics.host,
          port: config.metrics.port,
          metrics,
          logger: log.child('ops'),
          ready: () => {
            const s = watch.check();
            return {
              ready: server.endpoint !== '' && s.ready,
              degraded: s.degraded,
              detail: { endpoint: server.endpoint, degraded: s.degraded, tiers: s.tiers },
            };
          },
          health: () => {
            const s = watch.check();
            return {
              status: s.degraded || !s.ready ? 'degraded' : 'ok',
              version: KVTIER_VERSION,
              epoch: storage.epoch,
              ready: server.endpoint !== '' && s.ready,
              tiers: s.tiers,
            };
          },
        });
        await ops.start();
      }
    } catch (err) {
      watch.close();
      await ops?.close().catch(() => {});
      await server.close();
      await dataPlane.close();
      await storage.close();
      await events?.close();
      throw err;
    }
    metrics.bindSources({
      ...storage.metricSources(),
      serving: () => {
        const s = watch.check();
        return { ready: server.endpoint !== '' && s.ready, degraded: s.degraded };
      },
    });
    log.info('kvtier started', {
      version: KVTIER_VERSION,
      endpoint: server.endpoint,
      metrics: ops === undefined ? null : `http://${config.metrics!.host}:${ops.port}/metrics`,
      tiers: config.tiers.map((t, i) => ({
        name: t.name,
        type: t.type,
        health: storage.tiers[i]?.health(),
      })),
      events: events?.info() ?? null,
    });
    const sidecar = new Sidecar(config, metrics, storage, dataPlane, server, ops, log, watch);
    sidecar.#hitCounts = hitCounts;
    sidecar.#events = events;
    sidecar.#auth = auth;
    return sidecar;
  }

  /** Every tier's name, type, bound and path, from the config. */
  tierSummary(): TierSummary[] {
    return tierSummaries(this.config);
  }

  /** The epoch file's absolute path, or undefined when the epoch is not kept. */
  get epochFilePath(): string | undefined {
    const f = this.config.storage.epochFile;
    return f === null ? undefined : resolve(this.config.baseDir, f);
  }

  /**
   * Applies a config read again (SIGHUP) without a restart, so host memory keeps its chunks:
   * the log level, and the CurveZMQ allow-list (`security.clients`, read again from its key
   * files) when CurveZMQ is on. Other changed keys are listed in `restartNeeded` and left as
   * they run. @throws KvtierError KVT_CONFIG when a client key file cannot be read or the list
   * is bad; nothing is applied then.
   */
  async reload(next: KvtierConfig): Promise<ReloadResult> {
    const applied: string[] = [];
    const cur = this.#current;
    let clients: Awaited<ReturnType<typeof serverClientGrants>> | undefined;
    const clientsChanged =
      JSON.stringify(next.security.clients) !== JSON.stringify(cur.security.clients) ||
      next.security.clients.some((c) => c.publicKeyFile !== undefined);
    if (this.#auth !== undefined && clientsChanged) clients = await serverClientGrants(next);
    if (clients !== undefined) {
      let r: ReturnType<ServerAuth['setClients']>;
      try {
        r = this.#auth!.setClients(clients);
      } catch (err) {
        throw new KvtierError('KVT_CONFIG', `security: ${(err as Error).message}`, { cause: err });
      }
      cur.security.clients = next.security.clients;
      if (r.added + r.removed + r.changed > 0) {
        applied.push('security.clients');
        this.#log.child('auth').info('client keys reloaded', r);
      }
    }
    if (next.logLevel !== cur.logLevel) {
      setLogLevel(this.#log, next.logLevel);
      cur.logLevel = next.logLevel;
      applied.push('logLevel');
    }
    const restartNeeded: string[] = [];
    const a = { ...cur, security: { ...cur.security, clients: [] } } as Record<string, unknown>;
    const b = { ...next, security: { ...next.security, clients: [] } } as Record<string, unknown>;
    if (this.#auth === undefined && clientsChanged) restartNeeded.push('security.clients');
    for (const key of Object.keys(b))
      if (key !== 'logLevel' && JSON.stringify(a[key]) !== JSON.stringify(b[key]))
        restartNeeded.push(key);
    return { applied, restartNeeded };
  }

  /** The event stream (docs/events.md), or undefined when the config turns it off. */
  get events(): EventPublisher | undefined {
    return this.#events;
  }

  /** Ops HTTP URL base, or undefined when disabled. */
  get opsUrl(): string | undefined {
    return this.ops === undefined
      ? undefined
      : `http://${this.config.metrics!.host}:${this.ops.port}`;
  }

  /**
   * Stops serving, releases engines' mappings and pins, flushes write-through and closes the
   * tiers. Idempotent.
   */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      await this.server.close();
      await this.dataPlane.close();
      await this.ops?.close();
      this.#watch.close();
      this.#hitCounts?.close();
      await this.storage.close();
      await this.#events?.close();
      this.#log.info('kvtier stopped');
    })();
    return this.#closing;
  }
}

/** The native addon's aligned slabs for the host-memory tier, when the addon is built. */
function hostSlabs(): { allocateHostSlab?: (bytes: number) => Uint8Array } {
  const allocateHostSlab = nativeSlabAllocator();
  return allocateHostSlab === undefined ? {} : { allocateHostSlab };
}
