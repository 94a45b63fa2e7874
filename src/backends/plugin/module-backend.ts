import { existsSync } from 'node:fs';
import { isAbsolute, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { KvtierError } from '../../errors.ts';
import {
  closeQuietly,
  isConfigFailure,
  storageBackendProblems,
  withoutTierPrefix,
} from '../core/backend-check.ts';
import type {
  BackendContext,
  BackendFactory,
  PluginContext,
  PluginFactory,
} from '../core/types.ts';
import { kvtierInstanceCount, OWN_KVTIER, otherKvtierSince } from './instance.ts';
import { MODULE_OPTIONS } from './module-options.ts';
import { createPluginContext } from './plugin-context.ts';

/**
 * The `module` backend type: loads a plug-in backend from a module named in the config.
 *
 * Config: `{ "name": "t", "type": "module", "module": "<package name or path>", "options": {...} }`.
 * A relative path is resolved against `baseDir` (the config file's directory when there is one,
 * else the working directory); a package name is resolved by Node from kvtier's own location.
 * The module must export `createBackend` (a {@link PluginFactory}) or a default export that is
 * one; it is called with `options` and the tier's {@link PluginContext}, and what it resolves to
 * is checked against the `StorageBackend` interface. TypeScript modules (`.ts`) are loaded
 * through tsx when it is installed.
 *
 * Every failure to load fails startup with KVT_CONFIG naming the module and saying what was
 * expected: the module is missing or cannot be imported (CommonJS/ES module mix-ups, a throw at
 * import time), exports no factory or a class, the factory throws `KVT_CONFIG` or
 * `KVT_INVALID_ARGUMENT` (its options), or its result is not a backend. A factory that throws
 * anything else could not reach its service: `KVT_BACKEND`, and the registry may start the tier
 * down (`CreateTiersOptions.onStartDown`). The registry prefixes the tier's name. A plug-in that
 * fails to load is never skipped.
 */
export function createModuleBackendFactory(baseDir: string = process.cwd()): BackendFactory {
  return async (raw, ctx) => {
    // The options as MODULE_OPTIONS declares them (KVT_CONFIG naming the key).
    const { module: spec, options = {} } = MODULE_OPTIONS.fromConfig(raw, ctx.name);
    const copies = kvtierInstanceCount();
    const factory = await loadPluginFactory(spec, baseDir);
    const pctx = isPluginContext(ctx)
      ? ctx
      : createPluginContext({ name: ctx.name, configDir: baseDir });
    let backend: unknown;
    try {
      backend = await factory(options as Record<string, unknown>, pctx);
    } catch (err) {
      warnOtherKvtier(spec, copies, pctx);
      const msg = err instanceof Error ? err.message : String(err);
      // The factory's own verdict: its options (KVT_CONFIG), or a service it could not reach.
      throw new KvtierError(
        isConfigFailure(err) ? 'KVT_CONFIG' : 'KVT_BACKEND',
        `plug-in module "${spec}": ${withoutTierPrefix(msg, ctx.name)}`,
        { cause: err },
      );
    }
    warnOtherKvtier(spec, copies, pctx);
    const problems = storageBackendProblems(backend, ctx.name);
    if (problems.length > 0) {
      await closeQuietly(backend);
      throw new KvtierError(
        'KVT_CONFIG',
        `plug-in module "${spec}": its factory must resolve to a StorageBackend (docs/backends.md §2), but ${problems.join('; ')}`,
      );
    }
    return backend as Awaited<ReturnType<BackendFactory>>;
  };
}

/**
 * Warns (on the tier's logger) when loading plug-in `spec` or running its factory loaded a copy of
 * kvtier other than the host's: its errors are then another `KvtierError` class.
 */
function warnOtherKvtier(spec: string, since: number, ctx: PluginContext): void {
  for (const other of otherKvtierSince(since)) {
    ctx.log.warn(
      `plug-in module "${spec}" loaded a second copy of kvtier (${other.root}), not the host's (${OWN_KVTIER.root}): its KvtierError is another class, so instanceof checks between the two fail; make kvtier a peerDependency of the plug-in and install the plug-in where it resolves the host's kvtier (docs/backends.md §14)`,
      { tier: ctx.name, module: spec, pluginKvtier: other.root, hostKvtier: OWN_KVTIER.root },
    );
  }
}

/**
 * Imports a plug-in module and returns its factory (`createBackend`, or the default export).
 * @throws KvtierError KVT_CONFIG naming the module and saying what was expected.
 */
export async function loadPluginFactory(spec: string, baseDir: string): Promise<PluginFactory> {
  const isPath = spec.startsWith('.') || isAbsolute(spec);
  const target = isPath ? resolve(baseDir, spec) : spec;
  const label = isPath && target !== spec ? `"${spec}" (${target})` : `"${spec}"`;
  if (isPath && !existsSync(target)) {
    const from = isAbsolute(spec) ? '' : ` (resolved against ${baseDir})`;
    throw new KvtierError('KVT_CONFIG', `plug-in module ${target} does not exist${from}`);
  }
  let mod: Record<string, unknown>;
  try {
    if (isPath && /\.(c|m)?ts$/.test(target)) await ensureTypeScriptLoader();
    mod = (await import(isPath ? pathToFileURL(target).href : target)) as Record<string, unknown>;
  } catch (err) {
    if (err instanceof KvtierError) {
      throw new KvtierError(err.code, `plug-in module ${label}: ${err.message}`, { cause: err });
    }
    throw new KvtierError('KVT_CONFIG', importFailure(label, spec, isPath, err), { cause: err });
  }
  return pickFactory(mod, label);
}

/** Names the module and says what was expected, for an import that threw. */
function importFailure(label: string, spec: string, isPath: boolean, err: unknown): string {
  const e = err as { code?: unknown; message?: unknown };
  const msg = typeof e?.message === 'string' ? e.message : String(err);
  const code = typeof e?.code === 'string' ? e.code : '';
  const mixUp =
    ['ERR_REQUIRE_ESM', 'ERR_REQUIRE_CYCLE_MODULE', 'ERR_REQUIRE_ASYNC_MODULE'].includes(code) ||
    /Cannot use import statement outside a module|Unexpected token 'export'|require\(\) (of )?ES Module/.test(
      msg,
    );
  if (mixUp) {
    return `plug-in module ${label} mixes CommonJS and ES modules (${msg}); kvtier imports plug-ins as ES modules: set "type": "module" in the plug-in's package.json (or name the file .mjs/.mts) and use import/export`;
  }
  if (/(require|module|exports|__dirname|__filename) is not defined in ES module scope/.test(msg)) {
    return `plug-in module ${label} is CommonJS but loads as an ES module (${msg}); kvtier imports plug-ins as ES modules: use import/export, or name a CommonJS file .cjs`;
  }
  if (!isPath && (code === 'ERR_MODULE_NOT_FOUND' || code === 'MODULE_NOT_FOUND')) {
    if (msg.includes(`'${spec}'`)) {
      return `cannot find plug-in package ${label} (${msg}); a package name is resolved from kvtier's own location: install the plug-in in the project that installs kvtier, or name the module by path`;
    }
  }
  if (code === 'ERR_MODULE_NOT_FOUND' || code === 'MODULE_NOT_FOUND') {
    return `plug-in module ${label} cannot be imported: ${msg}; install the plug-in's dependencies (kvtier itself is the host's copy, a peer dependency)`;
  }
  return `plug-in module ${label} threw while being imported: ${msg}; importing a plug-in must only define its exports: do the work (connect, open files) in the factory`;
}

/** `createBackend`, or the default export, checked to be a factory function (not a class). */
function pickFactory(mod: Record<string, unknown>, label: string): PluginFactory {
  let candidate: unknown = mod.createBackend ?? mod.default;
  // A CommonJS module compiled from ES syntax arrives as { default: { createBackend | default } }.
  if (typeof candidate === 'object' && candidate !== null) {
    const inner = candidate as Record<string, unknown>;
    candidate = inner.createBackend ?? inner.default ?? candidate;
  }
  const which = mod.createBackend !== undefined ? 'createBackend' : 'default';
  const exported = Object.keys(mod).filter((k) => k !== '__esModule');
  if (typeof candidate !== 'function') {
    return fail(
      `plug-in module ${label} exports no createBackend function (named or default); it exports ${
        exported.length > 0 ? exported.join(', ') : 'nothing'
      }. Expected: export const createBackend: PluginFactory = async (options, ctx) => backend`,
    );
  }
  if (/^class\b/.test(Function.prototype.toString.call(candidate))) {
    const name = (candidate as { name?: string }).name || 'anonymous';
    return fail(
      `plug-in module ${label}: its ${which} export is a class (${name}), but kvtier calls a factory function; export one instead: export const createBackend: PluginFactory = async (options, ctx) => new ${name}(...)`,
    );
  }
  return candidate as PluginFactory;
}

function fail(message: string): never {
  throw new KvtierError('KVT_CONFIG', message);
}

function isPluginContext(ctx: BackendContext): ctx is PluginContext {
  const c = ctx as Partial<PluginContext>;
  return typeof c.resolvePath === 'function' && c.abort !== undefined && c.metrics !== undefined;
}

let tsLoader: Promise<void> | undefined;

function ensureTypeScriptLoader(): Promise<void> {
  // Running from TypeScript sources, tsx is already registered; registering twice is harmless.
  tsLoader ??= import('tsx/esm/api').then(
    (m: { register: () => unknown }) => {
      m.register();
    },
    (err: unknown) => {
      throw new KvtierError(
        'KVT_CONFIG',
        `loading a TypeScript plug-in needs the tsx package: ${(err as Error).message}`,
        { cause: err },
      );
    },
  );
  return tsLoader;
}
