import { parentPort } from 'node:worker_threads';
import { executePlannerRun, type PlannerRunSpec } from './planner-run.ts';
import type { Workload } from './types.ts';
import { loadWorkload, scaleArrivals, type WorkloadSpec } from './workload-spec.ts';

/**
 * A worker thread of the planner's run pool (`run-pool.ts`): makes each run it is sent, with the
 * workload made again from its spec (the last one is kept for the next run), and answers with
 * the report or the error.
 */

/** A message from the pool: a run to make, or the request to end once idle. */
export type RunRequest = { id: number; spec: PlannerRunSpec } | { stop: true };

/** The answer to a {@link RunRequest}. */
export type RunAnswer =
  | { id: number; ok: true; report: unknown }
  | { id: number; ok: false; error: { message: string; code?: string } };

let cached: { key: string; workload: Workload } | undefined;

async function workloadOf(spec: WorkloadSpec): Promise<Workload> {
  const key = JSON.stringify(spec);
  if (cached?.key !== key) cached = { key, workload: await loadWorkload(spec) };
  return cached.workload;
}

parentPort?.on('message', (m: RunRequest) => {
  if ('stop' in m) {
    // No more runs: the thread ends once what the last run closed has finished closing.
    parentPort?.close();
    return;
  }
  void (async () => {
    try {
      if (m.spec.workloadSpec === undefined) throw new Error('a worker run needs a workload spec');
      const workload = scaleArrivals(await workloadOf(m.spec.workloadSpec), m.spec.arrivalScale);
      const report = await executePlannerRun({ ...m.spec, workload });
      parentPort?.postMessage({ id: m.id, ok: true, report } satisfies RunAnswer);
    } catch (err) {
      const e = err as { message?: string; code?: string };
      parentPort?.postMessage({
        id: m.id,
        ok: false,
        error: {
          message: String(e?.message ?? err),
          ...(e?.code === undefined ? {} : { code: e.code }),
        },
      } satisfies RunAnswer);
    }
  })();
});
