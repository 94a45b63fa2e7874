/**
 * One string per namespace id in the process. The host tier compares a lookup's namespace with
 * each chunk's (src/backends/index/packed-key-index.ts); two different strings of the same 32
 * digits are compared digit by digit, one string with itself at once. Ids are interned where they
 * enter: decoded from the wire, and when a chunk is indexed.
 */

/** Most ids interned; past it, ids are returned as given (still correct, compared in full). */
export const MAX_INTERNED_NAMESPACES = 4096;

const INTERNED = new Map<string, string>();

/** The process's one string equal to `id` (the first one seen, up to {@link MAX_INTERNED_NAMESPACES}). */
export function internNamespaceId<S extends string>(id: S): S {
  const known = INTERNED.get(id);
  if (known !== undefined) return known as S;
  if (INTERNED.size < MAX_INTERNED_NAMESPACES) INTERNED.set(id, id);
  return id;
}
