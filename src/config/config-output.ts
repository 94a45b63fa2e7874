/**
 * A resolved config written back in the config file's own format, as `kvtier config check`
 * prints it: a file `kvtier serve --config` accepts, wherever it is saved.
 */
import { isAbsolute, resolve } from 'node:path';
import { redactSecrets } from '../util/log.ts';
import type { KvtierConfig } from './config.ts';

/**
 * `cfg` as a config document: tiers as `{ name, type, health?, ...options }`, relative paths
 * (key files, plug-in modules given by path, the epoch file) made absolute against
 * `cfg.baseDir`, no `baseDir` key, unset keys left out, and credentials as `"[redacted]"` (fill
 * them in, or give them through the environment, before serving from it).
 */
export function configDocumentOf(cfg: KvtierConfig): Record<string, unknown> {
  const abs = (p: string) => resolve(cfg.baseDir, p);
  const security: Record<string, unknown> = {
    allowUnauthenticated: cfg.security.allowUnauthenticated,
  };
  // `clients` goes with a server key: without one the file may not name it (even empty).
  if (cfg.security.serverSecretKeyFile !== null) {
    security.serverSecretKeyFile = abs(cfg.security.serverSecretKeyFile);
    security.clients = cfg.security.clients.map((c) =>
      c.publicKeyFile !== undefined ? { ...c, publicKeyFile: abs(c.publicKeyFile) } : { ...c },
    );
  }
  const doc = {
    listen: cfg.listen,
    metrics: cfg.metrics,
    tiers: cfg.tiers.map((t) => {
      const options = { ...t.options };
      const spec = options.module;
      if (
        t.type === 'module' &&
        typeof spec === 'string' &&
        (spec.startsWith('.') || isAbsolute(spec))
      )
        options.module = abs(spec);
      return {
        name: t.name,
        type: t.type,
        ...(t.health !== undefined ? { health: t.health } : {}),
        ...options,
      };
    }),
    storage: {
      ...cfg.storage,
      epochFile: cfg.storage.epochFile === null ? null : abs(cfg.storage.epochFile),
    },
    server: cfg.server,
    limits: cfg.limits,
    logLevel: cfg.logLevel,
    ...(cfg.allowOversizedTiers ? { allowOversizedTiers: true } : {}),
    security,
    ...(cfg.events !== null ? { events: cfg.events } : {}),
  };
  return redactSecrets(doc, 16) as Record<string, unknown>;
}
