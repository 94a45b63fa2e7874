/**
 * A kvtier tier whose storage can be made to stall, for the runs that ask what a stuck lower
 * tier costs vLLM's engine step (a disk in D state, a hung NFS mount: faults that cannot be made
 * for real on a test machine). One file per chunk in `path`, like the plug-in starter's store,
 * wrapped in kvtier's StoreBackend; while the file `stallFile` exists every call waits (checked
 * every 20 ms), and an aborted call gives up. Loaded by the sidecar as a `module` tier from this
 * repository's build (dist/).
 */
import { existsSync } from 'node:fs';
import { link, mkdir, readdir, readFile, stat, unlink, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const orMissing = (value) => (err) => (err?.code === 'ENOENT' ? value : Promise.reject(err));

class StallingStore {
  info = { persistent: true, shared: false, evicts: false, ttl: false };
  constructor(path, stallFile) {
    this.path = path;
    this.stallFile = stallFile;
    this.seq = 0;
  }
  async #gate(signal) {
    while (existsSync(this.stallFile)) {
      if (signal?.aborted) throw signal.reason;
      await sleep(20);
    }
  }
  #file(key) {
    return join(this.path, `${key}.kvtc`);
  }
  async get(key, opts = {}) {
    await this.#gate(opts.signal);
    return readFile(this.#file(key)).catch(orMissing(null));
  }
  async has(key, opts = {}) {
    await this.#gate(opts.signal);
    return stat(this.#file(key)).then(() => true, orMissing(false));
  }
  async put(key, value, opts = {}) {
    await this.#gate(opts.signal);
    const file = this.#file(key);
    const tmp = `${file}.${process.pid}.${this.seq++}.tmp`;
    await mkdir(dirname(file), { recursive: true });
    await writeFile(tmp, value);
    try {
      await link(tmp, file);
      return true;
    } catch (err) {
      if (err?.code === 'EEXIST') return false;
      throw err;
    } finally {
      await unlink(tmp).catch(() => {});
    }
  }
  async delete(key, opts = {}) {
    await this.#gate(opts.signal);
    const file = this.#file(key);
    const size = await stat(file).then((s) => s.size, orMissing(false));
    return size === false ? false : unlink(file).then(() => size, orMissing(false));
  }
  async *list(prefix) {
    const none = () => [];
    const spaces = prefix === '' ? await readdir(this.path).catch(none) : [prefix.slice(0, -1)];
    for (const ns of spaces)
      for (const f of await readdir(join(this.path, ns)).catch(none))
        if (f.endsWith('.kvtc')) yield { key: `${ns}/${f.slice(0, -5)}` };
  }
  async close() {}
}

export default async function createBackend(options, ctx) {
  const { StoreBackend } = await import(
    new URL('../../../../dist/src/index.js', import.meta.url).href
  );
  const path = ctx.resolvePath(options.path);
  await mkdir(path, { recursive: true });
  const backend = new StoreBackend(
    new StallingStore(path, ctx.resolvePath(options.stallFile)),
    { kind: 'stalling-store', maxChunkBytes: 64 * 1024 * 1024, log: ctx.log },
    ctx,
  );
  await backend.start();
  return backend;
}
