/**
 * File deletes kept in order per key: a delete of a chunk's file waits for the previous delete
 * of the same key, and a writer about to rename a new file into place waits for them too, so a
 * late delete can never undo a newer write. A delete of a file already gone is not an error.
 */
import type { LimitFunction } from 'p-limit';
import type { TaskSet } from './chunk-files.ts';
import { type FileSystem, isNotFound } from './file-store.ts';

/** Dependencies of {@link KeyedUnlinks}. */
export interface KeyedUnlinksOptions {
  fs: FileSystem;
  /** The tier's I/O concurrency limit. */
  run: LimitFunction;
  /** Where the deletes are tracked, so that close waits for them. */
  tasks: TaskSet;
  /** A delete that failed for another reason than a missing file. */
  onError: (err: unknown) => void;
}

/** Per-key ordered deletes of a file tier (see the module comment). */
export class KeyedUnlinks {
  readonly #o: KeyedUnlinksOptions;
  readonly #pending = new Map<string, Promise<void>>();

  constructor(opts: KeyedUnlinksOptions) {
    this.#o = opts;
  }

  /** Deletes `path` (the file of `key`) after any earlier delete of `key`. */
  unlink(key: string, path: string): Promise<void> {
    const prev = this.#pending.get(key);
    const p: Promise<void> = (async () => {
      await prev;
      try {
        await this.#o.run(() => this.#o.fs.unlink(path));
      } catch (err) {
        if (!isNotFound(err)) this.#o.onError(err);
      }
    })();
    this.#pending.set(key, p);
    this.#o.tasks.track(p);
    void p.then(() => {
      if (this.#pending.get(key) === p) this.#pending.delete(key);
    });
    return p;
  }

  /** Whether a delete of `key` is under way. */
  has(key: string): boolean {
    return this.#pending.has(key);
  }

  /** Resolves once the deletes of `key` under way now are done. */
  settled(key: string): Promise<void> {
    return this.#pending.get(key) ?? Promise.resolve();
  }

  /** Resolves once every delete under way now is done. */
  async allSettled(): Promise<void> {
    await Promise.all([...this.#pending.values()]);
  }
}
