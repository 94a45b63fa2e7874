/**
 * The epoch across restarts. Clients drop answers whose epoch is below the highest they have
 * seen (docs/protocol.md 4.3), so a restarted sidecar must start above every epoch its
 * predecessor gave out, however many CLEARs it served. The clock alone does not ensure that (a
 * sidecar cleared more times than seconds passed would be succeeded by a lower epoch, and clocks
 * are set back), so the epoch is also kept in a small file: the next start takes the larger of
 * the clock's value and one above the file's.
 */
import { randomBytes } from 'node:crypto';
import { mkdir, open, readFile, rename, unlink } from 'node:fs/promises';
import { dirname } from 'node:path';
import { KvtierError } from '../errors.ts';
import { type Logger, silentLogger } from '../util/log.ts';

/** Epoch values are u32 on the wire; the largest one kvtier gives out. */
export const MAX_EPOCH = 2 ** 32 - 2;

const EPOCH_BASE_MS = Date.UTC(2024, 0, 1);

/** The clock's epoch: whole seconds since 2024-01-01 UTC (never below 0). */
export function clockEpoch(nowMs: number = Date.now()): number {
  return Math.min(MAX_EPOCH, Math.max(0, Math.floor((nowMs - EPOCH_BASE_MS) / 1000)));
}

/** The first epoch of a sidecar whose predecessor last wrote `persisted` (undefined: none). */
export function startEpoch(persisted: number | undefined, nowMs: number = Date.now()): number {
  const clock = clockEpoch(nowMs);
  return persisted === undefined ? clock : Math.min(MAX_EPOCH, Math.max(clock, persisted + 1));
}

/**
 * One epoch file: a decimal number and a newline, replaced atomically (temp file, fsync,
 * rename). Writes are serialised and never lower the value in the file.
 */
export class EpochFile {
  readonly path: string;
  readonly #log: Logger;
  #written = -1;
  #chain: Promise<void> = Promise.resolve();

  constructor(path: string, log: Logger = silentLogger) {
    this.path = path;
    this.#log = log;
  }

  /**
   * The epoch last written, or undefined when there is no file yet.
   * @throws KvtierError `KVT_CONFIG` when the file cannot be read or does not hold an epoch
   *   (serving on would risk epochs going back, so the sidecar does not start).
   */
  async read(): Promise<number | undefined> {
    let text: string;
    try {
      text = await readFile(this.path, 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
      throw new KvtierError(
        'KVT_CONFIG',
        `cannot read the epoch file ${this.path} (storage.epochFile): ${(err as Error).message}`,
        { cause: err },
      );
    }
    const t = text.trim();
    const n = /^\d{1,10}$/.test(t) ? Number(t) : Number.NaN;
    if (!Number.isInteger(n) || n > MAX_EPOCH)
      throw new KvtierError(
        'KVT_CONFIG',
        `the epoch file ${this.path} (storage.epochFile) must hold an epoch (an integer in [0, ${MAX_EPOCH}]), got ${JSON.stringify(t.slice(0, 40))}; remove it to start from the clock's epoch`,
      );
    return n;
  }

  /**
   * Records `epoch` (ignored when not above what was written). Resolves once it is on disk; a
   * failure is logged and resolves too (the epoch in memory is what the sidecar serves).
   */
  write(epoch: number): Promise<void> {
    this.#chain = this.#chain.then(async () => {
      if (epoch <= this.#written) return;
      try {
        await this.#replace(epoch);
        this.#written = epoch;
      } catch (err) {
        this.#log.error('cannot write the epoch file; a restart may reuse epochs', {
          path: this.path,
          epoch,
          err,
        });
      }
    });
    return this.#chain;
  }

  async #replace(epoch: number): Promise<void> {
    // Another process may have written the file since (a sidecar before this one on the same
    // endpoint): never lower it.
    const there = await this.read().catch(() => undefined);
    if (there !== undefined && there >= epoch) return;
    await mkdir(dirname(this.path), { recursive: true });
    const tmp = `${this.path}.${randomBytes(4).toString('hex')}.tmp`;
    const fh = await open(tmp, 'w', 0o644);
    try {
      await fh.writeFile(`${epoch}\n`);
      await fh.sync();
    } finally {
      await fh.close();
    }
    try {
      await rename(tmp, this.path);
    } catch (err) {
      await unlink(tmp).catch(() => {});
      throw err;
    }
  }
}
