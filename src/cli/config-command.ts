import { existsSync } from 'node:fs';
import { isAbsolute, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { BackendRegistry } from '../backends/registry.ts';
import { ConfigError, type KvtierConfig, loadConfig } from '../config/config.ts';
import type { ConfigProblem } from '../config/schema-kit.ts';
import { isKvtierError } from '../errors.ts';
import { redactSecrets } from '../util/log.ts';

/** Where `kvtier config` writes. */
export interface ConfigCommandIo {
  /** Writes one line of output (no trailing newline). */
  out: (line: string) => void;
  /** Writes one line to stderr (no trailing newline). */
  err: (line: string) => void;
  /** The environment the config is resolved with (as `kvtier serve` would); default none. */
  env?: NodeJS.ProcessEnv;
}

export const CONFIG_COMMAND_USAGE = `Usage: kvtier config check FILE

Validates a config file as \`kvtier serve --config FILE\` would load it (with the KVTIER_*
environment applied) and checks every tier's options with its backend. Valid: prints the resolved
config as JSON, credentials redacted, and exits 0. Invalid: prints each problem as
"FILE: key.path: what is wrong and what is allowed" on stderr and exits 1. Usage errors exit 2.
The JSON Schema for editors is schema/kvtier.config.schema.json (docs/configuration.md).`;

/** The built-in types that keep chunks in host memory: the only ones allowed first. */
const HOST_MEMORY_TYPES = new Set(['local-cpu']);

/**
 * Checks what only the backends and the tier order know: every type is registered and its
 * options pass its backend's validator, the first tier keeps chunks in host memory, and a plug-in
 * given by path exists (it is not imported: that would run its code).
 */
export function checkTiers(cfg: KvtierConfig): ConfigProblem[] {
  const problems: ConfigProblem[] = [];
  const registry = new BackendRegistry({ pluginBaseDir: cfg.baseDir });
  const builtins = new Set(new BackendRegistry().types());
  cfg.tiers.forEach((tier, i) => {
    try {
      registry.validateTiers([tier]);
    } catch (err) {
      problems.push({ path: `tiers[${i}]`, message: (err as Error).message });
    }
    const spec = tier.options.module;
    if (tier.type === 'module' && typeof spec === 'string') {
      const isPath = spec.startsWith('.') || isAbsolute(spec);
      if (isPath && !existsSync(resolve(cfg.baseDir, spec)))
        problems.push({
          path: `tiers[${i}].module`,
          message: `plug-in module ${resolve(cfg.baseDir, spec)} does not exist`,
        });
    }
  });
  const first = cfg.tiers[0];
  if (first !== undefined && builtins.has(first.type) && !HOST_MEMORY_TYPES.has(first.type))
    problems.push({
      path: 'tiers[0].type',
      message: `the first tier must keep chunks in host memory (local-cpu), got "${first.type}"`,
    });
  return problems;
}

/** Runs `kvtier config ...`; resolves the exit code. */
export async function runConfigCommand(args: string[], io: ConfigCommandIo): Promise<number> {
  const { positionals } = parseArgs({ args, options: {}, allowPositionals: true, strict: true });
  const [sub, file, ...extra] = positionals;
  if (sub !== 'check' || file === undefined || extra.length > 0) {
    io.err(CONFIG_COMMAND_USAGE);
    return 2;
  }
  const env: NodeJS.ProcessEnv = { ...(io.env ?? {}) };
  delete env.KVTIER_CONFIG;
  let cfg: KvtierConfig;
  try {
    cfg = await loadConfig({ configPath: file }, env);
  } catch (err) {
    if (err instanceof ConfigError) {
      for (const p of err.problems) io.err(`${file}: ${p.path}: ${p.message}`);
      return 1;
    }
    if (isKvtierError(err)) {
      io.err(`${file}: ${err.message}`);
      return 1;
    }
    throw err;
  }
  const problems = checkTiers(cfg);
  if (problems.length > 0) {
    for (const p of problems) io.err(`${file}: ${p.path}: ${p.message}`);
    return 1;
  }
  io.out(JSON.stringify(redactSecrets(cfg, 16), null, 2));
  return 0;
}
