/**
 * What "acknowledged and durable" means for a chunk written through a sidecar, and the bytes such
 * chunks hold, for the crash-safety test and the soak run.
 *
 * A PUT's reply says the chunk is in host memory and queued for the lower tiers, not that it is
 * on disk. A chunk counts as durably acknowledged once, after its PUT was answered, a checkpoint
 * saw the write-through queue empty (STATS `writeThrough.depth` 0) and the durable tier lost
 * nothing since the previous checkpoint (`kvtier_writethrough_dropped_total` for that tier, every
 * reason, plus its evictions, unchanged). A window in which the tier lost something is not
 * counted (its chunks may be the lost ones); neither are chunks answered after the last
 * checkpoint before a crash.
 */
import { createHash } from 'node:crypto';
import type { ChunkHash } from '../../src/hashing/chunk-hash.ts';
import type { LookupClient } from '../../src/lookup-client/lookup-client.ts';

/** The payload of the chunk `hash` (hex), `bytes` long: a SHA-256 stream, so every byte checks. */
export function chunkBytes(hash: string, bytes: number): Buffer {
  const out = Buffer.allocUnsafe(bytes);
  for (let i = 0, block = 0; i < bytes; block++) {
    const d = createHash('sha256').update(hash).update(String(block)).digest();
    i += d.copy(out, i);
  }
  return out;
}

/** Sum of a Prometheus counter's samples whose labels include `labels` (e.g. `tier="disk"`). */
export function sumCounter(promText: string, name: string, labels: string): number {
  let sum = 0;
  for (const line of promText.split('\n')) {
    if (!line.startsWith(`${name}{`) || !line.includes(labels)) continue;
    sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return sum;
}

/** One chunk written by PUT. */
export interface WrittenChunk {
  ns: string;
  hash: ChunkHash;
  bytes: number;
}

/** Options of {@link DurableLedger}. */
export interface DurableLedgerOptions {
  /** Name of the durable tier in the sidecar's config (its metric label and STATS entry). */
  tier: string;
  /** Bound on the wait for an empty write-through queue at a checkpoint, ms; default 10 000. */
  drainTimeoutMs?: number;
}

/** Tracks which PUTs are durably acknowledged (see the module docs). */
export class DurableLedger {
  /** Durably acknowledged chunks, by `${ns}/${hash}`. */
  readonly confirmed = new Map<string, WrittenChunk>();
  /** Chunks answered but never confirmed (a loss in their window, or a crash first). */
  unconfirmed = 0;
  readonly #tier: string;
  readonly #drainTimeoutMs: number;
  #window: WrittenChunk[] = [];
  #baseline: number | undefined;
  /** Bumped by `crashed()`: a checkpoint that spans a crash decides nothing. */
  #generation = 0;

  constructor(opts: DurableLedgerOptions) {
    this.#tier = opts.tier;
    this.#drainTimeoutMs = opts.drainTimeoutMs ?? 10_000;
  }

  /**
   * Records a PUT answered `stored` (call only once the reply arrived). Not `exists`: that PUT
   * queued no write of its own, and the earlier one may have been lost.
   */
  answered(chunk: WrittenChunk): void {
    this.#window.push(chunk);
  }

  /** The sidecar died: chunks not confirmed yet stay unconfirmed; counters start again. */
  crashed(): void {
    this.unconfirmed += this.#window.length;
    this.#window = [];
    this.#baseline = undefined;
    this.#generation++;
  }

  /**
   * Checkpoint: call with none of the caller's PUTs in flight. Waits (polling STATS) for an empty
   * write-through queue, then confirms the window when the tier lost nothing since the previous
   * checkpoint. Returns false when the queue did not drain in time or the sidecar crashed
   * meanwhile (the window stays open). Throws what the client throws (a dead sidecar).
   */
  async checkpoint(client: LookupClient, metricsUrl: string): Promise<boolean> {
    const generation = this.#generation;
    const until = Date.now() + this.#drainTimeoutMs;
    let stats = await client.stats();
    while (depthOf(stats) > 0) {
      if (Date.now() > until) return false;
      await new Promise((r) => setTimeout(r, 20));
      stats = await client.stats();
    }
    const res = await fetch(metricsUrl);
    const text = await res.text();
    const tier = (stats.tiers as { name: string; evictions?: number }[]).find(
      (t) => t.name === this.#tier,
    );
    const losses =
      sumCounter(text, 'kvtier_writethrough_dropped_total', `tier="${this.#tier}"`) +
      (tier?.evictions ?? 0);
    if (generation !== this.#generation) return false;
    if (this.#baseline !== undefined && losses === this.#baseline) {
      for (const c of this.#window) this.confirmed.set(`${c.ns}/${c.hash}`, c);
    } else this.unconfirmed += this.#window.length;
    this.#window = [];
    this.#baseline = losses;
    return true;
  }
}

function depthOf(stats: Record<string, unknown>): number {
  return (stats.writeThrough as { depth: number }).depth;
}
