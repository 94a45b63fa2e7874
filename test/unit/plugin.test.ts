import assert from 'node:assert/strict';
import { mkdir, mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { Registry } from 'prom-client';
import { CircuitBreakerBackend } from '../../src/backends/core/circuit-breaker.ts';
import type { StorageBackend } from '../../src/backends/core/types.ts';
import { BackendRegistry } from '../../src/backends/registry.ts';
import { KvtierError } from '../../src/errors.ts';
import { createLogger } from '../../src/util/log.ts';

const memoryUrl = new URL('../../src/backends/memory/memory-backend.ts', import.meta.url).href;
const MEMORY = `import { MemoryBackend } from ${JSON.stringify(memoryUrl)};\n`;

/** A temp directory holding `files` (path relative to the directory → contents). */
async function pluginDir(files: Record<string, string>): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'kvtier-plugin-'));
  for (const [name, text] of Object.entries(files)) {
    await mkdir(join(dir, name, '..'), { recursive: true });
    await writeFile(join(dir, name), text);
  }
  return dir;
}

/** Starts one module tier named "p" from `dir`; resolves the tier or the KvtierError's message. */
async function startTier(
  dir: string,
  options: Record<string, unknown>,
  code: 'KVT_CONFIG' | 'KVT_BACKEND' = 'KVT_CONFIG',
): Promise<StorageBackend | string> {
  const reg = new BackendRegistry({ pluginBaseDir: dir });
  try {
    const [tier] = await reg.createTiers([{ name: 'p', type: 'module', options, health: false }]);
    return tier!;
  } catch (err) {
    assert.ok(err instanceof KvtierError, `not a KvtierError: ${String(err)}`);
    assert.equal(err.code, code);
    return err.message;
  }
}

/** The start-up error message of module `file` in `dir` (a `KVT_CONFIG` error unless `code`). */
async function failure(
  dir: string,
  file: string,
  code: 'KVT_CONFIG' | 'KVT_BACKEND' = 'KVT_CONFIG',
): Promise<string> {
  const r = await startTier(dir, { module: file }, code);
  if (typeof r !== 'string') {
    await r.close();
    assert.fail(`${file} started; expected a ${code} error`);
  }
  return r;
}

describe('plug-in backends (type: module)', () => {
  test('loads a factory from a path relative to the config directory and wraps it in a breaker', async () => {
    const dir = await pluginDir({
      'my-tier.ts': `${MEMORY}export async function createBackend(options: Record<string, unknown>, ctx: { name: string }) {
  return new MemoryBackend({ capacityBytes: options.capacityBytes as number }, ctx);
}
`,
    });
    const reg = new BackendRegistry({ pluginBaseDir: dir });
    const [tier] = await reg.createTiers([
      {
        name: 'plug',
        type: 'module',
        options: { module: './my-tier.ts', options: { capacityBytes: 4096 } },
        health: { timeoutMs: 50, failureThreshold: 2, probeIntervalMs: 100 },
      },
    ]);
    assert.ok(tier instanceof CircuitBreakerBackend, 'a tier below host memory gets a breaker');
    assert.equal(tier.name, 'plug');
    assert.equal(tier.kind, 'memory');
    assert.equal(tier.stats().capacityBytes, 4096, 'plug-in options reach the factory');
    await tier.close();
  });

  test('a default export works too, and health: false leaves the tier unwrapped', async () => {
    const dir = await pluginDir({
      'def.ts': `${MEMORY}export default async (_o: unknown, ctx: { name: string }) => new MemoryBackend({}, ctx);\n`,
    });
    const tier = await startTier(dir, { module: join(dir, 'def.ts') });
    assert.ok(typeof tier !== 'string', tier as string);
    assert.equal(tier instanceof CircuitBreakerBackend, false);
    await tier.close();
  });

  test('a CommonJS plug-in (.cjs, module.exports) loads', async () => {
    const dir = await pluginDir({
      'package.json': '{"type": "module"}\n',
      'impl.mjs': `${MEMORY}export const make = (ctx) => new MemoryBackend({}, ctx);\n`,
      'plugin.cjs':
        'module.exports = { createBackend: async (_o, ctx) => (await import("./impl.mjs")).make(ctx) };\n',
    });
    const tier = await startTier(dir, { module: './plugin.cjs' });
    assert.ok(typeof tier !== 'string', tier as string);
    await tier.close();
  });

  test('the factory context: logger at the configured level, config directory, abort helpers, metrics registry', async () => {
    const dir = await pluginDir({
      'ctx.ts': `${MEMORY}import type { PluginFactory } from ${JSON.stringify(new URL('../../src/backends/core/types.ts', import.meta.url).href)};
export const seen: Record<string, unknown> = {};
export const createBackend: PluginFactory = async (_o, ctx) => {
  ctx.log.info('info line from the plug-in');
  ctx.log.error('error line from the plug-in', { tier: ctx.name });
  seen.configDir = ctx.configDir;
  seen.data = ctx.resolvePath('./data');
  seen.abs = ctx.resolvePath('/var/x');
  const ac = new AbortController();
  ac.abort();
  try { ctx.abort.throwIfAborted(ac.signal, 'probe'); } catch (e) { seen.aborted = (e as { code?: string }).code; }
  seen.timeout = ctx.abort.error(AbortSignal.abort(new DOMException('t', 'TimeoutError')), 'probe').code;
  const late = new AbortController();
  const raced = ctx.abort.race(new Promise(() => {}), late.signal, 'slow op');
  late.abort();
  seen.raced = await raced.then(() => 'resolved', (e: { code?: string; message: string }) => e.code + ' ' + e.message);
  ctx.metrics.gauge({ name: 'kvtier_ctx_test_extra', help: 'extra', labelNames: ['tier'] }).set({ tier: ctx.name }, 7);
  seen.same = ctx.metrics.gauge({ name: 'kvtier_ctx_test_extra', help: 'extra', labelNames: ['tier'] }) === ctx.metrics.registry.getSingleMetric('kvtier_ctx_test_extra');
  return new MemoryBackend({}, ctx);
};
`,
    });
    const lines: string[] = [];
    const log = createLogger('kvtier', { level: 'error', write: (l) => lines.push(l) }).child(
      'tier',
    );
    const metrics = new Registry();
    const reg = new BackendRegistry({ pluginBaseDir: dir, log, metricsRegistry: metrics });
    const [tier] = await reg.createTiers([
      { name: 'p', type: 'module', options: { module: './ctx.ts' }, health: false },
    ]);
    const mod = (await import(new URL(`file://${join(dir, 'ctx.ts')}`).href)) as {
      seen: Record<string, unknown>;
    };
    assert.equal(lines.length, 1, `only the error line passes logLevel "error": ${lines.join('')}`);
    const rec = JSON.parse(lines[0]!) as Record<string, unknown>;
    assert.equal(rec.msg, 'error line from the plug-in');
    assert.equal(rec.component, 'kvtier.tier.p', 'the child logger is named after the tier');
    assert.deepEqual(mod.seen, {
      configDir: dir,
      data: join(dir, 'data'),
      abs: '/var/x',
      aborted: 'KVT_ABORTED',
      timeout: 'KVT_TIMEOUT',
      raced: 'KVT_ABORTED slow op was aborted',
      same: true,
    });
    assert.match(await metrics.metrics(), /kvtier_ctx_test_extra\{tier="p"\} 7/);
    await tier!.close();
  });

  test('module-tier config errors name what is allowed', async () => {
    const dir = await pluginDir({});
    assert.equal(await startTier(dir, {}), 'tier "p" (module) failed to start: module is required');
    assert.equal(
      await startTier(dir, { module: './x.ts', capacityBytes: 1 }),
      'tier "p" (module) failed to start: unknown module option "capacityBytes"; put plug-in settings under "options"',
    );
    assert.equal(
      await failure(dir, './missing.ts'),
      `tier "p" (module) failed to start: plug-in module ${join(dir, 'missing.ts')} does not exist (resolved against ${dir})`,
    );
    assert.match(
      await failure(dir, 'kvtier-no-such-package'),
      /^tier "p" \(module\) failed to start: cannot find plug-in package "kvtier-no-such-package" \(.*\); a package name is resolved from kvtier's own location: install the plug-in in the project that installs kvtier, or name the module by path$/,
    );
  });

  test('a module without a factory, or with a class, says a factory function was expected', async () => {
    const dir = await pluginDir({
      'nofactory.ts': 'export const nothing = 1;\n',
      'class-default.mjs': 'export default class DirStore {}\n',
      'class-named.mjs': 'export class createBackend {}\n',
    });
    assert.equal(
      await failure(dir, './nofactory.ts'),
      `tier "p" (module) failed to start: plug-in module "./nofactory.ts" (${join(dir, 'nofactory.ts')}) exports no createBackend function (named or default); it exports nothing. Expected: export const createBackend: PluginFactory = async (options, ctx) => backend`,
    );
    assert.equal(
      await failure(dir, './class-default.mjs'),
      `tier "p" (module) failed to start: plug-in module "./class-default.mjs" (${join(dir, 'class-default.mjs')}): its default export is a class (DirStore), but kvtier calls a factory function; export one instead: export const createBackend: PluginFactory = async (options, ctx) => new DirStore(...)`,
    );
    assert.match(
      await failure(dir, './class-named.mjs'),
      /: its createBackend export is a class \(createBackend\), but kvtier calls a factory function;/,
    );
  });

  test('a CommonJS/ES module mix-up says how to load the plug-in as an ES module', async () => {
    const dir = await pluginDir({
      // A .ts plug-in in a package without "type": "module" is compiled to CommonJS, which cannot
      // require() an ES module that is still evaluating (or awaits at top level).
      'cjs/package.json': '{}\n',
      'cjs/helper.mts': 'export const ready = await Promise.resolve(1);\n',
      'cjs/plugin.ts':
        'import { ready } from "./helper.mts";\nexport const createBackend = async () => ready;\n',
      // CommonJS syntax in a "type": "module" package.
      'esm/package.json': '{"type": "module"}\n',
      'esm/plugin.js': 'module.exports = { createBackend: async () => ({}) };\n',
    });
    const mixed = await failure(dir, './cjs/plugin.ts');
    assert.ok(
      mixed.startsWith(
        `tier "p" (module) failed to start: plug-in module "./cjs/plugin.ts" (${join(dir, 'cjs/plugin.ts')}) mixes CommonJS and ES modules (`,
      ),
      mixed,
    );
    assert.ok(
      mixed.endsWith(
        `); kvtier imports plug-ins as ES modules: set "type": "module" in the plug-in's package.json (or name the file .mjs/.mts) and use import/export`,
      ),
      mixed,
    );
    const cjs = await failure(dir, './esm/plugin.js');
    assert.match(
      cjs,
      /^tier "p" \(module\) failed to start: plug-in module "\.\/esm\/plugin\.js" \(.*\) is CommonJS but loads as an ES module \(module is not defined in ES module scope/,
    );
    assert.ok(
      cjs.endsWith(
        'kvtier imports plug-ins as ES modules: use import/export, or name a CommonJS file .cjs',
      ),
      cjs,
    );
  });

  test('a module that throws on import, or does not parse, names the module', async () => {
    const dir = await pluginDir({
      'throws.mjs': 'throw new Error("DIR_STORE_ROOT is not set");\n',
      'syntax.ts': 'export const = ;\n',
    });
    assert.equal(
      await failure(dir, './throws.mjs'),
      `tier "p" (module) failed to start: plug-in module "./throws.mjs" (${join(dir, 'throws.mjs')}) threw while being imported: DIR_STORE_ROOT is not set; importing a plug-in must only define its exports: do the work (connect, open files) in the factory`,
    );
    assert.match(
      await failure(dir, './syntax.ts'),
      /^tier "p" \(module\) failed to start: plug-in module "\.\/syntax\.ts" \(.*syntax\.ts\) threw while being imported: /,
    );
  });

  test('a factory that throws: its message once, the tier named once; KVT_CONFIG only for its options', async () => {
    const dir = await pluginDir({
      'throws.ts':
        'export async function createBackend() { throw new Error("store unreachable"); }\n',
      // Following the old advice (naming the tier) must not double the prefix. The code is read
      // as a property: a plug-in's KvtierError may come from another copy of kvtier.
      'prefixed.ts':
        "export async function createBackend(_o: unknown, ctx: { name: string }) { throw Object.assign(new Error('tier \"' + ctx.name + '\" (dir-store): path must be a string'), { code: 'KVT_CONFIG' }); }\n",
    });
    // Not its options: a service it could not reach (the sidecar starts such a tier down).
    assert.equal(
      await failure(dir, './throws.ts', 'KVT_BACKEND'),
      'tier "p" (module) failed to start: plug-in module "./throws.ts": store unreachable',
    );
    assert.equal(
      await failure(dir, './prefixed.ts'),
      'tier "p" (module) failed to start: plug-in module "./prefixed.ts": path must be a string',
    );
  });

  test('what the factory resolves to is checked against StorageBackend at start-up', async () => {
    const dir = await pluginDir({
      'empty.mjs': 'export const createBackend = async () => ({});\n',
      'partial.ts': `${MEMORY}export const createBackend = async (_o: unknown, ctx: { name: string }) => {
  const b = new MemoryBackend({}, ctx);
  return { name: b.name, kind: b.kind, capabilities: b.capabilities, pin: 3, batchedContains: b.batchedContains.bind(b), close: () => b.close() };
};
`,
      'renamed.ts': `${MEMORY}export const createBackend = async () => new MemoryBackend({}, { name: 'dir-store' });\n`,
      'nothing.mjs': 'export default async () => undefined;\n',
    });
    assert.equal(
      await failure(dir, './empty.mjs'),
      'tier "p" (module) failed to start: plug-in module "./empty.mjs": its factory must resolve to a StorageBackend (docs/backends.md §2), but missing methods: batchedContains, batchedGet, put, remove, pin, unpin, clear, stats, health, close; name is undefined; it must be the tier\'s name ("p", ctx.name); kind is undefined; it must be a non-empty string (the backend type); capabilities is undefined; it must be a BackendCapabilities object',
    );
    assert.equal(
      await failure(dir, './partial.ts'),
      'tier "p" (module) failed to start: plug-in module "./partial.ts": its factory must resolve to a StorageBackend (docs/backends.md §2), but missing methods: batchedGet, put, remove, unpin, clear, stats, health; pin is 3, not a function',
    );
    assert.equal(
      await failure(dir, './renamed.ts'),
      'tier "p" (module) failed to start: plug-in module "./renamed.ts": its factory must resolve to a StorageBackend (docs/backends.md §2), but name is "dir-store"; it must be the tier\'s name ("p", ctx.name)',
    );
    assert.equal(
      await failure(dir, './nothing.mjs'),
      'tier "p" (module) failed to start: plug-in module "./nothing.mjs": its factory must resolve to a StorageBackend (docs/backends.md §2), but got undefined instead of a backend object',
    );
  });

  test("a built-in type's own tier prefix is not doubled", async () => {
    const reg = new BackendRegistry();
    await assert.rejects(
      reg.createTiers([{ name: 'c', type: 'local-cpu', options: { capacityBytes: 1e6, x: 1 } }]),
      (e: unknown) =>
        e instanceof KvtierError &&
        e.message.startsWith(
          'tier "c" (local-cpu) failed to start: unknown local-cpu option "x"',
        ) &&
        e.message.split('tier "c"').length === 2,
    );
  });

  test('registered factories are checked the same way', async () => {
    const reg = new BackendRegistry();
    reg.register('broken', async () => ({ name: 'b' }) as unknown as StorageBackend);
    await assert.rejects(
      reg.createTiers([{ name: 'b', type: 'broken', options: {} }]),
      (e: unknown) =>
        e instanceof KvtierError &&
        e.code === 'KVT_CONFIG' &&
        e.message.startsWith(
          'tier "b" (broken) failed to start: its factory must resolve to a StorageBackend, but missing methods: batchedContains,',
        ),
    );
  });
});
