import { closeSync, openSync, readdirSync, readSync, statSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { OBJECT_SUFFIX } from '../backends/files/file-store.ts';
import { CHUNK_HEADER_BYTES } from '../backends/format/chunk-format.ts';
import type { LoadIntent } from '../connector/types.ts';
import { KvtierError } from '../errors.ts';
import { chunkHashesFromPacked } from '../hashing/chunk-hash.ts';
import type { LookupClient } from '../lookup-client/lookup-client.ts';
import type { Sidecar } from '../sidecar.ts';
import type { SimFaults, SimTierConfig } from './types.ts';

/**
 * Fault injection for the simulator (`SimFaults`). A fault fires at its step, or, for faults
 * that need something to act on, at the first step from then on where there is something:
 * the lookup deadline needs a lookup in flight, the eviction needs a load about to start, the
 * corruption needs a stored chunk on the lowest tier. Each fault is recorded with what it did;
 * the report adds how the run handled it.
 */

/** Tier types whose stored objects `corruptStoredChunks` can damage. */
export const CORRUPTIBLE_TIER_TYPES: readonly string[] = ['local-disk', 'fs', 'redis'];

/** What the injector needs from the running engine. */
export interface FaultEnv {
  sidecar(): Sidecar;
  restartSidecar(): Promise<void>;
  /** A lookup client of its own, to release a lookup's pins as a TTL expiry would. */
  admin: LookupClient;
  namespace(): string;
  /** Moves the scheduler's lookup clock forward (the engine stalled past the deadline). */
  skewLookupClock(ms: number): void;
  pendingLookups(): number;
  lookupTimeoutMs: number;
  killRedis?: () => Promise<void>;
  restartRedis?: () => Promise<void>;
}

/** One fault that fired. */
export interface FiredFault {
  kind:
    | 'redis-outage'
    | 'sidecar-restart'
    | 'corrupt-chunks'
    | 'lookup-deadline'
    | 'evict-between-lookup-and-load';
  step: number;
  detail: string;
}

/**
 * Checks the fault options against the tiers and hooks.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for a bad step, a Redis outage without the kill and
 *   restart hooks (the simulator does not own the Redis server), or corruption of a tier type it
 *   cannot reach.
 */
export function validateFaults(
  faults: SimFaults,
  lowest: SimTierConfig | undefined,
  hooks: { killRedis?: unknown; restartRedis?: unknown },
): void {
  const step = (name: string, v: unknown) => {
    if (v !== undefined && (typeof v !== 'number' || !Number.isInteger(v) || v < 1))
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `faults.${name} must be an integer >= 1, got ${String(v)}`,
      );
  };
  step('sidecarRestartAtStep', faults.sidecarRestartAtStep);
  step('lookupDeadlineAtStep', faults.lookupDeadlineAtStep);
  step('evictBetweenLookupAndLoadAtStep', faults.evictBetweenLookupAndLoadAtStep);
  if (faults.redisOutage !== undefined) {
    step('redisOutage.atStep', faults.redisOutage.atStep);
    step('redisOutage.forSteps', faults.redisOutage.forSteps);
    if (typeof hooks.killRedis !== 'function' || typeof hooks.restartRedis !== 'function')
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        'faults.redisOutage needs hooks.killRedis and hooks.restartRedis (the simulator does not own the Redis server)',
      );
  }
  if (faults.corruptChunks !== undefined) {
    step('corruptChunks.atStep', faults.corruptChunks.atStep);
    step('corruptChunks.count', faults.corruptChunks.count);
    if (lowest === undefined || !CORRUPTIBLE_TIER_TYPES.includes(lowest.type))
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `faults.corruptChunks needs a lowest tier of type ${CORRUPTIBLE_TIER_TYPES.join(', ')}; got ${lowest?.type ?? 'only the CPU tier'}`,
      );
  }
}

/** Fires the configured faults at their steps; see the module comment. */
export class FaultInjector {
  readonly #f: SimFaults;
  readonly #lowest: SimTierConfig | undefined;
  readonly #env: FaultEnv;
  readonly fired: FiredFault[] = [];
  #corruptDone = false;
  #deadlineDone = false;
  #evictDone = false;

  constructor(faults: SimFaults, lowest: SimTierConfig | undefined, env: FaultEnv) {
    this.#f = faults;
    this.#lowest = lowest;
    this.#env = env;
  }

  /** Faults at the start of a step: Redis kill/restart, sidecar restart, corruption. */
  async beforeStep(step: number): Promise<void> {
    const f = this.#f;
    const env = this.#env;
    const outage = f.redisOutage;
    if (outage !== undefined && step === outage.atStep) {
      await env.killRedis!();
      this.#fire('redis-outage', step, `Redis killed for ${outage.forSteps} steps`);
    }
    if (outage !== undefined && step === outage.atStep + outage.forSteps) {
      await env.restartRedis!();
      this.#fire('redis-outage', step, 'Redis restarted (empty: nothing persisted)');
    }
    if (f.sidecarRestartAtStep === step) {
      await env.restartSidecar();
      const held = env
        .sidecar()
        .storage.tiers.slice(1)
        .map((t) => `${t.name}: ${t.stats().chunks} chunks`);
      this.#fire(
        'sidecar-restart',
        step,
        `sidecar restarted on the same endpoint, KV caches registered again; recovered ${held.join(', ') || 'no lower tier'}`,
      );
    }
    const c = f.corruptChunks;
    if (c !== undefined && !this.#corruptDone && step >= c.atStep && this.#lowest !== undefined) {
      const tier = env.sidecar().storage.tiers.find((t) => t.name === this.#lowest!.name);
      if (tier !== undefined && tier.stats().chunks > 0) {
        this.#corruptDone = true;
        const n = await corruptStoredChunks(this.#lowest, c.count);
        this.#fire(
          'corrupt-chunks',
          step,
          `${n} stored chunks corrupted on tier "${this.#lowest.name}"`,
        );
      }
    }
  }

  /** Between lookup and load: releases the loads' pins and evicts their chunks from the CPU tier. */
  async beforeLoads(step: number, loads: readonly LoadIntent[]): Promise<void> {
    const at = this.#f.evictBetweenLookupAndLoadAtStep;
    if (at === undefined || this.#evictDone || step < at || loads.length === 0) return;
    this.#evictDone = true;
    const env = this.#env;
    const cpu = env.sidecar().storage.tiers[0]!;
    let removed = 0;
    for (const l of loads) {
      await env.admin.cancel(l.lookupId);
      removed += await cpu.remove(env.namespace(), chunkHashesFromPacked(l.chunkHashes));
    }
    this.#fire(
      'evict-between-lookup-and-load',
      step,
      `${loads.length} loads lost their pins; ${removed} chunks evicted from the CPU tier`,
    );
  }

  /** After the scheduling pass: returns true when the engine must stall past the lookup deadline. */
  afterSchedule(step: number): boolean {
    const at = this.#f.lookupDeadlineAtStep;
    const env = this.#env;
    if (at === undefined || this.#deadlineDone || step < at || env.pendingLookups() === 0)
      return false;
    this.#deadlineDone = true;
    const n = env.pendingLookups();
    env.skewLookupClock(env.lookupTimeoutMs + 1);
    this.#fire(
      'lookup-deadline',
      step,
      `engine stalled past the lookup deadline with ${n} lookups in flight`,
    );
    return true;
  }

  #fire(kind: FiredFault['kind'], step: number, detail: string): void {
    this.fired.push({ kind, step, detail });
  }
}

/**
 * Damages up to `count` stored chunk objects of a tier below its API (one payload byte flipped,
 * header intact), in a stable order; the tier's checksum must catch them on read. Returns how
 * many were damaged.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for a tier type it cannot reach.
 */
export async function corruptStoredChunks(tier: SimTierConfig, count: number): Promise<number> {
  if (tier.type === 'local-disk' || tier.type === 'fs') {
    const files = listObjects(String(tier.options.path)).sort().slice(0, count);
    let n = 0;
    for (const f of files) if (flipFileByte(f)) n++;
    return n;
  }
  if (tier.type === 'redis') return corruptRedis(tier.options, count);
  throw new KvtierError('KVT_INVALID_ARGUMENT', `cannot corrupt chunks of a ${tier.type} tier`);
}

function listObjects(dir: string): string[] {
  const out: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...listObjects(p));
    else if (e.isFile() && e.name.endsWith(OBJECT_SUFFIX)) out.push(p);
  }
  return out;
}

function flipFileByte(path: string): boolean {
  const size = statSync(path).size;
  if (size <= CHUNK_HEADER_BYTES) return false;
  const at = CHUNK_HEADER_BYTES + ((size - CHUNK_HEADER_BYTES) >> 1);
  const fd = openSync(path, 'r+');
  try {
    const b = Buffer.alloc(1);
    readSync(fd, b, 0, 1, at);
    b[0]! ^= 0x5a;
    writeSync(fd, b, 0, 1, at);
  } finally {
    closeSync(fd);
  }
  return true;
}

async function corruptRedis(o: Record<string, unknown>, count: number): Promise<number> {
  const opts = { lazyConnect: true, maxRetriesPerRequest: 1, enableOfflineQueue: false };
  const client =
    typeof o.url === 'string'
      ? new Redis(o.url, opts)
      : new Redis({
          ...opts,
          host: typeof o.host === 'string' ? o.host : '127.0.0.1',
          port: typeof o.port === 'number' ? o.port : 6379,
          ...(typeof o.password === 'string' ? { password: o.password } : {}),
          ...(typeof o.db === 'number' ? { db: o.db } : {}),
        });
  try {
    await client.connect();
    const prefix = typeof o.keyPrefix === 'string' ? o.keyPrefix : 'kvtier:';
    const keys: string[] = [];
    let cursor = '0';
    do {
      const [next, batch] = await client.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
      cursor = next;
      keys.push(...batch);
    } while (cursor !== '0');
    let n = 0;
    for (const key of keys.sort().slice(0, count)) {
      const v = await client.getBuffer(key);
      if (v === null || v.length <= CHUNK_HEADER_BYTES) continue;
      v[CHUNK_HEADER_BYTES + ((v.length - CHUNK_HEADER_BYTES) >> 1)]! ^= 0x5a;
      await client.set(key, v, 'KEEPTTL');
      n++;
    }
    return n;
  } finally {
    client.disconnect();
  }
}
