/**
 * Building blocks of option and config schemas (valibot), for the config file and for every
 * tier's options alike. Every block carries its own message: what was wrong, what is allowed and
 * what was given ("must be an integer in [1, 256], got 1000"). Blocks whose JSON Schema valibot
 * cannot derive (byte sizes) record it in {@link JSON_SCHEMA_OVERRIDES}; blocks that accept more
 * in a file than in code (byte sizes as strings) record their code form for {@link integerForm}.
 */
import * as v from 'valibot';
import { BYTE_SIZE_PATTERN, BYTE_SIZE_RULE, tryParseBytes } from './bytes.ts';
import { describe } from './validate.ts';

/** A schema of any input and output, as the blocks below are used. */
export type AnySchema = v.GenericSchema<unknown, unknown>;

/** The JSON Schema of blocks that the converter cannot derive, keyed by the valibot schema. */
export const JSON_SCHEMA_OVERRIDES = new WeakMap<object, Record<string, unknown>>();

const INTEGER_FORMS = new WeakMap<object, AnySchema>();

/**
 * The form of `schema` that options given in code take: a byte size must be an integer there
 * (a config file may write "8GiB"); every other block is itself.
 */
export function integerForm(schema: AnySchema): AnySchema {
  return INTEGER_FORMS.get(schema) ?? schema;
}

type Issue = v.BaseIssue<unknown>;

const UNBOUNDED = Number.MAX_SAFE_INTEGER;

function range(min: number, max: number): string {
  return max === UNBOUNDED ? `>= ${min}` : `in [${min}, ${max}]`;
}

/** An integer in [min, max]. */
export function int(min: number, max = UNBOUNDED) {
  const msg = (i: Issue) => `must be an integer ${range(min, max)}, got ${describe(i.input)}`;
  return v.pipe(v.number(msg), v.integer(msg), v.minValue(min, msg), v.maxValue(max, msg));
}

/**
 * A byte size in [min, max]: an integer, or a string such as "512MiB" (see `parseBytes`); the
 * output is the number of bytes.
 */
export function bytes(min = 0, max = UNBOUNDED) {
  const bounded = min > 0 || max < UNBOUNDED;
  const rule = bounded
    ? BYTE_SIZE_RULE.replace('a byte size', `a byte size ${range(min, max)}`)
    : BYTE_SIZE_RULE;
  const msg = (i: Issue) => `${rule}, got ${describe(i.input)}`;
  const size = v.custom<number | string>((x) => tryParseBytes(x) !== undefined, msg);
  const schema = v.pipe(
    size,
    v.rawTransform(({ dataset, addIssue, NEVER }) => {
      const n = tryParseBytes(dataset.value)!;
      if (n >= min && n <= max) return n;
      addIssue({ message: `${rule}, got ${describe(dataset.value)}` });
      return NEVER;
    }),
  );
  const integer: Record<string, unknown> = { type: 'integer', minimum: min };
  if (max < UNBOUNDED) integer.maximum = max;
  JSON_SCHEMA_OVERRIDES.set(size, {
    anyOf: [integer, { type: 'string', pattern: BYTE_SIZE_PATTERN }],
  });
  INTEGER_FORMS.set(schema, int(min, max));
  return schema;
}

/** `schema` or null (with its integer form, see {@link integerForm}). */
export function nullable<S extends AnySchema>(schema: S) {
  const out = v.nullable(schema);
  const form = INTEGER_FORMS.get(schema);
  if (form !== undefined) INTEGER_FORMS.set(out, v.nullable(form));
  return out;
}

/** A string; `nonEmpty` refuses "". */
export function str(opts: { nonEmpty?: boolean } = {}) {
  const what = opts.nonEmpty === true ? 'a non-empty string' : 'a string';
  const msg = (i: Issue) => `must be ${what}, got ${describe(i.input)}`;
  return opts.nonEmpty === true ? v.pipe(v.string(msg), v.minLength(1, msg)) : v.string(msg);
}

/** A string matching `re`; `rule` says what is allowed ("must be ..."). */
export function pattern(re: RegExp, rule: string) {
  const msg = (i: Issue) => `${rule}, got ${describe(i.input)}`;
  return v.pipe(v.string(msg), v.regex(re, msg));
}

/** A boolean. */
export function bool() {
  return v.boolean((i) => `must be a boolean (true or false), got ${describe(i.input)}`);
}

/** One of `values`. */
export function oneOf<const T extends readonly string[]>(values: T) {
  return v.picklist(
    values,
    (i: Issue) =>
      `must be one of ${values.map((x) => JSON.stringify(x)).join(', ')}, got ${describe(i.input)}`,
  );
}

/**
 * An object with only the keys of `entries`; an unknown key is reported at its own path with the
 * allowed keys (`unknownKey` overrides that message).
 */
export function strict<const E extends v.ObjectEntries>(
  entries: E,
  unknownKey = `unknown key; allowed: ${Object.keys(entries).join(', ')}`,
) {
  const msg = (i: Issue) => objectMsg(i);
  // valibot's object schemas take arrays; a config section never is one.
  return v.pipe(
    v.unknown(),
    v.check((x) => !Array.isArray(x), msg),
    v.strictObject(entries, (i: Issue) => (i.expected === 'never' ? unknownKey : objectMsg(i))),
  );
}

/**
 * The message of an object schema's own issue: a missing key (valibot reports it with the key,
 * quoted, as `expected`) or a value that is no object.
 */
export function objectMsg(i: Issue, rule = 'must be an object'): string {
  if (i.expected?.startsWith('"')) return 'is required';
  return `${rule}, got ${describe(i.input)}`;
}

/** A problem found in a config: where (a key path such as `tiers[1].port`) and what. */
export interface ConfigProblem {
  /** Key path from the root of the document; `(root)` for the document itself. */
  readonly path: string;
  readonly message: string;
}

/** Renders a key path: keys joined by dots, array indices in brackets. */
export function formatPath(prefix: string, keys: readonly (string | number)[]): string {
  let out = prefix;
  for (const k of keys) {
    if (typeof k === 'number') out += `[${k}]`;
    else out += out === '' ? k : `.${k}`;
  }
  return out === '' ? '(root)' : out;
}

/** The problems of a failed parse, with paths under `prefix`. */
export function problemsOf(prefix: string, issues: readonly Issue[]): ConfigProblem[] {
  return issues.map((i) => ({
    path: formatPath(
      prefix,
      (i.path ?? []).map((p) => p.key as string | number),
    ),
    message: i.message,
  }));
}

/** Parses with every problem reported (one per key: a key's checks stop at its first failure). */
export function check<S extends AnySchema>(
  schema: S,
  input: unknown,
  prefix = '',
): { ok: true; value: v.InferOutput<S> } | { ok: false; problems: ConfigProblem[] } {
  const r = v.safeParse(schema, input, { abortPipeEarly: true });
  return r.success
    ? { ok: true, value: r.output as v.InferOutput<S> }
    : { ok: false, problems: problemsOf(prefix, r.issues) };
}
