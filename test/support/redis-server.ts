/**
 * Real `redis-server` processes for tests: a standalone server or a local 3-master cluster on
 * free loopback ports, without persistence, in temp dirs. Every process this module starts is
 * killed by `stop()`, and (as a backstop for a crashed test) when the test process exits.
 */
import { type ChildProcess, execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { accessSync, constants, mkdtempSync, rmSync } from 'node:fs';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Cluster, Redis } from 'ioredis';
import { CHUNK_HEADER_BYTES, encodeChunkObject } from '../../src/backends/format/chunk-format.ts';
import { RedisBackend, type RedisBackendOptions } from '../../src/backends/redis/redis-backend.ts';
import { chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';
import { silentLogger } from '../../src/util/log.ts';
import type { ContractSubject, CorruptionKind } from '../contract/backend.contract.ts';
import { spawnGuarded } from './child-guard.ts';
import { freeTcpPort } from './fixtures.ts';

/** How long a server may take to start answering, and a cluster to agree on its slots (ms). */
const START_TIMEOUT_MS = 60_000;

const live = new Set<ChildProcess>();
process.once('exit', () => {
  for (const p of live) p.kill('SIGKILL');
});

function findProgram(name: string): string {
  const dirs = ['/usr/bin', ...(process.env.PATH ?? '').split(delimiter).filter((d) => d !== '')];
  for (const dir of dirs) {
    const file = join(dir, name);
    try {
      accessSync(file, constants.X_OK);
      return file;
    } catch {}
  }
  throw new Error(`${name} not found: install it with \`apt-get install redis-server\``);
}

/** A free loopback port (and, with `busPort`, port + 10000 free too, for the cluster bus). */
async function freePort(busPort = false): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = await freeTcpPort(); // below the ephemeral range: restarts keep it
    if (!busPort || (port + 10000 <= 65535 && (await bindable(port + 10000)) !== -1)) return port;
  }
  throw new Error('no free port pair found for a redis cluster node');
}

function bindable(port: number): Promise<number> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.once('error', () => resolve(-1));
    srv.listen(port, '127.0.0.1', () => {
      const addr = srv.address();
      srv.close(() => resolve(typeof addr === 'object' && addr !== null ? addr.port : -1));
    });
  });
}

/**
 * Sends one inline command over a raw socket; resolves with the reply's first line, or the body
 * of a bulk reply (CLUSTER INFO answers that way).
 */
export function rawCommand(port: number, command: string, timeoutMs = 2000): Promise<string> {
  return new Promise((resolve, reject) => {
    const sock = connect(port, '127.0.0.1');
    let buf = Buffer.alloc(0);
    const finish = (err: Error | null, reply = '') => {
      clearTimeout(timer);
      sock.destroy();
      if (err === null) resolve(reply);
      else reject(err);
    };
    const timer = setTimeout(
      () => finish(new Error(`redis on port ${port}: no reply to ${command} in ${timeoutMs} ms`)),
      timeoutMs,
    );
    sock.once('connect', () => sock.write(`${command}\r\n`));
    sock.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      const eol = buf.indexOf('\r\n');
      if (eol < 0) return;
      const line = buf.subarray(0, eol).toString('latin1');
      if (!line.startsWith('$')) return finish(null, line);
      const len = Number(line.slice(1));
      if (len < 0) return finish(null, line);
      if (buf.length >= eol + 2 + len)
        finish(null, buf.subarray(eol + 2, eol + 2 + len).toString('latin1'));
    });
    sock.once('error', (err) => finish(err));
  });
}

/** Options of {@link startRedis}. */
export interface StartRedisOptions {
  /** Extra server arguments, e.g. `['--maxmemory', '2mb']`. */
  args?: string[];
  /** Sets `--requirepass`. */
  password?: string;
}

/** A running `redis-server`. */
export interface RedisServer {
  readonly port: number;
  /** `redis://127.0.0.1:<port>` (no credentials). */
  readonly url: string;
  /** Kills the server and removes its directory; idempotent. */
  stop(): Promise<void>;
  /** Kills the server (SIGKILL) and waits for it to exit; `restart()` brings it back. */
  kill(): Promise<void>;
  /** Starts the server again on the same port and directory (empty: nothing is persisted). */
  restart(): Promise<void>;
  /** Freezes the server (SIGSTOP): connections stay open but nothing is answered. */
  pause(): void;
  /** Undoes `pause()` (SIGCONT). */
  resume(): void;
}

interface ServerProcess {
  readonly port: number;
  readonly dir: string;
  proc: ChildProcess | null;
  start(): Promise<void>;
  kill(): Promise<void>;
}

function serverProcess(port: number, dir: string, args: string[]): ServerProcess {
  const program = findProgram('redis-server');
  const self: ServerProcess = {
    port,
    dir,
    proc: null,
    async start() {
      if (self.proc !== null) throw new Error(`redis-server on port ${port} is already running`);
      const p = spawnGuarded(
        program,
        ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'].concat(
          ['--dir', dir],
          args,
        ),
        { stdio: ['ignore', 'pipe', 'pipe'] },
      );
      self.proc = p;
      live.add(p);
      p.once('exit', () => live.delete(p));
      await waitReady(p, port);
    },
    async kill() {
      const p = self.proc;
      self.proc = null;
      if (p === null || p.exitCode !== null || p.signalCode !== null) return;
      const exited = new Promise((resolve) => p.once('exit', resolve));
      p.kill('SIGKILL');
      await exited;
    },
  };
  return self;
}

/** Resolves once the server logs that it accepts connections and answers PING. */
function waitReady(p: ChildProcess, port: number): Promise<void> {
  return new Promise((resolve, reject) => {
    let out = '';
    const finish = (err?: Error) => {
      clearTimeout(timer);
      p.stdout?.off('data', onData);
      p.off('exit', onExit);
      p.stdout?.resume();
      p.stderr?.resume();
      if (err === undefined) resolve();
      else reject(err);
    };
    const onData = (d: Buffer) => {
      out += d.toString();
      if (!out.includes('Ready to accept connections')) return;
      rawCommand(port, 'PING').then(
        // NOAUTH still proves the server answers.
        (reply) =>
          finish(/^(\+PONG|-NOAUTH)/.test(reply) ? undefined : new Error(`PING: ${reply}`)),
        (err: Error) => finish(err),
      );
    };
    const onExit = (code: number | null) =>
      finish(new Error(`redis-server on port ${port} exited (${code}): ${out.slice(-500)}`));
    const timer = setTimeout(() => {
      p.kill('SIGKILL');
      finish(new Error(`redis-server on port ${port} not ready in ${START_TIMEOUT_MS} ms`));
    }, START_TIMEOUT_MS);
    p.stdout?.on('data', onData);
    p.stderr?.resume();
    p.once('exit', onExit);
  });
}

/**
 * Starts a standalone `redis-server` (no persistence) on a free port.
 * @throws Error "redis-server not found: install it with `apt-get install redis-server`".
 */
export async function startRedis(opts: StartRedisOptions = {}): Promise<RedisServer> {
  const args = [...(opts.args ?? [])];
  if (opts.password !== undefined) args.push('--requirepass', opts.password);
  const dir = mkdtempSync(join(tmpdir(), 'kvtier-redis-'));
  const server = serverProcess(await freePort(), dir, args);
  let stopped: Promise<void> | null = null;
  try {
    await server.start();
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
  return {
    port: server.port,
    url: `redis://127.0.0.1:${server.port}`,
    stop() {
      stopped ??= server.kill().finally(() => rmSync(dir, { recursive: true, force: true }));
      return stopped;
    },
    kill: () => server.kill(),
    restart: () => server.start(),
    pause: () => server.proc?.kill('SIGSTOP'),
    resume: () => server.proc?.kill('SIGCONT'),
  };
}

/** A running 3-master Redis Cluster. */
export interface RedisCluster {
  /** Seed nodes for a cluster client. */
  readonly nodes: { host: string; port: number }[];
  /** Kills every node and removes their directories; idempotent. */
  stop(): Promise<void>;
  /** Kills every node (SIGKILL). */
  kill(): Promise<void>;
  /** Starts every node again from its saved cluster config and waits for `cluster_state:ok`. */
  restart(): Promise<void>;
}

/**
 * Starts 3 cluster-enabled masters, joins them with `redis-cli --cluster create` (no replicas)
 * and waits until every node reports `cluster_state:ok`.
 * @throws Error naming what to install when redis-server or redis-cli is missing.
 */
export async function startRedisCluster(): Promise<RedisCluster> {
  const cli = findProgram('redis-cli');
  const servers: ServerProcess[] = [];
  const dirs: string[] = [];
  const stopAll = async () => {
    await Promise.all(servers.map((s) => s.kill()));
  };
  try {
    for (let i = 0; i < 3; i++) {
      const dir = mkdtempSync(join(tmpdir(), 'kvtier-redis-cluster-'));
      dirs.push(dir);
      const port = await freePort(true);
      servers.push(
        serverProcess(port, dir, [
          '--cluster-enabled',
          'yes',
          '--cluster-config-file',
          join(dir, 'nodes.conf'),
          '--cluster-node-timeout',
          '2000',
        ]),
      );
    }
    await Promise.all(servers.map((s) => s.start()));
    await new Promise<void>((resolve, reject) => {
      execFile(
        cli,
        ['--cluster', 'create', ...servers.map((s) => `127.0.0.1:${s.port}`)].concat([
          '--cluster-replicas',
          '0',
          '--cluster-yes',
        ]),
        { timeout: START_TIMEOUT_MS },
        (err, stdout, stderr) =>
          err === null
            ? resolve()
            : reject(
                new Error(`redis-cli --cluster create failed: ${err.message} ${stdout} ${stderr}`),
              ),
      );
    });
    await waitClusterOk(servers.map((s) => s.port));
  } catch (err) {
    await stopAll();
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
    throw err;
  }
  let stopped: Promise<void> | null = null;
  return {
    nodes: servers.map((s) => ({ host: '127.0.0.1', port: s.port })),
    stop() {
      stopped ??= stopAll().finally(() => {
        for (const d of dirs) rmSync(d, { recursive: true, force: true });
      });
      return stopped;
    },
    kill: stopAll,
    async restart() {
      await Promise.all(servers.map((s) => s.start()));
      await waitClusterOk(servers.map((s) => s.port));
    },
  };
}

/**
 * Polls CLUSTER INFO on every node until all say `cluster_state:ok`: gossip between external
 * processes has no event to wait on, so this is a bounded poll with a short pause.
 */
async function waitClusterOk(ports: readonly number[]): Promise<void> {
  const deadline = Date.now() + START_TIMEOUT_MS;
  let last = '';
  while (Date.now() < deadline) {
    const infos = await Promise.all(ports.map((p) => rawCommand(p, 'CLUSTER INFO').catch(String)));
    if (infos.every((i) => i.includes('cluster_state:ok'))) return;
    last = infos.join(' | ').slice(0, 300);
    await sleep(50);
  }
  throw new Error(`redis cluster not ok after ${START_TIMEOUT_MS} ms: ${last}`);
}

/** Raw access to a key's bytes, as a plain ioredis client or cluster client provides. */
export interface RawRedis {
  getBuffer(key: string): Promise<Buffer | null>;
  set(key: string, value: Buffer): Promise<unknown>;
}

/**
 * Damages the stored chunk object at `key` below the backend's API (the contract suite's
 * `corrupt` hook): flips a payload byte, truncates, breaks the magic, or replaces the value with
 * a valid object of another hash.
 */
export async function corruptRedisValue(
  raw: RawRedis,
  key: string,
  ns: string,
  kind: CorruptionKind,
): Promise<void> {
  const obj = await raw.getBuffer(key);
  if (obj === null) throw new Error(`corrupt: no value at ${key}`);
  let damaged: Buffer;
  switch (kind) {
    case 'payload':
      damaged = Buffer.from(obj);
      damaged[CHUNK_HEADER_BYTES + ((obj.length - CHUNK_HEADER_BYTES) >> 1)]! ^= 0x5a;
      break;
    case 'truncate':
      damaged = obj.subarray(0, obj.length - Math.max(1, (obj.length - CHUNK_HEADER_BYTES) >> 1));
      break;
    case 'magic':
      damaged = Buffer.from(obj);
      damaged.write('XXXX', 0, 'latin1');
      break;
    case 'foreign-hash':
      damaged = encodeChunkObject(ns, chunkHashFromBytes(randomBytes(32)), {
        tokens: 1,
        data: randomBytes(64),
      });
      break;
  }
  await raw.set(key, damaged);
}

/**
 * Builds a contract-suite subject over a running server or cluster: a {@link RedisBackend} with
 * a key prefix of its own (so subjects never see each other's keys), a raw client for
 * `corrupt`, `down`/`up` that kill and restart the server(s), and `reopen` (a new instance).
 * `cleanup` brings a downed server back and deletes the subject's keys.
 */
export async function redisContractSubject(
  target: { kind: 'standalone'; server: RedisServer } | { kind: 'cluster'; cluster: RedisCluster },
  options: RedisBackendOptions = {},
): Promise<ContractSubject> {
  const keyPrefix = `kvt-contract-${randomBytes(6).toString('hex')}:`;
  const where: RedisBackendOptions =
    target.kind === 'standalone'
      ? { port: target.server.port }
      : { cluster: { nodes: target.cluster.nodes } };
  const open = async (): Promise<RedisBackend> => {
    const b = new RedisBackend(
      { ...where, keyPrefix, log: silentLogger, ...options },
      { name: `redis-${target.kind}` },
    );
    try {
      await b.start();
    } catch (err) {
      await b.close();
      throw err;
    }
    return b;
  };
  const backend = await open();
  const servers = target.kind === 'standalone' ? target.server : target.cluster;
  let downed = false;
  return {
    backend,
    async corrupt(ns, hash, kind) {
      const raw =
        target.kind === 'standalone'
          ? new Redis({ port: target.server.port, lazyConnect: true })
          : new Cluster(target.cluster.nodes, { lazyConnect: true });
      try {
        await raw.connect();
        await corruptRedisValue(raw, `${keyPrefix}${ns}:${hash}`, ns, kind);
      } finally {
        raw.disconnect();
      }
    },
    async down() {
      downed = true;
      await servers.kill();
    },
    async up() {
      await servers.restart();
      downed = false;
    },
    reopen: open,
    async cleanup() {
      await backend.close();
      if (downed) {
        await servers.restart();
        downed = false;
      }
      const sweeper = await open();
      try {
        await sweeper.clear();
      } finally {
        await sweeper.close();
      }
    },
  };
}
