/**
 * Children that die with their parent. A server a process starts (a private redis-server, a
 * test's sidecar) must not outlive it, even when the parent is killed with SIGKILL and runs no
 * exit handler. On Linux, util-linux's `setpriv --pdeathsig KILL` sets the child's parent-death
 * signal before it execs the program (the pid stays the program's); elsewhere the program runs
 * as given.
 */
import { accessSync, constants } from 'node:fs';

const SETPRIV = ['/usr/bin/setpriv', '/bin/setpriv'];

let found: string | null | undefined;

/** The setpriv binary, or null where there is none (or not Linux). */
function setpriv(): string | null {
  if (found !== undefined) return found;
  found = null;
  if (process.platform !== 'linux') return found;
  for (const p of SETPRIV) {
    try {
      accessSync(p, constants.X_OK);
      found = p;
      break;
    } catch {}
  }
  return found;
}

/**
 * `[command, args]` that run `program args` so that it is killed (SIGKILL) when this process
 * dies: through setpriv where it exists, else unchanged. Spawn the result from the main thread
 * (the signal follows the thread that forked).
 */
export function dyingWithParent(program: string, args: readonly string[]): [string, string[]] {
  const sp = setpriv();
  return sp === null ? [program, [...args]] : [sp, ['--pdeathsig', 'KILL', '--', program, ...args]];
}
