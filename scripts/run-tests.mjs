#!/usr/bin/env node
// Runs every test file under test/ with node:test. Node 20's --test does not expand globs and
// exits 0 when it finds nothing, so the file list is built here and an empty list is an error.
//
// First it makes sure the programs the tests run for real are there: redis-server (the Redis
// tier's tests) and Debian's /usr/bin/python3 with python3-zmq, python3-numpy and python3-pytest
// (the Python package's tests, test/python). Missing ones are installed with apt-get when this
// runs as root; otherwise one line says what to install (the tests that need them then fail
// with their own message, the others still run).
import { spawnSync } from 'node:child_process';
import { accessSync, constants, readdirSync, statSync } from 'node:fs';
import { delimiter, join, relative } from 'node:path';

const root = new URL('..', import.meta.url).pathname;
const filter = process.argv.slice(2);

function onPath(program) {
  const dirs = ['/usr/bin', '/usr/sbin', ...(process.env.PATH ?? '').split(delimiter)];
  return dirs.some((d) => {
    try {
      accessSync(join(d, program), constants.X_OK);
      return true;
    } catch {
      return false;
    }
  });
}

function pythonModulesMissing() {
  const probe = spawnSync(
    '/usr/bin/python3',
    [
      '-c',
      'import importlib.util as u; print(" ".join(n for n in ("zmq","numpy","pytest") if u.find_spec(n) is None))',
    ],
    { encoding: 'utf8' },
  );
  if (probe.status !== 0) return ['python3'];
  return probe.stdout.trim() === '' ? [] : probe.stdout.trim().split(' ');
}

/** Debian packages the tests need that are not installed. */
function missingPackages() {
  const pkgs = [];
  if (!onPath('redis-server')) pkgs.push('redis-server');
  const py = pythonModulesMissing();
  if (py.includes('python3'))
    pkgs.push('python3', 'python3-zmq', 'python3-numpy', 'python3-pytest');
  else pkgs.push(...py.map((m) => `python3-${m}`));
  return pkgs;
}

function ensurePrerequisites() {
  let pkgs = missingPackages();
  if (pkgs.length === 0) return;
  const isRoot = typeof process.getuid === 'function' && process.getuid() === 0;
  if (isRoot && onPath('apt-get')) {
    console.error(`run-tests: installing ${pkgs.join(' ')} with apt-get`);
    const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
    spawnSync('apt-get', ['update', '-qq'], { stdio: 'inherit', env });
    spawnSync('apt-get', ['install', '-y', '-qq', ...pkgs], { stdio: 'inherit', env });
    pkgs = missingPackages();
    if (pkgs.length === 0) return;
  }
  console.error(
    `run-tests: missing ${pkgs.join(', ')}; install with: sudo apt-get install ${pkgs.join(' ')} (the tests that need them will fail)`,
  );
}

if (process.env.KVTIER_SKIP_PREREQUISITES !== '1') ensurePrerequisites();

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
// A hung test fails after 2 minutes instead of holding CI.
const args = [
  '--import',
  'tsx',
  '--test',
  '--test-concurrency=2',
  '--test-timeout=120000',
  ...files,
];
const res = spawnSync(process.execPath, args, { cwd: root, stdio: 'inherit' });
process.exit(res.status ?? 1);
