/**
 * The checks a resolved config must pass before the sidecar binds anything, shared by
 * `kvtier serve` (Sidecar.start) and `kvtier config check`, so that the check cannot pass what
 * serve refuses: tier types and options, the host-memory first tier, plug-in paths, paths that
 * must be writable, and (config check) the CurveZMQ keys and bind rule and every tier that is
 * built rather than checked statically.
 */
import { constants } from 'node:fs';
import { access, stat } from 'node:fs/promises';
import { dirname, isAbsolute, resolve } from 'node:path';
import { type BackendRegistry, BUILTIN_TIERS } from '../backends/registry.ts';
import { isKvtierError } from '../errors.ts';
import { exposedEventEndpoints } from '../event-stream/sidecar-events.ts';
import { silentLogger } from '../util/log.ts';
import type { ConfigProblem } from '../util/schema-kit.ts';
import type { KvtierConfig } from './config.ts';
import { endpointClashes } from './endpoint-clash.ts';
import { hostSizeProblems } from './host-limits.ts';
import { serverAuthFromConfig } from './server-auth.ts';

/** The built-in types that keep chunks in host memory: the only ones allowed first. */
const HOST_MEMORY_TYPES = new Set(
  BUILTIN_TIERS.filter((t) => t.hostMemory === true).map((t) => t.options.type),
);

/**
 * Built-in types checked without building them (`check: 'static'` in the registry), with the option
 * naming the directory that must be writable, if any.
 */
const STATIC_TYPES: ReadonlyMap<string, string | undefined> = new Map(
  BUILTIN_TIERS.filter((t) => t.check === 'static').map((t) => [t.options.type, t.dirOption]),
);

const BUILTIN_TYPES = BUILTIN_TIERS.map((t) => t.options.type);

/** Types whose directory is shared storage: it must exist, serve does not create it. */
const SHARED_TYPES: ReadonlySet<string> = new Set(['fs']);

/** Built-in types that connect to a server; `config check --offline` leaves them unbuilt. */
export const REMOTE_TYPES: ReadonlySet<string> = new Set(
  BUILTIN_TIERS.filter((t) => t.check === 'remote').map((t) => t.options.type),
);

/**
 * Why this process cannot create files in `path` (a directory, made when missing), or
 * undefined when it can: `path` exists and is not a writable directory, or the nearest
 * directory that exists above it is not writable.
 */
export async function unwritableDir(path: string): Promise<string | undefined> {
  let dir = resolve(path);
  for (;;) {
    try {
      const st = await stat(dir);
      if (!st.isDirectory())
        return dir === resolve(path)
          ? `${dir} exists and is not a directory`
          : `${resolve(path)} cannot be created: ${dir} is not a directory`;
      await access(dir, constants.W_OK | constants.X_OK);
      return undefined;
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if ((code === 'ENOENT' || code === 'ENOTDIR') && dirname(dir) !== dir) {
        dir = dirname(dir);
        continue;
      }
      const who = typeof process.getuid === 'function' ? ` (uid ${process.getuid()})` : '';
      const what =
        dir === resolve(path)
          ? `${dir} is not writable`
          : `${resolve(path)} cannot be created: ${dir} is not writable`;
      return `${what} by this user${who}: ${code ?? (err as Error).message}`;
    }
  }
}

/**
 * What serve checks before it builds a tier: every type is registered and its options pass its
 * validator, the first tier keeps chunks in host memory, a plug-in given by path exists, the
 * local stores' directories and the epoch file's directory are writable. Never builds anything.
 */
export async function staticConfigProblems(
  cfg: KvtierConfig,
  registry: BackendRegistry,
): Promise<ConfigProblem[]> {
  const problems: ConfigProblem[] = [];
  const builtins = new Set(BUILTIN_TYPES);
  for (const [i, tier] of cfg.tiers.entries()) {
    try {
      registry.validateTiers([tier]);
    } catch (err) {
      problems.push({ path: `tiers[${i}]`, message: (err as Error).message });
      continue;
    }
    const spec = tier.options.module;
    if (tier.type === 'module' && typeof spec === 'string') {
      const isPath = spec.startsWith('.') || isAbsolute(spec);
      const file = resolve(cfg.baseDir, spec);
      if (isPath && (await stat(file).catch(() => undefined)) === undefined)
        problems.push({
          path: `tiers[${i}].module`,
          message: `plug-in module ${file} does not exist`,
        });
    }
    const key = STATIC_TYPES.get(tier.type);
    const dir = key === undefined ? undefined : tier.options[key];
    if (typeof dir === 'string') {
      const why =
        SHARED_TYPES.has(tier.type) && (await stat(dir).catch(() => undefined)) === undefined
          ? `${resolve(dir)} does not exist: a ${tier.type} tier's directory is shared storage (an NFS, Lustre or 3FS mount) and is never created, so that a share that is not mounted does not become a local directory; mount it or create it first`
          : await unwritableDir(dir);
      if (why !== undefined) problems.push({ path: `tiers[${i}].${key}`, message: why });
    }
  }
  problems.push(...endpointClashes(cfg));
  const first = cfg.tiers[0];
  if (first !== undefined && builtins.has(first.type) && !HOST_MEMORY_TYPES.has(first.type))
    problems.push({
      path: 'tiers[0].type',
      message: `the first tier must keep chunks in host memory (local-cpu), got "${first.type}"`,
    });
  const epochFile = cfg.storage.epochFile;
  if (epochFile !== null) {
    const why = await unwritableDir(dirname(resolve(cfg.baseDir, epochFile)));
    if (why !== undefined) problems.push({ path: 'storage.epochFile', message: why });
  }
  return problems;
}

/** Options of {@link checkConfig}. */
export interface CheckConfigOptions {
  /** Leave the tiers that connect to servers ({@link REMOTE_TYPES}) unbuilt; default false. */
  offline?: boolean;
}

/** A tier below host memory that the check could not reach: serve starts with it down. */
export interface UnreachableTier {
  /** Its key path, `tiers[<i>]`. */
  path: string;
  name: string;
  type: string;
  /** Why: the start's error message (`tier "<name>" (<type>) failed to start: ...`). */
  reason: string;
}

/** What {@link checkConfig} found. */
export interface ConfigCheck {
  /** What serve refuses (empty when it would start). */
  problems: ConfigProblem[];
  /** Tiers it could not reach; serve starts without them and they join when they answer. */
  unreachable: UnreachableTier[];
}

/**
 * Everything serve checks short of binding its sockets: {@link staticConfigProblems}; the tiers'
 * sizes against the host (host-limits.ts; `kvtier serve` checks them before it starts the
 * sidecar, an embedder's `Sidecar.start` does not); the
 * CurveZMQ key files (present, keys, the secret one owner-only) and the rule that a non-loopback
 * endpoint needs keys; then every tier that is not checked statically (plug-ins, Redis, S3,
 * types registered by an embedder) is built as serve builds it (a tier below host memory within
 * its `health.timeoutMs`), checked, and closed again. A tier below host memory whose start fails
 * for any reason but its config is unreachable, not a problem: serve starts with it down.
 */
export async function checkConfig(
  cfg: KvtierConfig,
  registry: BackendRegistry,
  opts: CheckConfigOptions = {},
): Promise<ConfigCheck> {
  const problems = [
    ...(await staticConfigProblems(cfg, registry)),
    ...(await hostSizeProblems(cfg)),
  ];
  const unreachable: UnreachableTier[] = [];
  try {
    const auth = await serverAuthFromConfig(cfg, silentLogger, {});
    await auth?.close();
  } catch (err) {
    problems.push({ path: 'security', message: (err as Error).message });
  }
  if (cfg.events !== null) {
    try {
      exposedEventEndpoints(
        cfg.events,
        cfg.security.serverSecretKeyFile !== null,
        cfg.security.allowUnauthenticated,
      );
    } catch (err) {
      problems.push({ path: 'events', message: (err as Error).message });
    }
  }
  const failed = new Set(problems.map((p) => /^tiers\[(\d+)\]/.exec(p.path)?.[1]).filter(Boolean));
  for (const [i, tier] of cfg.tiers.entries()) {
    if (failed.has(String(i)) || STATIC_TYPES.has(tier.type)) continue;
    if (opts.offline === true && REMOTE_TYPES.has(tier.type)) continue;
    const path = `tiers[${i}]`;
    try {
      const built = await registry.createTiers([tier], { position: i });
      await Promise.all(built.map((b) => b.close()));
    } catch (err) {
      const message = (err as Error).message;
      if (i > 0 && isKvtierError(err, 'KVT_BACKEND'))
        unreachable.push({ path, name: tier.name, type: tier.type, reason: message });
      else problems.push({ path, message });
    }
  }
  return { problems, unreachable };
}
