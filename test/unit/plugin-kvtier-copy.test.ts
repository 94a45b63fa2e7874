/**
 * A plug-in that resolves its own copy of kvtier (a real second copy of the built package in the
 * plug-in's node_modules) makes the host warn, naming both copies; one that uses the host's copy
 * does not; `config check` shows the same warning.
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { cp, mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { kvtierInstances } from '../../src/backends/plugin/instance.ts';
import { createModuleBackendFactory } from '../../src/backends/plugin/module-backend.ts';
import { createPluginContext } from '../../src/backends/plugin/plugin-context.ts';
import { runConfigCommand } from '../../src/cli/config-command.ts';
import type { Logger } from '../../src/util/log.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
let dir: string;

before(async () => {
  assert.ok(
    existsSync(join(ROOT, 'dist/src/backends/plugin/instance.js')),
    'dist/ is missing or stale: run npm run build first',
  );
  dir = await mkdtemp(join(tmpdir(), 'kvtier-copy-'));
  // Two plug-ins with their own kvtier each (the second for `config check`: a copy is imported
  // once per process, and it warns when it is first imported).
  await ownCopyPlugin(dir);
  await ownCopyPlugin(join(dir, 'check'));
  const hostMemory = pathToFileURL(join(ROOT, 'src/backends/memory/memory-backend.ts')).href;
  const hostIndex = pathToFileURL(join(ROOT, 'src/index.ts')).href;
  await writeFile(
    join(dir, 'host-copy.mjs'),
    `import { MemoryBackend } from ${JSON.stringify(hostMemory)};
import ${JSON.stringify(hostIndex)};
export const createBackend = async (_options, ctx) => new MemoryBackend({}, ctx);\n`,
  );
});

/**
 * `<at>/own-copy.mjs`, a plug-in on its own kvtier: a copy of the built package in
 * `<at>/node_modules` (not a link: a link resolves to the host's files and so to the host's
 * module instances).
 */
async function ownCopyPlugin(at: string): Promise<void> {
  const pkg = join(at, 'node_modules', 'kvtier');
  await mkdir(pkg, { recursive: true });
  await cp(join(ROOT, 'package.json'), join(pkg, 'package.json'));
  await cp(join(ROOT, 'dist', 'src'), join(pkg, 'dist', 'src'), { recursive: true });
  await symlink(join(ROOT, 'node_modules'), join(pkg, 'node_modules'), 'dir');
  await writeFile(
    join(at, 'own-copy.mjs'),
    `import { MemoryBackend } from 'kvtier';
export const createBackend = async (_options, ctx) => new MemoryBackend({}, ctx);\n`,
  );
}

after(async () => {
  await rm(dir, { recursive: true, force: true });
});

function capture(): { log: Logger; warnings: string[] } {
  const warnings: string[] = [];
  const log: Logger = {
    debug() {},
    info() {},
    warn: (msg) => void warnings.push(msg),
    error() {},
    child: () => log,
  };
  return { log, warnings };
}

async function load(module: string, log: Logger): Promise<void> {
  const ctx = createPluginContext({ name: 't', configDir: dir, log });
  const backend = await createModuleBackendFactory(dir)({ module, options: {} }, ctx);
  await backend.close();
}

test('a plug-in on the host copy of kvtier loads without a warning', async () => {
  const { log, warnings } = capture();
  await load('./host-copy.mjs', log);
  assert.deepEqual(warnings, []);
});

test('a plug-in that resolves a second copy of kvtier makes the host warn, naming both', async () => {
  const { log, warnings } = capture();
  const before = kvtierInstances().length;
  await load('./own-copy.mjs', log);
  const copies = kvtierInstances();
  assert.equal(copies.length, before + 1, 'the second copy registered itself');
  const other = copies.at(-1)!;
  assert.notEqual(other.KvtierError, copies[0]!.KvtierError, 'two KvtierError classes');
  assert.equal(warnings.length, 1, `warnings: ${JSON.stringify(warnings)}`);
  const w = warnings[0]!;
  assert.match(w, /second copy of kvtier/);
  assert.ok(w.includes(pathToFileURL(join(dir, 'node_modules/kvtier/')).href), w);
  assert.ok(w.includes(pathToFileURL(ROOT).href), w);
  assert.match(w, /peerDependency/);
});

test('config check shows the warning serve logs for a plug-in on a second copy of kvtier', async () => {
  const at = join(dir, 'check');
  const file = join(at, 'kvtier.json');
  await writeFile(
    file,
    JSON.stringify({
      listen: 'tcp://127.0.0.1:*',
      metrics: null,
      tiers: [
        { name: 'cpu', type: 'local-cpu', capacityBytes: '64MiB' },
        { name: 'p', type: 'module', module: './own-copy.mjs' },
      ],
      storage: { epochFile: join(at, 'epoch') },
    }),
  );
  const out: string[] = [];
  const err: string[] = [];
  const code = await runConfigCommand(['check', file], {
    out: (l) => void out.push(l),
    err: (l) => void err.push(l),
  });
  assert.equal(code, 0, err.join('\n'));
  assert.equal(err.length, 1, `stderr: ${JSON.stringify(err)}`);
  const w = err[0]!;
  assert.ok(
    w.startsWith(
      `${file}: warning: tier "p": plug-in module "./own-copy.mjs" loaded a second copy of kvtier`,
    ),
    w,
  );
  assert.ok(w.includes(pathToFileURL(join(at, 'node_modules/kvtier/')).href), w);
  assert.match(w, /peerDependency/);
  assert.equal(JSON.parse(out.join('\n')).tiers[1].module, join(at, 'own-copy.mjs'));
});
