/**
 * Deadline timers for tests: {@link ManualTimers} is a clock that moves only when the test calls
 * `advance`; {@link setTimeoutTimers} arms each deadline with the global `setTimeout`, so it
 * follows node:test's `mock.timers` when those are enabled.
 */
import type { DeadlineTimers } from '../../src/util/deadline.ts';

function timeoutReason(): DOMException {
  return new DOMException('The operation was aborted due to timeout', 'TimeoutError');
}

/** A fake clock for deadlines: timers fire, in order, when `advance` moves past them. */
export class ManualTimers implements DeadlineTimers {
  #now = 0;
  readonly #armed: { at: number; ac: AbortController }[] = [];

  /** Milliseconds since the clock was made. */
  get now(): number {
    return this.#now;
  }

  /** Timers armed and not yet fired. */
  get armed(): number {
    return this.#armed.length;
  }

  timeout(ms: number): AbortSignal {
    const ac = new AbortController();
    this.#armed.push({ at: this.#now + ms, ac });
    this.#armed.sort((a, b) => a.at - b.at);
    return ac.signal;
  }

  /** Moves the clock by `ms`, firing every timer that falls due. */
  advance(ms: number): void {
    this.#now += ms;
    while (this.#armed.length > 0 && this.#armed[0]!.at <= this.#now) {
      this.#armed.shift()!.ac.abort(timeoutReason());
    }
  }
}

/** Deadline timers on the global `setTimeout` (mocked by `mock.timers.enable`). */
export const setTimeoutTimers: DeadlineTimers = {
  timeout(ms: number): AbortSignal {
    const ac = new AbortController();
    setTimeout(() => ac.abort(timeoutReason()), ms);
    return ac.signal;
  },
};
