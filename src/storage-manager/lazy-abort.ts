import { setMaxListeners } from 'node:events';

/**
 * An abort flag whose AbortSignal is created only when someone needs one. Lookups answered from
 * host memory never hand a signal to a slow tier, and an AbortController per lookup is a
 * measurable share of the lookup fast path.
 */
export class LazyAbort {
  #controller: AbortController | undefined;
  #aborted = false;
  #reason: unknown;

  get aborted(): boolean {
    return this.#aborted;
  }

  get reason(): unknown {
    return this.#reason;
  }

  /** A signal that is (or becomes) aborted with this flag. */
  get signal(): AbortSignal {
    if (this.#controller === undefined) {
      this.#controller = new AbortController();
      // One signal for every tier read of a lookup's prefetch: many listeners by design.
      setMaxListeners(0, this.#controller.signal);
      if (this.#aborted) this.#controller.abort(this.#reason);
    }
    return this.#controller.signal;
  }

  abort(reason?: unknown): void {
    if (this.#aborted) return;
    this.#aborted = true;
    this.#reason = reason;
    this.#controller?.abort(reason);
  }
}
