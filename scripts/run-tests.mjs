#!/usr/bin/env node
// Runs every test file under test/ with node:test. Node 20's --test does not expand globs and
// exits 0 when it finds nothing, so the file list is built here and an empty list is an error.
import { spawnSync } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';

const root = new URL('..', import.meta.url).pathname;
const filter = process.argv.slice(2);

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
