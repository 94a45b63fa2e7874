/**
 * Deadline timers for tests: {@link ManualTimers} is a clock that moves only when the test calls
 * `advance`. (The default timers call the global `setTimeout`, so `mock.timers` drives them too.)
 */
import type { DeadlineTimers } from '../../src/util/deadline.ts';

/** A fake clock for deadlines: timers fire, in order, when `advance` moves past them. */
export class ManualTimers implements DeadlineTimers {
  #now = 0;
  #armed: { at: number; fire: () => void }[] = [];

  /** Milliseconds since the clock was made. */
  get now(): number {
    return this.#now;
  }

  /** Timers armed and neither fired nor cleared. */
  get armed(): number {
    return this.#armed.length;
  }

  arm(ms: number, onExpire: () => void): () => void {
    const entry = { at: this.#now + ms, fire: onExpire };
    this.#armed.push(entry);
    this.#armed.sort((a, b) => a.at - b.at);
    return () => {
      this.#armed = this.#armed.filter((e) => e !== entry);
    };
  }

  /** Moves the clock by `ms`, firing every timer that falls due. */
  advance(ms: number): void {
    this.#now += ms;
    while (this.#armed.length > 0 && this.#armed[0]!.at <= this.#now) {
      this.#armed.shift()!.fire();
    }
  }
}
