#!/usr/bin/env node
// Builds native-cuda/build/Release/kvtier_native.node with node-gyp.
//   node scripts/build-native.mjs            build; a failure fails the command
//   KVTIER_NATIVE_OPTIONAL=1 ...             a failure is reported and the command exits 0
//                                            (kvtier then runs on the pure-JS copy fallback)
//   KVTIER_NO_CUDA=1 ...                     build the host part only
// node-gyp needs Node's headers; npm passes them as npm_config_nodedir. Run directly, the
// headers next to this node binary are used, so no download is attempted.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const addonDir = join(root, 'native-cuda');
const optional = ['1', 'true'].includes(process.env.KVTIER_NATIVE_OPTIONAL ?? '');

function fail(message) {
  console.error(`build-native: ${message}`);
  if (optional) {
    console.error('build-native: KVTIER_NATIVE_OPTIONAL is set; continuing without the addon');
    process.exit(0);
  }
  process.exit(1);
}

let nodeGyp;
try {
  nodeGyp = createRequire(join(root, 'package.json')).resolve('node-gyp/bin/node-gyp.js');
} catch {
  fail('node-gyp is not installed (it is a devDependency: run npm ci)');
}

const args = [nodeGyp, 'rebuild', '--jobs=max'];
const bundledHeaders = join(dirname(process.execPath), '..', 'include', 'node', 'node_api.h');
if (!process.env.npm_config_nodedir && existsSync(bundledHeaders)) {
  args.push(`--nodedir=${join(dirname(process.execPath), '..')}`);
}
const res = spawnSync(process.execPath, args, { cwd: addonDir, stdio: 'inherit' });
if (res.status !== 0) fail(`node-gyp exited with ${res.status ?? res.signal}`);
const out = join(addonDir, 'build', 'Release', 'kvtier_native.node');
if (!existsSync(out)) fail(`node-gyp succeeded but ${out} is missing`);
console.log(`build-native: built ${out}`);
