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
import { MESSAGES } from '../../src/protocol/wire-table.ts';

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

  it('covers every message type of the protocol table in both directions', () => {
    const f = pythonFixturesJson() as {
      requests: { fields: { type: string } }[];
      replies: { fields: { type: string } }[];
    };
    const req = new Set(f.requests.map((r) => r.fields.type));
    const rep = new Set(f.replies.map((r) => r.fields.type));
    for (const m of MESSAGES)
      assert.ok((m.dir === 'request' ? req : rep).has(m.tag), `${m.dir} ${m.name}`);
  });
});
