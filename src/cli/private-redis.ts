import { type ChildProcess, spawn } from 'node:child_process';
import { mkdir } from 'node:fs/promises';
import { createServer } from 'node:net';
import { dyingWithParent } from '../util/parent-death.ts';

/**
 * The Redis servers `kvtier simulate` owns: a Redis tier of a given size (`maxmemory` with LRU
 * eviction), and `--fault redis-outage`, which needs a server the command can kill and restart.
 * Each run starts its own.
 */

/** How long a private redis-server may take to accept connections (ms). */
const REDIS_START_TIMEOUT_MS = 10_000;

/**
 * A `redis-server` without persistence on a loopback port, killed and restarted on demand.
 * `REDIS_SERVER` names the program (default `redis-server` on PATH).
 */
export class PrivateRedis {
  #proc: ChildProcess | undefined;

  private constructor(
    readonly port: number,
    readonly dir: string,
    readonly maxMemoryBytes: number | undefined,
  ) {}

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  /**
   * Starts a server in `dir`; with `maxMemoryBytes` it holds at most that much and evicts the
   * least recently used keys (`allkeys-lru`).
   */
  static async start(dir: string, maxMemoryBytes?: number): Promise<PrivateRedis> {
    await mkdir(dir, { recursive: true });
    const r = new PrivateRedis(await freePort(), dir, maxMemoryBytes);
    await r.restart();
    return r;
  }

  /** Starts the server (again) on the same port, empty. */
  async restart(): Promise<void> {
    const program = process.env.REDIS_SERVER ?? 'redis-server';
    const args = [
      '--port',
      String(this.port),
      '--bind',
      '127.0.0.1',
      '--save',
      '',
      '--appendonly',
      'no',
      '--dir',
      this.dir,
      ...(this.maxMemoryBytes === undefined
        ? []
        : ['--maxmemory', String(this.maxMemoryBytes), '--maxmemory-policy', 'allkeys-lru']),
    ];
    // Killed with this process even when it is killed first (no orphaned servers).
    const p = spawn(...dyingWithParent(program, args), { stdio: ['ignore', 'pipe', 'ignore'] });
    this.#proc = p;
    await new Promise<void>((resolve, reject) => {
      let out = '';
      const done = (err?: Error) => {
        clearTimeout(timer);
        p.stdout?.off('data', onData);
        p.off('error', done);
        p.off('exit', onExit);
        p.stdout?.resume();
        if (err === undefined) resolve();
        else reject(err);
      };
      const onData = (d: Buffer) => {
        out += d.toString();
        if (out.includes('Ready to accept connections')) done();
      };
      const onExit = (code: number | null) =>
        done(new Error(`${program} on port ${this.port} exited (${code}) before it was ready`));
      const timer = setTimeout(() => {
        p.kill('SIGKILL');
        done(
          new Error(`${program} on port ${this.port} not ready in ${REDIS_START_TIMEOUT_MS} ms`),
        );
      }, REDIS_START_TIMEOUT_MS);
      p.stdout?.on('data', onData);
      p.once('error', done);
      p.once('exit', onExit);
    });
  }

  /** Kills the server (SIGKILL) and waits for it to exit; idempotent. */
  async kill(): Promise<void> {
    const p = this.#proc;
    this.#proc = undefined;
    if (p === undefined || p.exitCode !== null || p.signalCode !== null) return;
    const exited = new Promise((resolve) => p.once('exit', resolve));
    p.kill('SIGKILL');
    await exited;
  }
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() =>
        typeof addr === 'object' && addr !== null
          ? resolve(addr.port)
          : reject(new Error('no port')),
      );
    });
  });
}
