/**
 * The plug-in of `index.ts` written against the whole `StorageBackend` interface instead of the
 * four-method store (read `index.ts` first): one directory per namespace, one file per chunk
 * (`<path>/<ns>/<hash>.kvtc`) in kvtier's stored chunk format.
 *
 * - A put writes a temp file and publishes it with `link()`, which fails when the key exists:
 *   a reader sees a whole object or nothing, and concurrent puts of one key leave one copy.
 * - A get reads and verifies the whole object (`decodeChunkObject`): damaged or misplaced bytes
 *   are a miss, removed and counted, never data.
 * - Nothing is evicted and there is no bound, so pins have nothing to protect
 *   (`capabilities.pinning` is false). Several sidecars may share the directory.
 *
 * Config: `{ "name": "dirs", "type": "module", "module": "kvtier-plugin-starter",
 * "options": { "path": "./chunks" } }` (a relative `path` resolves against the config file).
 */
import { randomBytes } from 'node:crypto';
import { link, mkdir, readdir, readFile, rm, stat, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import {
  type BackendCapabilities,
  type BackendHealth,
  type BackendStats,
  CHUNK_MAX_PAYLOAD_BYTES,
  type Chunk,
  type ChunkHash,
  type ContainsOptions,
  chunkObjectBytes,
  closedError,
  decodeChunkObject,
  encodeChunkObject,
  type GetOptions,
  KvtierError,
  type NamespaceId,
  type PluginContext,
  type PluginFactory,
  type PutOptions,
  type PutOutcome,
  parseBytes,
  requireInt,
  requireString,
  type StorageBackend,
} from 'kvtier';

/** Options of {@link DirStoreBackend}, as the config's `options` object gives them. */
export interface DirStoreOptions {
  /** Directory of the store; created if missing. Relative: against the config file's directory. */
  path: string;
  /** Largest payload in bytes (a number or a size string such as "64MiB"); default 64 MiB. */
  maxChunkBytes?: number | string;
}

const ALLOWED = ['path', 'maxChunkBytes'];
const DEFAULT_MAX_CHUNK_BYTES = 64 * 1024 * 1024;
const NS_RE = /^[0-9a-f]{32}$/;

/** Builds the backend for one tier: the plug-in's entry point. */
export const createBackend: PluginFactory = async (options, ctx) => {
  for (const key of Object.keys(options)) {
    if (!ALLOWED.includes(key)) {
      // No tier prefix: kvtier adds `tier "<name>" (module) failed to start: plug-in module ...`.
      throw new KvtierError(
        'KVT_CONFIG',
        `unknown dir-store option "${key}"; allowed: ${ALLOWED.join(', ')}`,
      );
    }
  }
  const path = ctx.resolvePath(requireString('path', options.path, { nonEmpty: true }));
  const rawMax = options.maxChunkBytes ?? DEFAULT_MAX_CHUNK_BYTES;
  const max = typeof rawMax === 'string' ? parseBytes('maxChunkBytes', rawMax) : rawMax;
  const maxChunkBytes = requireInt('maxChunkBytes', max, 1, CHUNK_MAX_PAYLOAD_BYTES);
  return DirStoreBackend.open(path, maxChunkBytes, ctx);
};

export default createBackend;

/** The backend; see the file's comment. */
export class DirStoreBackend implements StorageBackend {
  readonly name: string;
  readonly kind = 'dir-store';
  readonly capabilities: BackendCapabilities;
  readonly path: string;
  readonly #ctx: PluginContext;
  readonly #inflight = new Set<Promise<unknown>>();
  readonly #ioErrors: { inc(labels: { tier: string }): void };
  #chunks = 0;
  #bytes = 0;
  #dropped = 0;
  #corrupt = 0;
  #degraded = false;
  #closing: Promise<void> | undefined;

  private constructor(path: string, maxChunkBytes: number, ctx: PluginContext) {
    this.name = ctx.name;
    this.path = path;
    this.#ctx = ctx;
    this.capabilities = Object.freeze({
      pinning: false,
      hostMemory: false,
      persistent: true,
      shared: true,
      evicts: false,
      maxChunkBytes,
    });
    this.#ioErrors = ctx.metrics.counter({
      name: 'kvtier_dir_store_io_errors_total',
      help: 'I/O errors of dir-store tiers (other than missing files)',
      labelNames: ['tier'],
    });
  }

  /** Creates the directory and counts what it holds. @throws when it cannot be created. */
  static async open(path: string, maxChunkBytes: number, ctx: PluginContext) {
    const b = new DirStoreBackend(path, maxChunkBytes, ctx);
    await mkdir(path, { recursive: true });
    for (const ns of await readdir(path)) {
      if (!NS_RE.test(ns)) continue;
      for (const f of await readdir(join(path, ns))) {
        if (!f.endsWith('.kvtc')) continue;
        b.#chunks++;
        b.#bytes += (await stat(join(path, ns, f))).size;
      }
    }
    ctx.log.info('dir-store opened', { path, chunks: b.#chunks });
    return b;
  }

  async batchedContains(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: ContainsOptions = {},
  ): Promise<number> {
    this.#check(ns, opts.signal, 'contains');
    const probe = async () => {
      let k = 0;
      for (const h of hashes) {
        if (!(await this.#exists(this.#file(ns, h)))) break;
        k++;
      }
      return k;
    };
    return this.#ctx.abort.race(this.#track(probe()), opts.signal, `${this.name} contains`);
  }

  async batchedGet(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: GetOptions = {},
  ): Promise<Map<ChunkHash, Chunk | null>> {
    this.#check(ns, opts.signal, 'get');
    const read = async () => {
      const out = new Map<ChunkHash, Chunk | null>();
      const unique = [...new Set(hashes)];
      const chunks = await Promise.all(unique.map((h) => this.#read(ns, h)));
      for (const [i, h] of unique.entries()) out.set(h, chunks[i] ?? null);
      return out;
    };
    return this.#ctx.abort.race(this.#track(read()), opts.signal, `${this.name} get`);
  }

  async put(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    opts: PutOptions = {},
  ): Promise<PutOutcome> {
    this.#check(ns, opts.signal, 'put');
    if (!Number.isSafeInteger(chunk.tokens) || chunk.tokens < 1 || chunk.data.byteLength < 1) {
      throw new KvtierError('KVT_INVALID_ARGUMENT', 'a chunk needs tokens >= 1 and some bytes');
    }
    if (chunk.data.byteLength > this.capabilities.maxChunkBytes) {
      this.#dropped++;
      return 'dropped';
    }
    // Encoding copies the caller's bytes before the first await, as put must.
    const obj = encodeChunkObject(ns, hash, chunk);
    const write = this.#track(this.#write(ns, hash, obj));
    return this.#ctx.abort.race(write, opts.signal, `${this.name} put`);
  }

  async remove(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    this.#check(ns, undefined, 'remove');
    let n = 0;
    for (const h of new Set(hashes)) if (await this.#unlink(this.#file(ns, h))) n++;
    return n;
  }

  pin(ns: NamespaceId, _hashes: readonly ChunkHash[]): number {
    this.#check(ns, undefined, 'pin');
    return 0; // nothing is evicted: there is nothing for a pin to protect
  }

  unpin(ns: NamespaceId, _hashes: readonly ChunkHash[]): void {
    this.#check(ns, undefined, 'unpin');
  }

  async clear(ns?: NamespaceId): Promise<void> {
    this.#check(ns, undefined, 'clear');
    const spaces = ns === undefined ? await readdir(this.path) : [ns];
    for (const space of spaces) {
      if (!NS_RE.test(space)) continue;
      const dir = join(this.path, space);
      const files = await readdir(dir).catch(() => [] as string[]);
      for (const f of files) {
        if (!f.endsWith('.kvtc')) continue;
        await this.#unlink(join(dir, f));
      }
      await rm(dir, { recursive: true, force: true });
    }
    if (ns === undefined) [this.#chunks, this.#bytes] = [0, 0];
  }

  stats(): BackendStats {
    this.#check(undefined, undefined, 'stats');
    return {
      chunks: this.#chunks,
      bytesUsed: this.#bytes,
      capacityBytes: null,
      pinnedChunks: 0,
      evictions: 0,
      droppedPuts: this.#dropped,
      corruptObjects: this.#corrupt,
    };
  }

  health(): BackendHealth {
    this.#check(undefined, undefined, 'health');
    return this.#degraded ? 'degraded' : 'up';
  }

  close(): Promise<void> {
    this.#closing ??= Promise.allSettled([...this.#inflight]).then(() => {
      this.#ctx.log.info('dir-store closed', { path: this.path });
    });
    return this.#closing;
  }

  #file(ns: NamespaceId, hash: ChunkHash): string {
    return join(this.path, ns, `${hash}.kvtc`);
  }

  /**
   * Closed, a malformed namespace, an aborted signal: each throws its documented error. Hashes
   * need no check: a `ChunkHash` is validated once by kvtier where it enters.
   */
  #check(ns: string | undefined, signal?: AbortSignal, op = '') {
    if (this.#closing !== undefined) throw closedError(`tier "${this.name}"`);
    if (ns !== undefined && !NS_RE.test(ns))
      throw new KvtierError('KVT_INVALID_ARGUMENT', `ns must be 32 lowercase hex digits`);
    this.#ctx.abort.throwIfAborted(signal, `${this.name} ${op}`);
  }

  #track<T>(work: Promise<T>): Promise<T> {
    this.#inflight.add(work);
    const done = () => this.#inflight.delete(work);
    work.then(done, done);
    return work;
  }

  async #write(ns: NamespaceId, hash: ChunkHash, obj: Buffer): Promise<PutOutcome> {
    const dir = join(this.path, ns);
    const tmp = join(dir, `.${hash}.${randomBytes(6).toString('hex')}.tmp`);
    try {
      await mkdir(dir, { recursive: true });
      await writeFile(tmp, obj);
      try {
        await link(tmp, this.#file(ns, hash)); // fails with EEXIST: the first copy stays
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'EEXIST') return 'exists';
        throw err;
      }
      this.#chunks++;
      this.#bytes += obj.byteLength;
      this.#degraded = false;
      return 'stored';
    } catch (err) {
      this.#ioError('put', err);
      this.#dropped++;
      return 'dropped';
    } finally {
      await unlink(tmp).catch(() => {});
    }
  }

  async #read(ns: NamespaceId, hash: ChunkHash): Promise<Chunk | null> {
    const file = this.#file(ns, hash);
    let bytes: Buffer;
    try {
      bytes = await readFile(file);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') this.#ioError('get', err);
      return null;
    }
    this.#degraded = false;
    const r = decodeChunkObject(ns, hash, bytes);
    if (r.ok) return r.chunk;
    this.#corrupt++;
    this.#ctx.log.warn('corrupt chunk object removed', { file, reason: r.reason });
    await this.#unlink(file);
    return null;
  }

  async #exists(file: string): Promise<boolean> {
    try {
      return (await stat(file)).size >= chunkObjectBytes(1);
    } catch {
      return false;
    }
  }

  /** Removes a chunk file; true when this call removed it. */
  async #unlink(file: string): Promise<boolean> {
    let size: number;
    try {
      size = (await stat(file)).size;
      await unlink(file);
    } catch {
      return false;
    }
    this.#chunks = Math.max(0, this.#chunks - 1);
    this.#bytes = Math.max(0, this.#bytes - size);
    return true;
  }

  #ioError(op: string, err: unknown): void {
    this.#degraded = true;
    this.#ioErrors.inc({ tier: this.name });
    this.#ctx.log.warn('dir-store I/O error', { op, err });
  }
}
