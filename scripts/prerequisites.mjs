// The Debian packages the test suite runs for real, and what `npm test` does when some are
// missing. The decision (`planPrerequisites`) is a pure function so that a unit test covers
// every branch without uninstalling anything (test/unit/deploy-prerequisites.test.ts).
import { spawnSync } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { delimiter, join } from 'node:path';

/**
 * Needed: the tests that use them fail without them. redis-server for the Redis tier's tests;
 * Debian's /usr/bin/python3 with python3-zmq, python3-msgpack, python3-numpy and python3-pytest
 * for the Python package's tests (test/python).
 */
export const REQUIRED_PACKAGES = Object.freeze([
  'redis-server',
  'python3',
  'python3-zmq',
  'python3-msgpack',
  'python3-numpy',
  'python3-pytest',
]);

/**
 * Optional: the tests that use them are skipped, with the reason, without them. prometheus
 * provides `promtool` (checks of /metrics and the alert rules) and the Prometheus server that
 * scrapes the compose twin; docker-compose (Debian's, 1.29) runs `docker-compose config` on the
 * compose file with and without its gpu profile (no Docker engine needed).
 */
export const OPTIONAL_PACKAGES = Object.freeze(['prometheus', 'docker-compose']);

/** What each optional package's absence skips, for the notice. */
const SKIPPED = {
  prometheus: 'promtool and Prometheus checks',
  'docker-compose': 'docker-compose config checks',
};

/** Whether `program` is an executable in /usr/bin, /usr/sbin or a directory of `path`. */
export function onPath(program, path = process.env.PATH ?? '') {
  const dirs = ['/usr/bin', '/usr/sbin', ...path.split(delimiter).filter((d) => d !== '')];
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
      'import importlib.util as u; print(" ".join(n for n in ("zmq","msgpack","numpy","pytest") if u.find_spec(n) is None))',
    ],
    { encoding: 'utf8' },
  );
  if (probe.status !== 0) return null;
  return probe.stdout.trim() === '' ? [] : probe.stdout.trim().split(' ');
}

/** The packages of {@link REQUIRED_PACKAGES} and {@link OPTIONAL_PACKAGES} not installed here. */
export function probeMissing() {
  const required = [];
  if (!onPath('redis-server')) required.push('redis-server');
  const py = pythonModulesMissing();
  if (py === null)
    required.push('python3', 'python3-zmq', 'python3-msgpack', 'python3-numpy', 'python3-pytest');
  else required.push(...py.map((m) => `python3-${m}`));
  const optional = onPath('promtool') && onPath('prometheus') ? [] : ['prometheus'];
  if (!onPath('docker-compose')) optional.push('docker-compose');
  return { required, optional };
}

/**
 * What to do about missing packages.
 *
 * - Nothing missing: nothing to do.
 * - Root with apt-get: install everything missing, needed and optional.
 * - Otherwise: one line on stderr naming what is missing, what it is for, and the command that
 *   installs it; the suite still runs (the tests that need a missing program fail with their own
 *   message, and those that use an optional one are skipped).
 *
 * @param {{ required: string[], optional: string[] }} missing
 * @param {{ isRoot: boolean, hasAptGet: boolean }} host
 * @returns {{ install: string[], notice: string | null }}
 */
export function planPrerequisites(missing, host) {
  const all = [...missing.required, ...missing.optional];
  if (all.length === 0) return { install: [], notice: null };
  if (host.isRoot && host.hasAptGet) return { install: all, notice: null };
  return { install: [], notice: noticeFor(missing, host) };
}

/** The one line printed when packages are missing and cannot be installed here. */
export function noticeFor(missing, host) {
  const all = [...missing.required, ...missing.optional];
  const parts = [];
  if (missing.required.length > 0)
    parts.push(`missing ${missing.required.join(', ')} (the tests that need them will fail)`);
  if (missing.optional.length > 0)
    parts.push(
      `missing ${missing.optional.join(', ')} (${missing.optional.map((p) => SKIPPED[p] ?? `${p} checks`).join(' and ')} are skipped)`,
    );
  const how = host.hasAptGet
    ? `sudo apt-get install --no-install-recommends ${all.join(' ')}`
    : `install the Debian packages ${all.join(' ')}`;
  return `run-tests: ${parts.join('; ')}; install with: ${how}`;
}

/**
 * Probes, installs with apt-get as root, probes again, and prints the notice for whatever is
 * still missing. Returns the packages still missing.
 */
export function ensurePrerequisites({ log = (line) => console.error(line) } = {}) {
  const isRoot = typeof process.getuid === 'function' && process.getuid() === 0;
  const host = { isRoot, hasAptGet: onPath('apt-get') };
  let missing = probeMissing();
  const plan = planPrerequisites(missing, host);
  if (plan.install.length > 0) {
    log(`run-tests: installing ${plan.install.join(' ')} with apt-get`);
    const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
    spawnSync('apt-get', ['update', '-qq'], { stdio: 'inherit', env });
    spawnSync('apt-get', ['install', '-y', '-qq', '--no-install-recommends', ...plan.install], {
      stdio: ['ignore', 'ignore', 'inherit'],
      env,
    });
    missing = probeMissing();
    if (missing.required.length + missing.optional.length > 0)
      log(noticeFor(missing, { isRoot: false, hasAptGet: host.hasAptGet }));
  } else if (plan.notice !== null) {
    log(plan.notice);
  }
  return missing;
}
