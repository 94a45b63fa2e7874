/**
 * A kvtier storage plug-in over the four-method store (`KvStore`): one file per chunk,
 * `<path>/<ns>/<hash>.kvtc`. kvtier's `StoreBackend` makes it a full tier: it encodes and verifies
 * the stored chunk format (a damaged or misplaced file is a miss, deleted and counted), batches
 * calls, serializes puts of one key, keeps stats and handles close and aborts. `full-backend.ts`
 * is the same store written against the whole `StorageBackend` interface.
 *
 * Config: `{ "name": "dirs", "type": "module", "module": "kvtier-plugin-starter",
 * "options": { "path": "./chunks", "maxChunkBytes": "64MiB" } }`.
 */
import { randomBytes } from 'node:crypto';
import { link, mkdir, readdir, readFile, stat, unlink, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import {
  CHUNK_MAX_PAYLOAD_BYTES,
  closedError,
  type KvStore,
  KvtierError,
  type PluginFactory,
  parseBytes,
  requireInt,
  requireString,
  StoreBackend,
  type StoreKey,
} from 'kvtier';

const code = (err: unknown) => (err as { code?: unknown }).code;
function orMissing<T>(value: T) {
  return (err: unknown) => (code(err) === 'ENOENT' ? value : Promise.reject(err));
}

/** The store: keys are `<ns>/<hash>` (ASCII hex), so a key is a relative file path as it is. */
export class DirStore implements KvStore {
  readonly info = { persistent: true, shared: true, evicts: false, ttl: false };
  #closed = false;
  constructor(readonly path: string) {}

  async get(key: StoreKey): Promise<Uint8Array | null> {
    return readFile(this.#file(key)).catch(orMissing(null));
  }

  async has(key: StoreKey): Promise<boolean> {
    return stat(this.#file(key)).then(() => true, orMissing(false));
  }

  /** A temp file, then `link()`, which fails when the key exists: readers see all or nothing. */
  async put(key: StoreKey, value: Uint8Array): Promise<boolean> {
    const file = this.#file(key);
    const tmp = `${file}.${randomBytes(6).toString('hex')}.tmp`;
    await mkdir(dirname(file), { recursive: true });
    await writeFile(tmp, value);
    try {
      return await link(tmp, file).then(() => true);
    } catch (err) {
      if (code(err) === 'EEXIST') return false;
      throw err;
    } finally {
      await unlink(tmp).catch(() => {});
    }
  }

  /** The bytes removed, or false when there was no file. */
  async delete(key: StoreKey): Promise<number | false> {
    const file = this.#file(key);
    const size = await stat(file).then((s) => s.size, orMissing(false as const));
    return size === false ? false : unlink(file).then(() => size, orMissing(false as const));
  }

  /** Every key under `prefix` (`''` or `<ns>/`): lets the wrapper clear a namespace. */
  async *list(prefix: string): AsyncIterable<{ key: StoreKey }> {
    const none = (): string[] => [];
    if (this.#closed) throw closedError('dir store');
    const spaces = prefix === '' ? await readdir(this.path).catch(none) : [prefix.slice(0, -1)];
    for (const ns of spaces)
      for (const f of await readdir(join(this.path, ns)).catch(none))
        if (f.endsWith('.kvtc')) yield { key: `${ns}/${f.slice(0, -5)}` as StoreKey };
  }

  async close(): Promise<void> {
    this.#closed = true;
  }

  /** The file of `key`; calls after close reject here (`KVT_CLOSED`). */
  #file(key: StoreKey): string {
    if (this.#closed) throw closedError('dir store');
    return join(this.path, `${key}.kvtc`);
  }
}

/** Builds the tier: the plug-in's entry point. */
export const createBackend: PluginFactory = async (options, ctx) => {
  const { path, maxChunkBytes = 64 * 1024 * 1024, ...rest } = options;
  const extra = Object.keys(rest)[0];
  if (extra !== undefined)
    throw new KvtierError('KVT_CONFIG', `unknown option "${extra}" (allowed: path, maxChunkBytes)`);
  const dir = ctx.resolvePath(requireString('path', path, { nonEmpty: true }));
  const bytes = parseBytes('maxChunkBytes', maxChunkBytes);
  const max = requireInt('maxChunkBytes', bytes, 1, CHUNK_MAX_PAYLOAD_BYTES);
  await mkdir(dir, { recursive: true });
  const opts = { kind: 'dir-kv', maxChunkBytes: max, log: ctx.log };
  const backend = new StoreBackend(new DirStore(dir), opts, ctx);
  await backend.start();
  return backend;
};

export default createBackend;
