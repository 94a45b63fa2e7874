/**
 * The schema of one tier in the config file, collected from the registry: a tier is
 * `{ name?, type, health?, ...options }`, where the options of a built-in type are the ones its
 * folder declares (src/backends/<tier>/<tier>-options.ts, `defineTierOptions`) as a config file
 * can give them (byte sizes as "8GiB", no callbacks). Nothing about a tier's options is written
 * here.
 */
import * as v from 'valibot';
import { type AnyTierOptions, configEntries, crossCheck } from '../backends/core/tier-options.ts';
import { BUILTIN_TIERS } from '../backends/registry.ts';
import { type AnySchema, int, objectMsg, pattern, strict } from '../util/schema-kit.ts';
import { describe } from '../util/validate.ts';

const HOUR_MS = 3_600_000;

/** Health and circuit-breaker settings of a tier below host memory, or `false` for none. */
export const healthSchema = v.union(
  [
    v.literal(false),
    strict({
      timeoutMs: v.optional(int(1, 600_000)),
      failureThreshold: v.optional(int(1, 1000)),
      probeIntervalMs: v.optional(int(1, HOUR_MS)),
    }),
  ],
  (i) =>
    `must be false or an object { timeoutMs, failureThreshold, probeIntervalMs }, got ${describe(i.input)}`,
);

/** Tier names: what a metric label and a log component can carry. */
export const TIER_NAME_RULE = 'must match [a-zA-Z0-9_.-]{1,64}';

/** The keys every tier has, whatever its type. */
function common(type: v.GenericSchema<string>) {
  return {
    name: v.optional(pattern(/^[a-zA-Z0-9_.-]{1,64}$/, TIER_NAME_RULE)),
    type,
    health: v.optional(healthSchema),
  };
}

/** A tier of a type the config does not know (registered by an embedder): options unchecked here. */
export const genericTierSchema = v.looseObject(
  common(pattern(/^.+$/, 'must be a backend type name')),
  (i) => objectMsg(i, 'must be an object { name, type, ...options }'),
);

/** The config file's schema of a tier whose options `spec` declares. */
export function tierSchema(spec: AnyTierOptions): AnySchema {
  const entries = { ...common(v.literal(spec.type)), ...configEntries(spec) };
  const hint = spec.unknownKeyHint ?? `allowed: ${Object.keys(entries).join(', ')}`;
  return v.pipe(
    strict(entries, `unknown ${spec.type} option; ${hint}`) as v.GenericSchema<
      unknown,
      Record<string, unknown>
    >,
    crossCheck(spec),
    v.description(spec.description),
  );
}

/** The schema of a tier of each built-in type, by type name, in the registry's order. */
export const BUILTIN_TIER_SCHEMAS: ReadonlyMap<string, AnySchema> = new Map(
  BUILTIN_TIERS.map((t) => [t.options.type, tierSchema(t.options)]),
);
