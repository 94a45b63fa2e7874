/**
 * What the host gives the sidecar: the memory it may use (the machine's, or less under a cgroup
 * memory limit, as in a container) and the space on the filesystem of each disk tier. The
 * embedded defaults are sized from them, and a configured size beyond them is refused (with the
 * numbers) unless `allowOversizedTiers` says otherwise: a host-memory tier larger than the
 * memory limit ends in an OOM kill, a disk tier larger than its filesystem in ENOSPC.
 */
import { existsSync, readFileSync, statfsSync, statSync } from 'node:fs';
import { lstat, opendir } from 'node:fs/promises';
import { totalmem } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { formatBytes } from '../util/bytes.ts';
import type { ConfigProblem } from '../util/schema-kit.ts';

/** What {@link hostSizeProblems} reads of a config (KvtierConfig has it). */
export interface SizedConfig {
  readonly tiers: readonly { readonly type: string; readonly options: Record<string, unknown> }[];
  readonly allowOversizedTiers: boolean;
}

/** Where the cgroup filesystem and this process's cgroup file are; tests point them elsewhere. */
export interface HostPaths {
  /** The cgroup mount; default /sys/fs/cgroup. */
  cgroupRoot?: string;
  /** This process's cgroup membership; default /proc/self/cgroup. */
  procSelfCgroup?: string;
  /** The machine's memory in bytes; default os.totalmem(). */
  totalMemoryBytes?: number;
}

/** A limit at or past this is "no limit" (cgroup v1 writes 2^63 rounded down to a page). */
const UNLIMITED = 2 ** 60;

function readLimit(file: string): number | undefined {
  let text: string;
  try {
    text = readFileSync(file, 'utf8').trim();
  } catch {
    return undefined;
  }
  if (text === 'max') return undefined;
  const n = Number(text);
  return Number.isFinite(n) && n > 0 && n < UNLIMITED ? n : undefined;
}

/** The smallest limit in `file` of `dir` and of every directory above it up to `top`. */
function smallestUpTo(top: string, dir: string, file: string): number | undefined {
  let best: number | undefined;
  let d = dir;
  for (;;) {
    const n = readLimit(join(d, file));
    if (n !== undefined && (best === undefined || n < best)) best = n;
    if (d === top || !d.startsWith(top)) break;
    d = dirname(d);
  }
  return best;
}

/**
 * The cgroup memory limit of this process in bytes, or undefined when there is none: cgroup v2
 * `memory.max`, else v1 `memory.limit_in_bytes`, of its cgroup and every cgroup above it (the
 * smallest wins).
 */
export function cgroupMemoryLimitBytes(paths: HostPaths = {}): number | undefined {
  const root = paths.cgroupRoot ?? '/sys/fs/cgroup';
  let lines: string[];
  try {
    lines = readFileSync(paths.procSelfCgroup ?? '/proc/self/cgroup', 'utf8').split('\n');
  } catch {
    lines = [];
  }
  const v1 = lines
    .map((l) => /^\d+:([^:]*):(.*)$/.exec(l))
    .find((m) => m?.[1]?.split(',').includes('memory'));
  if (v1 !== undefined && v1 !== null && existsSync(join(root, 'memory'))) {
    const top = join(root, 'memory');
    return smallestUpTo(top, join(top, v1[2]!), 'memory.limit_in_bytes');
  }
  const v2 = lines.map((l) => /^0::(.*)$/.exec(l)).find((m) => m !== null);
  if (existsSync(join(root, 'cgroup.controllers')))
    return smallestUpTo(root, join(root, v2?.[1] ?? '/'), 'memory.max');
  return undefined;
}

/** The memory this process may use: the machine's, or its cgroup limit when that is lower. */
export function hostMemory(paths: HostPaths = {}): {
  bytes: number;
  machineBytes: number;
  cgroupBytes: number | undefined;
} {
  const machineBytes = paths.totalMemoryBytes ?? totalmem();
  const cgroupBytes = cgroupMemoryLimitBytes(paths);
  return {
    bytes: cgroupBytes === undefined ? machineBytes : Math.min(machineBytes, cgroupBytes),
    machineBytes,
    cgroupBytes,
  };
}

/** The nearest directory at or above `path` that exists. */
export function existingAncestor(path: string): string {
  let dir = resolve(path);
  while (!existsSync(dir) && dirname(dir) !== dir) dir = dirname(dir);
  return dir;
}

/** Free and total bytes of the filesystem that holds (or will hold) `path`; zeros if unknown. */
export function filesystemSpace(path: string): { freeBytes: number; totalBytes: number } {
  try {
    const st = statfsSync(existingAncestor(path));
    return { freeBytes: st.bavail * st.bsize, totalBytes: st.blocks * st.bsize };
  } catch {
    return { freeBytes: 0, totalBytes: 0 };
  }
}

/** Bytes of the files under `dir` (0 when it does not exist); a bound on work, not on size. */
export async function directoryBytes(dir: string): Promise<number> {
  let total = 0;
  const walk = async (d: string): Promise<void> => {
    let handle: Awaited<ReturnType<typeof opendir>>;
    try {
      handle = await opendir(d);
    } catch {
      return;
    }
    for await (const e of handle) {
      const p = join(d, e.name);
      if (e.isDirectory()) await walk(p);
      else if (e.isFile()) total += (await lstat(p).catch(() => ({ size: 0 }))).size;
    }
  };
  await walk(dir);
  return total;
}

const HOST_MEMORY_TYPES = new Set(['local-cpu', 'memory']);
const DISK_TYPES = new Set(['local-disk']);

/**
 * Configured sizes beyond what the host gives: host-memory tiers whose `capacityBytes` add up
 * to more than {@link hostMemory}, and disk tiers whose `capacityBytes` (added up per
 * filesystem) are more than that filesystem's free space plus what their directories already
 * hold. Each problem names the numbers and the override. Empty when `allowOversizedTiers`.
 */
export async function hostSizeProblems(
  cfg: SizedConfig,
  paths: HostPaths = {},
): Promise<ConfigProblem[]> {
  if (cfg.allowOversizedTiers) return [];
  const problems: ConfigProblem[] = [];
  const override =
    'lower it, or set allowOversizedTiers: true (KVTIER_ALLOW_OVERSIZED_TIERS=1) to start anyway';
  const mem = hostMemory(paths);
  let memSum = 0;
  for (const [i, t] of cfg.tiers.entries()) {
    const cap = t.options.capacityBytes;
    if (!HOST_MEMORY_TYPES.has(t.type) || typeof cap !== 'number') continue;
    memSum += cap;
    if (memSum <= mem.bytes) continue;
    const limit =
      mem.cgroupBytes !== undefined && mem.cgroupBytes < mem.machineBytes
        ? `the cgroup memory limit of ${formatBytes(mem.bytes)} (the machine has ${formatBytes(mem.machineBytes)})`
        : `this machine's memory, ${formatBytes(mem.bytes)}`;
    const what =
      memSum === cap
        ? formatBytes(cap)
        : `${formatBytes(cap)} (${formatBytes(memSum)} with the tiers above)`;
    problems.push({
      path: `tiers[${i}].capacityBytes`,
      message: `${what} of host memory is more than ${limit}; ${override}`,
    });
  }
  // Disk tiers, added up per filesystem (its device number).
  const byDevice = new Map<number, { sum: number; held: number; dirs: string[] }>();
  for (const [i, t] of cfg.tiers.entries()) {
    const cap = t.options.capacityBytes;
    const path = t.options.path;
    if (!DISK_TYPES.has(t.type) || typeof cap !== 'number' || typeof path !== 'string') continue;
    const dir = resolve(path);
    let dev: number;
    try {
      dev = statSync(existingAncestor(dir)).dev;
    } catch {
      continue;
    }
    const fs = byDevice.get(dev) ?? { sum: 0, held: 0, dirs: [] };
    byDevice.set(dev, fs);
    fs.sum += cap;
    fs.dirs.push(dir);
    const { freeBytes } = filesystemSpace(dir);
    if (fs.sum <= freeBytes + fs.held) continue;
    // Past the free space: count what the tiers' directories hold already (a restarted tier).
    fs.held = 0;
    for (const d of fs.dirs) fs.held += await directoryBytes(d);
    if (fs.sum <= freeBytes + fs.held) continue;
    const what =
      fs.sum === cap
        ? formatBytes(cap)
        : `${formatBytes(cap)} (${formatBytes(fs.sum)} with the disk tiers above on that filesystem)`;
    problems.push({
      path: `tiers[${i}].capacityBytes`,
      message: `${what} is more than the ${formatBytes(freeBytes)} free on the filesystem of ${dir}${fs.held > 0 ? ` plus the ${formatBytes(fs.held)} its tier directories hold` : ''}; ${override}`,
    });
  }
  return problems;
}
