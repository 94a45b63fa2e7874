/**
 * When the loads of one modeled engine are ready on the modeled clock. A load issued at `now`
 * takes its modeled duration after the engine's host link is free (its loads go one at a time);
 * the worker may report it done sooner on the real clock, and it is held until its time.
 */
export class LoadClock {
  readonly #readyAt = new Map<string, number>();
  readonly #held = new Set<string>();
  #linkFreeMs = 0;

  /** Records a load of `requestId` issued at `nowMs` taking `durationMs`; returns its ready time. */
  issued(requestId: string, nowMs: number, durationMs: number): number {
    const ready = Math.max(nowMs, this.#linkFreeMs) + durationMs;
    this.#linkFreeMs = ready;
    this.#readyAt.set(requestId, ready);
    return ready;
  }

  /**
   * Takes the loads the worker reported done (`recving`) and returns those whose modeled time is
   * over by `nowMs`, with the held ones that now are; the others stay held.
   */
  gate(recving: ReadonlySet<string>, nowMs: number): Set<string> {
    for (const id of recving) this.#held.add(id);
    const out = new Set<string>();
    for (const id of this.#held) {
      const t = this.#readyAt.get(id);
      if (t !== undefined && t > nowMs) continue;
      out.add(id);
      this.#held.delete(id);
      this.#readyAt.delete(id);
    }
    return out;
  }

  /** The earliest ready time of a load not yet passed on, if any. */
  nextDueMs(): number | undefined {
    let min: number | undefined;
    for (const t of this.#readyAt.values()) if (min === undefined || t < min) min = t;
    return min;
  }

  /** Whether a load due by `nowMs` has not been reported done by the worker yet. */
  dueUnreported(nowMs: number): boolean {
    for (const [id, t] of this.#readyAt) if (t <= nowMs && !this.#held.has(id)) return true;
    return false;
  }

  /** Whether any load is issued and not passed on. */
  get pending(): boolean {
    return this.#readyAt.size > 0 || this.#held.size > 0;
  }
}
