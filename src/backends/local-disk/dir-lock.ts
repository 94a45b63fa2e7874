/**
 * One sidecar per disk directory. Two sidecars sharing a local-disk directory would evict,
 * clear and journal each other's chunks without knowing; the second to start is refused,
 * naming the first. The lock is a file, `.kvtier.lock`, holding who took it (pid, host, boot
 * id, process start time), removed on close. A lock is stale, and taken over, when its holder is
 * gone: on this host (same boot) its pid is not running or is another process now; after a
 * reboot; or, from another host sharing the directory, when its holder stopped touching it
 * (every {@link HEARTBEAT_MS}) for {@link STALE_AFTER_MS}.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { readFile, rename, stat, unlink, utimes, writeFile } from 'node:fs/promises';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { KvtierError } from '../../errors.ts';
import type { Logger } from '../../util/log.ts';

/** The lock file's name in the directory. */
export const LOCK_FILE = '.kvtier.lock';
/** How often the holder touches the lock, ms. */
export const HEARTBEAT_MS = 10_000;
/** A lock from another host untouched this long is stale, ms. */
export const STALE_AFTER_MS = 3 * HEARTBEAT_MS;

interface LockOwner {
  pid: number;
  host: string;
  bootId: string;
  /** The process's start time in clock ticks since boot (/proc/PID/stat), or '' off Linux. */
  started: string;
  since: string;
  token: string;
}

function bootId(): string {
  try {
    return readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
  } catch {
    return '';
  }
}

function processStart(pid: number): string {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19] ?? '';
  } catch {
    return '';
  }
}

function running(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Directories locked by this process, so that two tiers of one sidecar cannot share one. */
const heldHere = new Set<string>();

/** A held lock: `release()` on close. */
export interface DirLock {
  readonly path: string;
  release(): Promise<void>;
}

/**
 * Takes `dir`'s lock (the directory must exist).
 * @throws KvtierError KVT_CONFIG when a running sidecar holds it, naming its pid and host.
 */
export async function lockDirectory(dir: string, tier: string, log: Logger): Promise<DirLock> {
  const path = join(dir, LOCK_FILE);
  if (heldHere.has(dir))
    throw new KvtierError(
      'KVT_CONFIG',
      `tier "${tier}": disk directory ${dir} is used by another tier of this sidecar; give each tier its own directory`,
    );
  const me: LockOwner = {
    pid: process.pid,
    host: hostname(),
    bootId: bootId(),
    started: processStart(process.pid),
    since: new Date().toISOString(),
    token: randomBytes(8).toString('hex'),
  };
  const text = `${JSON.stringify(me)}\n`;
  try {
    await writeFile(path, text, { flag: 'wx', mode: 0o644 });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    const held = await holder(path);
    if (held !== undefined && !stale(held.owner, held.mtimeMs, me))
      throw new KvtierError(
        'KVT_CONFIG',
        `tier "${tier}": disk directory ${dir} is in use by another kvtier sidecar (pid ${held.owner.pid} on ${held.owner.host}, since ${held.owner.since}; lock file ${path}); give each sidecar its own directory, or stop that one`,
      );
    log.info('taking over the lock of a sidecar that is gone', {
      tier,
      lock: path,
      ...(held !== undefined ? { pid: held.owner.pid, host: held.owner.host } : {}),
    });
    // Written whole, then renamed over the stale one; the read-back settles a race of two.
    const tmp = `${path}.${me.token}`;
    await writeFile(tmp, text, { mode: 0o644 });
    await rename(tmp, path);
    const now = await holder(path);
    if (now?.owner.token !== me.token)
      throw new KvtierError(
        'KVT_CONFIG',
        `tier "${tier}": disk directory ${dir} was just locked by another kvtier sidecar (pid ${now?.owner.pid ?? '?'}; lock file ${path})`,
      );
  }
  heldHere.add(dir);
  const timer = setInterval(() => {
    const t = new Date();
    utimes(path, t, t).catch(() => {});
  }, HEARTBEAT_MS);
  timer.unref();
  log.debug('disk directory locked', { tier, lock: path });
  let released: Promise<void> | undefined;
  return {
    path,
    release() {
      released ??= (async () => {
        clearInterval(timer);
        heldHere.delete(dir);
        if ((await holder(path))?.owner.token === me.token) await unlink(path).catch(() => {});
      })();
      return released;
    },
  };
}

async function holder(path: string): Promise<{ owner: LockOwner; mtimeMs: number } | undefined> {
  try {
    const [text, st] = await Promise.all([readFile(path, 'utf8'), stat(path)]);
    const owner = JSON.parse(text) as LockOwner;
    if (typeof owner.pid !== 'number') return undefined;
    return { owner, mtimeMs: st.mtimeMs };
  } catch {
    return undefined;
  }
}

function stale(owner: LockOwner, mtimeMs: number, me: LockOwner): boolean {
  if (owner.host === me.host && owner.bootId !== '' && owner.bootId === me.bootId) {
    // Same machine, same boot: the pid says it (a pid of ours is a previous run's, say pid 1 in
    // a restarted container; a reused pid has another start time).
    if (owner.pid === me.pid || !running(owner.pid)) return true;
    return owner.started !== '' && processStart(owner.pid) !== owner.started;
  }
  if (owner.host === me.host && owner.bootId !== me.bootId) return true;
  return Date.now() - mtimeMs > STALE_AFTER_MS;
}
