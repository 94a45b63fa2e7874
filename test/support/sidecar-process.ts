/**
 * A whole sidecar as a user runs it, `bin/kvtier.js serve --config FILE`, in a child process:
 * started, measured (VmRSS from /proc), killed with any signal and restarted on the same config.
 * Used by the flood, crash-safety and soak runs.
 */
import type { ChildProcess } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { spawnGuarded } from './child-guard.ts';

const BIN = fileURLToPath(new URL('../../bin/kvtier.js', import.meta.url));

const live = new Set<ChildProcess>();
process.once('exit', () => {
  for (const p of live) p.kill('SIGKILL');
});

/** A running `kvtier serve` child. */
export interface SidecarProcess {
  readonly pid: number;
  /** What the child wrote to stdout and stderr so far (the last 64 KiB). */
  readonly output: string;
  /** Resolves with the exit code or signal once the child has exited. */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** Resident set size of the child in bytes (VmRSS), or 0 once it is gone. */
  rssBytes(): number;
  /** Sends `signal` (default SIGKILL) unless already gone, and waits for the exit. */
  kill(signal?: NodeJS.Signals): Promise<void>;
}

/**
 * Writes `config` to `configPath` and starts `kvtier serve` on it (node run with `nodeFlags`, e.g.
 * `--cpu-prof`); resolves once it prints that it serves. Rejects (and kills the child) when it
 * exits first or after `timeoutMs` (120 000, a bound on a broken start rather than a slow one: a
 * busy machine takes seconds).
 */
export async function startSidecarProcess(
  configPath: string,
  config: Record<string, unknown>,
  timeoutMs = 120_000,
  nodeFlags: readonly string[] = [],
): Promise<SidecarProcess> {
  writeFileSync(configPath, JSON.stringify(config, null, 2));
  const child = spawnGuarded(
    process.execPath,
    [...nodeFlags, BIN, 'serve', '--config', configPath],
    {
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  live.add(child);
  let output = '';
  let onServing: (() => void) | undefined;
  const onData = (d: Buffer) => {
    output = (output + d.toString('utf8')).slice(-65536);
    if (output.includes('serving on')) onServing?.();
  };
  child.stdout!.on('data', onData);
  child.stderr!.on('data', onData);
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once('exit', (code, signal) => {
      live.delete(child);
      resolve({ code, signal });
    }),
  );
  const handle: SidecarProcess = {
    pid: child.pid!,
    get output() {
      return output;
    },
    exited,
    rssBytes() {
      try {
        const m = /VmRSS:\s+(\d+)\s+kB/.exec(readFileSync(`/proc/${child.pid}/status`, 'utf8'));
        return m === null ? 0 : Number(m[1]) * 1024;
      } catch {
        return 0;
      }
    },
    async kill(signal: NodeJS.Signals = 'SIGKILL') {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal);
      await exited;
    },
  };
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      new Promise<void>((resolve) => {
        onServing = resolve;
        if (output.includes('serving on')) resolve();
      }),
      exited.then((e) => {
        throw new Error(`kvtier serve exited before serving (${JSON.stringify(e)}):\n${output}`);
      }),
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`kvtier serve did not start in ${timeoutMs} ms:\n${output}`)),
          timeoutMs,
        );
      }),
    ]);
  } catch (err) {
    await handle.kill();
    throw err;
  } finally {
    clearTimeout(timer);
  }
  return handle;
}
