/**
 * The published JSON Schema of the config file (schema/kvtier.config.schema.json, for editors),
 * derived from the valibot schema in schema.ts and the tiers' option declarations (collected in
 * tier-schemas.ts), with the defaults from CONFIG_DEFAULTS and from those declarations. Used by scripts/config-schema.ts and its test;
 * it needs the dev dependency `@valibot/to-json-schema`, so nothing at run time imports it.
 */
import { toJsonSchema } from '@valibot/to-json-schema';
import { CIRCUIT_BREAKER_DEFAULTS } from '../backends/core/circuit-breaker.ts';
import { BUILTIN_TIERS } from '../backends/registry.ts';
import { type AnySchema, JSON_SCHEMA_OVERRIDES } from '../util/schema-kit.ts';
import { CONFIG_DEFAULTS } from './config.ts';
import { rootSchema } from './schema.ts';
import { genericTierSchema, tierSchema } from './tier-schemas.ts';

type Json = Record<string, unknown>;

/** Where the committed schema lives, relative to the repository root. */
export const CONFIG_SCHEMA_PATH = 'schema/kvtier.config.schema.json';

function convert(schema: AnySchema): Json {
  const json = toJsonSchema(schema, {
    target: 'draft-07',
    // Object sections are pipes ending in their object schema; byte sizes end in a transform.
    typeMode: 'output',
    errorMode: 'throw',
    ignoreActions: ['check', 'raw_check', 'raw_transform'],
    overrideSchema: ({ valibotSchema }) => JSON_SCHEMA_OVERRIDES.get(valibotSchema),
  }) as Json;
  delete json.$schema;
  return dropUnboundedMaximum(json) as Json;
}

/** `maximum: 2^53 - 1` says nothing to an editor: integers are unbounded there. */
function dropUnboundedMaximum(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(dropUnboundedMaximum);
  if (typeof value !== 'object' || value === null) return value;
  const out: Json = {};
  for (const [k, v] of Object.entries(value))
    if (!(k === 'maximum' && v === Number.MAX_SAFE_INTEGER)) out[k] = dropUnboundedMaximum(v);
  return out;
}

/** Sets `default` on each property of `schema` that `defaults` names, recursing into objects. */
function annotate(schema: Json, defaults: Record<string, unknown>): void {
  const props = schema.properties as Record<string, Json> | undefined;
  if (props === undefined) return;
  for (const [k, d] of Object.entries(defaults)) {
    const p = props[k];
    if (p === undefined) continue;
    if (typeof d === 'object' && d !== null && !Array.isArray(d)) {
      const obj = (p.anyOf as Json[] | undefined)?.find((s) => s.type === 'object') ?? p;
      annotate(obj, d as Record<string, unknown>);
    }
    p.default = d;
  }
}

function healthJson(): Json {
  const health = convert(genericTierSchema).properties as Record<string, Json>;
  const h = health.health!;
  const obj = (h.anyOf as Json[]).find((s) => s.type === 'object')!;
  annotate(obj, CIRCUIT_BREAKER_DEFAULTS as unknown as Record<string, unknown>);
  h.description =
    'Timeouts and circuit breaker of a tier below host memory; false turns the breaker off.';
  return h;
}

/** One tier: the common keys, then per built-in type its options (if/then on `type`). */
function tierJson(): Json {
  const common = convert(genericTierSchema);
  const props = common.properties as Record<string, Json>;
  props.health = healthJson();
  props.name = { ...props.name, description: 'Unique tier name; default: the type.' };
  props.type = {
    ...props.type,
    description:
      'Backend type: a built-in type, or one an embedder registered (its options are not checked here).',
    examples: BUILTIN_TIERS.map((t) => t.options.type),
  };
  const allOf: Json[] = [];
  for (const { options: spec } of BUILTIN_TIERS) {
    const type = spec.type;
    const then = convert(tierSchema(spec));
    const tprops = then.properties as Record<string, Json>;
    tprops.name = props.name;
    tprops.health = props.health;
    annotate(then, spec.defaults);
    allOf.push({ if: { properties: { type: { const: type } }, required: ['type'] }, then });
  }
  return { ...common, allOf };
}

/** The config file's JSON Schema (draft-07), as committed at {@link CONFIG_SCHEMA_PATH}. */
export function configJsonSchema(): Json {
  const root = convert(rootSchema);
  annotate(root, CONFIG_DEFAULTS as unknown as Record<string, unknown>);
  const props = root.properties as Record<string, Json>;
  props.tiers = { ...props.tiers, items: tierJson() };
  return {
    $schema: 'http://json-schema.org/draft-07/schema#',
    $comment:
      'Generated from src/config/schema.ts by scripts/config-schema.ts; do not edit. Docs: docs/configuration.md',
    title: 'kvtier config',
    description:
      'Configuration of the kvtier sidecar (kvtier serve --config FILE). Byte sizes are integers or strings such as "8GiB".',
    ...root,
  };
}
