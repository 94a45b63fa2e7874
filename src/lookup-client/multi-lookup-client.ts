import { KvtierError } from '../errors.ts';
import type {
  HashesInput,
  LookupAnswer,
  LookupCallOptions,
  LookupClient,
} from './lookup-client.ts';

/**
 * Looks up the same prompt on several lookup servers (one per rank or node) and answers the
 * minimum, so ranks never disagree about how many tokens are ready. Like `LookupClient.lookup`,
 * `lookup()` never blocks: it returns null until every server has answered.
 */
export class MultiLookupClient {
  readonly #clients: readonly LookupClient[];
  readonly #partial = new Map<string, (LookupAnswer | undefined)[]>();

  /** @throws KVT_INVALID_ARGUMENT with no clients. The clients stay owned by the caller. */
  constructor(clients: readonly LookupClient[]) {
    if (clients.length === 0)
      throw new KvtierError('KVT_INVALID_ARGUMENT', 'MultiLookupClient needs at least one client');
    this.#clients = [...clients];
  }

  /** Non-blocking: null while any server is pending, then the minimum of their answers. */
  lookup(
    lookupId: string,
    hashes: HashesInput,
    tokenCounts: ArrayLike<number>,
    opts: LookupCallOptions = {},
  ): number | null {
    return this.lookupAnswer(lookupId, hashes, tokenCounts, opts)?.hitTokens ?? null;
  }

  /**
   * Non-blocking, with the whole answer: null while any server is pending, then the answer of
   * the server that had the fewest tokens ready (the first of them), whose tiers and rates are
   * what limited the claim.
   */
  lookupAnswer(
    lookupId: string,
    hashes: HashesInput,
    tokenCounts: ArrayLike<number>,
    opts: LookupCallOptions = {},
  ): LookupAnswer | null {
    let answers = this.#partial.get(lookupId);
    if (answers === undefined) {
      answers = new Array<LookupAnswer | undefined>(this.#clients.length).fill(undefined);
      this.#partial.set(lookupId, answers);
    }
    let pending = false;
    this.#clients.forEach((client, i) => {
      if (answers[i] !== undefined) return;
      const a = client.lookupAnswer(lookupId, hashes, tokenCounts, opts);
      if (a === null) pending = true;
      else answers[i] = a;
    });
    if (pending) return null;
    this.#partial.delete(lookupId);
    let min = answers[0]!;
    for (const a of answers as LookupAnswer[]) if (a.hitTokens < min.hitTokens) min = a;
    return min;
  }

  /** Promise variant: the minimum of every server's hit tokens (a timeout counts as 0). */
  async lookupAsync(
    lookupId: string,
    hashes: HashesInput,
    tokenCounts: ArrayLike<number>,
    opts: LookupCallOptions & { signal?: AbortSignal } = {},
  ): Promise<number> {
    const answers = await Promise.all(
      this.#clients.map((c) => c.lookupAsync(lookupId, hashes, tokenCounts, opts)),
    );
    return Math.min(...answers.map((a) => a.hitTokens));
  }

  /** Forgets a pending lookup everywhere and cancels it on every server. */
  forget(lookupId: string): void {
    this.#partial.delete(lookupId);
    for (const c of this.#clients) c.forget(lookupId);
  }

  /** Releases the lookup's pins on every server. */
  async cancel(lookupId: string): Promise<void> {
    this.#partial.delete(lookupId);
    await Promise.all(this.#clients.map((c) => c.cancel(lookupId)));
  }
}
