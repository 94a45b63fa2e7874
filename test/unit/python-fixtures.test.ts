/**
 * The cross-language fixture python/tests/fixtures/cross-language.json must be what
 * scripts/gen-python-fixtures.ts computes now: a change to the hasher, the namespace derivation
 * or the codec that forgets to regenerate it fails here (python/tests checks the Python side
 * against the same file).
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { FIXTURE_PATH, pythonFixturesJson } from '../../scripts/gen-python-fixtures.ts';

const ROOT = new URL('../..', import.meta.url).pathname;

describe('python cross-language fixture', () => {
  it('the committed file is current (regenerate with node --import tsx scripts/gen-python-fixtures.ts)', () => {
    const committed = JSON.parse(readFileSync(join(ROOT, FIXTURE_PATH), 'utf8')) as Record<
      string,
      unknown
    >;
    const fresh = pythonFixturesJson() as Record<string, unknown>;
    // Section by section, so a failure names the stale one.
    for (const key of Object.keys(fresh))
      assert.deepEqual(committed[key], fresh[key], `section "${key}" is stale`);
    assert.deepEqual(Object.keys(committed), Object.keys(fresh));
  });

  it('covers every message type in both directions', () => {
    const f = pythonFixturesJson() as {
      requests: { fields: { type: string } }[];
      replies: { fields: { type: string } }[];
    };
    const req = new Set(f.requests.map((r) => r.fields.type));
    const rep = new Set(f.replies.map((r) => r.fields.type));
    for (const t of [
      'lookup',
      'cancel',
      'clear',
      'ping',
      'stats',
      'put',
      'get',
      'register',
      'save',
      'load',
      'hold',
      'request-finished',
      'heartbeat',
      'unregister',
    ])
      assert.ok(req.has(t), `request ${t}`);
    for (const t of [
      'lookup-result',
      'cancel-result',
      'clear-result',
      'pong',
      'stats-result',
      'put-result',
      'get-result',
      'register-result',
      'save-result',
      'load-result',
      'hold-result',
      'request-finished-result',
      'heartbeat-result',
      'unregister-result',
      'error',
    ])
      assert.ok(rep.has(t), `reply ${t}`);
  });
});
