import type { Chunk, ChunkHash, NamespaceId, StorageBackend } from '../backends/core/types.ts';
import { KvtierError } from '../errors.ts';
import { requireInt } from '../util/validate.ts';

/** Why a write-through was not done. */
export type WriteDropReason = 'queue_full' | 'backend_dropped' | 'backend_error' | 'closed';

export interface WriteThroughOptions {
  /** Most queued chunks; default 1024. */
  maxChunks?: number;
  /** Most queued payload bytes; default 1 GiB. */
  maxBytes?: number;
  /** Puts running at once; default 4. */
  concurrency?: number;
  /** Called once per tier a chunk did not reach. */
  onDrop?: (tier: string, reason: WriteDropReason) => void;
}

export interface WriteJob {
  ns: NamespaceId;
  hash: ChunkHash;
  /** Bytes to write; must stay valid until `done` is called (the caller pins or owns them). */
  chunk: Chunk;
  targets: readonly StorageBackend[];
  /** Called exactly once when the job has left the queue, written or not. */
  done: () => void;
}

const DEFAULTS = { maxChunks: 1024, maxBytes: 1024 ** 3, concurrency: 4 };

/**
 * Bounded write-through queue to the tiers below host memory. Enqueue never waits: a job that
 * does not fit is refused and the caller drops it (stores never wait: design decision 4,
 * docs/architecture.md).
 */
export class WriteThroughQueue<J extends WriteJob = WriteJob> {
  readonly #maxChunks: number;
  readonly #maxBytes: number;
  readonly #concurrency: number;
  readonly #onDrop: (tier: string, reason: WriteDropReason) => void;
  readonly #jobs: J[] = [];
  #head = 0;
  #bytes = 0;
  #active = 0;
  #closed = false;
  #idleWaiters: (() => void)[] = [];
  /** Jobs being written, with the promise that settles when each is done. */
  readonly #running = new Map<J, Promise<void>>();

  constructor(opts: WriteThroughOptions = {}) {
    this.#maxChunks = requireInt('writeThrough.maxChunks', opts.maxChunks ?? DEFAULTS.maxChunks, 1);
    this.#maxBytes = requireInt('writeThrough.maxBytes', opts.maxBytes ?? DEFAULTS.maxBytes, 1);
    this.#concurrency = requireInt(
      'writeThrough.concurrency',
      opts.concurrency ?? DEFAULTS.concurrency,
      1,
      256,
    );
    this.#onDrop = opts.onDrop ?? (() => {});
  }

  /** Jobs waiting plus jobs being written. */
  get depth(): number {
    return this.#jobs.length - this.#head + this.#active;
  }

  /** Payload bytes waiting or being written. */
  get bytes(): number {
    return this.#bytes;
  }

  /**
   * Queues a job; returns false (and calls nothing) when the queue is full or closed, so the
   * caller can count the drop and release what it holds.
   */
  enqueue(job: J): boolean {
    const size = job.chunk.data.length;
    if (this.#closed || this.depth >= this.#maxChunks || this.#bytes + size > this.#maxBytes)
      return false;
    this.#jobs.push(job);
    this.#bytes += size;
    if (this.#active < this.#concurrency) void this.#worker();
    return true;
  }

  /** Resolves when nothing is queued or running. */
  idle(): Promise<void> {
    if (this.depth === 0) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.push(resolve));
  }

  /**
   * Removes the queued (not yet running) jobs that `match` selects, calling each one's `done`
   * (they are not counted as drops: the caller discards them on purpose). Returns how many.
   */
  discard(match: (job: J) => boolean): number {
    const kept: J[] = [];
    const removed: J[] = [];
    for (let i = this.#head; i < this.#jobs.length; i++) {
      const job = this.#jobs[i]!;
      (match(job) ? removed : kept).push(job);
    }
    this.#jobs.length = 0;
    this.#jobs.push(...kept);
    this.#head = 0;
    for (const job of removed) {
      this.#bytes -= job.chunk.data.length;
      job.done();
    }
    if (removed.length > 0 && this.depth === 0) this.#wakeIdle();
    return removed.length;
  }

  /** Resolves when every job that `match` selects among those being written now has finished. */
  async settled(match: (job: J) => boolean): Promise<void> {
    await Promise.all([...this.#running].filter(([job]) => match(job)).map(([, p]) => p));
  }

  /** Stops accepting jobs and waits for the queued ones to be written. */
  async close(): Promise<void> {
    this.#closed = true;
    await this.idle();
  }

  async #worker(): Promise<void> {
    this.#active++;
    try {
      for (let job = this.#next(); job !== undefined; job = this.#next()) {
        const written = this.#write(job);
        this.#running.set(job, written);
        try {
          await written;
        } finally {
          this.#running.delete(job);
          this.#bytes -= job.chunk.data.length;
          job.done();
        }
      }
    } finally {
      this.#active--;
      if (this.depth === 0) this.#wakeIdle();
    }
  }

  #wakeIdle(): void {
    const waiters = this.#idleWaiters;
    this.#idleWaiters = [];
    for (const w of waiters) w();
  }

  #next(): J | undefined {
    if (this.#head >= this.#jobs.length) return undefined;
    const job = this.#jobs[this.#head]!;
    this.#jobs[this.#head] = undefined as unknown as J;
    this.#head++;
    if (this.#head > 1024 && this.#head * 2 > this.#jobs.length) {
      this.#jobs.splice(0, this.#head);
      this.#head = 0;
    }
    return job;
  }

  async #write(job: J): Promise<void> {
    await Promise.all(
      job.targets.map(async (tier) => {
        try {
          const outcome = await tier.put(job.ns, job.hash, job.chunk);
          if (outcome === 'dropped') this.#onDrop(tier.name, 'backend_dropped');
        } catch (err) {
          this.#onDrop(
            tier.name,
            err instanceof KvtierError && err.code === 'KVT_CLOSED' ? 'closed' : 'backend_error',
          );
        }
      }),
    );
  }
}
