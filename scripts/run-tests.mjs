#!/usr/bin/env node
// Runs every test file under test/ with node:test. Node 20's --test does not expand globs and
// exits 0 when it finds nothing, so the file list is built here and an empty list is an error.
//
// First it makes sure the programs the tests run for real are there (scripts/prerequisites.mjs):
// redis-server (the Redis tier's tests), Debian's /usr/bin/python3 with python3-zmq,
// python3-msgpack, python3-numpy and python3-pytest (the Python package's tests, test/python),
// and optionally prometheus (promtool checks and the compose twin's scrape; skipped without it).
// Missing ones are installed with apt-get when this runs as root; otherwise one line says what
// to install (the tests that need them then fail with their own message, the others still run).
// KVTIER_SKIP_PREREQUISITES=1 skips the check.
import { spawnSync } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { checkoutState, leftBehind } from './checkout-state.mjs';
import { ensurePrerequisites } from './prerequisites.mjs';
import { sweepTestChildren } from './sweep-test-children.mjs';

const root = new URL('..', import.meta.url).pathname;
const filter = process.argv.slice(2);

if (process.env.KVTIER_SKIP_PREREQUISITES !== '1') ensurePrerequisites();

// Servers an earlier run started and could not stop (its test process was killed).
const leftovers = sweepTestChildren();
if (leftovers.length > 0)
  console.error(`run-tests: killed leftovers of earlier runs: ${leftovers.join(', ')}`);

function walk(dir) {
  const out = [];
  for (const name of readdirSync(dir).sort()) {
    if (name.startsWith('.')) continue;
    const p = join(dir, name);
    if (statSync(p).isDirectory()) out.push(...walk(p));
    else if (name.endsWith('.test.ts')) out.push(relative(root, p));
  }
  return out;
}

let files = walk(join(root, 'test'));
if (filter.length > 0) files = files.filter((f) => filter.some((s) => f.includes(s)));
if (files.length === 0) {
  console.error('run-tests: no test files found under test/');
  process.exit(1);
}
// A hung test file fails after 20 minutes instead of holding CI. Node applies the timeout to
// each file as a whole, and a file's real work stretches with the machine's load (two suites and
// other work on 2 cores run every file several times slower than an idle machine; the vLLM file,
// about 4 minutes idle, took over 10 beside a second suite), so this is a backstop for hangs
// only: the tests themselves wait on events, not on the clock.
const timeoutMs = Number(process.env.KVTIER_TEST_TIMEOUT_MS ?? 1_200_000);
const args = [
  '--import',
  'tsx',
  '--test',
  '--test-concurrency=2',
  `--test-timeout=${timeoutMs}`,
  ...files,
];
// Tests run with the repository as their working directory; what they write belongs in a temp
// dir. A file that the run left untracked in the checkout fails it, named.
const before = checkoutState(root);
const res = spawnSync(process.execPath, args, { cwd: root, stdio: 'inherit' });
const left = leftBehind(before, checkoutState(root));
if (left.length > 0) {
  console.error(
    `run-tests: the tests left ${left.length} file(s) in the repository (tests write under a temp dir):`,
  );
  for (const e of left) console.error(`  ${e}`);
  process.exit(res.status || 1);
}
process.exit(res.status ?? 1);
