/**
 * Programs a test starts (redis-server, sidecar processes, Prometheus, pytest) die with the test
 * process, however it ends:
 * - on Linux each is started through `setpriv --pdeathsig KILL` (src/util/parent-death.ts), so
 *   the kernel kills it when the test process dies, SIGKILL and timeouts included;
 * - every child still running when the test process exits normally is killed (its process group
 *   for `group` children, which start programs of their own);
 * - each child is recorded in {@link LEFTOVERS_DIR} until it exits, and scripts/run-tests.mjs
 *   kills those whose test process is gone before it runs anything (what no signal reached:
 *   grandchildren of a killed group, or systems without setpriv).
 */
import {
  type ChildProcess,
  type ChildProcessWithoutNullStreams,
  type SpawnOptions,
  spawn,
} from 'node:child_process';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { dyingWithParent } from '../../src/util/parent-death.ts';

/**
 * Where running children are recorded: one file `<owner pid>-<child pid>` each
 * (`KVTIER_TEST_CHILDREN_DIR` names another, for a test of the sweep that no other run's sweep
 * may touch).
 */
export const LEFTOVERS_DIR =
  process.env.KVTIER_TEST_CHILDREN_DIR ?? join(tmpdir(), 'kvtier-test-children');

/** A record's contents (scripts/run-tests.mjs reads them). */
export interface ChildRecord {
  owner: number;
  ownerStart: string;
  pid: number;
  start: string;
  group: boolean;
  program: string;
}

/** Field 22 of /proc/<pid>/stat: when the process started (clock ticks since boot); '' if unknown. */
export function processStart(pid: number): string {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19] ?? '';
  } catch {
    return '';
  }
}

const live = new Map<ChildProcess, boolean>();
let hooked = false;

/**
 * `spawn(program, args, options)`, tied to this process as the module comment says. `group`
 * makes the child a process-group leader and kills its whole group (for programs that start
 * their own servers). Typed with piped streams by default (`T` when some are not).
 */
export function spawnGuarded<T extends ChildProcess = ChildProcessWithoutNullStreams>(
  program: string,
  args: readonly string[],
  options: SpawnOptions & { group?: boolean } = {},
): T {
  const { group = false, ...rest } = options;
  if (!hooked) {
    hooked = true;
    process.once('exit', () => {
      for (const [child, isGroup] of live) {
        try {
          process.kill(isGroup ? -child.pid! : child.pid!, 'SIGKILL');
        } catch {}
      }
    });
  }
  const [cmd, argv] = dyingWithParent(program, args);
  const child = spawn(cmd, argv, { ...rest, detached: group });
  if (child.pid === undefined) return child as T;
  live.set(child, group);
  const record = join(LEFTOVERS_DIR, `${process.pid}-${child.pid}`);
  const data: ChildRecord = {
    owner: process.pid,
    ownerStart: processStart(process.pid),
    pid: child.pid,
    start: processStart(child.pid),
    group,
    program,
  };
  try {
    mkdirSync(LEFTOVERS_DIR, { recursive: true });
    writeFileSync(record, JSON.stringify(data));
  } catch {}
  child.once('exit', () => {
    live.delete(child);
    rmSync(record, { force: true });
  });
  return child as T;
}
