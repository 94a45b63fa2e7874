/**
 * docs/configuration.md's table of tier types is the one BUILTIN_TIERS generates
 * (`npm run gen:docs`): a tier's new option, default or description shows up there or this fails.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { CONFIG_DOC_PATH, withTierTable } from '../../scripts/gen-docs.ts';
import { BUILTIN_TIERS } from '../../src/backends/registry.ts';
import { TIER_TABLE_BEGIN, tierTableMarkdown } from '../../src/config/tier-table.ts';

const doc = readFileSync(
  join(fileURLToPath(new URL('../../', import.meta.url)), CONFIG_DOC_PATH),
  'utf8',
);

test('the committed tier table is the generated one (npm run gen:docs)', () => {
  assert.equal(withTierTable(doc), doc, 'docs/configuration.md is stale: run npm run gen:docs');
});

test('the table has a row per built-in type with each of its options and defaults', () => {
  const table = tierTableMarkdown();
  for (const { options: t } of BUILTIN_TIERS) {
    const row = table.split('\n').find((l) => l.startsWith(`| \`${t.type}\` |`));
    assert.ok(row, `no row for ${t.type}`);
    for (const [key, o] of Object.entries(t.options)) {
      assert.ok(row.includes(`\`${key}\``), `${t.type}: ${key} missing`);
      if (o.kind === 'default' && typeof o.default === 'number')
        assert.ok(row.includes(`\`${key}\` (${o.default})`), `${t.type}: ${key}'s default`);
    }
  }
});

test('a table that differs from the tiers is found stale', () => {
  const at = doc.indexOf(TIER_TABLE_BEGIN);
  const edited = `${doc.slice(0, at)}${doc.slice(at).replace('(65536)', '(4096)')}`;
  assert.notEqual(edited, doc);
  assert.notEqual(withTierTable(edited), edited);
  assert.equal(withTierTable(edited), doc);
});
