// What a test run left in the repository: `npm test` runs every test file with the repository
// as its working directory, so a test that writes a relative path (or a CLI it runs with a
// relative --out) leaves files in the checkout. The runner takes `git status` before and after
// and fails the run when an untracked file appeared. Plain JavaScript so that it runs before tsx.
import { spawnSync } from 'node:child_process';

/**
 * The entries `git status` lists for the checkout at `dir` (untracked files one by one, ignored
 * ones left out), or null when `dir` is not a git checkout or git is missing.
 * @param {string} dir
 * @returns {Set<string> | null}
 */
export function checkoutState(dir) {
  const r = spawnSync('git', ['status', '--porcelain=v1', '-z', '--untracked-files=all'], {
    cwd: dir,
    encoding: 'utf8',
  });
  if (r.error !== undefined || r.status !== 0) return null;
  return new Set(r.stdout.split('\0').filter((e) => e !== ''));
}

/**
 * The untracked files of `after` that `before` lacks (files a run created and left), as paths.
 * Changes to tracked files are not counted: someone may edit the checkout while tests run.
 * Empty when either state is unknown.
 * @param {Set<string> | null} before
 * @param {Set<string> | null} after
 * @returns {string[]}
 */
export function leftBehind(before, after) {
  if (before === null || after === null) return [];
  return [...after]
    .filter((e) => e.startsWith('?? ') && !before.has(e))
    .map((e) => e.slice(3))
    .sort();
}
