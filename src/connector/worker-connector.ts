import type { KvRegistration } from '../data-plane/kv-layout.ts';
import { closedError, KvtierError } from '../errors.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import { requireInt } from '../util/validate.ts';
import type {
  ConnectorMeta,
  FinishedTransfers,
  LoadIntent,
  RequestEndKind,
  SaveIntent,
} from './types.ts';

/**
 * The part of `DataPlaneClient` (src/data-plane/data-plane-client.ts) the worker connector uses;
 * declared structurally so a port can hand in the client it already holds.
 */
export interface WorkerDataPlaneClient {
  register(
    reg: KvRegistration,
  ): Promise<{ engineId: string; namespace: string; chunkSize: number; blockSize: number }>;
  save(a: {
    requestId: string;
    blockIds: readonly number[];
    chunkHashes: Uint8Array | readonly Uint8Array[];
  }): Promise<{ saved: number; skipped: number; dropped: number }>;
  load(a: {
    requestId: string;
    lookupId: string;
    blockIds: readonly number[];
    chunkHashes: Uint8Array | readonly Uint8Array[];
    deadlineMs?: number;
    skipBlocks?: number;
  }): Promise<{ loadedTokens: number; invalidBlockIds: number[] }>;
  requestFinished(requestId: string, kind: RequestEndKind): Promise<boolean>;
  /**
   * UNREGISTER: releases the engine on the sidecar at once. Optional; `close()` calls it before
   * closing the client when present (`DataPlaneClient.close` also sends it itself).
   */
  unregister?(opts?: { signal?: AbortSignal }): Promise<boolean>;
  close(): Promise<void>;
}

/** Options of {@link KvtierWorkerConnector}. */
export interface WorkerConnectorOptions {
  /** Owned: `close()` closes it. Typically `new DataPlaneClient({ endpoint })`. */
  client: WorkerDataPlaneClient;
  /** Deadline of each load, ms after it is sent; chunks not started by then are invalid. Default: the server's. */
  loadTimeoutMs?: number;
  /** How long `close()` waits for the sidecar's answer to UNREGISTER, ms; default 1000. */
  unregisterTimeoutMs?: number;
  log?: Logger;
}

/** What the sidecar answered to `registerKvCaches`. */
export interface WorkerRegistration {
  readonly engineId: string;
  /** Namespace id (32 hex digits) the scheduler connector looks up in. */
  readonly namespace: string;
  readonly chunkSize: number;
  readonly blockSize: number;
}

/** Counters of a worker connector since it started. */
export interface WorkerConnectorStats {
  loadsStarted: number;
  loadsFailed: number;
  savesStarted: number;
  savesFailed: number;
  chunksSaved: number;
  chunksDropped: number;
}

/**
 * Worker side of the kvtier connector (vLLM `KVConnectorBase_V1`, worker role). Loads start in
 * `startLoadKv` and saves in `waitForSave`; neither waits for the sidecar, so the forward pass is
 * never held. Completions surface through `getFinished` and `getBlockIdsWithLoadErrors`, which
 * the engine polls once per step. Transfers are chunk-granular, so the per-layer hooks
 * `saveKvLayer` and `waitForLayerLoad` do nothing.
 */
export class KvtierWorkerConnector {
  readonly #client: WorkerDataPlaneClient;
  readonly #loadTimeoutMs: number | undefined;
  readonly #unregisterTimeoutMs: number;
  readonly #log: Logger;
  readonly #inflight = new Map<string, Set<Promise<void>>>();
  readonly #loading = new Map<string, number>();
  readonly #finishedRecving = new Set<string>();
  readonly #loadErrors = new Set<number>();
  /** Ended requests whose free the scheduler delayed: reported once their transfers are over. */
  readonly #awaitingFree = new Set<string>();
  #pendingSaves: readonly SaveIntent[] = [];
  #registration: WorkerRegistration | undefined;
  #closing: Promise<void> | undefined;
  readonly #stats: WorkerConnectorStats = {
    loadsStarted: 0,
    loadsFailed: 0,
    savesStarted: 0,
    savesFailed: 0,
    chunksSaved: 0,
    chunksDropped: 0,
  };

  /** @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options. */
  constructor(opts: WorkerConnectorOptions) {
    if (typeof opts?.client?.load !== 'function')
      throw new KvtierError('KVT_INVALID_ARGUMENT', 'client must be a DataPlaneClient');
    this.#client = opts.client;
    this.#loadTimeoutMs =
      opts.loadTimeoutMs === undefined
        ? undefined
        : requireInt('loadTimeoutMs', opts.loadTimeoutMs, 1);
    this.#unregisterTimeoutMs = requireInt(
      'unregisterTimeoutMs',
      opts.unregisterTimeoutMs ?? 1000,
      1,
      2 ** 31 - 1,
    );
    this.#log = opts.log ?? silentLogger;
  }

  /** The sidecar's answer to the registration; undefined before `registerKvCaches`. */
  get registration(): WorkerRegistration | undefined {
    return this.#registration;
  }

  /** A snapshot of the counters. */
  stats(): WorkerConnectorStats {
    return { ...this.#stats };
  }

  /**
   * vLLM `register_kv_caches`: registers the worker's KV caches with the sidecar once.
   * @throws KvtierError from the sidecar (`KVT_INVALID_ARGUMENT` for a bad registration), or
   *   `KVT_CLOSED`.
   */
  async registerKvCaches(registration: KvRegistration): Promise<WorkerRegistration> {
    this.#open();
    const r = await this.#client.register(registration);
    this.#registration = Object.freeze({
      engineId: r.engineId,
      namespace: r.namespace,
      chunkSize: r.chunkSize,
      blockSize: r.blockSize,
    });
    return this.#registration;
  }

  /**
   * vLLM `start_load_kv` (with `bind_connector_metadata`): sends this step's releases and loads
   * and keeps its saves for `waitForSave`. Returns at once; a load's outcome arrives later in
   * `getFinished().finishedRecving`, its failed blocks in `getBlockIdsWithLoadErrors()`.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` before `registerKvCaches`; `KVT_CLOSED`.
   */
  startLoadKv(meta: ConnectorMeta): void {
    this.#open();
    if (this.#registration === undefined)
      throw new KvtierError('KVT_INVALID_ARGUMENT', 'startLoadKv before registerKvCaches');
    for (const end of meta.finished) {
      if (end.delayFree) this.#awaitingFree.add(end.requestId);
      // Preemption releases nothing on the sidecar, so it needs no message.
      if (end.kind === 'preempted') continue;
      this.#client.requestFinished(end.requestId, end.kind).catch((err: unknown) => {
        this.#log.warn('request release failed; the pin TTL releases it', {
          requestId: end.requestId,
          err,
        });
      });
    }
    for (const intent of meta.loads) this.#startLoad(intent);
    this.#pendingSaves = meta.saves;
  }

  /** vLLM `wait_for_layer_load`: no-op (loads are chunk-granular and finish before the request is scheduled). */
  waitForLayerLoad(_layerName?: string): void {}

  /** vLLM `save_kv_layer`: no-op (saves gather every layer of a chunk at once in `waitForSave`). */
  saveKvLayer(_layerName?: string): void {}

  /**
   * vLLM `wait_for_save`: sends the saves of the current metadata; call it after the forward
   * pass's KV writes are complete (on a GPU: after the compute stream is synchronized). Does not
   * wait for the sidecar; the blocks stay safe because the scheduler delays the free of requests
   * with saves and `handlePreemptions` waits for saves of preempted ones.
   */
  waitForSave(): void {
    this.#open();
    const saves = this.#pendingSaves;
    this.#pendingSaves = [];
    for (const s of saves) this.#startSave(s);
  }

  /**
   * vLLM `handle_preemptions`: resolves once no save still reads the blocks of these requests,
   * so the engine may reuse them. Never rejects.
   */
  async handlePreemptions(requestIds: Iterable<string>): Promise<void> {
    const work: Promise<void>[] = [];
    for (const id of requestIds) work.push(...(this.#inflight.get(id) ?? []));
    await Promise.allSettled(work);
  }

  /**
   * vLLM `get_finished`: `finishedRecving` holds the requests whose loads settled since the last
   * call (loaded, or failed: see `getBlockIdsWithLoadErrors`); `finishedSending` holds the ended
   * requests whose free the scheduler delayed and that have no transfer left. Each id is
   * reported once. `finishedReqIds` is accepted for parity with vLLM: the ended requests travel
   * in the metadata.
   */
  getFinished(_finishedReqIds?: Iterable<string>): FinishedTransfers {
    const finishedRecving = new Set(this.#finishedRecving);
    this.#finishedRecving.clear();
    const finishedSending = new Set<string>();
    for (const id of this.#awaitingFree) {
      if (this.#inflight.has(id)) continue;
      finishedSending.add(id);
      this.#awaitingFree.delete(id);
    }
    return { finishedSending, finishedRecving };
  }

  /**
   * vLLM `get_block_ids_with_load_errors`: blocks of failed loads reported since the last call
   * (drained). The engine recomputes those requests from their first invalid block.
   */
  getBlockIdsWithLoadErrors(): Set<number> {
    const out = new Set(this.#loadErrors);
    this.#loadErrors.clear();
    return out;
  }

  /** Resolves once every load and save started so far has settled. Never rejects. */
  async whenIdle(): Promise<void> {
    while (this.#inflight.size > 0)
      await Promise.allSettled([...this.#inflight.values()].flatMap((s) => [...s]));
  }

  /**
   * Waits for transfers in flight, unregisters the engine (best effort, waiting at most
   * `unregisterTimeoutMs`: the sidecar releases its pins and KV mappings now rather than after
   * its heartbeat timeout), then closes the client.
   * Never rejects for a failed unregister. Idempotent.
   */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      await this.whenIdle();
      if (this.#registration !== undefined && this.#client.unregister !== undefined) {
        // A plain (ref'd) timer: close must settle even when nothing else keeps Node running,
        // and even for a client that ignores the signal.
        const ac = new AbortController();
        let timer: ReturnType<typeof setTimeout> | undefined;
        const timedOut = new Promise<void>((resolve) => {
          timer = setTimeout(() => {
            ac.abort(new KvtierError('KVT_TIMEOUT', 'unregister got no reply in time'));
            resolve();
          }, this.#unregisterTimeoutMs);
        });
        const sent = this.#client.unregister({ signal: ac.signal }).then(
          () => {},
          (err: unknown) => {
            this.#log.debug('unregister failed; the sidecar releases the engine later', { err });
          },
        );
        try {
          await Promise.race([sent, timedOut]);
        } finally {
          clearTimeout(timer);
        }
      }
      await this.#client.close();
    })();
    return this.#closing;
  }

  #open(): void {
    if (this.#closing !== undefined) throw closedError('worker connector');
  }

  #startLoad(intent: LoadIntent): void {
    this.#stats.loadsStarted++;
    this.#loading.set(intent.requestId, (this.#loading.get(intent.requestId) ?? 0) + 1);
    const work = this.#client
      .load({
        requestId: intent.requestId,
        lookupId: intent.lookupId,
        blockIds: intent.blockIds,
        chunkHashes: intent.chunkHashes,
        ...(this.#loadTimeoutMs === undefined ? {} : { deadlineMs: this.#loadTimeoutMs }),
        ...(intent.skipBlocks ? { skipBlocks: intent.skipBlocks } : {}),
      })
      .then(
        (r) => {
          if (r.invalidBlockIds.length > 0) this.#stats.loadsFailed++;
          for (const b of r.invalidBlockIds) this.#loadErrors.add(b);
        },
        (err: unknown) => {
          // A load that never ran loaded nothing: every block is invalid and gets recomputed.
          this.#stats.loadsFailed++;
          for (const b of intent.blockIds) this.#loadErrors.add(b);
          this.#log.warn('load failed; its blocks are reported invalid', {
            requestId: intent.requestId,
            err,
          });
        },
      )
      .finally(() => {
        const left = (this.#loading.get(intent.requestId) ?? 1) - 1;
        if (left > 0) this.#loading.set(intent.requestId, left);
        else {
          this.#loading.delete(intent.requestId);
          this.#finishedRecving.add(intent.requestId);
        }
      });
    this.#track(intent.requestId, work);
  }

  #startSave(intent: SaveIntent): void {
    this.#stats.savesStarted++;
    const work = this.#client
      .save({
        requestId: intent.requestId,
        blockIds: intent.blockIds,
        chunkHashes: intent.chunkHashes,
      })
      .then(
        (r) => {
          this.#stats.chunksSaved += r.saved;
          this.#stats.chunksDropped += r.dropped;
        },
        (err: unknown) => {
          // A lost save only costs a future hit; the engine's KV is untouched.
          this.#stats.savesFailed++;
          this.#log.warn('save failed', { requestId: intent.requestId, err });
        },
      );
    this.#track(intent.requestId, work);
  }

  #track(requestId: string, work: Promise<void>): void {
    let set = this.#inflight.get(requestId);
    if (set === undefined) {
      set = new Set();
      this.#inflight.set(requestId, set);
    }
    set.add(work);
    const s = set;
    void work.finally(() => {
      s.delete(work);
      if (s.size === 0 && this.#inflight.get(requestId) === s) this.#inflight.delete(requestId);
    });
  }
}
