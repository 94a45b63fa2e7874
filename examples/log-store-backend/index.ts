/**
 * An example kvtier backend plug-in: a log-structured chunk store.
 *
 * Every namespace appends its chunks to rolling segment files `<path>/<ns>.<seq>.seg`, each a
 * plain concatenation of stored chunk objects (docs/storage-format.md). An in-memory index maps
 * (ns, hash) to (segment, offset, length); it is rebuilt at open by scanning the segments, and a
 * torn tail (a crash mid-append) is truncated away. Reads are positional and verify the whole
 * object, so damaged or misplaced bytes are a miss, never data.
 *
 * Load it from a config with `{ "type": "module", "module": "<path to this file>", "options":
 * { "path": "/var/cache/kvtier/log" } }`; see README.md next to this file.
 */
import { type FileHandle, mkdir, open, readdir, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import type {
  BackendCapabilities,
  BackendContext,
  BackendHealth,
  BackendStats,
  Chunk,
  ChunkHash,
  ContainsOptions,
  GetOptions,
  NamespaceId,
  PluginFactory,
  PutOptions,
  PutOutcome,
  StorageBackend,
} from '../../src/backends/core/types.ts';
// A published plug-in imports these from the `kvtier` package instead of by relative path.
import {
  CHUNK_HEADER_BYTES,
  CHUNK_MAX_PAYLOAD_BYTES,
  decodeChunkHeader,
  decodeChunkObject,
  encodeChunkObject,
} from '../../src/backends/format/chunk-format.ts';
import { abortedError, closedError, KvtierError } from '../../src/errors.ts';
import { chunkHashFromBytes } from '../../src/hashing/chunk-hash.ts';
import { parseBytes } from '../../src/util/bytes.ts';
import { createLogger, type Logger } from '../../src/util/log.ts';
import { describe, requireInt, requireString } from '../../src/util/validate.ts';

/** Options of {@link LogStoreBackend}. */
export interface LogStoreOptions {
  /** Directory of the segment files; created (with parents) if missing. One instance per directory. */
  path: string;
  /** Largest chunk payload in bytes; default 256 MiB, at most 2 GiB (the stored format's bound). */
  maxChunkBytes?: number;
  /** A namespace starts a new segment when an append would take its segment past this; default 256 MiB. */
  segmentBytes?: number;
  /**
   * Bound on segment bytes on disk, removed chunks included until `clear` deletes their segments;
   * a put that would pass it is dropped. Default `null`: no bound.
   */
  capacityBytes?: number | null;
  /** Logger; default a JSON logger for component `log-store.<tier name>`. */
  log?: Logger;
}

/** Options after defaults and validation. */
export interface ResolvedLogStoreOptions {
  readonly path: string;
  readonly maxChunkBytes: number;
  readonly segmentBytes: number;
  readonly capacityBytes: number | null;
}

/** Defaults of {@link LogStoreOptions}. */
export const LOG_STORE_DEFAULTS = Object.freeze({
  maxChunkBytes: 256 * 1024 ** 2,
  segmentBytes: 256 * 1024 ** 2,
  capacityBytes: null,
});

const CONFIG_KEYS: readonly string[] = ['path', 'maxChunkBytes', 'segmentBytes', 'capacityBytes'];
const SEGMENT_RE = /^([0-9a-f]{32})\.(\d{8})\.seg$/;

/**
 * Applies defaults and validates.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the bad option and what is allowed.
 */
export function resolveLogStoreOptions(o: LogStoreOptions): ResolvedLogStoreOptions {
  if (typeof o !== 'object' || o === null) {
    throw new KvtierError('KVT_INVALID_ARGUMENT', `options must be an object, got ${describe(o)}`);
  }
  const d = LOG_STORE_DEFAULTS;
  const cap = o.capacityBytes ?? d.capacityBytes;
  return {
    path: requireString('path', o.path, { nonEmpty: true }),
    maxChunkBytes: requireInt(
      'maxChunkBytes',
      o.maxChunkBytes ?? d.maxChunkBytes,
      1,
      CHUNK_MAX_PAYLOAD_BYTES,
    ),
    segmentBytes: requireInt('segmentBytes', o.segmentBytes ?? d.segmentBytes, 1),
    capacityBytes: cap === null ? null : requireInt('capacityBytes', cap, CHUNK_HEADER_BYTES + 1),
  };
}

/**
 * Reads options from a tier's config (`path`; `maxChunkBytes`, `segmentBytes` and
 * `capacityBytes` as integers or size strings such as "256MiB").
 * @throws KvtierError `KVT_CONFIG` naming the bad or unknown option (the host adds the tier).
 */
export function logStoreOptionsFromConfig(raw: Record<string, unknown>): LogStoreOptions {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) {
    throw new KvtierError(
      'KVT_CONFIG',
      `log-store options must be an object, got ${describe(raw)}`,
    );
  }
  try {
    const out: Record<string, unknown> = {};
    for (const [key, v] of Object.entries(raw)) {
      if (!CONFIG_KEYS.includes(key)) {
        throw new KvtierError(
          'KVT_CONFIG',
          `unknown log-store option "${key}"; allowed: ${CONFIG_KEYS.join(', ')}`,
        );
      }
      out[key] = key.endsWith('Bytes') && typeof v === 'string' ? parseBytes(key, v) : v;
    }
    const options = out as unknown as LogStoreOptions;
    resolveLogStoreOptions(options);
    return options;
  } catch (err) {
    const msg = err instanceof Error ? err.message : String(err);
    // No tier prefix: the host adds `tier "<name>" (module) failed to start: plug-in module ...`.
    throw new KvtierError('KVT_CONFIG', msg, { cause: err });
  }
}

/** Stats: the interface's plus the log's own. */
export interface LogStoreStats extends BackendStats {
  readonly corruptObjects: number;
  /** Header + payload bytes of indexed chunks (`bytesUsed` also counts removed, unreclaimed ones). */
  readonly liveBytes: number;
  readonly segments: number;
  /** Bytes of torn tails cut off the segments at open. */
  readonly truncatedBytes: number;
  /** Reads or appends that failed with an I/O error. */
  readonly ioErrors: number;
}

interface Segment {
  readonly path: string;
  readonly fh: FileHandle;
  /** End of the last whole object: where the next append goes. */
  size: number;
  /** Set once `clear` closes it: a read that fails on it is a plain miss, not an I/O error. */
  dropped: boolean;
}

interface Entry {
  readonly seg: Segment;
  readonly offset: number;
  /** Header + payload. */
  readonly length: number;
  pins: number;
}

/** One namespace: its index, its segments (the last is appended to) and its writer queue. */
interface Space {
  readonly ns: NamespaceId;
  readonly entries: Map<ChunkHash, Entry>;
  readonly segments: Segment[];
  nextSeq: number;
  /** Appends and clears of a namespace run one at a time, in call order. */
  tail: Promise<unknown>;
}

/**
 * The log-structured store. Contains is answered from the index; get reads each object at its
 * offset and verifies it; put appends (one writer per namespace, never waiting for room: over
 * `capacityBytes` it drops). `remove` only drops index entries — a removed chunk may reappear
 * after a restart, with bytes that still verify — and `clear` reclaims space by deleting the
 * namespace's segments. Nothing is evicted, so pins only keep count. Not shared: one instance
 * per directory.
 */
export class LogStoreBackend implements StorageBackend {
  readonly name: string;
  readonly kind = 'log-store';
  readonly capabilities: BackendCapabilities;
  readonly options: ResolvedLogStoreOptions;

  readonly #log: Logger;
  readonly #spaces = new Map<NamespaceId, Space>();
  /** Puts being written, by key: a second put of the key waits for the first. */
  readonly #writes = new Map<string, Promise<unknown>>();
  readonly #reads = new Set<Promise<unknown>>();
  #chunks = 0;
  #liveBytes = 0;
  #diskBytes = 0;
  #reservedBytes = 0;
  #pinnedChunks = 0;
  #droppedPuts = 0;
  #corrupt = 0;
  #truncatedBytes = 0;
  #ioErrors = 0;
  #health: BackendHealth = 'up';
  #closing: Promise<void> | null = null;

  /**
   * Opens the store: creates the directory and indexes every segment by scanning its headers
   * (payloads are verified when read). A segment's tail from its first object whose header fails
   * to decode, or that runs past the end of the file, is truncated away.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options; the system error when the
   *   directory or a segment cannot be opened.
   */
  static async open(
    options: LogStoreOptions,
    ctx: BackendContext = { name: 'log-store' },
  ): Promise<LogStoreBackend> {
    const b = new LogStoreBackend(resolveLogStoreOptions(options), ctx, options.log);
    try {
      await b.#load();
    } catch (err) {
      await b.close();
      throw err;
    }
    return b;
  }

  private constructor(o: ResolvedLogStoreOptions, ctx: BackendContext, log: Logger | undefined) {
    this.options = o;
    this.name = ctx.name;
    this.#log = log ?? createLogger(`log-store.${ctx.name}`);
    this.capabilities = Object.freeze({
      pinning: true,
      hostMemory: false,
      persistent: true,
      shared: false,
      evicts: false,
      maxChunkBytes: o.maxChunkBytes,
    });
  }

  async batchedContains(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: ContainsOptions = {},
  ): Promise<number> {
    this.#check(opts.signal, 'contains');
    const entries = this.#spaces.get(ns)?.entries;
    const hits: Entry[] = [];
    for (const h of hashes) {
      const e = entries?.get(h);
      if (e === undefined) break;
      hits.push(e);
    }
    if (opts.pin === true) for (const e of hits) this.#pinEntry(e);
    return hits.length;
  }

  async batchedGet(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: GetOptions = {},
  ): Promise<Map<ChunkHash, Chunk | null>> {
    this.#check(opts.signal, 'get');
    const out = new Map<ChunkHash, Chunk | null>();
    const space = this.#spaces.get(ns);
    const reads: Promise<void>[] = [];
    for (const h of hashes) {
      if (out.has(h)) continue;
      out.set(h, null);
      const e = space?.entries.get(h);
      if (space === undefined || e === undefined) continue;
      reads.push(
        this.#read(space, h, e).then((chunk) => {
          if (chunk !== null) out.set(h, chunk);
        }),
      );
    }
    const all = Promise.all(reads);
    this.#reads.add(all);
    void all.finally(() => this.#reads.delete(all));
    await raceSignal(all, opts.signal, `${this.name} get`);
    return out;
  }

  async put(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    opts: PutOptions = {},
  ): Promise<PutOutcome> {
    this.#check(opts.signal, 'put');
    const key = `${ns}/${hash}`;
    for (;;) {
      const existing = this.#spaces.get(ns)?.entries.get(hash);
      if (existing !== undefined) {
        if (opts.pin === true) this.#pinEntry(existing);
        return 'exists';
      }
      const inflight = this.#writes.get(key);
      if (inflight === undefined) break;
      await raceSignal(inflight, opts.signal, `${this.name} put`);
      this.#check(opts.signal, 'put');
    }
    const n = chunk?.data?.byteLength;
    if (typeof n === 'number' && n > this.options.maxChunkBytes) return this.#drop();
    // Validates the key and chunk (KVT_INVALID_ARGUMENT) and copies the caller's bytes.
    const obj = encodeChunkObject(ns, hash, chunk);
    const cap = this.options.capacityBytes;
    if (cap !== null && this.#diskBytes + this.#reservedBytes + obj.byteLength > cap)
      return this.#drop();
    this.#reservedBytes += obj.byteLength;
    const space = this.#space(ns);
    const write = this.#enqueue(space, () => this.#append(space, hash, obj, opts)).then(
      (outcome) => outcome,
      (err: unknown) => {
        if (opts.signal?.aborted === true) throw err;
        this.#ioFailed('append', err);
        return this.#drop();
      },
    );
    const done: Promise<void> = write.then(noop, noop).then(() => {
      this.#reservedBytes -= obj.byteLength;
      if (this.#writes.get(key) === done) this.#writes.delete(key);
    });
    this.#writes.set(key, done);
    // An aborted caller stops waiting; a write already under way still lands and is indexed.
    return raceSignal(write, opts.signal, `${this.name} put`);
  }

  /** Drops index entries (no I/O): the bytes stay in their segment until `clear`. */
  async remove(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    this.#check(undefined, 'remove');
    const space = this.#spaces.get(ns);
    let removed = 0;
    for (const h of hashes) {
      const e = space?.entries.get(h);
      if (space === undefined || e === undefined) continue;
      this.#forget(space, h, e);
      removed++;
    }
    return removed;
  }

  pin(ns: NamespaceId, hashes: readonly ChunkHash[]): number {
    this.#check(undefined, 'pin');
    const entries = this.#spaces.get(ns)?.entries;
    let pinned = 0;
    for (const h of hashes) {
      const e = entries?.get(h);
      if (e === undefined) continue;
      this.#pinEntry(e);
      pinned++;
    }
    return pinned;
  }

  unpin(ns: NamespaceId, hashes: readonly ChunkHash[]): void {
    this.#check(undefined, 'unpin');
    const entries = this.#spaces.get(ns)?.entries;
    for (const h of hashes) {
      const e = entries?.get(h);
      if (e === undefined || e.pins === 0) continue;
      e.pins--;
      if (e.pins === 0) this.#pinnedChunks--;
    }
  }

  /** Drops the namespace's (or every) index entries and deletes its segment files, after the appends queued before it. */
  async clear(ns?: NamespaceId): Promise<void> {
    this.#check(undefined, 'clear');
    const spaces = ns === undefined ? [...this.#spaces.values()] : [this.#spaces.get(ns)];
    await Promise.all(
      spaces.map((s) => (s === undefined ? undefined : this.#enqueue(s, () => this.#dropSpace(s)))),
    );
  }

  stats(): LogStoreStats {
    this.#check(undefined, 'stats');
    let segments = 0;
    for (const s of this.#spaces.values()) segments += s.segments.length;
    return {
      chunks: this.#chunks,
      bytesUsed: this.#diskBytes,
      capacityBytes: this.options.capacityBytes,
      pinnedChunks: this.#pinnedChunks,
      evictions: 0,
      droppedPuts: this.#droppedPuts,
      corruptObjects: this.#corrupt,
      liveBytes: this.#liveBytes,
      segments,
      truncatedBytes: this.#truncatedBytes,
      ioErrors: this.#ioErrors,
    };
  }

  /** 'degraded' after an I/O error, until the next append or read that succeeds. */
  health(): BackendHealth {
    this.#check(undefined, 'health');
    return this.#health;
  }

  /** Waits for reads and queued appends and clears, then closes the segment files. Files stay. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      await Promise.allSettled([...this.#reads]);
      await Promise.all([...this.#spaces.values()].map((s) => s.tail));
      for (const s of this.#spaces.values()) {
        await Promise.all(s.segments.map((seg) => seg.fh.close().catch(() => {})));
      }
      this.#spaces.clear();
    })();
    return this.#closing;
  }

  async #load(): Promise<void> {
    const dir = this.options.path;
    await mkdir(dir, { recursive: true });
    const found: { ns: NamespaceId; seq: number; name: string }[] = [];
    for (const name of await readdir(dir)) {
      const m = SEGMENT_RE.exec(name);
      if (m !== null) found.push({ ns: m[1]!, seq: Number(m[2]), name });
    }
    found.sort((a, b) => a.seq - b.seq);
    for (const f of found) {
      const space = this.#space(f.ns);
      const seg: Segment = {
        path: join(dir, f.name),
        fh: await open(join(dir, f.name), 'r+'),
        size: 0,
        dropped: false,
      };
      space.segments.push(seg);
      space.nextSeq = Math.max(space.nextSeq, f.seq + 1);
      await this.#scan(space, seg);
    }
    this.#log.info('log store opened', {
      tier: this.name,
      chunks: this.#chunks,
      segments: found.length,
      truncatedBytes: this.#truncatedBytes,
    });
  }

  /** Indexes a segment's objects in order; later copies of a key win (they were appended later). */
  async #scan(space: Space, seg: Segment): Promise<void> {
    const fileBytes = (await seg.fh.stat()).size;
    const header = Buffer.alloc(CHUNK_HEADER_BYTES);
    let pos = 0;
    while (pos + CHUNK_HEADER_BYTES <= fileBytes) {
      await readFully(seg.fh, header, pos);
      // The header's CRC covers the hash, so reading it before the check is safe.
      const hash = chunkHashFromBytes(header, 32);
      const parsed = decodeChunkHeader(space.ns, hash, header);
      if (!parsed.ok) break;
      const length = CHUNK_HEADER_BYTES + parsed.header.payloadBytes;
      if (pos + length > fileBytes) break;
      this.#setEntry(space, hash, { seg, offset: pos, length, pins: 0 });
      pos += length;
    }
    seg.size = pos;
    this.#diskBytes += pos;
    if (pos < fileBytes) {
      await seg.fh.truncate(pos);
      this.#truncatedBytes += fileBytes - pos;
      this.#log.warn('torn segment tail truncated', {
        tier: this.name,
        path: seg.path,
        offset: pos,
        bytes: fileBytes - pos,
      });
    }
  }

  async #append(space: Space, hash: ChunkHash, obj: Buffer, opts: PutOptions): Promise<PutOutcome> {
    // A caller that gave up while queued leaves the queue without writing.
    if (opts.signal?.aborted === true) throw abortedError(opts.signal, `${this.name} put`);
    let seg = space.segments.at(-1);
    if (
      seg === undefined ||
      (seg.size > 0 && seg.size + obj.byteLength > this.options.segmentBytes)
    ) {
      seg = await this.#roll(space);
    }
    const offset = seg.size;
    try {
      await writeFully(seg.fh, obj, offset);
    } catch (err) {
      // Cut a partial object off now, so a restart does not stop its scan there.
      await seg.fh.truncate(offset).catch(() => {});
      throw err;
    }
    seg.size += obj.byteLength;
    this.#diskBytes += obj.byteLength;
    this.#health = 'up';
    const e: Entry = { seg, offset, length: obj.byteLength, pins: 0 };
    this.#setEntry(space, hash, e);
    // A caller that gave up while the write ran would never release the pin.
    if (opts.pin === true && !isAborted(opts.signal)) this.#pinEntry(e);
    return 'stored';
  }

  async #roll(space: Space): Promise<Segment> {
    const name = `${space.ns}.${String(space.nextSeq++).padStart(8, '0')}.seg`;
    const path = join(this.options.path, name);
    const seg: Segment = { path, fh: await open(path, 'wx+'), size: 0, dropped: false };
    space.segments.push(seg);
    return seg;
  }

  async #read(space: Space, hash: ChunkHash, e: Entry): Promise<Chunk | null> {
    let obj: Buffer;
    try {
      const buf = Buffer.allocUnsafe(e.length);
      obj = buf.subarray(0, await readFully(e.seg.fh, buf, e.offset));
    } catch (err) {
      if (!e.seg.dropped) this.#ioFailed('read', err);
      return null;
    }
    const decoded = decodeChunkObject(space.ns, hash, obj);
    if (decoded.ok) {
      this.#health = 'up';
      return decoded.chunk;
    }
    this.#corrupt++;
    this.#log.warn('corrupt object dropped from the index', {
      tier: this.name,
      path: e.seg.path,
      offset: e.offset,
      reason: decoded.reason,
    });
    if (space.entries.get(hash) === e) this.#forget(space, hash, e);
    return null;
  }

  async #dropSpace(space: Space): Promise<void> {
    for (const [h, e] of [...space.entries]) this.#forget(space, h, e);
    for (const seg of space.segments.splice(0)) {
      seg.dropped = true;
      this.#diskBytes -= seg.size;
      await seg.fh.close().catch(() => {});
      await unlink(seg.path).catch((err: unknown) => {
        if ((err as { code?: unknown }).code !== 'ENOENT') this.#ioFailed('unlink', err);
      });
    }
  }

  #enqueue<T>(space: Space, job: () => Promise<T>): Promise<T> {
    const run = space.tail.then(job);
    space.tail = run.catch(() => {});
    return run;
  }

  #space(ns: NamespaceId): Space {
    let s = this.#spaces.get(ns);
    if (s === undefined) {
      s = { ns, entries: new Map(), segments: [], nextSeq: 0, tail: Promise.resolve() };
      this.#spaces.set(ns, s);
    }
    return s;
  }

  #setEntry(space: Space, hash: ChunkHash, e: Entry): void {
    const old = space.entries.get(hash);
    if (old !== undefined) this.#forget(space, hash, old);
    space.entries.set(hash, e);
    this.#chunks++;
    this.#liveBytes += e.length;
  }

  #forget(space: Space, hash: ChunkHash, e: Entry): void {
    space.entries.delete(hash);
    this.#chunks--;
    this.#liveBytes -= e.length;
    if (e.pins > 0) this.#pinnedChunks--;
  }

  #pinEntry(e: Entry): void {
    if (e.pins === 0) this.#pinnedChunks++;
    e.pins++;
  }

  #drop(): 'dropped' {
    this.#droppedPuts++;
    return 'dropped';
  }

  #ioFailed(op: string, err: unknown): void {
    this.#ioErrors++;
    this.#health = 'degraded';
    this.#log.warn(`log store ${op} failed`, { tier: this.name, err });
  }

  #check(signal: AbortSignal | undefined, op: string): void {
    if (this.#closing !== null) throw closedError(`backend ${this.name}`);
    if (signal?.aborted === true) throw abortedError(signal, `${this.name} ${op}`);
  }
}

function noop(): void {}

/** Read through a call, so a check made before an `await` does not narrow it. */
function isAborted(signal: AbortSignal | undefined): boolean {
  return signal?.aborted === true;
}

/** Positional read until `buf` is full or the file ends; returns the bytes read. */
async function readFully(fh: FileHandle, buf: Buffer, position: number): Promise<number> {
  let filled = 0;
  while (filled < buf.byteLength) {
    const { bytesRead } = await fh.read(buf, filled, buf.byteLength - filled, position + filled);
    if (bytesRead === 0) break;
    filled += bytesRead;
  }
  return filled;
}

async function writeFully(fh: FileHandle, buf: Buffer, position: number): Promise<void> {
  let done = 0;
  while (done < buf.byteLength) {
    const { bytesWritten } = await fh.write(buf, done, buf.byteLength - done, position + done);
    if (bytesWritten <= 0) throw new KvtierError('KVT_BACKEND', 'segment write made no progress');
    done += bytesWritten;
  }
}

/** `p`, or a rejection with the abort error as soon as `signal` fires (`p` keeps running). */
function raceSignal<T>(p: Promise<T>, signal: AbortSignal | undefined, what: string): Promise<T> {
  if (signal === undefined) return p;
  if (signal.aborted) {
    p.catch(() => {});
    return Promise.reject(abortedError(signal, what));
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(abortedError(signal, what));
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}

/**
 * The plug-in's factory, as kvtier's `module` tier type looks it up: validates the tier's
 * `options` and opens the store.
 * @throws KvtierError `KVT_CONFIG` on bad options; the system error when the directory cannot be used.
 */
export const createBackend: PluginFactory = async (options, ctx) => {
  const o = logStoreOptionsFromConfig(options);
  // A relative path resolves against the config file's directory; logs follow its logLevel.
  return LogStoreBackend.open({ ...o, path: ctx.resolvePath(o.path), log: ctx.log }, ctx);
};
