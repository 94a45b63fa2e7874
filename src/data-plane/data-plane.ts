import type { ChunkHash } from '../backends/core/types.ts';
import { closedError, KvtierError } from '../errors.ts';
import type { StorageManager } from '../storage-manager/storage-manager.ts';
import type { PinnedLookup, StorageReservation } from '../storage-manager/storage-types.ts';
import { type Logger, silentLogger } from '../util/log.ts';
import { describe, requireInt, requireString } from '../util/validate.ts';
import type { CopyEngine } from './copy-engine-types.ts';
import {
  COPY_GROUP_BYTES,
  COPY_GROUPS_IN_FLIGHT,
  copyChunks,
  defaultLoadGroupsInFlight,
  LOAD_GROUP_BYTES,
  scatterLayerwise,
} from './copy-groups.ts';
import {
  checkHashes,
  hasRepeat,
  loadablePrefix,
  progressWriter,
  saveFence,
  writeLoadState,
} from './data-plane-support.ts';
import type {
  DataPlaneOptions,
  DataPlaneStats,
  LoadRequest,
  LoadResult,
  SaveRequest,
  SaveResult,
} from './data-plane-types.ts';
import {
  cudaDeviceFor,
  type EngineState,
  openSurfaces,
  type RequestState,
} from './engine-state.ts';
import { createFsCopyEngine } from './fs-copy-engine.ts';
import { coverAmong, loadableShards, type ShardChunkCopy, scatterShards } from './head-shards.ts';
import {
  chunkPayloadBytes,
  type KvLayout,
  type KvRegistration,
  layerRegions,
  resolveKvRegistration,
  splitBlocks,
} from './kv-layout.ts';

export type { CopyEngine, CopySurface, DeviceSurface } from './copy-engine-types.ts';
export {
  type DataPlaneOptions,
  type DataPlaneStats,
  LOAD_STATE,
  type LoadRequest,
  type LoadResult,
  type SaveRequest,
  type SaveResult,
} from './data-plane-types.ts';

const DEFAULTS = { heartbeatTimeoutMs: 30_000, sweepIntervalMs: 5000 };

/**
 * The worker-side data plane (design decision 6, docs/architecture.md): engines register their
 * KV caches, saves gather blocks into the CPU tier and write them through, loads scatter pinned
 * chunks into blocks.
 * Pins are released on terminal request end (finished or aborted), never on preemption, and
 * all of an engine's pins and mappings when it goes away.
 */
export class DataPlane {
  readonly #storage: StorageManager;
  readonly #copy: CopyEngine;
  readonly #grouping: { groupBytes: number; inFlight: number };
  readonly #loadGrouping: { groupBytes: number; inFlight: number };
  readonly #now: () => number;
  readonly #monoNs: () => bigint;
  readonly #log: Logger;
  readonly #heartbeatTimeoutMs: number;
  readonly #engines = new Map<string, EngineState>();
  readonly #timer: ReturnType<typeof setInterval> | undefined;
  #saves = 0;
  #loads = 0;
  #lateSaves = 0;
  #cancelledSaves = 0;
  #lateLoads = 0;
  #layerwiseLoads = 0;
  #crossTpLoads = 0;
  #closing: Promise<void> | undefined;

  /** @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options. */
  constructor(opts: DataPlaneOptions) {
    this.#storage = opts.storage;
    this.#copy = opts.copyEngine ?? createFsCopyEngine();
    this.#grouping = {
      groupBytes: requireInt('copyGroupBytes', opts.copyGroupBytes ?? COPY_GROUP_BYTES, 1),
      inFlight: requireInt(
        'copyGroupsInFlight',
        opts.copyGroupsInFlight ?? COPY_GROUPS_IN_FLIGHT,
        1,
        64,
      ),
    };
    this.#loadGrouping = {
      groupBytes: requireInt(
        'loadGroupBytes',
        opts.loadGroupBytes ?? opts.copyGroupBytes ?? LOAD_GROUP_BYTES,
        1,
      ),
      inFlight: requireInt(
        'loadGroupsInFlight',
        opts.loadGroupsInFlight ?? opts.copyGroupsInFlight ?? defaultLoadGroupsInFlight(),
        1,
        64,
      ),
    };
    this.#now = opts.now ?? Date.now;
    this.#monoNs = opts.monotonicNs ?? process.hrtime.bigint;
    this.#log = opts.log ?? silentLogger;
    this.#heartbeatTimeoutMs = requireInt(
      'heartbeatTimeoutMs',
      opts.heartbeatTimeoutMs ?? DEFAULTS.heartbeatTimeoutMs,
      1,
    );
    const every = requireInt(
      'sweepIntervalMs',
      opts.sweepIntervalMs ?? DEFAULTS.sweepIntervalMs,
      0,
    );
    if (every > 0) {
      this.#timer = setInterval(() => void this.sweep(), every);
      this.#timer.unref();
    }
  }

  /**
   * Registers an engine's KV caches: validates, opens every file (or IPC allocation) once and
   * checks each region fits. Re-registering an engine id first releases the old registration.
   * A cuda registration is opened on the device whose UUID it names (`deviceUuid`), found among
   * the copy engine's `cudaDevices()`; without one, on the only device this process sees.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` for a bad registration, an unopenable file, or a
   *   `deviceUuid` this process does not see (or none named while it sees several GPUs);
   *   `KVT_CONFIG` for the cuda device without a CUDA copy engine; `KVT_CLOSED` after close.
   */
  async register(reg: KvRegistration): Promise<KvLayout> {
    this.#open();
    const layout = resolveKvRegistration(reg);
    const cudaDevice = cudaDeviceFor(this.#copy, layout);
    if (this.#engines.has(layout.engineId)) await this.engineGone(layout.engineId);
    const opened = await openSurfaces(this.#copy, layout, cudaDevice);
    try {
      this.#open();
      // A concurrent registration of the same engine won the race: this one replaces it.
      if (this.#engines.has(layout.engineId)) await this.engineGone(layout.engineId);
      this.#engines.set(layout.engineId, {
        layout,
        ...opened,
        requests: new Map(),
        inflight: new Set(),
        lastSeenMs: this.#now(),
        gone: false,
      });
      this.#log.info('kv cache registered', {
        engineId: layout.engineId,
        namespace: layout.namespace.label,
        ...(cudaDevice >= 0 ? { cudaDevice, deviceUuid: layout.deviceUuid } : {}),
      });
      return layout;
    } catch (err) {
      await Promise.all(opened.surfaces.map((s) => s.close()));
      throw err;
    }
  }

  /** The namespace id an engine is registered under, or undefined for an unknown engine. */
  namespaceOf(engineId: string): string | undefined {
    return this.#engines.get(engineId)?.layout.namespace.id;
  }

  /** Records that an engine is alive; returns false for an unknown engine. */
  heartbeat(engineId: string): boolean {
    const eng = this.#engines.get(engineId);
    if (eng !== undefined) eng.lastSeenMs = this.#now();
    return eng !== undefined;
  }

  /**
   * Gathers each chunk not skipped and not already in the CPU tier from every region straight
   * into host memory reserved by the storage manager, then commits it there (indexed, pinned
   * until written through to the lower tiers; no second copy). Resolves when the blocks may be
   * reused. Past `notAfterNs` nothing is copied, and a copy that finishes after it is discarded:
   * the engine may have reused the blocks by then (its chunks count as dropped).
   * @throws KvtierError `KVT_INVALID_ARGUMENT`, `KVT_NOT_FOUND` (engine), `KVT_CLOSED`, or the copy
   *   engine's error (nothing is indexed then).
   */
  async save(req: SaveRequest): Promise<SaveResult> {
    try {
      return await this.#save(req);
    } finally {
      this.#saves++;
    }
  }

  async #save(req: SaveRequest): Promise<SaveResult> {
    const t0 = performance.now();
    const eng = this.#engine(req.engineId);
    const { layout } = eng;
    const hashes = checkHashes(req.chunkHashes, 'save');
    const chunks = splitBlocks(layout, req.blockIds, hashes.length, 'save');
    const skip = requireInt('save.skipChunks', req.skipChunks ?? 0, 0, hashes.length);
    const ns = layout.namespace.id;
    const result: SaveResult = { saved: 0, skipped: skip, dropped: 0 };
    const fence = req.fence === undefined ? undefined : saveFence(this.#copy, eng, req.fence);
    if (this.#late(req.notAfterNs)) {
      this.#lateSaves++;
      result.dropped = hashes.length - skip;
      return result;
    }
    if (fence !== undefined && !(await fence.stands())) {
      this.#cancelledSaves++;
      result.dropped = hashes.length - skip;
      return result;
    }
    const pending: StorageReservation[] = [];
    const pendingIds: Uint32Array[] = [];
    let copyMs = 0;
    try {
      for (let i = skip; i < hashes.length; i++) {
        const ids = chunks[i]!;
        const bytes = chunkPayloadBytes(layout, ids.length);
        const r = this.#storage.reserve(ns, hashes[i]!, bytes, ids.length * layout.blockSize);
        if (r === 'exists') result.skipped++;
        else if (r === 'dropped') result.dropped++;
        else {
          pending.push(r);
          pendingIds.push(ids);
        }
      }
      const copied = await this.#track(
        eng,
        copyChunks(
          this.#copy,
          eng,
          'gather',
          pending.map((r, k) => ({ ids: pendingIds[k]!, payload: r.view })),
          {
            ...this.#grouping,
            ...(req.cudaEvent === undefined ? {} : { copy: { waitEvent: req.cudaEvent } }),
            // Later groups are not started once the engine cancelled (checked without waiting).
            ...(fence === undefined ? {} : { stop: () => fence.cancelledNow() }),
          },
        ),
      );
      if (copied.error !== undefined) throw copied.error;
      copyMs = copied.ms;
    } catch (err) {
      for (const r of pending) r.abort();
      throw err;
    }
    if (this.#late(req.notAfterNs)) {
      for (const r of pending) r.abort();
      this.#lateSaves++;
      result.dropped += pending.length;
      return result;
    }
    // Read after the copy completed: a cancel the engine published before it reused the blocks
    // is seen here whenever the copy could have read reused bytes.
    if (fence !== undefined && !(await fence.stands())) {
      for (const r of pending) r.abort();
      this.#cancelledSaves++;
      result.dropped += pending.length;
      return result;
    }
    for (const r of pending) {
      const outcome = r.commit();
      result[outcome === 'stored' ? 'saved' : outcome === 'exists' ? 'skipped' : 'dropped']++;
    }
    this.#log.debug('save', { ...result, copyMs, ms: performance.now() - t0 });
    return result;
  }

  /**
   * Moves a lookup's pins from the storage manager (where they expire with the pin TTL) to the
   * request, where they last until the request's load or terminal end, or its engine goes away.
   * @returns the number of chunks held, 0 when the lookup is unknown, running or expired.
   */
  holdLookup(engineId: string, requestId: string, lookupId: string): number {
    const eng = this.#engine(engineId);
    const pinned = this.#storage.takeLookup(lookupId);
    if (pinned === undefined) return 0;
    const req = this.#request(eng, requestId);
    const old = req.held.get(lookupId);
    if (old !== undefined) this.#storage.releaseLookup(old);
    req.held.set(lookupId, pinned);
    return pinned.hitChunks;
  }

  /**
   * Scatters the lookup's pinned chunks into the blocks and releases the pins. Chunks are matched
   * by hash against the pinned set; a chunk that is not pinned, gone, malformed, past the deadline
   * or cut short by the request's end, and every chunk after it, are reported in
   * `invalidBlockIds`, never as loaded. The chunks are copied in groups (`copyGroupBytes`, a few in
   * flight); `signal`, `deadlineMs` and `notAfterNs` are checked before each group is started
   * (a group being copied completes). Chunk `i` goes to `blockIds[i * blocksPerChunk ...]`; with
   * `skipBlocks = s` only blocks `s..` of the first chunk are written (to `blockIds[0 ...]`), the
   * later chunks' ranges move down by `s`, and `loadedTokens` counts only written blocks.
   *
   * Completion word: a 4-byte little-endian int32 the engine sets to `LOAD_STATE.PENDING` before
   * asking and polls; kvtier writes `DONE` (every chunk loaded) or `FAILED` (some invalid, or the
   * load was refused) after the last block write, also when the call throws. Either slot
   * `stateSlot` of the registered state file (at byte `4 * stateSlot`, for an engine in another
   * process that maps the file) or element 0 of `stateWord` (in-process; notified when shared).
   * @throws KvtierError `KVT_INVALID_ARGUMENT`, `KVT_NOT_FOUND` (engine), `KVT_CLOSED`.
   */
  async load(req: LoadRequest, opts: { signal?: AbortSignal } = {}): Promise<LoadResult> {
    try {
      return await this.#load(req, opts);
    } finally {
      this.#loads++;
    }
  }

  async #load(req: LoadRequest, opts: { signal?: AbortSignal }): Promise<LoadResult> {
    const t0 = performance.now();
    let eng: EngineState | undefined;
    let result: LoadResult | undefined;
    try {
      eng = this.#engine(req.engineId);
      const lookupId = requireString('load.lookupId', req.lookupId, { nonEmpty: true });
      const hashes = checkHashes(req.chunkHashes, 'load');
      const skip = req.skipBlocks ?? 0;
      const chunks = splitBlocks(eng.layout, req.blockIds, hashes.length, 'load', skip);
      if (hasRepeat(chunks))
        throw new KvtierError('KVT_INVALID_ARGUMENT', 'load.blockIds must not repeat a block');
      if (req.stateSlot !== undefined)
        requireInt('load.stateSlot', req.stateSlot, 0, (eng.layout.stateFile?.slots ?? 0) - 1);
      if (req.progressSlot !== undefined) {
        requireInt(
          'load.progressSlot',
          req.progressSlot,
          0,
          (eng.layout.stateFile?.slots ?? 0) - 1,
        );
        if (req.progressSlot === req.stateSlot)
          throw new KvtierError(
            'KVT_INVALID_ARGUMENT',
            'load.progressSlot must differ from load.stateSlot',
          );
      }
      const state = this.#request(
        eng,
        requireString('load.requestId', req.requestId, { nonEmpty: true }),
      );
      const pinned = state.held.get(lookupId) ?? this.#storage.takeLookup(lookupId);
      state.held.delete(lookupId);
      state.active++;
      try {
        result = await this.#track(
          eng,
          this.#scatter(eng, state, pinned, hashes, chunks, skip, req, opts.signal),
        );
      } finally {
        if (pinned !== undefined) this.#storage.releaseLookup(pinned);
        state.active--;
        if (state.finished && state.active === 0) eng.requests.delete(req.requestId);
      }
      this.#log.debug('load', {
        loadedTokens: result.loadedTokens,
        invalidBlocks: result.invalidBlockIds.length,
        ms: performance.now() - t0,
      });
      return result;
    } finally {
      await writeLoadState(this.#copy, this.#log, eng?.stateSurface, req, result);
    }
  }

  async #scatter(
    eng: EngineState,
    state: RequestState,
    pinned: PinnedLookup | undefined,
    hashes: readonly ChunkHash[],
    chunks: Uint32Array[],
    skipBlocks: number,
    req: LoadRequest,
    signal: AbortSignal | undefined,
  ): Promise<LoadResult> {
    const { deadlineMs, notAfterNs } = req;
    const { layout } = eng;
    const ns = layout.namespace.id;
    const ok = pinned !== undefined && pinned.status === 'ok';
    // A lookup that named other ranks' head shards instead of this rank's namespace: chunks
    // saved at another TP size, assembled head range by head range (head-shards.ts).
    const cover =
      ok && !pinned.namespaces.includes(ns) ? coverAmong(layout, pinned.namespaces) : undefined;
    const ready =
      ok && (cover !== undefined || pinned.namespaces.includes(ns))
        ? new Set(pinned.hashes)
        : new Set<ChunkHash>();
    if (cover !== undefined) {
      const shardItems = await loadableShards(
        (n, h) => this.#storage.hostChunks(n, h),
        layout,
        cover,
        hashes,
        chunks,
        skipBlocks,
        ready,
        this.#log,
      );
      return this.#scatterCover(eng, state, shardItems, chunks, req, signal);
    }
    const wanted = hashes.filter((h) => ready.has(h));
    const found = wanted.length === 0 ? new Map() : await this.#storage.hostChunks(ns, wanted);
    const loadable = loadablePrefix(layout, hashes, chunks, skipBlocks, ready, found, this.#log);
    // Copied in groups, a few in flight; the request's end, its engine going away, the signal,
    // the deadline and the not-after time are checked before each group (a group being copied
    // completes).
    let late = false;
    const stop = () => {
      if (state.finished || eng.gone || signal?.aborted === true) return true;
      if (deadlineMs !== undefined && this.#now() >= deadlineMs) return true;
      late = this.#late(notAfterNs);
      return late;
    };
    const items = loadable.map((c, i) => ({
      ids: chunks[i]!,
      payload: c.data,
      skip: i === 0 ? skipBlocks : 0,
    }));
    let n: number;
    let error: unknown;
    let copyMs: number;
    if (req.progressSlot !== undefined) {
      // Layer by layer: every chunk's layer is in place before the next layer starts, and the
      // engine reads how many layers are in from its state file. All or nothing per chunk.
      this.#layerwiseLoads++;
      const progress = progressWriter(this.#copy, this.#log, eng.stateSurface, req.progressSlot);
      const all = loadable.length === chunks.length;
      const layers = layerRegions(layout).length;
      const r = await scatterLayerwise(this.#copy, eng, items, {
        ...this.#loadGrouping,
        stop,
        // Without every chunk the last layer is never announced (the completion word fails the
        // load): the count stops one short.
        onLayers: (l) => progress.write(l < layers || all ? l : layers - 1),
      });
      await progress.flush();
      n = r.layers === layers ? items.length : 0;
      error = r.error;
      copyMs = r.ms;
    } else {
      const r = await copyChunks(this.#copy, eng, 'scatter', items, {
        ...this.#loadGrouping,
        stop,
      });
      n = r.copied;
      error = r.error;
      copyMs = r.ms;
    }
    if (late) this.#lateLoads++;
    if (error !== undefined)
      this.#log.warn('scatter failed; its chunks reported invalid', { err: error, fromChunk: n });
    this.#log.debug('scatter', {
      chunks: hashes.length,
      copied: n,
      copyMs,
      layerwise: req.progressSlot !== undefined,
    });
    let loadedTokens = 0;
    for (let i = 0; i < n; i++) loadedTokens += chunks[i]!.length * layout.blockSize;
    return { loadedTokens, invalidBlockIds: chunks.slice(n).flatMap((c) => Array.from(c)) };
  }

  /**
   * {@link #scatter} for chunks assembled from other ranks' head shards: copied chunk-wise (a
   * layer-wise load announces every layer once all chunks are in, or one short of that).
   */
  async #scatterCover(
    eng: EngineState,
    state: RequestState,
    items: ShardChunkCopy[],
    chunks: Uint32Array[],
    req: LoadRequest,
    signal: AbortSignal | undefined,
  ): Promise<LoadResult> {
    const { layout } = eng;
    let late = false;
    const stop = () => {
      if (state.finished || eng.gone || signal?.aborted === true) return true;
      if (req.deadlineMs !== undefined && this.#now() >= req.deadlineMs) return true;
      late = this.#late(req.notAfterNs);
      return late;
    };
    this.#crossTpLoads++;
    const r = await scatterShards(this.#copy, eng, items, { ...this.#loadGrouping, stop });
    if (late) this.#lateLoads++;
    if (r.error !== undefined)
      this.#log.warn('scatter failed; its chunks reported invalid', {
        err: r.error,
        fromChunk: r.copied,
      });
    if (req.progressSlot !== undefined) {
      this.#layerwiseLoads++;
      const progress = progressWriter(this.#copy, this.#log, eng.stateSurface, req.progressSlot);
      const layers = layerRegions(layout).length;
      progress.write(r.copied === chunks.length ? layers : layers - 1);
      await progress.flush();
    }
    let loadedTokens = 0;
    for (let i = 0; i < r.copied; i++) loadedTokens += chunks[i]!.length * layout.blockSize;
    return {
      loadedTokens,
      invalidBlockIds: chunks.slice(r.copied).flatMap((c) => Array.from(c)),
    };
  }

  /** Terminal end (finished or aborted): releases the request's held pins and state. In-flight loads stop at the next chunk. */
  requestFinished(engineId: string, requestId: string): void {
    const eng = this.#engines.get(engineId);
    const state = eng?.requests.get(requestId);
    if (eng === undefined || state === undefined) return;
    state.finished = true;
    this.#releaseHeld(state);
    if (state.active === 0) eng.requests.delete(requestId);
  }

  /** Preemption keeps everything: a preempted request asks again and may still load what it holds. */
  requestPreempted(engineId: string, requestId: string): void {
    this.#log.debug('request preempted; pins kept', { engineId, requestId });
  }

  /**
   * Releases every pin and mapping of an engine (disconnect or missed heartbeats). Waits for its
   * in-flight copies before closing mappings. Returns false for an unknown engine.
   */
  async engineGone(engineId: string): Promise<boolean> {
    const eng = this.#engines.get(engineId);
    if (eng === undefined) return false;
    this.#engines.delete(engineId);
    eng.gone = true;
    for (const state of eng.requests.values()) {
      state.finished = true;
      this.#releaseHeld(state);
    }
    await Promise.allSettled([...eng.inflight]);
    eng.requests.clear();
    await Promise.all(eng.surfaces.map((s) => s.close()));
    this.#log.info('engine released', { engineId });
    return true;
  }

  /** Releases engines silent for longer than `heartbeatTimeoutMs`; returns how many. */
  async sweep(): Promise<number> {
    const now = this.#now();
    const stale = [...this.#engines]
      .filter(([, e]) => now - e.lastSeenMs > this.#heartbeatTimeoutMs)
      .map(([id]) => id);
    await Promise.all(stale.map((id) => this.engineGone(id)));
    return stale.length;
  }

  /** The copy engine's own description (kind, CUDA availability), for PING. */
  copyEngineInfo(): Record<string, unknown> {
    return this.#copy.describe?.() ?? { kind: 'custom' };
  }

  /**
   * A JSON-friendly snapshot: engines, request states and held lookups now; SAVEs and LOADs
   * handled (answered or failed) since start, and those cut short by their not-after time
   * (`lateSaves`: nothing stored; `lateLoads`: the chunks from there on invalid).
   */
  stats(): DataPlaneStats {
    let requests = 0;
    let heldLookups = 0;
    for (const e of this.#engines.values()) {
      requests += e.requests.size;
      for (const r of e.requests.values()) heldLookups += r.held.size;
    }
    return {
      engines: this.#engines.size,
      requests,
      heldLookups,
      writeThroughDropped: this.#storage.writeThroughDropped,
      saves: this.#saves,
      loads: this.#loads,
      lateSaves: this.#lateSaves,
      cancelledSaves: this.#cancelledSaves,
      lateLoads: this.#lateLoads,
      layerwiseLoads: this.#layerwiseLoads,
      crossTpLoads: this.#crossTpLoads,
    };
  }

  /** Releases every engine; idempotent. Work after close rejects with `KVT_CLOSED`. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      if (this.#timer !== undefined) clearInterval(this.#timer);
      await Promise.all([...this.#engines.keys()].map((id) => this.engineGone(id)));
    })();
    return this.#closing;
  }

  #open(): void {
    if (this.#closing !== undefined) throw closedError('data plane');
  }

  /** True once the host's monotonic clock is past a not-after time (none: never). */
  #late(notAfterNs: bigint | undefined): boolean {
    return notAfterNs !== undefined && notAfterNs > 0n && this.#monoNs() > notAfterNs;
  }

  #engine(engineId: string): EngineState {
    this.#open();
    const eng = this.#engines.get(engineId);
    if (eng === undefined)
      throw new KvtierError(
        'KVT_NOT_FOUND',
        `engine ${describe(engineId)} has no registered KV cache`,
      );
    eng.lastSeenMs = this.#now();
    return eng;
  }

  #request(eng: EngineState, requestId: string): RequestState {
    let state = eng.requests.get(requestId);
    if (state === undefined) {
      state = { held: new Map(), active: 0, finished: false };
      eng.requests.set(requestId, state);
    }
    return state;
  }

  #releaseHeld(state: RequestState): void {
    for (const p of state.held.values()) this.#storage.releaseLookup(p);
    state.held.clear();
  }

  async #track<T>(eng: EngineState, work: Promise<T>): Promise<T> {
    eng.inflight.add(work);
    try {
      return await work;
    } finally {
      eng.inflight.delete(work);
    }
  }
}
