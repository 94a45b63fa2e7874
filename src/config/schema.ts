/**
 * The schema of a kvtier config file (valibot), and {@link validateConfigDocument}, which checks
 * a parsed file against it and reports every problem with its key path. Defaults are not applied
 * here: `resolveConfig` merges what a file gives over `defaultConfig()`.
 */
import * as v from 'valibot';
import { resolveCircuitBreakerOptions } from '../backends/core/circuit-breaker.ts';
import type { TierConfig } from '../backends/registry.ts';
import type { EventsDocument } from '../event-stream/events-options.ts';
import { BYTE_SIZE_RULE, tryParseBytes } from '../util/bytes.ts';
import type { LogLevel } from '../util/log.ts';
import {
  bool,
  bytes,
  type ConfigProblem,
  check,
  int,
  oneOf,
  pattern,
  str,
  strict,
} from '../util/schema-kit.ts';
import { BIND_ENDPOINT, bindEndpointRule } from './endpoint-rule.ts';
import { eventsSchema } from './events-schema.ts';
import { checkSecurity, type SecurityDocument, securitySchema } from './security-schema.ts';
import { BUILTIN_TIER_SCHEMAS, genericTierSchema } from './tier-schemas.ts';

/** Log levels, most verbose first. */
export const LOG_LEVELS = [
  'debug',
  'info',
  'warn',
  'error',
  'silent',
] as const satisfies readonly LogLevel[];

const TIERS_RULE = 'must be a non-empty array of { name, type, ...options }';

/** The config file's top level; `tiers` items are checked per type by {@link validateTier}. */
export const rootSchema = strict({
  $schema: v.optional(
    v.pipe(str(), v.description('Where an editor finds this schema; ignored by kvtier.')),
  ),
  listen: v.optional(
    v.pipe(
      pattern(BIND_ENDPOINT, bindEndpointRule('tcp://127.0.0.1:5555')),
      v.description('ZMQ endpoint of the lookup server.'),
    ),
  ),
  metrics: v.optional(
    v.pipe(
      v.nullable(
        strict({
          host: v.optional(str({ nonEmpty: true })),
          port: v.optional(int(0, 65535)),
        }),
      ),
      v.description(
        'Ops HTTP endpoint (/metrics, /healthz, /readyz); port 0 picks a free one, null disables it.',
      ),
    ),
  ),
  tiers: v.optional(
    v.pipe(
      v.array(v.unknown(), TIERS_RULE),
      v.minLength(1, TIERS_RULE),
      v.description('Tiers, fastest first; the first must be a host-memory tier (local-cpu).'),
    ),
  ),
  storage: v.optional(
    strict({
      prefetchBudgetChunks: v.optional(
        v.pipe(int(1), v.description('Chunks that prefetches may hold in host memory at once.')),
      ),
      pinTtlMs: v.optional(
        v.pipe(int(1), v.description('A pin not released by then expires (leak backstop), ms.')),
      ),
      maxLookups: v.optional(v.pipe(int(1), v.description('Lookups tracked at once.'))),
      maxLookupBytes: v.optional(
        v.pipe(
          bytes(4096),
          v.description(
            'Estimated bytes of lookups in flight and answered lookups holding pins; past it a LOOKUP is refused with KVT_CAPACITY.',
          ),
        ),
      ),
      epochFile: v.optional(
        v.pipe(
          v.nullable(str({ nonEmpty: true })),
          v.description(
            'Where the epoch is kept across restarts, so a restarted sidecar starts above every epoch its clients saw (relative: to this file); null: from the clock alone. Default: a file per listen endpoint under epochs/ in the kvtier cache directory.',
          ),
        ),
      ),
      writeThrough: v.optional(
        strict({
          maxChunks: v.optional(int(1)),
          maxBytes: v.optional(bytes(1)),
          concurrency: v.optional(int(1, 256)),
        }),
      ),
    }),
  ),
  server: v.optional(
    strict({
      maxSendQueueBytes: v.optional(
        v.pipe(
          bytes(4096),
          v.description(
            'Reply bytes queued for sending at once; a reply past it is dropped and counted (the client times out).',
          ),
        ),
      ),
    }),
  ),
  limits: v.optional(
    strict({
      maxChunksPerLookup: v.optional(int(1, 65536)),
      maxPayloadBytes: v.optional(bytes(1, 2 ** 32 - 1)),
      maxTokensPerChunk: v.optional(int(1, 2 ** 32 - 1)),
    }),
  ),
  logLevel: v.optional(oneOf(LOG_LEVELS)),
  allowOversizedTiers: v.optional(
    v.pipe(
      bool(),
      v.description(
        "Start even when host-memory tiers add up to more than the memory this sidecar may use (the cgroup limit, else the machine's), or disk tiers to more than their filesystem's free space; default false: refused with the numbers.",
      ),
    ),
  ),
  security: v.optional(
    v.pipe(securitySchema, v.description('CurveZMQ keys and client roles (docs/security.md).')),
  ),
  events: v.optional(
    v.pipe(
      eventsSchema,
      v.description('The event stream of chunks stored and removed (docs/events.md); null: off.'),
    ),
  ),
});

/** A config file after validation: what it gives, sizes as numbers, tiers as the registry takes them. */
export interface ConfigDocument {
  listen?: string;
  metrics?: { host?: string; port?: number } | null;
  tiers?: TierConfig[];
  storage?: {
    prefetchBudgetChunks?: number;
    pinTtlMs?: number;
    maxLookups?: number;
    maxLookupBytes?: number;
    epochFile?: string | null;
    writeThrough?: { maxChunks?: number; maxBytes?: number; concurrency?: number };
  };
  server?: { maxSendQueueBytes?: number };
  limits?: { maxChunksPerLookup?: number; maxPayloadBytes?: number; maxTokensPerChunk?: number };
  logLevel?: LogLevel;
  allowOversizedTiers?: boolean;
  security?: SecurityDocument;
  events?: EventsDocument | null;
}

/**
 * Checks one tier: the built-in type's schema, or for another type (registered by an embedder)
 * the common keys, with its `*Bytes` options turned into numbers.
 */
export function validateTier(
  raw: unknown,
  index: number,
  problems: ConfigProblem[],
): TierConfig | undefined {
  const prefix = `tiers[${index}]`;
  const type = (raw as { type?: unknown } | null)?.type;
  const schema =
    (typeof type === 'string' ? BUILTIN_TIER_SCHEMAS.get(type) : undefined) ?? genericTierSchema;
  const r = check(schema, raw, prefix);
  if (!r.ok) {
    problems.push(...r.problems);
    return undefined;
  }
  const { name, type: t, health, ...options } = r.value as Record<string, unknown>;
  if (schema === genericTierSchema) {
    for (const [k, val] of Object.entries(options)) {
      if (!k.endsWith('Bytes') || typeof val !== 'string') continue;
      const n = tryParseBytes(val);
      if (n === undefined)
        problems.push({
          path: `${prefix}.${k}`,
          message: `${BYTE_SIZE_RULE}, got ${JSON.stringify(val)}`,
        });
      else options[k] = n;
    }
  }
  const tier: TierConfig = { name: (name ?? t) as string, type: t as string, options };
  if (health === false) tier.health = false;
  else if (health !== undefined)
    tier.health = resolveCircuitBreakerOptions(health as Record<string, number>);
  return tier;
}

/**
 * Validates a parsed config file. Every problem is reported, each with its key path and what is
 * allowed; tier names must be unique.
 */
export function validateConfigDocument(
  raw: unknown,
): { ok: true; value: ConfigDocument } | { ok: false; problems: ConfigProblem[] } {
  const root = check(rootSchema, raw);
  const problems: ConfigProblem[] = root.ok ? [] : [...root.problems];
  const rawTiers = (raw as { tiers?: unknown } | null)?.tiers;
  const tiers: TierConfig[] = [];
  if (Array.isArray(rawTiers)) {
    const names = new Map<string, number>();
    rawTiers.forEach((t, i) => {
      const tier = validateTier(t, i, problems);
      if (tier !== undefined) tiers.push(tier);
      const o = (t ?? {}) as { name?: unknown; type?: unknown };
      const name = o.name ?? o.type;
      if (typeof name !== 'string') return;
      const first = names.get(name);
      if (first !== undefined)
        problems.push({
          path: `tiers[${i}].name`,
          message: `"${name}" is used twice (also by tiers[${first}]); tier names must be unique`,
        });
      else names.set(name, i);
    });
  }
  if (root.ok) checkSecurity(root.value.security as SecurityDocument | undefined, problems);
  if (!root.ok || problems.length > 0) return { ok: false, problems };
  const { $schema: _, tiers: __, ...rest } = root.value;
  const value: ConfigDocument = rest as ConfigDocument;
  if (root.value.tiers !== undefined) value.tiers = tiers;
  return { ok: true, value };
}
