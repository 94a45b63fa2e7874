/**
 * One sidecar per disk directory: a second `kvtier serve` on a directory a running sidecar uses
 * is refused, naming the first's pid, instead of sharing (and clearing) its chunks; the lock
 * goes with a graceful stop, and the lock of a sidecar that was killed is taken over.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { LOCK_FILE } from '../../src/backends/local-disk/dir-lock.ts';
import { LocalDiskBackend } from '../../src/backends/local-disk/local-disk-backend.ts';
import { isKvtierError } from '../../src/errors.ts';
import { spawnGuarded } from '../support/child-guard.ts';
import { REPO_ROOT, withDeadline } from '../support/fixtures.ts';
import { startSidecarProcess } from '../support/sidecar-process.ts';

const DEADLINE_MS = 120_000;

describe('a lock file per disk directory', () => {
  const tmp = mkdtempSync(join(tmpdir(), 'kvtier-disk-lock-'));
  after(() => rmSync(tmp, { recursive: true, force: true }));
  const disk = join(tmp, 'chunks');
  const config = (name: string) => ({
    listen: 'tcp://127.0.0.1:*',
    metrics: null,
    storage: { epochFile: join(tmp, `epoch-${name}`) },
    tiers: [
      { name: 'cpu', type: 'local-cpu', capacityBytes: '32MiB' },
      { name: 'disk', type: 'local-disk', path: disk, capacityBytes: '256MiB' },
    ],
  });

  it('the second sidecar on a directory is refused, naming the first one', async () => {
    const first = await startSidecarProcess(join(tmp, 'a.json'), config('a'));
    try {
      assert.ok(existsSync(join(disk, LOCK_FILE)));
      writeFileSync(join(tmp, 'b.json'), JSON.stringify(config('b')));
      const second = spawnGuarded(
        process.execPath,
        [join(REPO_ROOT, 'bin', 'kvtier.js'), 'serve', '--config', join(tmp, 'b.json')],
        { stdio: ['ignore', 'ignore', 'pipe'] },
      );
      let err = '';
      second.stderr!.setEncoding('utf8').on('data', (d: string) => {
        err += d;
      });
      const code = await withDeadline(
        new Promise<number | null>((resolve) => second.once('exit', resolve)),
        DEADLINE_MS,
        'the second sidecar',
      );
      assert.equal(code, 2, err);
      assert.match(
        err,
        new RegExp(
          `disk directory ${disk} is in use by another kvtier sidecar \\(pid ${first.pid} `,
        ),
      );
      await first.kill('SIGTERM');
      assert.deepEqual(await first.exited, { code: 0, signal: null });
      assert.ok(!existsSync(join(disk, LOCK_FILE)), 'a graceful stop removes the lock');
    } finally {
      await first.kill();
    }
  });

  it("a killed sidecar's lock is taken over", async () => {
    const first = await startSidecarProcess(join(tmp, 'a.json'), config('a'));
    await first.kill('SIGKILL');
    const held = JSON.parse(readFileSync(join(disk, LOCK_FILE), 'utf8')) as { pid: number };
    assert.equal(held.pid, first.pid, 'SIGKILL leaves the lock');
    const next = await startSidecarProcess(join(tmp, 'b.json'), config('b'));
    try {
      const now = JSON.parse(readFileSync(join(disk, LOCK_FILE), 'utf8')) as { pid: number };
      assert.equal(now.pid, next.pid, 'the new sidecar holds the lock');
    } finally {
      await next.kill('SIGTERM');
    }
  });

  it('two tiers of one sidecar cannot share a directory', async () => {
    const dir = join(tmp, 'shared');
    const a = await LocalDiskBackend.open({ path: dir, capacityBytes: 1 << 20 }, { name: 'a' });
    try {
      await assert.rejects(
        LocalDiskBackend.open({ path: dir, capacityBytes: 1 << 20 }, { name: 'b' }),
        (e: unknown) =>
          isKvtierError(e, 'KVT_CONFIG') && /another tier of this sidecar/.test(e.message),
      );
    } finally {
      await a.close();
    }
  });
});
