import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import {
  chunkObjectBytes,
  lowerTierBytes,
  type PlanShapes,
  redisMaxMemory,
} from '../sim/planner.ts';
import type { PlannerTier } from '../sim/tier-models.ts';
import type { SimTierConfig } from '../sim/types.ts';
import { PrivateRedis } from './private-redis.ts';

/**
 * The sidecar tiers below the CPU tier for one planner run, in the verification model's bytes,
 * with whatever they need started (private Redis servers). Tiers keep the planner tier's name:
 *
 * - `disk`: a local-disk tier per engine (a node's own disk), the full capacity each;
 * - `fs`: the fs backend on one directory, shared by a fleet's engines (or, node-local, one
 *   directory per engine with the capacity split N ways); its capacity is enforced by the
 *   backend's sweep, which the engines run every 60 s of modeled time;
 * - `redis`: a private redis-server with `maxmemory` and LRU eviction (or the `--redis` URL's
 *   server, which bounds itself), shared or one per engine like `fs`;
 * - `s3`: an object store of that capacity: the fs backend holds the objects (a bucket has no
 *   capacity of its own; the planner's bound stands for a lifecycle rule) and the S3 tier model
 *   times its loads.
 *
 * - `peer` (with `peers`): below those, a peer tier over the fleet's sidecars, each listening on
 *   an `inproc://` endpoint of its own (the fleet's sidecars run in one thread); each chunk has one
 *   home among them, as `replicas: 1` places it.
 *
 * Writes are not made durable (`fsync: none`): the planner measures reuse, not durability.
 */

/** Lower tiers in the order a sidecar walks them. */
const ORDER = ['disk', 'fs', 'redis', 's3'] as const;

/** What {@link setUpTiers} made. */
export interface RunTiers {
  /** Each engine's tiers below its CPU tier. */
  engineTiers: SimTierConfig[][];
  /** Tiers one store serves to every engine. */
  sharedTiers: string[];
  /** Each engine's sidecar endpoint, with a peer tier. */
  listens?: string[];
  /** fs-backed tiers whose capacity the modeled-clock sweep enforces. */
  sweepTiers: string[];
  /** Kill and restart of the run's Redis (with `redisOutage`). */
  hooks?: { killRedis(): Promise<void>; restartRedis(): Promise<void> };
  /** Stops what was started; idempotent, never rejects. */
  close(): Promise<void>;
}

/** Options of {@link setUpTiers}. */
export interface SetUpTiersOptions {
  /** Capacity per lower tier, planned model's bytes. */
  capacities: Partial<Record<PlannerTier, number>>;
  engines: number;
  /** Whether fs, redis and s3 are one store for all engines (else each engine its 1/N). */
  shared: boolean;
  /** A peer tier below the others (a fleet: engines >= 2). */
  peers?: boolean;
  shapes: PlanShapes;
  /** The run's directory. */
  workDir: string;
  /** A Redis server's URL to use instead of a private one. */
  redisUrl?: string | undefined;
  /** `--fault redis-outage`: the run owns a Redis server it can kill. */
  redisOutage?: boolean;
}

/**
 * Starts and describes the run's tiers.
 * @throws the private Redis server's error when it cannot start (none is left running).
 */
export async function setUpTiers(o: SetUpTiersOptions): Promise<RunTiers> {
  const servers: PrivateRedis[] = [];
  const close = async () => {
    await Promise.all(servers.map((s) => s.kill().catch(() => {})));
  };
  try {
    const n = o.engines;
    const engineTiers: SimTierConfig[][] = Array.from({ length: n }, () => []);
    const sharedTiers: string[] = [];
    const sweepTiers: string[] = [];
    let hooks: RunTiers['hooks'];
    const wantsRedis =
      o.capacities.redis !== undefined || o.redisUrl !== undefined || o.redisOutage === true;
    for (const t of ORDER) {
      const cap = o.capacities[t];
      if (t === 'redis' ? !wantsRedis : cap === undefined) continue;
      const shared = o.shared && t !== 'disk' && n > 1;
      if (shared) sharedTiers.push(t);
      if (t === 'fs' || t === 's3') sweepTiers.push(t);
      const split = shared || t === 'disk' ? 1 : n;
      let redisUrl: string | undefined = o.redisUrl;
      const prefix = `kvtier-sim-${randomBytes(6).toString('hex')}:`;
      for (let i = 0; i < n; i++) {
        const own = shared ? '' : `-${i}`;
        const part = cap === undefined ? undefined : Math.floor(cap / split);
        if (t === 'redis') {
          if (o.redisUrl === undefined && (i === 0 || !shared)) {
            const srv = await PrivateRedis.start(
              join(o.workDir, `redis${own}`),
              part === undefined ? undefined : redisMaxMemory(part, o.shapes),
            );
            servers.push(srv);
            redisUrl = srv.url;
            if (o.redisOutage === true)
              hooks = { killRedis: () => srv.kill(), restartRedis: () => srv.restart() };
          }
          engineTiers[i]!.push({
            name: t,
            type: 'redis',
            options: { url: redisUrl, keyPrefix: `${prefix}${shared ? '' : `e${i}:`}` },
          });
          continue;
        }
        const path = join(o.workDir, `${t}${t === 'disk' ? `-${i}` : own}`);
        const capacityBytes = Math.max(
          lowerTierBytes(part as number, o.shapes),
          chunkObjectBytes(o.shapes) + 1,
        );
        engineTiers[i]!.push(
          t === 'disk'
            ? { name: t, type: 'local-disk', options: { path, capacityBytes, fsync: 'none' } }
            : {
                name: t,
                type: 'fs',
                // The backend's own timer would sweep on the wall clock; the engines sweep instead.
                options: { path, capacityBytes, fsync: 'none', sweepIntervalMs: 24 * 3600 * 1000 },
              },
        );
      }
    }
    let listens: string[] | undefined;
    if (o.peers === true && n > 1) {
      const run = randomBytes(6).toString('hex');
      listens = Array.from({ length: n }, (_, i) => `inproc://kvtier-sim-${run}-${i}`);
      const peers = listens.map((endpoint, i) => ({ name: `engine-${i}`, endpoint }));
      for (let i = 0; i < n; i++)
        engineTiers[i]!.push({
          name: 'peer',
          type: 'peer',
          // The modeled clock times the loads: a busy machine's real delays must not miss.
          options: { self: `engine-${i}`, peers, timeoutMs: 600_000 },
        });
    }
    return {
      engineTiers,
      sharedTiers,
      ...(listens === undefined ? {} : { listens }),
      sweepTiers,
      ...(hooks === undefined ? {} : { hooks }),
      close,
    };
  } catch (err) {
    await close();
    throw err;
  }
}
