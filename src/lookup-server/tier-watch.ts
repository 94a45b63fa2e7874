/**
 * Watches every tier's health and says when it changes, in the log of the tier itself
 * (`kvtier.tier.<name>`): one warn line when it goes down (its breaker bypasses it: lookups skip
 * it, writes are dropped), one info line when it is back, with how long it was out; a change
 * between up and degraded at info. These are the only lines of a tier's state: the breaker
 * says nothing else above debug.
 * A tier that was down at start (its start logged why, once) is taken as down from the start,
 * and its first coming up is logged at info as it joining.
 * Also what readiness and /healthz report: the sidecar can serve lookups while its host-memory
 * tier is up, and is degraded (not unready) while a tier below it is not up.
 */
import type { BackendHealth } from '../backends/core/types.ts';
import type { Logger } from '../util/log.ts';

/** A tier as the watch reads it. */
export interface WatchedTier {
  readonly name: string;
  health(): BackendHealth;
}

/** Options of {@link TierWatch}. */
export interface TierWatchOptions {
  /** Tiers in config order; the first is host memory. */
  tiers: readonly WatchedTier[];
  /** The tiers' parent logger: each tier logs through `log.child(<name>)`. */
  log: Logger;
  /**
   * Names of tiers that could not be reached at start and started down: their start has logged
   * why, so they are down from the start without a line of the watch's; default none.
   */
  downAtStart?: ReadonlySet<string>;
  /** How often health is read, ms; default 1000. 0: only when {@link TierWatch.check} is called. */
  intervalMs?: number;
  /** Clock, ms; default `Date.now`. */
  now?: () => number;
}

/** The sidecar's state as readiness and health report it. */
export interface ServingState {
  /** Lookups can be answered: the host-memory tier is not down. */
  ready: boolean;
  /** A tier below host memory is down or degraded: served, with fewer hits. */
  degraded: boolean;
  /** Every tier's health, in order. */
  tiers: { name: string; health: BackendHealth }[];
}

const MESSAGES: Readonly<Record<BackendHealth, string>> = {
  down: 'tier is down: lookups skip it and its writes are dropped until it is back',
  degraded: 'tier is degraded: some of its calls fail or time out',
  up: 'tier is back up',
};

const BACK_DEGRADED = 'tier is back, degraded: some of its calls fail or time out';

const JOINED = 'tier joined: it was down at start; lookups and writes use it from now on';

/** See the module comment. `close()` stops the timer. */
export class TierWatch {
  readonly #tiers: readonly WatchedTier[];
  readonly #logs: readonly Logger[];
  readonly #last: BackendHealth[];
  readonly #since: number[];
  /** Per tier: down since start and not up yet. */
  readonly #notJoined: boolean[];
  readonly #now: () => number;
  readonly #timer: NodeJS.Timeout | undefined;

  constructor(opts: TierWatchOptions) {
    this.#tiers = opts.tiers;
    this.#logs = opts.tiers.map((t) => opts.log.child(t.name));
    this.#now = opts.now ?? Date.now;
    const downAtStart = opts.downAtStart ?? new Set<string>();
    this.#notJoined = opts.tiers.map((t) => downAtStart.has(t.name));
    this.#last = this.#notJoined.map((down) => (down ? 'down' : 'up'));
    this.#since = opts.tiers.map(() => this.#now());
    this.check();
    const every = opts.intervalMs ?? 1000;
    if (every > 0) {
      this.#timer = setInterval(() => this.check(), every);
      this.#timer.unref();
    }
  }

  /** Reads every tier's health now and logs what changed. Returns the state. */
  check(): ServingState {
    const tiers = this.#tiers.map((t, i) => {
      let health: BackendHealth;
      try {
        health = t.health();
      } catch {
        health = 'down';
      }
      const was = this.#last[i]!;
      if (health !== was) {
        const now = this.#now();
        const fields = { tier: t.name, health, was, forMs: now - this.#since[i]! };
        if (this.#notJoined[i]) {
          // Out of 'down' for the first time since start (up, or started but degraded).
          this.#logs[i]!.info(JOINED, fields);
          this.#notJoined[i] = false;
        } else if (health === 'down') this.#logs[i]!.warn(MESSAGES.down, fields);
        else if (was === 'down')
          // One line back, whether it came back whole or degraded.
          this.#logs[i]!.info(health === 'up' ? MESSAGES.up : BACK_DEGRADED, fields);
        else this.#logs[i]!.info(MESSAGES[health], fields);
        this.#last[i] = health;
        this.#since[i] = now;
      }
      return { name: t.name, health };
    });
    return {
      ready: tiers.length > 0 && tiers[0]!.health !== 'down',
      degraded: tiers.slice(1).some((t) => t.health !== 'up'),
      tiers,
    };
  }

  /** Stops the timer. Idempotent. */
  close(): void {
    if (this.#timer !== undefined) clearInterval(this.#timer);
  }
}
