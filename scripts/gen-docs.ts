/**
 * Writes what docs/configuration.md shows of the code: the table of built-in tier types, from
 * BUILTIN_TIERS (src/config/tier-table.ts).
 *
 *     npm run gen:docs            # rewrite it
 *     npm run gen:docs -- --check # exit 1 when it is stale
 *
 * test/unit/config-tier-table.test.ts fails when the committed table differs.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { TIER_TABLE_BEGIN, TIER_TABLE_END, tierTableMarkdown } from '../src/config/tier-table.ts';

/** The document holding the table, relative to the repository root. */
export const CONFIG_DOC_PATH = 'docs/configuration.md';

/** `text` with the block between the markers replaced by the generated table. */
export function withTierTable(text: string): string {
  const a = text.indexOf(TIER_TABLE_BEGIN);
  const b = text.indexOf(TIER_TABLE_END);
  if (a < 0 || b < a) throw new Error(`${CONFIG_DOC_PATH}: the tier-table markers are missing`);
  return `${text.slice(0, a + TIER_TABLE_BEGIN.length)}\n${tierTableMarkdown()}\n${text.slice(b)}`;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const path = join(fileURLToPath(new URL('..', import.meta.url)), CONFIG_DOC_PATH);
  const text = readFileSync(path, 'utf8');
  const next = withTierTable(text);
  if (process.argv.includes('--check')) {
    if (next !== text) {
      process.stderr.write(`${CONFIG_DOC_PATH}: the tier table is stale: run npm run gen:docs\n`);
      process.exit(1);
    }
  } else {
    writeFileSync(path, next);
    process.stdout.write(`wrote ${CONFIG_DOC_PATH}\n`);
  }
}
