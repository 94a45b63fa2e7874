import { KvtierError } from '../../errors.ts';
import { describe } from '../../util/validate.ts';

/**
 * Shared shape of `xOptionsFromConfig`: checks `raw` is an object with only `allowed` keys and
 * that `resolve` accepts it.
 * @throws KvtierError `KVT_CONFIG` naming the tier and the bad or unknown option.
 */
export function optionsFromConfig<T>(
  raw: Record<string, unknown>,
  tier: string,
  kind: string,
  allowed: readonly string[],
  resolve: (options: T) => unknown,
): T {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) {
    throw new KvtierError(
      'KVT_CONFIG',
      `tier "${tier}": options must be an object, got ${describe(raw)}`,
    );
  }
  for (const key of Object.keys(raw)) {
    if (!allowed.includes(key)) {
      throw new KvtierError(
        'KVT_CONFIG',
        `tier "${tier}": unknown ${kind} option "${key}"; allowed: ${allowed.join(', ')}`,
      );
    }
  }
  const options = { ...raw } as unknown as T;
  try {
    resolve(options);
  } catch (err) {
    const msg = err instanceof Error ? err.message : String(err);
    throw new KvtierError('KVT_CONFIG', `tier "${tier}": ${msg}`, { cause: err });
  }
  return options;
}
