import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type { ChunkHash } from '../../src/backends/core/types.ts';
import { LocalCpuBackend } from '../../src/backends/local-cpu/local-cpu-backend.ts';
import { chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';
import {
  SidecarServer,
  type SidecarServerOptions,
} from '../../src/lookup-server/sidecar-server.ts';
import { StorageManager } from '../../src/storage-manager/storage-manager.ts';
import type { StorageManagerOptions } from '../../src/storage-manager/storage-types.ts';
import { spawnGuarded } from './child-guard.ts';
import { GatedBackend, type GatedBackendOptions } from './gated-backend.ts';

/** Root of the repository (where package.json and bin/ live). */
export const REPO_ROOT = fileURLToPath(new URL('../../', import.meta.url));

/**
 * Default bound of {@link pollUntil} and {@link pollUntilNumber}: event-loop turns before a test
 * fails. An idle turn costs about 1 µs, so this allows a few seconds for a loaded machine's
 * socket round trips (another process included) without letting a broken test hang.
 */
export const DEFAULT_MAX_TURNS = 2_000_000;

/** `n` distinct, readable chunk hashes: `<tag>-<i>` padded to 32 bytes. */
export function taggedHashes(n: number, tag = 'h'): ChunkHash[] {
  return Array.from({ length: n }, (_, i) =>
    chunkHashFromBytes(Buffer.from(`${tag}-${i}`.padEnd(32, '.'))),
  );
}

/** A random namespace id (32 lowercase hex digits). */
export function randomNamespace(): string {
  return randomBytes(16).toString('hex');
}

/** A random chunk hash (64 lowercase hex digits). */
export function randomHash(): ChunkHash {
  return chunkHashFromBytes(randomBytes(32));
}

/** `n` distinct random chunk hashes. */
export function randomHashes(n: number): ChunkHash[] {
  return Array.from({ length: n }, () => randomHash());
}

/** `bytes` random payload bytes. */
export function randomPayload(bytes: number): Buffer {
  return randomBytes(bytes);
}

/** Packs hex hashes into the 32-bytes-per-hash buffer the lookup client sends. */
export function packHex(hashes: readonly string[]): Buffer {
  return Buffer.concat(hashes.map((h) => Buffer.from(h, 'hex')));
}

/** Options of {@link createTestStorage}. */
export interface TestStorageOptions {
  /** Host-memory bound of the CPU tier; default 64 MiB. */
  cpuCapacityBytes?: number;
  /** Options of the gated lower tier (name 'gated', gate closed by default). */
  gated?: GatedBackendOptions;
  /** Further storage-manager options (tiers are always [cpu, gated]). */
  storage?: Omit<StorageManagerOptions, 'tiers'>;
}

/** A storage manager and direct handles on its two tiers. */
export interface TestStorage {
  storage: StorageManager;
  cpu: LocalCpuBackend;
  gated: GatedBackend;
}

/**
 * Builds a storage manager with tiers [LocalCPU 'cpu', GatedBackend 'gated']. The pin sweep
 * timer is off (sweepIntervalMs 0) so nothing expires behind a test's back. The caller closes
 * `storage` (which closes both tiers).
 */
export function createTestStorage(opts: TestStorageOptions = {}): TestStorage {
  const cpu = new LocalCpuBackend(
    { capacityBytes: opts.cpuCapacityBytes ?? 64 * 1024 * 1024 },
    { name: 'cpu' },
  );
  const gated = new GatedBackend({ name: 'gated', ...opts.gated });
  const storage = new StorageManager({ sweepIntervalMs: 0, ...opts.storage, tiers: [cpu, gated] });
  return { storage, cpu, gated };
}

/** Starts a lookup server on `tcp://127.0.0.1:*` (or `opts.endpoint`) over `storage`. */
export async function startTestServer(
  storage: StorageManager,
  opts: Omit<SidecarServerOptions, 'storage'> = {},
): Promise<SidecarServer> {
  const server = new SidecarServer({ endpoint: 'tcp://127.0.0.1:*', ...opts, storage });
  await server.start();
  return server;
}

/** A storage manager plus a started lookup server over it. */
export interface TestStack extends TestStorage {
  server: SidecarServer;
  /** Closes the server, then the storage (idempotent). */
  close(): Promise<void>;
}

/** {@link createTestStorage} and {@link startTestServer} in one. */
export async function createTestStack(
  opts: TestStorageOptions & { server?: Omit<SidecarServerOptions, 'storage'> } = {},
): Promise<TestStack> {
  const parts = createTestStorage(opts);
  let server: SidecarServer;
  try {
    server = await startTestServer(parts.storage, opts.server);
  } catch (err) {
    await parts.storage.close();
    throw err;
  }
  let closing: Promise<void> | undefined;
  return {
    ...parts,
    server,
    close: () => {
      closing ??= (async () => {
        await server.close();
        await parts.storage.close();
      })();
      return closing;
    },
  };
}

/** Resolves after one turn of the event loop (I/O callbacks included). */
export function nextTurn(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/**
 * Checks `predicate` once per event-loop turn until it holds.
 * @throws Error naming `what` (or what `what()` says then) when it still fails after `maxTurns` turns.
 */
export async function pollUntil(
  predicate: () => boolean,
  what: string | (() => string),
  maxTurns = DEFAULT_MAX_TURNS,
): Promise<void> {
  for (let turn = 0; turn < maxTurns; turn++) {
    if (predicate()) return;
    await nextTurn();
  }
  if (predicate()) return;
  const said = typeof what === 'string' ? what : what();
  throw new Error(`${said}: still not true after ${maxTurns} event-loop turns`);
}

/**
 * Calls a non-blocking lookup (`() => client.lookup(...)`) once per event-loop turn until it
 * returns a number, as a scheduler would once per step.
 * @throws Error when it is still null after `maxTurns` turns.
 */
export async function pollUntilNumber(
  lookup: () => number | null,
  maxTurns = DEFAULT_MAX_TURNS,
): Promise<number> {
  for (let turn = 0; turn < maxTurns; turn++) {
    const answer = lookup();
    if (answer !== null) return answer;
    await nextTurn();
  }
  throw new Error(`lookup still null after ${maxTurns} event-loop turns`);
}

/**
 * Settles like `promise`, or rejects naming `what` when it has not settled within `ms`. This is
 * an upper bound that fails a test, never a delay it waits out.
 */
export async function withDeadline<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no result within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, deadline]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * A TCP port that was free a moment ago, below the kernel's ephemeral range: a test that closes
 * and binds the same endpoint again (a restart) must not lose it to an outgoing connection or a
 * `bind(0)` of another suite on the machine, which only ever take ephemeral ports. Picked at
 * random and checked by binding it; port 0's answer where no range lies below.
 */
export async function freeTcpPort(): Promise<number> {
  const [lo, hi] = belowEphemeral();
  for (let i = 0; i < 50 && hi > lo; i++) {
    const port = lo + Math.floor(Math.random() * (hi - lo));
    if ((await tryListen(port)) !== null) return port;
  }
  const port = await tryListen(0);
  if (port === null) throw new Error('no TCP port was assigned');
  return port;
}

/** The ports [lo, hi) below the ephemeral range (`ip_local_port_range`), at most 12,000 of them. */
function belowEphemeral(): [number, number] {
  let start = 32768;
  try {
    start = Number(
      readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0],
    );
  } catch {
    // not Linux: the IANA range's start
  }
  if (!Number.isInteger(start) || start < 2048) return [0, 0];
  return [Math.max(1024, start - 12_000), start];
}

/** Binds 127.0.0.1:`port` and releases it: the port bound, or null when it is taken. */
async function tryListen(port: number): Promise<number | null> {
  const srv = createServer();
  const ok = await new Promise<boolean>((resolve) => {
    srv.once('error', () => resolve(false));
    srv.listen(port, '127.0.0.1', () => resolve(true));
  });
  if (!ok) return null;
  const addr = srv.address();
  await new Promise<void>((resolve) => srv.close(() => resolve()));
  return addr === null || typeof addr === 'string' ? null : addr.port;
}

/** A lookup server running in a child process (test/support/server-process.ts). */
export interface ServerProcess {
  /** The ZMQ endpoint the child bound. */
  endpoint: string;
  /** Writes one command line to the child's stdin; resolves on the child's `ok <cmd>` line. */
  command(cmd: string): Promise<void>;
  /** What the child wrote to stderr so far (for failure messages). */
  readonly stderr: string;
  /** Sends SIGKILL (if still running) and resolves once the child has exited. */
  kill(): Promise<void>;
}

/**
 * Spawns `node --import tsx test/support/server-process.ts` and resolves once it prints
 * `ready <endpoint>`. Every wait is bounded by `timeoutMs` (default 120 000) so a broken child
 * fails the test instead of hanging it.
 */
export async function startServerProcess(timeoutMs = 120_000): Promise<ServerProcess> {
  const script = fileURLToPath(new URL('./server-process.ts', import.meta.url));
  const child = spawnGuarded(process.execPath, ['--import', 'tsx', script], {
    cwd: REPO_ROOT,
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let stderr = '';
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (d: string) => {
    stderr += d;
  });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const waiters: { line: string; resolve(): void }[] = [];
  let onReady: ((endpoint: string) => void) | undefined;
  const lines = createInterface({ input: child.stdout });
  lines.on('line', (line) => {
    if (line.startsWith('ready ')) onReady?.(line.slice('ready '.length));
    const i = waiters.findIndex((w) => w.line === line);
    if (i !== -1) waiters.splice(i, 1)[0]!.resolve();
  });
  const kill = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await exited;
  };
  const gone = exited.then(() => {
    throw new Error(`server process exited early (code ${child.exitCode}); stderr:\n${stderr}`);
  });
  gone.catch(() => {});
  try {
    const endpoint = await withDeadline(
      Promise.race([new Promise<string>((resolve) => (onReady = resolve)), gone]),
      timeoutMs,
      'server process start',
    );
    return {
      endpoint,
      get stderr() {
        return stderr;
      },
      command: (cmd: string) => {
        const ok = new Promise<void>((resolve) => waiters.push({ line: `ok ${cmd}`, resolve }));
        child.stdin.write(`${cmd}\n`);
        return withDeadline(Promise.race([ok, gone]), timeoutMs, `server process "${cmd}"`);
      },
      kill,
    };
  } catch (err) {
    await kill();
    throw err;
  }
}
