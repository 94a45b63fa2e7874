// Kills what earlier test runs left behind: every child recorded by test/support/child-guard.ts
// whose test process is gone (or is another process now) but which itself still runs as the
// same process it was (its start time in /proc matches), with its process group when it led
// one (also when only the group's later members are left). Records of children that are gone are removed. Children of live test runs (another run
// beside this one) are not touched.
import { readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const defaultDir = process.env.KVTIER_TEST_CHILDREN_DIR ?? join(tmpdir(), 'kvtier-test-children');

/** Fields of /proc/<pid>/stat after the command (field 3 on), or null when it is gone. */
function statOf(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  } catch {
    return null;
  }
}

function startOf(pid) {
  const f = statOf(pid);
  return f === null ? null : (f[19] ?? '');
}

/** Processes of process group `pgid` that started no earlier than its leader did (`start`). */
function groupMembers(pgid, start) {
  const out = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const f = statOf(Number(name));
    if (f !== null && Number(f[2]) === pgid && Number(f[19]) >= Number(start))
      out.push(Number(name));
  }
  return out;
}

/** Kills leftovers recorded in `dir`; returns the programs killed. */
export function sweepTestChildren(dir = defaultDir) {
  const killed = [];
  let names;
  try {
    names = readdirSync(dir);
  } catch {
    return killed;
  }
  for (const name of names) {
    const file = join(dir, name);
    let r;
    try {
      r = JSON.parse(readFileSync(file, 'utf8'));
    } catch {
      continue;
    }
    const ownerStart = startOf(r.owner);
    if (ownerStart !== null && ownerStart === r.ownerStart) continue; // its run is still going
    const start = startOf(r.pid);
    // A group outlives its leader when the leader got the parent-death signal and its own
    // children did not.
    const members = r.group && r.start !== '' ? groupMembers(r.pid, r.start) : [];
    if ((start !== null && start === r.start) || members.length > 0) {
      try {
        process.kill(r.group ? -r.pid : r.pid, 'SIGKILL');
        killed.push(`${r.program} (pid ${r.pid}${r.group ? ', its process group' : ''})`);
      } catch {}
    }
    rmSync(file, { force: true });
  }
  return killed;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const killed = sweepTestChildren();
  console.log(killed.length === 0 ? 'no leftovers' : `killed ${killed.join(', ')}`);
}
