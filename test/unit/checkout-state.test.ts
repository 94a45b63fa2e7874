/**
 * The runner's check for files a test run leaves in the repository (scripts/checkout-state.mjs),
 * against a real git checkout in a temp dir: a file written into it is named, an ignored one or
 * an edit of a tracked file is not, and without a checkout nothing is reported.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { checkoutState, leftBehind } from '../../scripts/checkout-state.mjs';

let dir = '';

function git(...args: string[]): void {
  const r = spawnSync('git', args, { cwd: dir, encoding: 'utf8' });
  assert.equal(r.status, 0, `git ${args.join(' ')}: ${r.stderr}`);
}

before(async () => {
  dir = await mkdtemp(join(tmpdir(), 'kvtier-checkout-state-'));
  git('init', '-q');
  await writeFile(join(dir, '.gitignore'), 'dist/\n');
  await writeFile(join(dir, 'tracked.txt'), 'a\n');
  git('add', '.');
  git('-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-q', '-m', 'start');
  await writeFile(join(dir, 'there-before.txt'), 'x\n');
});

after(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('files a test run leaves in the checkout', () => {
  it('names new untracked files, not ignored ones, edits, or files there before', async () => {
    const start = checkoutState(dir);
    assert.ok(start !== null);
    await mkdir(join(dir, '1'));
    await writeFile(join(dir, '1', 'kvtier.key'), 'secret\n');
    await writeFile(join(dir, '1', 'kvtier.pub'), 'public\n');
    await mkdir(join(dir, 'dist'));
    await writeFile(join(dir, 'dist', 'built.js'), '');
    await writeFile(join(dir, 'tracked.txt'), 'b\n');
    await writeFile(join(dir, 'there-before.txt'), 'y\n');
    assert.deepEqual(leftBehind(start, checkoutState(dir)), ['1/kvtier.key', '1/kvtier.pub']);
  });

  it('reports nothing when a state is unknown (no checkout, no git)', () => {
    assert.equal(checkoutState(join(dir, 'no-such-dir')), null);
    const some = new Set(['?? new.txt']);
    assert.deepEqual(leftBehind(null, some), []);
    assert.deepEqual(leftBehind(some, null), []);
  });
});
