/**
 * Servers a test starts die with the test process, however it ends: SIGKILL of the test process
 * kills its children (parent-death signal), and what a killed process group left running (a
 * grandchild) is killed by the next run's sweep (scripts/sweep-test-children.mjs).
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { after, describe, it } from 'node:test';
import { setTimeout as delay } from 'node:timers/promises';
import { pathToFileURL } from 'node:url';
import { LEFTOVERS_DIR } from '../support/child-guard.ts';
import { REPO_ROOT } from '../support/fixtures.ts';

const GUARD = pathToFileURL(join(REPO_ROOT, 'test', 'support', 'child-guard.ts')).href;

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Resolves once `pid` is gone; fails after `ms` (a bound on a broken guard, not a wait). */
async function gone(pid: number, what: string, ms = 30_000): Promise<void> {
  const until = Date.now() + ms;
  while (alive(pid)) {
    assert.ok(Date.now() < until, `${what} (pid ${pid}) still runs ${ms} ms later`);
    await delay(20);
  }
}

/**
 * A stand-in for a test process: starts `program args` with spawnGuarded (in its own group when
 * `group`), prints the child's pid and, for a shell, the pid the shell prints; then waits.
 */
async function testProcess(program: string, args: string[], group: boolean, env = process.env) {
  const script = `import { spawnGuarded } from ${JSON.stringify(GUARD)};
const c = spawnGuarded(${JSON.stringify(program)}, ${JSON.stringify(args)}, { group: ${group}, stdio: ['ignore', 'pipe', 'ignore'] });
console.log('child ' + c.pid);
c.stdout.on('data', (d) => process.stdout.write('said ' + d));
setInterval(() => {}, 1000);
`;
  const p = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
    cwd: REPO_ROOT,
    env,
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const lines = createInterface({ input: p.stdout });
  const said: string[] = [];
  const next = (prefix: string) =>
    new Promise<number>((resolve, reject) => {
      const found = said.find((l) => l.startsWith(prefix));
      if (found !== undefined) return resolve(Number(found.slice(prefix.length)));
      p.once('exit', (c) => reject(new Error(`test process exited (${c}) before "${prefix}"`)));
      lines.on('line', (l) => {
        said.push(l);
        if (l.startsWith(prefix)) resolve(Number(l.slice(prefix.length)));
      });
    });
  return { p, next };
}

describe('children of a test process', () => {
  it('die when the test process is killed with SIGKILL', async () => {
    const t = await testProcess('sleep', ['600'], false);
    const child = await t.next('child ');
    assert.ok(alive(child));
    assert.ok(existsSync(join(LEFTOVERS_DIR, `${t.p.pid}-${child}`)), 'recorded while it runs');
    t.p.kill('SIGKILL');
    await gone(child, 'the child of a killed test process');
  });

  it('what a killed group left behind is killed by the next run’s sweep', async () => {
    // A shell that starts a server of its own: the grandchild gets no parent-death signal. Its
    // record goes to a directory of this test's own, which no other run's sweep reads (a test
    // run beside this one sweeps the shared directory when it starts).
    const dir = mkdtempSync(join(tmpdir(), 'kvtier-test-children-'));
    after(() => rmSync(dir, { recursive: true, force: true }));
    const t = await testProcess('sh', ['-c', 'sleep 600 & echo $!; wait'], true, {
      ...process.env,
      KVTIER_TEST_CHILDREN_DIR: dir,
    });
    const shell = await t.next('child ');
    const grandchild = await t.next('said ');
    t.p.kill('SIGKILL');
    await gone(shell, 'the shell');
    assert.ok(alive(grandchild), 'the grandchild outlives its parents');
    const sweep = join(REPO_ROOT, 'scripts', 'sweep-test-children.mjs');
    const { sweepTestChildren } = (await import(pathToFileURL(sweep).href)) as {
      sweepTestChildren: (dir?: string) => string[];
    };
    assert.ok(existsSync(join(dir, `${t.p.pid}-${shell}`)), 'recorded in its directory');
    const killed = sweepTestChildren(dir);
    assert.ok(
      killed.some((k) => k.includes(`pid ${shell}`)),
      killed.join(', '),
    );
    await gone(grandchild, 'the grandchild after the sweep');
    assert.ok(!existsSync(join(dir, `${t.p.pid}-${shell}`)), 'its record is removed');
  });
});
