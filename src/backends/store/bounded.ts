/**
 * Runs one store call per item with at most `limit` in flight, keyed by index: the batched calls
 * of `StoreBackend` are built from single-key store calls this way, and so is a clear by listing.
 */
import { KvtierError } from '../../errors.ts';
import type { KvStore, StoreKey, StoreTally } from './kv-store.ts';

/** How one item's call ended; `skipped` when `skip` said so at its turn (never called). */
export type Settled<R> =
  | { readonly ok: true; readonly value: R }
  | { readonly ok: false; readonly error: unknown }
  | { readonly ok: false; readonly skipped: true; readonly error?: undefined };

const SKIPPED: Settled<never> = Object.freeze({ ok: false, skipped: true });

function call<T, R>(
  fn: (item: T, i: number) => Promise<R>,
  item: T,
  i: number,
): Promise<Settled<R>> {
  try {
    return fn(item, i).then(
      (value): Settled<R> => ({ ok: true, value }),
      (error: unknown): Settled<R> => ({ ok: false, error }),
    );
  } catch (error) {
    return Promise.resolve({ ok: false, error });
  }
}

/**
 * Calls `fn` for each item, at most `limit` at once, in index order; never rejects. When every
 * item fits under `limit`, all calls start in this turn (a client that pipelines the commands of
 * one turn sends them together). `skip(i)`, asked when item i's turn comes, skips it.
 */
export async function settleBounded<T, R>(
  items: readonly T[],
  limit: number,
  fn: (item: T, i: number) => Promise<R>,
  skip?: (i: number) => boolean,
): Promise<Settled<R>[]> {
  if (items.length <= limit && skip === undefined)
    return Promise.all(items.map((item, i) => call(fn, item, i)));
  const out = new Array<Settled<R>>(items.length);
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) {
      const i = next++;
      out[i] = skip?.(i) === true ? SKIPPED : await call(fn, items[i]!, i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}

/**
 * Deletes every key of `store` that starts with `prefix`: with the store's `clear`, else by `list`
 * and `delete`, 256 keys at a time with at most `limit` deletes in flight. Keys written meanwhile
 * may survive.
 * @throws KvtierError `KVT_BACKEND` when the store can neither clear nor list (`kind` names it);
 *   the first failure of the store's calls.
 */
export async function clearPrefix(
  store: KvStore,
  prefix: string,
  limit: number,
  kind: string,
): Promise<StoreTally> {
  if (store.clear !== undefined) return store.clear(prefix, {});
  if (store.list === undefined)
    throw new KvtierError('KVT_BACKEND', `the ${kind} store can neither clear nor list`);
  let keys = 0;
  let bytes = 0;
  let batch: StoreKey[] = [];
  const flush = async () => {
    const rs = await settleBounded(batch, limit, (k) => store.delete(k, {}));
    batch = [];
    for (const r of rs) {
      if (!r.ok) throw r.error;
      if (r.value === false) continue;
      keys++;
      if (typeof r.value === 'number') bytes += r.value;
    }
  };
  for await (const e of store.list(prefix, {})) {
    batch.push(e.key);
    if (batch.length >= 256) await flush();
  }
  await flush();
  return { keys, bytes };
}
