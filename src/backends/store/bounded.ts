/**
 * Runs one store call per item with at most `limit` in flight, keyed by index: the batched calls
 * of {@link StoreBackend} are built from single-key store calls this way.
 */

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
