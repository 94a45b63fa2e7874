#!/usr/bin/env node
// Entry point of the `kvtier` command. Runs the compiled build (dist/, made by `npm run build`,
// which `npm ci` runs); without one, or with KVTIER_FROM_SOURCE=1, runs the TypeScript sources.
import { existsSync } from 'node:fs';

const compiled = new URL('../dist/src/cli/main.js', import.meta.url);
let main;
if (process.env.KVTIER_FROM_SOURCE !== '1' && existsSync(compiled)) {
  ({ main } = await import(compiled.href));
} else {
  const { register } = await import('tsx/esm/api');
  register();
  ({ main } = await import('../src/cli/main.ts'));
}
process.exitCode = await main(process.argv.slice(2));
