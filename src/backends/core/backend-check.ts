import { describe } from '../../util/validate.ts';

/** The methods of `StorageBackend`, in the interface's order. */
export const STORAGE_BACKEND_METHODS: readonly string[] = Object.freeze([
  'batchedContains',
  'batchedGet',
  'put',
  'remove',
  'pin',
  'unpin',
  'clear',
  'stats',
  'health',
  'close',
]);

const CAPABILITY_FLAGS = ['pinning', 'hostMemory', 'persistent', 'shared', 'evicts'] as const;

/**
 * What keeps `value` from being a usable `StorageBackend` built for tier `tier`: missing or
 * non-function methods, a `name` other than the tier's, an empty `kind`, malformed
 * `capabilities`. Empty when there is nothing wrong. Checks shapes only; behaviour is the
 * contract suite's job.
 */
export function storageBackendProblems(value: unknown, tier: string): string[] {
  if (typeof value !== 'object' || value === null) {
    return [`got ${describe(value)} instead of a backend object`];
  }
  const v = value as Record<string, unknown>;
  const problems: string[] = [];
  const missing = STORAGE_BACKEND_METHODS.filter((m) => v[m] === undefined);
  const notFunctions = STORAGE_BACKEND_METHODS.filter(
    (m) => v[m] !== undefined && typeof v[m] !== 'function',
  );
  if (missing.length > 0) problems.push(`missing methods: ${missing.join(', ')}`);
  for (const m of notFunctions) problems.push(`${m} is ${describe(v[m])}, not a function`);
  if (v.name !== tier) {
    problems.push(`name is ${describe(v.name)}; it must be the tier's name ("${tier}", ctx.name)`);
  }
  if (typeof v.kind !== 'string' || v.kind.length === 0) {
    problems.push(`kind is ${describe(v.kind)}; it must be a non-empty string (the backend type)`);
  }
  const caps = v.capabilities;
  if (typeof caps !== 'object' || caps === null) {
    problems.push(`capabilities is ${describe(caps)}; it must be a BackendCapabilities object`);
  } else {
    const c = caps as Record<string, unknown>;
    for (const flag of CAPABILITY_FLAGS) {
      if (typeof c[flag] !== 'boolean')
        problems.push(`capabilities.${flag} is ${describe(c[flag])}; it must be a boolean`);
    }
    if (c.peers !== undefined && typeof c.peers !== 'boolean')
      problems.push(`capabilities.peers is ${describe(c.peers)}; it must be a boolean when given`);
    const max = c.maxChunkBytes;
    if (typeof max !== 'number' || !Number.isSafeInteger(max) || max < 1) {
      problems.push(
        `capabilities.maxChunkBytes is ${describe(max)}; it must be a positive integer`,
      );
    }
  }
  return problems;
}

/**
 * `message` without leading `tier "<tier>"` prefixes (with an optional `(type)` and
 * `failed to start`), so that the host, which adds its own, never doubles them.
 */
export function withoutTierPrefix(message: string, tier: string): string {
  const quoted = JSON.stringify(tier).replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const prefix = new RegExp(`^tier ${quoted}(?: \\([^)]*\\))?(?: failed to start)?: `);
  let out = message;
  for (let m = prefix.exec(out); m !== null; m = prefix.exec(out)) out = out.slice(m[0].length);
  return out;
}

/** Closes `backend` when it has a `close` function, ignoring any failure (a rejected backend). */
export async function closeQuietly(backend: unknown): Promise<void> {
  const close = (backend as { close?: unknown } | null)?.close;
  if (typeof close !== 'function') return;
  try {
    await close.call(backend);
  } catch {
    // The backend is rejected anyway; its own close failing changes nothing.
  }
}

/**
 * Whether a tier's start failed on its config (bad keys or values, a plug-in that cannot be
 * loaded or returns no backend): an error whose `code` is `KVT_CONFIG` or `KVT_INVALID_ARGUMENT`.
 * The code is read as a property, so that a plug-in's errors made by another copy of kvtier count
 * too. Any other failure (refused, timed out, an I/O error, a plain `Error`) is the tier's service
 * not being reachable.
 */
export function isConfigFailure(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  return code === 'KVT_CONFIG' || code === 'KVT_INVALID_ARGUMENT';
}
