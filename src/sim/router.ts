import { KvtierError } from '../errors.ts';
import { mapKey } from './block-allocator.ts';
import { prefixHashes } from './kv-model.ts';
import type { SimRequest } from './types.ts';

/**
 * Request routers of a modeled fleet: which engine gets each arriving request. They see each
 * engine's outstanding work (prompt and output tokens still to compute) at the request's arrival
 * on the fleet's modeled clock.
 *
 * - `round-robin`: engine `i mod N` for the i-th request.
 * - `least-loaded`: the engine with the least outstanding work (lowest index on a tie).
 * - `prefix-affinity`: the engine that most recently took the longest run of this prompt's first
 *   chunks (each engine remembers the chunk keys of the requests it took, as many as its GPU and
 *   CPU caches hold); no match, or a match on an engine whose outstanding work exceeds twice the
 *   least loaded engine's plus one average request, falls back to least-loaded. This is the
 *   cache-aware routing of routers such as SGLang's, with its balance guard.
 */

/** Router names `--router` accepts. */
export const ROUTERS = ['round-robin', 'prefix-affinity', 'least-loaded'] as const;
/** One of {@link ROUTERS}. */
export type RouterKind = (typeof ROUTERS)[number];

/** What a router sees of an engine. */
export interface RoutedEngine {
  /** Prompt and output tokens still to compute. */
  outstandingTokens(): number;
}

/** Picks an engine for each request, in arrival order. */
export interface Router {
  route(r: SimRequest, engines: readonly RoutedEngine[]): number;
}

/** Options of {@link createRouter}. */
export interface RouterOptions {
  /** Tokens per chunk (prefix affinity matches whole chunks). */
  chunkTokens: number;
  /** Chunk keys each engine remembers (its GPU and CPU caches' chunks). */
  memoryChunks: number;
  /** Mean prompt plus output tokens of a request (the balance guard's slack). */
  meanRequestTokens: number;
}

/**
 * A router of `kind` for `engines` engines.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for an unknown kind.
 */
export function createRouter(kind: string, engines: number, o: RouterOptions): Router {
  if (kind === 'round-robin') {
    let i = 0;
    return { route: () => i++ % engines };
  }
  if (kind === 'least-loaded') return { route: (_r, e) => leastLoaded(e) };
  if (kind === 'prefix-affinity') return new PrefixAffinity(engines, o);
  throw new KvtierError(
    'KVT_INVALID_ARGUMENT',
    `--router must be one of ${ROUTERS.join(', ')}, got ${JSON.stringify(kind)}`,
  );
}

function leastLoaded(engines: readonly RoutedEngine[]): number {
  let best = 0;
  let min = Number.POSITIVE_INFINITY;
  for (const [i, e] of engines.entries()) {
    const w = e.outstandingTokens();
    if (w < min) {
      min = w;
      best = i;
    }
  }
  return best;
}

class PrefixAffinity implements Router {
  readonly #seen: Map<number, true>[];
  readonly #o: RouterOptions;

  constructor(engines: number, o: RouterOptions) {
    this.#seen = Array.from({ length: engines }, () => new Map<number, true>());
    this.#o = o;
  }

  route(r: SimRequest, engines: readonly RoutedEngine[]): number {
    const cs = this.#o.chunkTokens;
    const full = Math.floor(r.promptTokens.length / cs);
    const h = prefixHashes(r.promptTokens.subarray(0, full * cs));
    const keys = Array.from({ length: full }, (_, c) => mapKey(h, (c + 1) * cs - 1));
    let best = -1;
    let bestRun = 0;
    for (const [i, seen] of this.#seen.entries()) {
      let run = 0;
      while (run < keys.length && seen.has(keys[run]!)) run++;
      if (run > bestRun) {
        bestRun = run;
        best = i;
      }
    }
    const min = leastLoaded(engines);
    const load = (i: number) => (engines[i] as RoutedEngine).outstandingTokens();
    if (best < 0 || load(best) > 2 * load(min) + this.#o.meanRequestTokens) best = min;
    const seen = this.#seen[best] as Map<number, true>;
    for (const k of keys) {
      seen.delete(k);
      seen.set(k, true);
      if (seen.size > this.#o.memoryChunks) seen.delete(seen.keys().next().value as number);
    }
    return best;
  }
}
