import { existsSync } from 'node:fs';
import { isAbsolute, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { KvtierError } from '../errors.ts';
import type { BackendFactory } from './types.ts';

/**
 * The `module` backend type: loads a plug-in backend from a module named in the config.
 *
 * Config: `{ "name": "t", "type": "module", "module": "<package name or path>", "options": {...} }`.
 * A relative path is resolved against `baseDir` (the config file's directory when there is one,
 * else the working directory). The module must export `createBackend` (a {@link BackendFactory})
 * or a default export that is one; it is called with `options` and the tier context. TypeScript
 * modules (`.ts`) are loaded through tsx when it is installed.
 *
 * Every failure (module not found, no factory exported, factory throws) fails startup with
 * KVT_CONFIG naming the module: a plug-in that fails to load is never skipped.
 */
export function createModuleBackendFactory(baseDir: string = process.cwd()): BackendFactory {
  return async (raw, ctx) => {
    const spec = raw.module;
    if (typeof spec !== 'string' || spec.length === 0) {
      throw new KvtierError(
        'KVT_CONFIG',
        `tier "${ctx.name}": type "module" needs "module": a package name or a path to the plug-in`,
      );
    }
    for (const key of Object.keys(raw)) {
      if (key !== 'module' && key !== 'options') {
        throw new KvtierError(
          'KVT_CONFIG',
          `tier "${ctx.name}": unknown key "${key}" for a module tier; put plug-in settings under "options"`,
        );
      }
    }
    const options = raw.options ?? {};
    if (typeof options !== 'object' || options === null || Array.isArray(options)) {
      throw new KvtierError('KVT_CONFIG', `tier "${ctx.name}": "options" must be an object`);
    }
    const factory = await loadPluginFactory(spec, baseDir, ctx.name);
    return factory(options as Record<string, unknown>, ctx);
  };
}

/** Imports a plug-in module and returns its factory. @throws KVT_CONFIG. */
export async function loadPluginFactory(
  spec: string,
  baseDir: string,
  tier: string,
): Promise<BackendFactory> {
  const isPath = spec.startsWith('.') || isAbsolute(spec);
  const target = isPath ? resolve(baseDir, spec) : spec;
  if (isPath && !existsSync(target)) {
    throw new KvtierError('KVT_CONFIG', `tier "${tier}": plug-in module ${target} does not exist`);
  }
  let mod: Record<string, unknown>;
  try {
    if (isPath && /\.(c|m)?ts$/.test(target)) await ensureTypeScriptLoader();
    mod = (await import(isPath ? pathToFileURL(target).href : target)) as Record<string, unknown>;
  } catch (err) {
    if (err instanceof KvtierError) throw err;
    throw new KvtierError(
      'KVT_CONFIG',
      `tier "${tier}": cannot load plug-in module "${spec}": ${(err as Error).message}`,
      { cause: err },
    );
  }
  const factory = mod.createBackend ?? mod.default;
  if (typeof factory !== 'function') {
    throw new KvtierError(
      'KVT_CONFIG',
      `tier "${tier}": plug-in module "${spec}" exports no createBackend function (named or default)`,
    );
  }
  return factory as BackendFactory;
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
