import { extname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { abortedError, KvtierError } from '../errors.ts';
import type { PlannerRunSpec } from './planner-run.ts';
import type { RunAnswer, RunRequest } from './run-worker.ts';
import type { SimReport } from './types.ts';

/**
 * Runs planner runs in worker threads, at most `workers` at once, each worker taking the next
 * run when it finishes one. Every run is independent (its own sidecar, directories and Redis
 * key prefix), so on a machine with several cores a sweep's configurations run side by side.
 * The reports come back in the order of `specs`.
 * @throws the first run's error (as a KvtierError with its code when it had one), after every
 *   worker is stopped; `KVT_ABORTED` when `signal` aborts.
 */
export async function runInWorkers(
  specs: readonly PlannerRunSpec[],
  workers: number,
  opts: { signal?: AbortSignal; onDone?: (index: number, report: SimReport) => void } = {},
): Promise<SimReport[]> {
  const out: SimReport[] = new Array(specs.length);
  if (specs.length === 0) return out;
  const pool = Array.from({ length: Math.max(1, Math.min(workers, specs.length)) }, startWorker);
  let next = 0;
  const busy = new Set<Worker>();
  try {
    await new Promise<void>((resolve, reject) => {
      let done = 0;
      const onAbort = () => reject(abortedError(opts.signal as AbortSignal, 'simulation'));
      if (opts.signal?.aborted) return onAbort();
      opts.signal?.addEventListener('abort', onAbort, { once: true });
      const feed = (w: Worker) => {
        if (next >= specs.length) return;
        const id = next++;
        busy.add(w);
        w.postMessage({ id, spec: specs[id] as PlannerRunSpec } satisfies RunRequest);
      };
      for (const w of pool) {
        w.on('message', (a: RunAnswer) => {
          busy.delete(w);
          if (!a.ok) {
            reject(
              new KvtierError((a.error.code ?? 'KVT_INTERNAL') as 'KVT_INTERNAL', a.error.message),
            );
            return;
          }
          out[a.id] = a.report as SimReport;
          opts.onDone?.(a.id, out[a.id] as SimReport);
          if (++done === specs.length) {
            opts.signal?.removeEventListener('abort', onAbort);
            resolve();
          } else feed(w);
        });
        w.on('error', reject);
        w.on('exit', (code) => {
          if (done < specs.length)
            reject(
              new KvtierError(
                'KVT_INTERNAL',
                `a run worker exited (${code}) before its run finished`,
              ),
            );
        });
        feed(w);
      }
    });
  } finally {
    await Promise.all(pool.map((w) => stopWorker(w, busy.has(w))));
  }
  return out;
}

/** How long an idle worker asked to stop may take to end on its own before it is terminated. */
const STOP_GRACE_MS = 30_000;

/**
 * Ends a worker. An idle one is asked to stop and ends when its event loop drains, so what its
 * runs closed (sockets, and the monitors the clients keep on them) finishes closing while the
 * thread can still run JavaScript; terminating it instead can catch a native callback
 * mid-teardown, which aborts the process. A busy worker, or one not gone within
 * {@link STOP_GRACE_MS}, is terminated.
 */
async function stopWorker(w: Worker, busy: boolean): Promise<void> {
  if (busy || w.threadId < 0) {
    await w.terminate();
    return;
  }
  const exited = new Promise<void>((resolve) => w.once('exit', () => resolve()));
  w.postMessage({ stop: true } satisfies RunRequest);
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<'late'>((resolve) => {
    timer = setTimeout(() => resolve('late'), STOP_GRACE_MS);
  });
  try {
    if ((await Promise.race([exited, late])) === 'late') await w.terminate();
  } finally {
    clearTimeout(timer);
  }
}

/**
 * A worker running `run-worker`: the compiled `.js` as is; from the TypeScript sources (tests,
 * `KVTIER_FROM_SOURCE=1`), through a bootstrap that registers tsx in the worker first (a worker
 * does not inherit a loader registered at run time).
 */
function startWorker(): Worker {
  const ext = extname(fileURLToPath(import.meta.url));
  const url = new URL(`./run-worker${ext}`, import.meta.url);
  if (ext !== '.ts') return new Worker(url);
  const tsx = import.meta.resolve('tsx/esm/api');
  return new Worker(
    `import(${JSON.stringify(tsx)}).then((m) => { m.register(); return import(${JSON.stringify(url.href)}); });`,
    { eval: true },
  );
}
