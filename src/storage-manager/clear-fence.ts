import type { NamespaceId } from '../backends/core/types.ts';

/**
 * Orders writes against CLEAR. A writer takes a stamp when it starts (a PUT, a save's
 * reservation, a prefetch, a queued write-through); CLEAR marks its namespaces (or all) as cleared
 * at a new stamp; a writer whose namespace was cleared after its stamp must not make its chunk
 * visible. Memory grows with the number of namespaces ever cleared one by one (a CLEAR of all
 * namespaces resets it).
 */
export class ClearFence {
  #seq = 0;
  #allAt = 0;
  readonly #nsAt = new Map<NamespaceId, number>();

  /** A stamp for a write starting now. */
  stamp(): number {
    return this.#seq;
  }

  /** Records a CLEAR of `namespaces` (every namespace when empty). */
  clear(namespaces: readonly NamespaceId[]): void {
    this.#seq++;
    if (namespaces.length === 0) {
      this.#allAt = this.#seq;
      this.#nsAt.clear();
    } else for (const ns of namespaces) this.#nsAt.set(ns, this.#seq);
  }

  /** Whether `ns` was cleared after `stamp` was taken. */
  clearedSince(ns: NamespaceId, stamp: number): boolean {
    return this.#allAt > stamp || (this.#nsAt.get(ns) ?? 0) > stamp;
  }
}
