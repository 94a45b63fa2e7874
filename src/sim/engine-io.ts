import { closeSync, ftruncateSync, openSync, readSync, writeSync } from 'node:fs';
import {
  type DataPlaneCallOptions,
  DataPlaneClient,
  type DataPlaneClientOptions,
} from '../data-plane/data-plane-client.ts';
import type { KvRegistration } from '../data-plane/kv-layout.ts';
import { abortedError, KvtierError } from '../errors.ts';
import {
  type HashesInput,
  type LookupAnswer,
  type LookupCallOptions,
  LookupClient,
  type LookupClientOptions,
} from '../lookup-client/lookup-client.ts';
import { loadNative } from '../native/native-addon.ts';
import type { TierTokens } from '../protocol/messages.ts';
import type { Sidecar } from '../sidecar.ts';

/**
 * The simulator's I/O pieces: a wake-up signal for the step loop (so an idle engine waits for
 * an event instead of spinning), the real kvtier clients with a thin recording layer (tier
 * breakdown of lookups, bytes and wall time of transfers), and the host-device KV file.
 */

/**
 * A counter the step loop waits on: every settled lookup or transfer bumps it. A waiter that
 * read `seen` before doing its work returns at once if anything happened since.
 */
export class Activity {
  #count = 0;
  #waiters = new Set<() => void>();

  /** Events so far. */
  get count(): number {
    return this.#count;
  }

  /** Records an event and wakes every waiter. */
  bump(): void {
    this.#count++;
    const w = this.#waiters;
    this.#waiters = new Set();
    for (const wake of w) wake();
  }

  /**
   * Resolves when the count moves past `seen`, after `timeoutMs` (when given), or rejects with
   * `KVT_ABORTED` when `signal` aborts. Timers and listeners are removed on the way out.
   */
  async wait(seen: number, opts: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<void> {
    if (this.#count !== seen) return;
    const { signal } = opts;
    if (signal?.aborted) throw abortedError(signal, 'simulation');
    let timer: NodeJS.Timeout | undefined;
    let wake!: () => void;
    let onAbort: (() => void) | undefined;
    try {
      await new Promise<void>((resolve, reject) => {
        wake = resolve;
        this.#waiters.add(wake);
        if (opts.timeoutMs !== undefined)
          timer = setTimeout(resolve, Math.max(0, Math.ceil(opts.timeoutMs)));
        if (signal !== undefined) {
          onAbort = () => reject(abortedError(signal, 'simulation'));
          signal.addEventListener('abort', onAbort, { once: true });
        }
      });
    } finally {
      this.#waiters.delete(wake);
      if (timer !== undefined) clearTimeout(timer);
      if (onAbort !== undefined) signal?.removeEventListener('abort', onAbort);
    }
  }
}

interface LookupRecord {
  deadline: number;
  settled: boolean;
}

/** Options of {@link SimLookupClient}: a `LookupClient`'s, plus the wake-up signal. */
export interface SimLookupClientOptions extends LookupClientOptions {
  activity: Activity;
}

/**
 * A real `LookupClient` that also keeps each answer's tier breakdown (the non-blocking `lookup`
 * the connector calls returns only the hit tokens), counts lookups whose deadline passed before
 * the answer arrived, and bumps the step loop's activity when an answer arrives.
 */
export class SimLookupClient extends LookupClient {
  readonly #activity: Activity;
  readonly #now: () => number;
  readonly #timeoutMs: number;
  readonly #records = new Map<string, LookupRecord>();
  /** Tier breakdown of each answered lookup, by lookup id (in tier order: contiguous chunks). */
  readonly tiersByLookup = new Map<string, TierTokens[]>();
  /** Lookups that returned 0 because their deadline passed first. */
  timedOut = 0;
  /**
   * What the lookups that named the engine's prefill rate decided per tier, over the answers the
   * connector took: lookups that loaded from it, lookups that declined it, and the tokens declined.
   */
  readonly decisions: Record<string, TierDecisionCount> = {};

  constructor(opts: SimLookupClientOptions) {
    super(opts);
    this.#activity = opts.activity;
    this.#now = opts.now ?? Date.now;
    this.#timeoutMs = opts.lookupTimeoutMs ?? 2000;
  }

  /** Lookups sent and not answered yet. */
  get pendingLookups(): number {
    let n = 0;
    for (const r of this.#records.values()) if (!r.settled) n++;
    return n;
  }

  /** Earliest deadline (on this client's clock) of a lookup still waiting, or undefined. */
  nextDeadline(): number | undefined {
    let min: number | undefined;
    for (const r of this.#records.values())
      if (!r.settled && (min === undefined || r.deadline < min)) min = r.deadline;
    return min;
  }

  /** The client's clock (ms), as deadlines are measured. */
  clock(): number {
    return this.#now();
  }

  override lookupAnswer(
    lookupId: string,
    hashes: HashesInput,
    tokenCounts: ArrayLike<number>,
    opts: LookupCallOptions = {},
  ): LookupAnswer | null {
    const answer = super.lookupAnswer(lookupId, hashes, tokenCounts, opts);
    // Counted when the connector takes the answer: a lookup it dropped first counts nowhere,
    // whether or not the sidecar answered it before the CANCEL came.
    if (answer !== null && answer.status === 'ok') this.#count(answer);
    if (answer !== null) {
      const rec = this.#records.get(lookupId);
      if (rec !== undefined && !rec.settled) this.timedOut++;
      this.#records.delete(lookupId);
    }
    return answer;
  }

  #count(a: LookupAnswer): void {
    for (const t of a.tierRates ?? []) {
      if (t.decision === 'none') continue;
      const c = this.decisions[t.tier] ?? { load: 0, decline: 0, declinedTokens: 0 };
      this.decisions[t.tier] = c;
      c[t.decision]++;
      c.declinedTokens += t.declinedTokens;
    }
  }

  override forget(lookupId: string): void {
    this.#records.delete(lookupId);
    super.forget(lookupId);
  }

  override lookupAsync(
    lookupId: string,
    hashes: HashesInput,
    tokenCounts: ArrayLike<number>,
    opts: LookupCallOptions & { signal?: AbortSignal; timeoutMs?: number } = {},
  ): Promise<LookupAnswer> {
    const rec: LookupRecord = { deadline: this.#now() + this.#timeoutMs, settled: false };
    this.#records.set(lookupId, rec);
    const settle = () => {
      rec.settled = true;
      this.#activity.bump();
    };
    return super.lookupAsync(lookupId, hashes, tokenCounts, opts).then(
      (a) => {
        if (a.status === 'ok' && a.hitTokens > 0) this.tiersByLookup.set(lookupId, a.tiers);
        settle();
        return a;
      },
      (err: unknown) => {
        settle();
        throw err;
      },
    );
  }
}

/** What lookups decided about one tier (`SimLookupClient.decisions`). */
export interface TierDecisionCount {
  load: number;
  decline: number;
  declinedTokens: number;
}

/** Options of {@link SimDataPlaneClient}: a `DataPlaneClient`'s, plus what it reports into. */
export interface SimDataPlaneClientOptions extends DataPlaneClientOptions {
  activity: Activity;
  /** Payload bytes of one full chunk, to turn chunk counts into bytes. */
  chunkBytes: number;
  /** Payload bytes of one token (all layers, K and V). */
  tokenBytes: number;
}

/**
 * A real `DataPlaneClient` that measures what moved: bytes saved and loaded (from the replies),
 * each request's load wall time, and bumps the step loop's activity when a transfer settles.
 */
export class SimDataPlaneClient extends DataPlaneClient {
  readonly #activity: Activity;
  readonly #chunkBytes: number;
  readonly #tokenBytes: number;
  bytesSaved = 0;
  bytesLoaded = 0;
  /** Saves and loads sent and not settled. */
  inFlight = 0;
  /** Measured wall time of loads, ms, by engine request id (summed over its loads). */
  readonly loadMsByRequest = new Map<string, number>();

  constructor(opts: SimDataPlaneClientOptions) {
    super(opts);
    this.#activity = opts.activity;
    this.#chunkBytes = opts.chunkBytes;
    this.#tokenBytes = opts.tokenBytes;
  }

  override async save(
    a: Parameters<DataPlaneClient['save']>[0],
    opts: DataPlaneCallOptions = {},
  ): Promise<{ saved: number; skipped: number; dropped: number }> {
    this.inFlight++;
    try {
      const r = await super.save(a, opts);
      this.bytesSaved += r.saved * this.#chunkBytes;
      return r;
    } finally {
      this.inFlight--;
      this.#activity.bump();
    }
  }

  override async load(
    a: Parameters<DataPlaneClient['load']>[0],
    opts: DataPlaneCallOptions = {},
  ): Promise<{ loadedTokens: number; invalidBlockIds: number[] }> {
    const t0 = performance.now();
    this.inFlight++;
    try {
      const r = await super.load(a, opts);
      this.bytesLoaded += r.loadedTokens * this.#tokenBytes;
      return r;
    } finally {
      this.inFlight--;
      const ms = performance.now() - t0;
      this.loadMsByRequest.set(a.requestId, (this.loadMsByRequest.get(a.requestId) ?? 0) + ms);
      this.#activity.bump();
    }
  }
}

/** Largest KV file the engine maps (typed arrays stop at 4 GiB in Node 20). */
const MAX_MAPPED_BYTES = 2 ** 32 - 1;

/** Shape of the host-device KV file. */
export interface KvFileShape {
  numBlocks: number;
  numLayers: number;
  blockSize: number;
  bytesPerTokenPerLayer: number;
}

/**
 * The engine's KV cache on the host device: one file, regions in registration order (layer 0 K,
 * layer 0 V, layer 1 K, ...), each `numBlocks` blocks of `blockSize * bytesPerTokenPerLayer`
 * bytes with no padding. The sidecar maps the same file. The engine maps it too (shared, through
 * the native addon) and reads and writes blocks in place; without the addon it falls back to
 * positional I/O, one system call per block and region.
 */
export class KvFile {
  readonly path: string;
  readonly shape: Readonly<KvFileShape>;
  readonly blockBytes: number;
  readonly regionBytes: number;
  #fd: number | undefined;
  #map: Uint8Array | undefined;
  #words: Uint32Array | undefined;

  /** Creates (or truncates) the file at its full size. */
  constructor(path: string, shape: KvFileShape) {
    this.path = path;
    this.shape = { ...shape };
    this.blockBytes = shape.blockSize * shape.bytesPerTokenPerLayer;
    this.regionBytes = shape.numBlocks * this.blockBytes;
    this.#fd = openSync(path, 'w+');
    const total = 2 * shape.numLayers * this.regionBytes;
    ftruncateSync(this.#fd, total);
    const native = loadNative();
    if (native.addon !== null && total <= MAX_MAPPED_BYTES) {
      const buf = native.addon.mapFile(path, { writable: true });
      this.#map = new Uint8Array(buf);
      if (shape.bytesPerTokenPerLayer % 4 === 0) this.#words = new Uint32Array(buf, 0, total >>> 2);
    }
  }

  /**
   * The mapped file as 32-bit words (region, block and token offsets are whole words when the
   * bytes per token and layer are), or undefined when the file is not mapped.
   */
  words(): Uint32Array | undefined {
    return this.#words;
  }

  /** The registration of this file for `DataPlaneClient.register`. */
  registration(a: {
    engineId: string;
    modelId: string;
    numKvHeads: number;
    headDim: number;
    chunkSize: number;
  }): KvRegistration {
    return {
      engineId: a.engineId,
      device: 'host',
      modelId: a.modelId,
      dtype: 'bf16',
      numKvHeads: a.numKvHeads,
      headDim: a.headDim,
      tpSize: 1,
      tpRank: 0,
      mla: false,
      numBlocks: this.shape.numBlocks,
      blockSize: this.shape.blockSize,
      blockStrideBytes: this.blockBytes,
      bytesPerTokenPerLayer: this.shape.bytesPerTokenPerLayer,
      chunkSize: a.chunkSize,
      layers: Array.from({ length: this.shape.numLayers }, (_, l) => ({
        k: { path: this.path, offsetBytes: 2 * l * this.regionBytes },
        v: { path: this.path, offsetBytes: (2 * l + 1) * this.regionBytes },
      })),
    };
  }

  /** Writes the bytes of tokens starting at `tokenInBlock` of block `blockId`, region `region`. */
  write(blockId: number, region: number, tokenInBlock: number, bytes: Uint8Array): void {
    const at = this.#at(blockId, region, tokenInBlock);
    const fd = this.#open();
    if (this.#map !== undefined) this.#map.set(bytes, at);
    else writeSync(fd, bytes, 0, bytes.length, at);
  }

  /** Reads block `blockId` of region `region` into `out` (`blockBytes` bytes). */
  read(blockId: number, region: number, out: Uint8Array): void {
    const at = this.#at(blockId, region, 0);
    const fd = this.#open();
    if (this.#map !== undefined) {
      out.set(this.#map.subarray(at, at + this.blockBytes));
      return;
    }
    const n = readSync(fd, out, 0, this.blockBytes, at);
    if (n !== this.blockBytes)
      throw new KvtierError('KVT_INTERNAL', `short read of block ${blockId}: ${n} bytes`);
  }

  /** Closes the file (it stays on disk). Idempotent. */
  close(): void {
    if (this.#fd !== undefined) closeSync(this.#fd);
    this.#fd = undefined;
    // The mapping goes with the ArrayBuffer's collection; nothing may touch it after close.
    this.#map = undefined;
    this.#words = undefined;
  }

  #at(blockId: number, region: number, tokenInBlock: number): number {
    return (
      region * this.regionBytes +
      blockId * this.blockBytes +
      tokenInBlock * this.shape.bytesPerTokenPerLayer
    );
  }

  #open(): number {
    if (this.#fd === undefined) throw new KvtierError('KVT_CLOSED', 'KV file is closed');
    return this.#fd;
  }
}

/** Corrupt objects the sidecar's tiers found so far. */
export function corruptOf(s: Sidecar): number {
  return s.storage.tiers.reduce((n, t) => n + (t.stats().corruptObjects ?? 0), 0);
}

/**
 * Runs the capacity sweep of each named tier that has one (the fs backend, under its metrics and
 * breaker decorators), waiting for each.
 */
export async function sweepTiers(s: Sidecar, names: readonly string[]): Promise<void> {
  for (const name of names) {
    let b: unknown = s.storage.tiers.find((t) => t.name === name);
    while (b !== undefined && typeof (b as { sweep?: unknown }).sweep !== 'function')
      b = (b as { inner?: unknown }).inner;
    if (b !== undefined) await (b as { sweep(): Promise<unknown> }).sweep();
  }
}
