/**
 * What `npm test` does on a machine without the programs the suite runs for real
 * (scripts/prerequisites.mjs): every branch of the decision, without uninstalling anything, and
 * the probe against this machine.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  OPTIONAL_PACKAGES,
  onPath,
  planPrerequisites,
  probeMissing,
  REQUIRED_PACKAGES,
} from '../../scripts/prerequisites.mjs';

const none = { required: [], optional: [] };
const noRedis = { required: ['redis-server'], optional: [] };
const noProm = { required: [], optional: ['prometheus'] };
const bare = {
  required: [
    'redis-server',
    'python3',
    'python3-zmq',
    'python3-msgpack',
    'python3-numpy',
    'python3-pytest',
  ],
  optional: ['prometheus', 'docker-compose'],
};

describe('npm test prerequisites', () => {
  it('does nothing when everything is installed, root or not', () => {
    for (const isRoot of [true, false])
      assert.deepEqual(planPrerequisites(none, { isRoot, hasAptGet: true }), {
        install: [],
        notice: null,
      });
  });

  it('installs everything missing with apt-get as root, silently', () => {
    assert.deepEqual(planPrerequisites(bare, { isRoot: true, hasAptGet: true }), {
      install: [...bare.required, ...bare.optional],
      notice: null,
    });
    assert.deepEqual(planPrerequisites(noRedis, { isRoot: true, hasAptGet: true }).install, [
      'redis-server',
    ]);
  });

  it('prints one line naming what is missing and the command, when not root', () => {
    const plan = planPrerequisites(noRedis, { isRoot: false, hasAptGet: true });
    assert.deepEqual(plan.install, []);
    assert.equal(
      plan.notice,
      'run-tests: missing redis-server (the tests that need them will fail); install with: sudo apt-get install --no-install-recommends redis-server',
    );
    const all = planPrerequisites(bare, { isRoot: false, hasAptGet: true }).notice!;
    assert.doesNotMatch(all, /\n/, 'one line');
    assert.match(
      all,
      /missing prometheus, docker-compose \(promtool and Prometheus checks and docker-compose config checks are skipped\)/,
    );
    assert.match(
      all,
      /install with: sudo apt-get install --no-install-recommends redis-server python3 python3-zmq python3-msgpack python3-numpy python3-pytest prometheus docker-compose$/,
    );
  });

  it('says that optional packages only skip tests', () => {
    const notice = planPrerequisites(noProm, { isRoot: false, hasAptGet: true }).notice!;
    assert.doesNotMatch(notice, /will fail/);
    assert.match(notice, /skipped/);
  });

  it('names the packages without apt-get, even as root', () => {
    const plan = planPrerequisites(noRedis, { isRoot: true, hasAptGet: false });
    assert.deepEqual(plan.install, []);
    assert.match(plan.notice!, /install the Debian packages redis-server$/);
  });

  it('probes this machine for the packages it knows', () => {
    const missing = probeMissing();
    for (const p of missing.required) assert.ok(REQUIRED_PACKAGES.includes(p), p);
    for (const p of missing.optional) assert.ok(OPTIONAL_PACKAGES.includes(p), p);
    assert.equal(onPath('node', process.env.PATH), true);
    assert.equal(onPath('kvtier-no-such-program', ''), false);
  });
});
