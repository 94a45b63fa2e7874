/**
 * Event-loop stall of a process that hosts kvtier during a benchmark: the longest delay of a
 * 1 ms timer beyond its 1 ms (perf_hooks.monitorEventLoopDelay's max minus the resolution).
 * `stallMeter()` measures in-process; `watchLoop()` does it in a child process and, when
 * `KVTIER_BENCH_LOOP_DIR` is set (by bench/run-all.ts), writes `<dir>/<label>-<pid>.json` when
 * the process exits.
 *
 * A delay is not always the process's own doing: on a busy machine the main thread also waits
 * for a core (or for the collector's helper threads, which wait for one). On Linux the meter
 * reads the main thread's scheduler times (/proc/<pid>/task/<pid>/schedstat) at every tick of
 * its own 1 ms timer and keeps, besides the longest delay, the longest time the thread spent on
 * a CPU between two ticks (`maxOnCpuMs`: a stall it caused itself, by work or a synchronous
 * collection) and the total time it waited for a core (`runqueueWaitMs`).
 */
import {
  closeSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  writeFileSync,
} from 'node:fs';
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
  /**
   * Longest time the main thread spent on a CPU between two ticks of the meter's 1 ms timer,
   * beyond the resolution, in ms: the part of a stall the process caused itself. Null where the
   * thread's scheduler times cannot be read (not Linux).
   */
  maxOnCpuMs(): number | null;
  /** Time the main thread waited for a core while on, in ms; null as {@link maxOnCpuMs}. */
  runqueueWaitMs(): number | null;
}

/** Reads the main thread's time on a CPU and waiting for one, in ns; undefined off Linux. */
function threadClock(): { read(): [number, number]; close(): void } | undefined {
  let fd: number;
  try {
    fd = openSync(`/proc/${process.pid}/task/${process.pid}/schedstat`, 'r');
  } catch {
    return undefined;
  }
  const buf = Buffer.alloc(128);
  return {
    read: () => {
      const n = readSync(fd, buf, 0, buf.length, 0);
      const [run, wait] = buf.toString('latin1', 0, n).split(' ');
      return [Number(run), Number(wait)];
    },
    close: () => closeSync(fd),
  };
}

export function stallMeter(): StallMeter {
  // A fresh histogram per watched stretch: a re-enabled one measures its first delay from the
  // last timer before it was disabled, which would count the paused time as a stall.
  let h: IntervalHistogram | null = null;
  let max = 0;
  let p99 = 0;
  const beyond = (ns: number) => Math.max(0, ns / 1e6 - RESOLUTION_MS);
  // Null until the first resume, undefined where the thread's times cannot be read.
  let clock: ReturnType<typeof threadClock> | null = null;
  let tick: NodeJS.Timeout | null = null;
  let maxOnCpuNs = 0;
  let waitNs = 0;
  const fold = () => {
    if (tick !== null) {
      clearInterval(tick);
      tick = null;
      clock?.close();
    }
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
      clock = threadClock();
      if (clock !== undefined) {
        const c = clock;
        let [run, wait] = c.read();
        tick = setInterval(() => {
          const [r, w] = c.read();
          maxOnCpuNs = Math.max(maxOnCpuNs, r - run);
          waitNs += w - wait;
          run = r;
          wait = w;
        }, RESOLUTION_MS);
        tick.unref();
      }
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
    maxOnCpuMs: () => (clock === undefined || clock === null ? null : beyond(maxOnCpuNs)),
    runqueueWaitMs: () => (clock === undefined || clock === null ? null : waitNs / 1e6),
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
      JSON.stringify({
        label,
        pid: process.pid,
        maxMs: m.maxMs(),
        p99Ms: m.p99Ms(),
        maxOnCpuMs: m.maxOnCpuMs(),
        runqueueWaitMs: m.runqueueWaitMs(),
      }),
    );
  });
}

/**
 * Points `KVTIER_BENCH_LOOP_DIR` (inherited by children spawned afterwards) at a fresh directory
 * unless it is set; `collect()` reads the stalls the children wrote there as they exited.
 */
export function childLoopStalls(): {
  collect(): {
    label: string;
    maxMs: number;
    p99Ms: number;
    maxOnCpuMs: number | null;
    runqueueWaitMs: number | null;
  }[];
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
