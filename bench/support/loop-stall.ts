/**
 * Event-loop stall of a process that hosts kvtier during a benchmark: the longest delay of a
 * 1 ms timer beyond its 1 ms (perf_hooks.monitorEventLoopDelay's max minus the resolution).
 * `stallMeter()` measures in-process; `watchLoop()` does it in a child process and, when
 * `KVTIER_BENCH_LOOP_DIR` is set (by bench/run-all.ts), writes `<dir>/<label>-<pid>.json` when
 * the process exits.
 */
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type IntervalHistogram, monitorEventLoopDelay } from 'node:perf_hooks';

/** Resolution of the delay timer in ms; a stall is the delay beyond it. */
const RESOLUTION_MS = 1;

/** A stall meter; on only between `resume()` and `pause()`. `p99Ms` is the largest stretch's p99. */
export interface StallMeter {
  resume(): void;
  pause(): void;
  /** Longest stall seen while on, in ms (0 before any sample). */
  maxMs(): number;
  /** 99th percentile of the timer delays beyond the resolution, in ms. */
  p99Ms(): number;
}

export function stallMeter(): StallMeter {
  // A fresh histogram per watched stretch: a re-enabled one measures its first delay from the
  // last timer before it was disabled, which would count the paused time as a stall.
  let h: IntervalHistogram | null = null;
  let max = 0;
  let p99 = 0;
  const beyond = (ns: number) => Math.max(0, ns / 1e6 - RESOLUTION_MS);
  const fold = () => {
    if (h === null) return;
    h.disable();
    if (h.count > 0) {
      max = Math.max(max, beyond(h.max));
      p99 = Math.max(p99, beyond(h.percentile(99)));
    }
    h = null;
  };
  return {
    resume: () => {
      fold();
      h = monitorEventLoopDelay({ resolution: RESOLUTION_MS });
      h.enable();
    },
    pause: fold,
    maxMs: () => {
      if (h !== null && h.count > 0) return Math.max(max, beyond(h.max));
      return max;
    },
    p99Ms: () => {
      if (h !== null && h.count > 0) return Math.max(p99, beyond(h.percentile(99)));
      return p99;
    },
  };
}

/** Watches this (child) process's loop from now until exit; a no-op without the variable. */
export function watchLoop(label: string): void {
  const dir = process.env.KVTIER_BENCH_LOOP_DIR;
  if (dir === undefined || dir === '') return;
  const m = stallMeter();
  m.resume();
  process.once('exit', () => {
    m.pause();
    writeFileSync(
      join(dir, `${label}-${process.pid}.json`),
      JSON.stringify({ label, pid: process.pid, maxMs: m.maxMs(), p99Ms: m.p99Ms() }),
    );
  });
}

/**
 * Points `KVTIER_BENCH_LOOP_DIR` (inherited by children spawned afterwards) at a fresh directory
 * unless it is set; `collect()` reads the stalls the children wrote there as they exited.
 */
export function childLoopStalls(): {
  collect(): { label: string; maxMs: number; p99Ms: number }[];
} {
  let dir = process.env.KVTIER_BENCH_LOOP_DIR;
  if (dir === undefined || dir === '') {
    dir = mkdtempSync(join(tmpdir(), 'kvtier-bench-loop-'));
    process.env.KVTIER_BENCH_LOOP_DIR = dir;
  }
  const at = dir;
  const before = new Set(readdirSync(at));
  return {
    collect: () =>
      readdirSync(at)
        .filter((f) => f.endsWith('.json') && !before.has(f))
        .map((f) => JSON.parse(readFileSync(join(at, f), 'utf8'))),
  };
}
