import { KvtierError } from '../errors.ts';

/**
 * Small validators for option resolvers. Each throws `KVT_INVALID_ARGUMENT` with a message that
 * names the option and says what is allowed.
 */

export function requireInt(
  name: string,
  value: unknown,
  min: number,
  max = Number.MAX_SAFE_INTEGER,
): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    const range = max === Number.MAX_SAFE_INTEGER ? `>= ${min}` : `in [${min}, ${max}]`;
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `${name} must be an integer ${range}, got ${describe(value)}`,
    );
  }
  return value;
}

export function requireNumber(
  name: string,
  value: unknown,
  min: number,
  max = Number.POSITIVE_INFINITY,
): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < min || value > max) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `${name} must be a finite number in [${min}, ${max}], got ${describe(value)}`,
    );
  }
  return value;
}

export function requireString(
  name: string,
  value: unknown,
  opts: { nonEmpty?: boolean } = {},
): string {
  if (typeof value !== 'string' || (opts.nonEmpty === true && value.length === 0)) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `${name} must be a ${opts.nonEmpty === true ? 'non-empty ' : ''}string, got ${describe(value)}`,
    );
  }
  return value;
}

export function requireBoolean(name: string, value: unknown): boolean {
  if (typeof value !== 'boolean') {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `${name} must be a boolean, got ${describe(value)}`,
    );
  }
  return value;
}

export function requireOneOf<T extends string>(
  name: string,
  value: unknown,
  allowed: readonly T[],
): T {
  if (typeof value !== 'string' || !(allowed as readonly string[]).includes(value)) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `${name} must be one of ${allowed.map((a) => JSON.stringify(a)).join(', ')}, got ${describe(value)}`,
    );
  }
  return value as T;
}

/** Short, safe rendering of a bad value for an error message. */
export function describe(value: unknown): string {
  if (value === undefined) return 'undefined';
  if (typeof value === 'string')
    return JSON.stringify(value.length > 60 ? `${value.slice(0, 60)}…` : value);
  if (typeof value === 'number' || typeof value === 'boolean' || value === null)
    return String(value);
  if (Array.isArray(value)) return `an array of length ${value.length}`;
  return typeof value;
}
