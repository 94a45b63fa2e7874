/**
 * Runs one job of the child engine worker (engine-process.ts) in a fresh `node --import tsx`
 * process, as the cross-process data-plane and fleet tests do, and returns its result line.
 */
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { spawnGuarded } from './child-guard.ts';
import type { EngineResult, LoadJob, SaveJob } from './engine-process.ts';
import { REPO_ROOT, withDeadline } from './fixtures.ts';

const SCRIPT = fileURLToPath(new URL('./engine-process.ts', import.meta.url));

/**
 * Runs `job` in an engine process; a process still running after `timeoutMs` is killed.
 * @throws AssertionError when it exits non-zero (with its stderr) or prints no result line.
 */
export async function runEngineJob(
  job: SaveJob | LoadJob,
  timeoutMs: number,
): Promise<EngineResult> {
  const child = spawnGuarded(process.execPath, ['--import', 'tsx', SCRIPT, JSON.stringify(job)], {
    cwd: REPO_ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => {
    out += d;
  });
  child.stderr.setEncoding('utf8').on('data', (d: string) => {
    err += d;
  });
  const code = await withDeadline(
    new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c))),
    timeoutMs,
    `engine process (${job.mode})`,
  ).catch((e: unknown) => {
    child.kill('SIGKILL');
    throw e;
  });
  assert.equal(code, 0, `engine process (${job.mode}) failed:\n${err}`);
  const line = out.split('\n').find((l) => l.startsWith('result '));
  assert.ok(line !== undefined, `engine process printed no result; stdout: ${out}\nstderr: ${err}`);
  return JSON.parse(line.slice('result '.length)) as EngineResult;
}
