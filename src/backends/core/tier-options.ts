/**
 * A tier's options, declared once: each option's schema (type and bounds, with its message), its
 * default or whether it is required, and its description; the checks across options. From that
 * one declaration come the options' TypeScript type ({@link OptionsOf}), their defaults, the
 * resolver of options given in code (`resolve`, `KVT_INVALID_ARGUMENT`), the reader of a tier's
 * config object (`fromConfig`, `KVT_CONFIG`), and the config file's schema of the tier (built by
 * src/config/ from {@link configEntries}, also the source of the published JSON Schema).
 */
import * as v from 'valibot';
import { KvtierError } from '../../errors.ts';
import { type AnySchema, formatPath, integerForm, objectMsg } from '../../util/schema-kit.ts';
import { describe } from '../../util/validate.ts';

/** An option that must be given. */
export interface RequiredOption<S extends AnySchema = AnySchema> {
  readonly kind: 'required';
  readonly schema: S;
  readonly description: string;
}

/** An option that may be left out; resolved options hold `null` for it then. */
export interface OptionalOption<S extends AnySchema = AnySchema> {
  readonly kind: 'optional';
  readonly schema: S;
  readonly description: string;
}

/** An option with a default. */
export interface DefaultedOption<S extends AnySchema = AnySchema, D = unknown> {
  readonly kind: 'default';
  readonly schema: S;
  readonly default: D;
  readonly description: string;
}

/** One option of a tier. */
export type OptionSpec = RequiredOption | OptionalOption | DefaultedOption;

/** A tier's options by name. */
export type OptionEntries = Readonly<Record<string, OptionSpec>>;

/** An option that must be given: `schema` says what it may be. */
export function required<S extends AnySchema>(schema: S, description: string): RequiredOption<S> {
  return { kind: 'required', schema, description };
}

/** An option that may be left out (no default). */
export function optional<S extends AnySchema>(schema: S, description: string): OptionalOption<S> {
  return { kind: 'optional', schema, description };
}

/** An option with a default, which the JSON Schema reports and `resolve` applies. */
export function withDefault<S extends AnySchema>(
  schema: S,
  value: v.InferOutput<S>,
  description: string,
): DefaultedOption<S, v.InferOutput<S>> {
  return { kind: 'default', schema, default: value, description };
}

type Out<O> = O extends { readonly schema: infer S extends AnySchema } ? v.InferOutput<S> : never;
type RequiredKeys<E> = {
  [K in keyof E]: E[K] extends { readonly kind: 'required' } ? K : never;
}[keyof E];
type Simplify<T> = { [K in keyof T]: T[K] } & {};

/** The options as code or a config file gives them: required keys required, the rest optional. */
export type OptionsOf<E extends OptionEntries> = Simplify<
  { [K in RequiredKeys<E>]: Out<E[K]> } & { [K in Exclude<keyof E, RequiredKeys<E>>]?: Out<E[K]> }
>;

/** The options after defaults: every key present; an optional one left out is `null`. */
export type ResolvedOf<E extends OptionEntries> = {
  readonly [K in keyof E]: E[K] extends { readonly kind: 'optional' }
    ? Out<E[K]> | null
    : Out<E[K]>;
};

/** The defaults of the options that have one. */
export type DefaultsOf<E extends OptionEntries> = {
  readonly [K in keyof E as E[K] extends { readonly kind: 'default' } ? K : never]: Out<E[K]>;
};

/**
 * A rule across options: the key it is reported at and what is wrong, or undefined when the
 * options (as given, before defaults) pass. A message that continues the key ("must be ...",
 * "needs ...") reads after it; any other is a whole sentence naming the options.
 */
export type OptionsCheck<E extends OptionEntries> = (
  given: OptionsOf<E>,
) => { key: string; message: string } | undefined;

/** What {@link defineTierOptions} takes. */
export interface TierOptionsDefinition<E extends OptionEntries, R> {
  /** The backend type name, as a config file's `type` says it. */
  readonly type: string;
  /** One line on what the tier is, for the JSON Schema. */
  readonly description: string;
  readonly options: E;
  readonly checks?: readonly OptionsCheck<E>[];
  /**
   * Turns the options with defaults applied into the tier's resolved form (derived fields,
   * tier-specific shapes); may throw `KVT_INVALID_ARGUMENT`. Default: the options as they are.
   */
  readonly finish?: (options: ResolvedOf<E>) => R;
  /** What to do about an unknown key (default: the allowed keys are listed). */
  readonly unknownKeyHint?: string;
  /** A minimal valid options object (docs, tests). */
  readonly example: OptionsOf<E>;
}

/** A tier's options, declared once; see the module comment. */
export interface TierOptions<E extends OptionEntries = OptionEntries, R = unknown> {
  readonly type: string;
  readonly description: string;
  readonly options: E;
  /** What to do about an unknown key, when the tier says more than the allowed keys. */
  readonly unknownKeyHint: string | undefined;
  readonly example: OptionsOf<E>;
  /** The defaults, frozen. */
  readonly defaults: DefaultsOf<E>;
  /** What the checks across options find wrong in options as given (before defaults). */
  crossProblems(given: Record<string, unknown>): { key: string; message: string }[];
  /**
   * Validates options given in code (keys it does not know, such as callbacks, are left to the
   * caller) and applies defaults.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the bad option and what is allowed.
   */
  resolve(options: unknown): R;
  /**
   * Reads a tier's options from a plain config object: only the declared keys, each valid, and
   * the whole passing `resolve`. Returns the options as given (defaults are `resolve`'s job).
   * @throws KvtierError `KVT_CONFIG` `tier "<tier>": ...` naming the bad or unknown option.
   */
  fromConfig(raw: Record<string, unknown>, tier?: string): OptionsOf<E>;
}

/** A tier's options of any declaration, as the registry and the config collect them. */
export type AnyTierOptions = TierOptions<OptionEntries, unknown>;

function sentence(path: string, message: string): string {
  if (path === '(root)') return `options ${message}`;
  return /^(must|needs|is)\b/.test(message) ? `${path} ${message}` : message;
}

function isObject(x: unknown): x is Record<string, unknown> {
  return typeof x === 'object' && x !== null && !Array.isArray(x);
}

/**
 * The entries of an object schema of a tier's options: `form` of what each option accepts,
 * optional ones wrapped, each described.
 */
function objectEntries(
  options: OptionEntries,
  form: (schema: AnySchema) => AnySchema,
): v.ObjectEntries {
  const out: Record<string, v.GenericSchema> = {};
  for (const [key, o] of Object.entries(options)) {
    const described = v.pipe(form(o.schema), v.description(o.description));
    out[key] = o.kind === 'required' ? described : v.optional(described);
  }
  return out;
}

/** The options' entries as a config file gives them (byte sizes may be strings). */
export function configEntries(spec: AnyTierOptions): v.ObjectEntries {
  return objectEntries(spec.options, (s) => s);
}

/**
 * A valibot action that reports what a tier's checks across options find, each at its key, on
 * an object schema of the options (checked once every option is valid).
 */
export function crossCheck(spec: Pick<AnyTierOptions, 'crossProblems'>) {
  return v.rawCheck<Record<string, unknown>>(({ dataset, addIssue }) => {
    if (!dataset.typed) return;
    const o = dataset.value;
    for (const { key, message } of spec.crossProblems(o)) {
      const item = { type: 'object', origin: 'value', input: o, key, value: o[key] } as const;
      addIssue({ message, path: [item] });
    }
  });
}

/**
 * Declares a tier's options; see the module comment. The declaration is the only place the
 * options' keys, types, bounds and defaults are written.
 */
export function defineTierOptions<E extends OptionEntries, R = ResolvedOf<E>>(
  def: TierOptionsDefinition<E, R>,
): TierOptions<E, R> {
  const { type, options } = def;
  const checks = def.checks ?? [];
  const keys = Object.keys(options);
  const crossProblems = (given: Record<string, unknown>) =>
    checks.flatMap((c) => c(given as OptionsOf<E>) ?? []);
  const schema = v.pipe(
    v.object(objectEntries(options, integerForm), (i) => objectMsg(i)),
    crossCheck({ crossProblems }),
  );
  const defaults: Record<string, unknown> = {};
  for (const [key, o] of Object.entries(options))
    if (o.kind === 'default') defaults[key] = o.default;

  const given = (input: unknown): Record<string, unknown> => {
    const r = v.safeParse(schema, input, { abortPipeEarly: true });
    if (r.success) return r.output;
    const issue = r.issues[0];
    const path = formatPath(
      '',
      (issue.path ?? []).map((p) => p.key as string | number),
    );
    throw new KvtierError('KVT_INVALID_ARGUMENT', sentence(path, issue.message));
  };
  const resolve = (input: unknown): R => {
    const o = given(input);
    const full: Record<string, unknown> = {};
    for (const [key, spec] of Object.entries(options)) {
      const value = o[key];
      full[key] = value !== undefined ? value : spec.kind === 'default' ? spec.default : null;
    }
    const resolved = full as ResolvedOf<E>;
    return def.finish ? def.finish(resolved) : (resolved as R);
  };
  const fromConfig = (raw: Record<string, unknown>, tier = type): OptionsOf<E> => {
    if (!isObject(raw))
      throw new KvtierError(
        'KVT_CONFIG',
        `tier "${tier}": options must be an object, got ${describe(raw)}`,
      );
    for (const key of Object.keys(raw)) {
      if (!Object.hasOwn(options, key))
        throw new KvtierError(
          'KVT_CONFIG',
          `tier "${tier}": unknown ${type} option "${key}"; ${def.unknownKeyHint ?? `allowed: ${keys.join(', ')}`}`,
        );
    }
    try {
      const out = given(raw);
      resolve(out);
      return out as OptionsOf<E>;
    } catch (err) {
      const msg = err instanceof Error ? err.message : String(err);
      throw new KvtierError('KVT_CONFIG', `tier "${tier}": ${msg}`, { cause: err });
    }
  };
  return Object.freeze({
    type,
    description: def.description,
    options,
    crossProblems,
    unknownKeyHint: def.unknownKeyHint,
    example: def.example,
    defaults: Object.freeze(defaults) as DefaultsOf<E>,
    resolve,
    fromConfig,
  });
}

/**
 * A check that hands the options to another component's resolver (one that throws
 * `"<option> <what is wrong>"`, as the validators in util/validate do) and reports what it
 * refuses at the option it names, so that a component's own rules are written once.
 */
export function checkedBy<E extends OptionEntries>(
  resolve: (given: OptionsOf<E>) => unknown,
): OptionsCheck<E> {
  return (given) => {
    try {
      resolve(given);
      return undefined;
    } catch (err) {
      const msg = err instanceof Error ? err.message : String(err);
      const m = /^(\w+) (.*)$/s.exec(msg);
      return m !== null ? { key: m[1]!, message: m[2]! } : { key: '', message: msg };
    }
  };
}
