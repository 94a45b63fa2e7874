/**
 * The Redis tier's bulk read path: `GET`s sent on connections of its own (one per master), their
 * replies parsed as they arrive, and the socket told to read a value's bytes straight into a
 * pooled buffer of its length (`onread`: no buffer allocated per socket read, no copy), its
 * CRC-32C computed piece by piece as they land. ioredis's parser keeps a large reply's pieces
 * (each a fresh allocation) and joins them into a fresh buffer once whole: two allocations and a
 * copy of every multi-MiB value, and garbage that drives a full collection after nearly every
 * batch. Everything but `GET` (and a `GET` this reader cannot place: no slot map yet, a `MOVED`
 * or `ASK` answer) stays with ioredis.
 *
 * Replies are answered in order per connection. A reply whose caller stopped waiting is still
 * read, then dropped (its buffer back to the pool). A lost connection fails every call on it
 * (a value cut short is never returned); the next call opens a new one. A call whose deadline
 * passes also closes its connection: a server that stopped answering is not waited on again.
 */
import { connect as netConnect, type Socket } from 'node:net';
import { abortedError, closedError, KvtierError } from '../../errors.ts';
import { BufferPool } from '../arena/buffer-pool.ts';
import { crc32cUpdateNative } from '../format/checksum.ts';
import { keySlot } from './redis-slot.ts';

/** The answer for a key this reader cannot serve: ask ioredis. */
export const REDIRECT: unique symbol = Symbol('redis redirect');

/** A value read into a pooled buffer: give it back with `release` once nothing reads it. */
export interface PooledValue {
  readonly bytes: Buffer;
  /** CRC-32C of `bytes` from the `crcFrom` the get gave to the end, when computed. */
  readonly crc32c?: number | undefined;
  readonly release: () => void;
}

/** Where a key's value lives: `host:port` of a master, or null when unknown. */
export type NodeOf = (key: string) => string | null;

/** What the reader connects with. */
export interface GetReaderOptions {
  readonly username?: string | undefined;
  readonly password?: string | undefined;
  /** Selected after connecting when not 0 (standalone only). */
  readonly db?: number;
  /** Timeout of a connection attempt, ms. */
  readonly connectTimeoutMs: number;
  /** The tier's name, for messages. */
  readonly name: string;
}

interface Pending {
  /** Most bytes buffered for the value; a longer one is read and answered as empty bytes. */
  readonly maxBytes: number;
  /** Where the value's CRC-32C starts; -1 for none. */
  readonly crcFrom: number;
  /** False once the caller stopped waiting. */
  live: boolean;
  readonly settle: (v: PooledValue | null | typeof REDIRECT | Error) => void;
}

const CR = 13;
const LF = 10;
/** Socket reads outside values land here (replies' lines, short values, a value's tail). */
const SCRATCH_BYTES = 64 * 1024;
/** A value with at least this much left is read straight into its buffer. */
const DIRECT_MIN_BYTES = 16 * 1024;

/** One connection to one node; the parser state of its reply stream. */
class Conn {
  readonly socket: Socket;
  readonly #queue: Pending[] = [];
  #head = 0;
  #out: string[] = [];
  #line: Buffer | null = null;
  /** The value being read: its buffer (null when skipped), bytes filled, bytes it has. */
  #value: Buffer | null = null;
  #filled = 0;
  #length = -1;
  /** CRC-32C of the value so far (from its pending's `crcFrom`), null when not computed. */
  #crc: number | null = null;
  #crcFrom = -1;
  readonly #scratch = Buffer.allocUnsafe(SCRATCH_BYTES);
  /** CRLF bytes after the value still to be read. */
  #tail = 0;
  #dead: Error | null = null;
  readonly #pool: BufferPool;
  readonly #onDead: (c: Conn) => void;

  constructor(
    host: string,
    port: number,
    o: GetReaderOptions,
    pool: BufferPool,
    onDead: (c: Conn) => void,
  ) {
    this.#pool = pool;
    this.#onDead = onDead;
    const where = `${o.name}: redis ${host}:${port}`;
    this.socket = netConnect({
      host,
      port,
      noDelay: true,
      onread: {
        buffer: () => this.#nextReadBuffer(),
        callback: (n: number, buf: Uint8Array) => {
          this.#onRead(n, buf);
          return true;
        },
      },
    });
    this.socket.setTimeout(o.connectTimeoutMs, () =>
      this.fail(new KvtierError('KVT_BACKEND', `${where}: connect timed out`)),
    );
    this.socket.once('connect', () => this.socket.setTimeout(0));
    this.socket.on('error', (err) =>
      this.fail(new KvtierError('KVT_BACKEND', `${where}: ${err.message}`, { cause: err })),
    );
    this.socket.on('close', () =>
      this.fail(new KvtierError('KVT_BACKEND', `${where}: connection closed`)),
    );
    const setup: string[][] = [];
    if (o.password !== undefined && o.password !== '')
      setup.push(
        // An empty user name is no user name (ioredis reads a URL's `:pass@` so).
        o.username ? ['AUTH', o.username, o.password] : ['AUTH', o.password],
      );
    if ((o.db ?? 0) !== 0) setup.push(['SELECT', String(o.db)]);
    for (const args of setup) this.#send(args, 0, (v) => this.#setupReply(v, args[0]!, where));
  }

  get dead(): boolean {
    return this.#dead !== null;
  }

  /** Queues `GET key`; written with the other commands of this turn. */
  get(key: string, maxBytes: number, crcFrom: number, settle: Pending['settle']): Pending {
    return this.#send(['GET', key], maxBytes, settle, crcFrom);
  }

  /** Fails every call waiting on this connection and destroys it; idempotent. */
  fail(err: Error): void {
    if (this.#dead !== null) return;
    this.#dead = err;
    this.socket.destroy();
    // A value cut short is dropped (the reply it belongs to fails below).
    if (this.#value !== null) this.#pool.release(this.#value);
    this.#value = null;
    const waiting = this.#queue.slice(this.#head);
    this.#queue.length = 0;
    this.#head = 0;
    for (const p of waiting) p.settle(err);
    this.#onDead(this);
  }

  #setupReply(v: PooledValue | null | typeof REDIRECT | Error, cmd: string, where: string): void {
    if (v instanceof Error)
      this.fail(new KvtierError('KVT_BACKEND', `${where}: ${cmd} failed: ${v.message}`));
  }

  #send(args: string[], maxBytes: number, settle: Pending['settle'], crcFrom = -1): Pending {
    const p: Pending = { maxBytes, crcFrom, live: true, settle };
    if (this.#dead !== null) {
      settle(this.#dead);
      return p;
    }
    this.#queue.push(p);
    let cmd = `*${args.length}\r\n`;
    for (const a of args) cmd += `$${Buffer.byteLength(a)}\r\n${a}\r\n`;
    if (this.#out.push(cmd) === 1) queueMicrotask(() => this.#flush());
    return p;
  }

  #flush(): void {
    const out = this.#out.join('');
    this.#out = [];
    if (this.#dead === null) this.socket.write(out);
  }

  #answer(v: PooledValue | null | typeof REDIRECT | Error): void {
    const p = this.#queue[this.#head];
    if (p === undefined) {
      if (v !== null && typeof v === 'object' && 'release' in v) v.release();
      this.fail(new KvtierError('KVT_PROTOCOL', 'redis sent a reply nobody asked for'));
      return;
    }
    this.#queue[this.#head++] = undefined as unknown as Pending;
    if (this.#head === this.#queue.length) {
      this.#queue.length = 0;
      this.#head = 0;
    } else if (this.#head > 1024 && this.#head * 2 > this.#queue.length) {
      this.#queue.splice(0, this.#head);
      this.#head = 0;
    }
    if (p.live) p.settle(v);
    else if (v !== null && typeof v === 'object' && 'release' in v) v.release();
  }

  /** The value being read has its bytes and CRLF: answer its caller. */
  #valueDone(): void {
    const buf = this.#value;
    const crc = this.#crc;
    this.#value = null;
    this.#length = -1;
    this.#crc = null;
    if (buf === null) {
      this.#answer({ bytes: Buffer.alloc(0), release: () => {} });
      return;
    }
    let released = false;
    const pool = this.#pool;
    this.#answer({
      bytes: buf,
      crc32c: crc ?? undefined,
      release: () => {
        if (released) return;
        released = true;
        pool.release(buf);
      },
    });
  }

  /** Where the socket's next read lands: the rest of a large value in place, else scratch. */
  #nextReadBuffer(): Uint8Array {
    const v = this.#value;
    if (v !== null && this.#dead === null && this.#length - this.#filled >= DIRECT_MIN_BYTES)
      return v.subarray(this.#filled, this.#length);
    return this.#scratch;
  }

  #onRead(n: number, buf: Uint8Array): void {
    if (this.#dead !== null) return;
    if (buf.buffer === this.#scratch.buffer) {
      this.#onData(this.#scratch.subarray(0, n));
      return;
    }
    // Read in place into the value being read (the buffer #nextReadBuffer gave).
    this.#filled += n;
    this.#crcUpdate(this.#filled - n, this.#filled);
  }

  /** Adds the value's bytes [from, to) to its CRC-32C. */
  #crcUpdate(from: number, to: number): void {
    if (this.#crc === null || to <= this.#crcFrom) return;
    this.#crc = crc32cUpdateNative(
      this.#crc,
      this.#value!.subarray(Math.max(from, this.#crcFrom), to),
    );
  }

  #onData(d: Buffer): void {
    let i = 0;
    while (i < d.length && this.#dead === null) {
      if (this.#length >= 0) {
        // Inside a value: its bytes, then its CRLF.
        const want = this.#length - this.#filled;
        if (want > 0) {
          const n = Math.min(want, d.length - i);
          if (this.#value !== null) {
            d.copy(this.#value, this.#filled, i, i + n);
            this.#crcUpdate(this.#filled, this.#filled + n);
          }
          this.#filled += n;
          i += n;
          continue;
        }
        const b = d[i++]!;
        if (b !== (this.#tail === 2 ? CR : LF)) {
          this.fail(new KvtierError('KVT_PROTOCOL', 'redis value not followed by CRLF'));
          return;
        }
        if (--this.#tail === 0) this.#valueDone();
        continue;
      }
      const lf = d.indexOf(LF, i);
      if (lf < 0) {
        const rest = d.subarray(i);
        this.#line = this.#line === null ? Buffer.from(rest) : Buffer.concat([this.#line, rest]);
        if (this.#line.length > 64 * 1024) {
          this.fail(new KvtierError('KVT_PROTOCOL', 'redis reply line too long'));
        }
        return;
      }
      let line = d.subarray(i, lf + 1);
      if (this.#line !== null) {
        line = Buffer.concat([this.#line, line]);
        this.#line = null;
      }
      i = lf + 1;
      this.#onLine(line);
    }
  }

  #onLine(line: Buffer): void {
    if (line.length < 3 || line[line.length - 2] !== CR) {
      this.fail(new KvtierError('KVT_PROTOCOL', 'redis reply line without CRLF'));
      return;
    }
    const text = line.toString('latin1', 1, line.length - 2);
    switch (line[0]) {
      case 0x24: {
        // '$': a bulk string, or -1 for none.
        const n = Number(text);
        if (n === -1) {
          this.#answer(null);
          return;
        }
        if (!Number.isSafeInteger(n) || n < 0) {
          this.fail(new KvtierError('KVT_PROTOCOL', `redis bulk length ${text}`));
          return;
        }
        const p = this.#queue[this.#head];
        const keep = p?.live === true && n <= p.maxBytes;
        this.#value = keep ? this.#pool.acquire(n) : null;
        this.#length = n;
        this.#filled = 0;
        this.#tail = 2;
        this.#crcFrom =
          keep && p !== undefined && p.crcFrom >= 0 && p.crcFrom <= n ? p.crcFrom : -1;
        this.#crc = this.#crcFrom >= 0 ? 0 : null;
        return;
      }
      case 0x2b: // '+'
        this.#answer(null);
        return;
      case 0x2d: // '-'
        if (text.startsWith('MOVED ') || text.startsWith('ASK ')) this.#answer(REDIRECT);
        else this.#answer(new KvtierError('KVT_BACKEND', `redis: ${text}`));
        return;
      default:
        this.fail(
          new KvtierError(
            'KVT_PROTOCOL',
            `unexpected redis reply ${line.toString('latin1', 0, 1)}`,
          ),
        );
    }
  }
}

/**
 * Sends `GET`s on connections of its own, one per node `nodeOf` names (see the file's comment).
 * Values come in buffers from a pool of its own; `close` ends every connection.
 */
export class RedisGetReader {
  readonly #o: GetReaderOptions;
  readonly #nodeOf: NodeOf;
  readonly #conns = new Map<string, Conn>();
  /** Value buffers, back once the tier has copied them into host memory. */
  readonly #pool = new BufferPool(32, 64 * 1024 * 1024);
  #closed = false;

  constructor(nodeOf: NodeOf, o: GetReaderOptions) {
    this.#nodeOf = nodeOf;
    this.#o = o;
  }

  /** Connections open now. */
  get connections(): number {
    return this.#conns.size;
  }

  /**
   * The value of `key`: a pooled buffer (empty when it is longer than `maxBytes`: read and
   * dropped) with its CRC-32C from byte `crcFrom` on when given (and the addon is loaded), null when there is none, {@link REDIRECT} when ioredis must ask (no node known
   * for the key, `MOVED`, `ASK`). Settles at once when `signal` fires; a deadline's timeout also
   * closes the connection.
   * @throws KvtierError `KVT_BACKEND` when the connection fails or Redis answers an error;
   *   `KVT_CLOSED`; the abort error.
   */
  get(
    key: string,
    maxBytes: number,
    crcFrom: number | undefined,
    signal: AbortSignal | undefined,
  ): Promise<PooledValue | null | typeof REDIRECT> {
    if (this.#closed) return Promise.reject(closedError(`backend ${this.#o.name}`));
    if (signal?.aborted === true)
      return Promise.reject(abortedError(signal, `${this.#o.name} get`));
    const node = this.#nodeOf(key);
    if (node === null) return Promise.resolve(REDIRECT);
    const conn = this.#conn(node);
    if (conn === null) return Promise.resolve(REDIRECT);
    return new Promise((resolve, reject) => {
      let onAbort: (() => void) | undefined;
      let settled = false;
      const p = conn.get(key, maxBytes, crcFrom ?? -1, (v) => {
        settled = true;
        if (onAbort !== undefined) signal!.removeEventListener('abort', onAbort);
        if (v instanceof Error) reject(v);
        else resolve(v);
      });
      if (signal === undefined || settled) return;
      onAbort = () => {
        p.live = false;
        const err = abortedError(signal, `${this.#o.name} get`);
        reject(err);
        if (err.code === 'KVT_TIMEOUT') conn.fail(err);
      };
      signal.addEventListener('abort', onAbort, { once: true });
    });
  }

  /** Ends every connection; calls waiting on them reject with `KVT_CLOSED`. */
  close(): void {
    this.#closed = true;
    const err = closedError(`backend ${this.#o.name}`);
    for (const c of [...this.#conns.values()]) c.fail(err);
  }

  #conn(node: string): Conn | null {
    const had = this.#conns.get(node);
    if (had !== undefined && !had.dead) return had;
    const at = node.lastIndexOf(':');
    const port = Number(node.slice(at + 1));
    if (at <= 0 || !Number.isInteger(port)) return null;
    const host = node.slice(0, at);
    const c = new Conn(host, port, this.#o, this.#pool, (dead) => {
      if (this.#conns.get(node) === dead) this.#conns.delete(node);
    });
    this.#conns.set(node, c);
    return c;
  }
}

/** The node of `key` in a cluster's slot map (ioredis's `slots`: per slot, master first). */
export function clusterNodeOf(slots: () => readonly (readonly string[] | undefined)[]): NodeOf {
  return (key) => slots()[keySlot(key)]?.[0] ?? null;
}
