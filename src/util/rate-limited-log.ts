/**
 * A log line that a flood cannot multiply: for events anyone on the network can cause (refused
 * handshakes), the first of each kind is written at once, then at most one line per interval,
 * carrying how many were left out since the last line.
 */
import type { Logger } from './log.ts';

/** Options of {@link RateLimitedLog}. */
export interface RateLimitedLogOptions {
  /** Shortest time between two lines of one kind, ms; default 10 000. */
  intervalMs?: number;
  /** Clock, ms; default `Date.now`. */
  now?: () => number;
}

interface Kind {
  last: number;
  suppressed: number;
  fields: Record<string, unknown>;
  timer: NodeJS.Timeout | undefined;
}

/**
 * Writes `warn` lines through `log`, at most one per `intervalMs` per message; lines left out are
 * counted in the next line's `suppressed` field, and a pending count is flushed at the end of the
 * interval (an unref'd timer), so the last of a burst is not lost. `close()` flushes and stops.
 */
export class RateLimitedLog {
  readonly #log: Logger;
  readonly #intervalMs: number;
  readonly #now: () => number;
  readonly #kinds = new Map<string, Kind>();

  constructor(log: Logger, opts: RateLimitedLogOptions = {}) {
    this.#log = log;
    this.#intervalMs = opts.intervalMs ?? 10_000;
    this.#now = opts.now ?? Date.now;
  }

  /** One event of kind `msg`; `fields` describe it (the latest are written with a flushed count). */
  warn(msg: string, fields: Record<string, unknown> = {}): void {
    const now = this.#now();
    let k = this.#kinds.get(msg);
    if (k === undefined) {
      k = { last: -Infinity, suppressed: 0, fields, timer: undefined };
      this.#kinds.set(msg, k);
    }
    k.fields = fields;
    if (now - k.last >= this.#intervalMs) {
      this.#write(msg, k, now);
      return;
    }
    k.suppressed++;
    if (k.timer === undefined) {
      const kind = k;
      kind.timer = setTimeout(
        () => {
          kind.timer = undefined;
          if (kind.suppressed > 0) this.#write(msg, kind, this.#now());
        },
        Math.max(0, kind.last + this.#intervalMs - now),
      );
      kind.timer.unref();
    }
  }

  #write(msg: string, k: Kind, now: number): void {
    const suppressed = k.suppressed;
    k.suppressed = 0;
    k.last = now;
    this.#log.warn(msg, suppressed > 0 ? { ...k.fields, suppressed } : k.fields);
  }

  /** Writes pending counts and cancels the timers. */
  close(): void {
    for (const [msg, k] of this.#kinds) {
      if (k.timer !== undefined) clearTimeout(k.timer);
      k.timer = undefined;
      if (k.suppressed > 0) this.#write(msg, k, this.#now());
    }
  }
}
