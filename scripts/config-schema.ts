/**
 * Writes the config file's JSON Schema (schema/kvtier.config.schema.json) from the valibot schema
 * in src/config/. Run after changing the config schema: `npm run config:schema`.
 * test/unit/config-schema.test.ts fails while the committed file is out of date.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { CONFIG_SCHEMA_PATH, configJsonSchema } from '../src/config/json-schema.ts';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const out = join(root, CONFIG_SCHEMA_PATH);
mkdirSync(dirname(out), { recursive: true });
writeFileSync(out, `${JSON.stringify(configJsonSchema(), null, 2)}\n`);
// Formatted as `npm run lint` wants it; the test compares the parsed JSON.
execFileSync(join(root, 'node_modules/.bin/biome'), ['format', '--write', out], {
  stdio: 'inherit',
});
process.stdout.write(`wrote ${CONFIG_SCHEMA_PATH}\n`);
