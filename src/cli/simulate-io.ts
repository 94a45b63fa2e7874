import type { PlannerRunOptions } from '../sim/planner-run.ts';
import type { SimReport } from '../sim/types.ts';

/** Runs one simulation; the planner's `executePlannerRun` unless a test injects another. */
export type SimulationRunner = (opts: PlannerRunOptions) => Promise<SimReport>;

/** What `kvtier simulate` reads from and writes to; injected so tests need no process. */
export interface SimulateCommandIo {
  /** Writes one line of output (no trailing newline). */
  out: (line: string) => void;
  /** Writes one line of diagnostics (no trailing newline). */
  err: (line: string) => void;
  /** Writes a whole file (the chart: SVG text, PNG bytes). */
  writeFile: (path: string, data: string | Uint8Array) => Promise<void>;
  /** Runs each simulation in this thread, one after the other; default: worker threads running the engine. */
  runSimulation?: SimulationRunner;
  /** Aborts the runs in progress. */
  signal?: AbortSignal;
}
