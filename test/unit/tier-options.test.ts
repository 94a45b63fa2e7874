/**
 * `defineTierOptions`: from one declaration, the defaults, the resolver of options given in code
 * (KVT_INVALID_ARGUMENT), the reader of a config object (KVT_CONFIG naming the tier) and the
 * config file's schema of the tier (problems at their key paths) all follow.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  checkedBy,
  defineTierOptions,
  type OptionsOf,
  optional,
  required,
  withDefault,
} from '../../src/backends/core/tier-options.ts';
import { tierSchema } from '../../src/config/tier-schemas.ts';
import { isKvtierError } from '../../src/errors.ts';
import { bytes, check, int, nullable, oneOf, str } from '../../src/util/schema-kit.ts';
import { requireInt } from '../../src/util/validate.ts';

const ENTRIES = {
  path: required(str({ nonEmpty: true }), 'Where the store lives.'),
  capacityBytes: optional(nullable(bytes(1024)), 'Bound on stored bytes; none when absent.'),
  ioConcurrency: withDefault(int(1, 64), 8, 'Operations at once.'),
  mode: withDefault(oneOf(['fast', 'safe'] as const), 'safe', 'Durability.'),
};

const SPEC = defineTierOptions({
  type: 'toy',
  description: 'A tier declared for this test.',
  options: ENTRIES,
  example: { path: '/x' },
  checks: [
    (o) =>
      o.mode === 'fast' && o.capacityBytes !== undefined && o.capacityBytes !== null
        ? { key: 'mode', message: 'must be "safe" when capacityBytes is set' }
        : undefined,
    checkedBy<typeof ENTRIES>((o) => requireInt('ioConcurrency', o.ioConcurrency ?? 8, 1, 32)),
  ],
});

function throwsWith(fn: () => unknown, code: 'KVT_CONFIG' | 'KVT_INVALID_ARGUMENT', text: string) {
  assert.throws(fn, (e: unknown) => {
    assert.ok(isKvtierError(e, code), String(e));
    assert.equal(e.message, text);
    return true;
  });
}

describe('defineTierOptions', () => {
  test('defaults come from the declaration; optional options left out resolve to null', () => {
    assert.deepEqual(SPEC.defaults, { ioConcurrency: 8, mode: 'safe' });
    assert.ok(Object.isFrozen(SPEC.defaults));
    assert.deepEqual(SPEC.resolve({ path: '/a' }), {
      path: '/a',
      capacityBytes: null,
      ioConcurrency: 8,
      mode: 'safe',
    });
    const given: OptionsOf<typeof ENTRIES> = { path: '/a', capacityBytes: 4096, mode: 'fast' };
    assert.throws(() => SPEC.resolve(given), /mode must be "safe" when capacityBytes is set/);
  });

  test('options given in code: integers for sizes, keys it does not know left alone', () => {
    const hooks = { path: '/a', ioConcurrency: 3, onCorrupt: () => {} };
    assert.equal(SPEC.resolve(hooks).ioConcurrency, 3);
    throwsWith(
      () => SPEC.resolve({ path: '/a', capacityBytes: '8KiB' }),
      'KVT_INVALID_ARGUMENT',
      'capacityBytes must be an integer >= 1024, got "8KiB"',
    );
    throwsWith(() => SPEC.resolve({}), 'KVT_INVALID_ARGUMENT', 'path is required');
    throwsWith(
      () => SPEC.resolve(null),
      'KVT_INVALID_ARGUMENT',
      'options must be an object, got null',
    );
    throwsWith(
      () => SPEC.resolve({ path: '/a', ioConcurrency: 40 }),
      'KVT_INVALID_ARGUMENT',
      'ioConcurrency must be an integer in [1, 32], got 40',
    );
  });

  test('a config object: only declared keys, messages naming the tier and the option', () => {
    assert.deepEqual(SPEC.fromConfig({ path: '/a', mode: 'fast' }, 'mine'), {
      path: '/a',
      mode: 'fast',
    });
    throwsWith(
      () => SPEC.fromConfig({ path: '/a', modes: 'fast' }, 'mine'),
      'KVT_CONFIG',
      'tier "mine": unknown toy option "modes"; allowed: path, capacityBytes, ioConcurrency, mode',
    );
    throwsWith(
      () => SPEC.fromConfig({ path: '/a', mode: 'quick' }),
      'KVT_CONFIG',
      'tier "toy": mode must be one of "fast", "safe", got "quick"',
    );
  });

  test("the config file's schema of the tier reports every problem at its key path", () => {
    const schema = tierSchema(SPEC);
    const ok = check(schema, { type: 'toy', path: '/a', capacityBytes: '8KiB' });
    assert.ok(ok.ok);
    assert.equal((ok.value as { capacityBytes: number }).capacityBytes, 8192, 'sizes as strings');
    const bad = check(schema, { type: 'toy', ioConcurrency: 0, colour: 1 }, 'tiers[1]');
    assert.ok(!bad.ok);
    assert.deepEqual(
      bad.problems.map((p) => `${p.path}: ${p.message}`),
      [
        'tiers[1].path: is required',
        'tiers[1].ioConcurrency: must be an integer in [1, 64], got 0',
        'tiers[1].colour: unknown toy option; allowed: name, type, health, path, capacityBytes, ioConcurrency, mode',
      ],
    );
    const cross = check(schema, { type: 'toy', path: '/a', ioConcurrency: 33 }, 'tiers[0]');
    assert.ok(!cross.ok);
    assert.deepEqual(cross.problems, [
      { path: 'tiers[0].ioConcurrency', message: 'must be an integer in [1, 32], got 33' },
    ]);
  });
});
