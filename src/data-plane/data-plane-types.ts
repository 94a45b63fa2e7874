/** The data plane's options and the requests and results of its saves and loads. */
import type { ChunkHash } from '../backends/core/types.ts';
import type { StorageManager } from '../storage-manager/storage-manager.ts';
import type { Logger } from '../util/log.ts';
import type { CopyEngine } from './copy-engine-types.ts';

/** Values of a load's completion word: the engine zeroes it before asking, kvtier writes the outcome. */
export const LOAD_STATE = Object.freeze({ PENDING: 0, DONE: 1, FAILED: 2 });

/** Options of {@link DataPlane}. */
export interface DataPlaneOptions {
  /** Not owned: the data plane neither starts nor closes it. */
  storage: StorageManager;
  /** Default: {@link createFsCopyEngine}. */
  copyEngine?: CopyEngine;
  /** An engine silent this long (no heartbeat or call) is treated as gone; default 30 000 ms. */
  heartbeatTimeoutMs?: number;
  /** How often silent engines are swept, ms; 0 disables the timer (call `sweep()`); default 5000. */
  sweepIntervalMs?: number;
  /** Clock for heartbeats and load deadlines (ms); default Date.now. */
  now?: () => number;
  /**
   * Payload bytes of one copy batch: a save or load copies consecutive chunks in groups of up
   * to this many bytes (a larger chunk alone); default 128 MiB. A load checks its request's end,
   * its signal and its deadline before each group.
   */
  copyGroupBytes?: number;
  /** Copy groups of one save in flight at once; 1..64, default 2. */
  copyGroupsInFlight?: number;
  /**
   * Payload bytes of one copy group of a load; default `copyGroupBytes` when that is given,
   * else 32 MiB. Loads keep more, smaller groups in flight than saves (`LOAD_GROUP_BYTES`).
   */
  loadGroupBytes?: number;
  /**
   * Copy groups of one load in flight at once, 1..64; default `copyGroupsInFlight` when that is
   * given, else half the libuv pool, 2..8 (`defaultLoadGroupsInFlight`).
   */
  loadGroupsInFlight?: number;
  /**
   * The host's monotonic clock in ns (`CLOCK_MONOTONIC`), which SAVE and LOAD not-after times
   * are read on; default `process.hrtime.bigint`.
   */
  monotonicNs?: () => bigint;
  log?: Logger;
}

/** A save after a forward pass: the blocks of the chunks to gather. */
export interface SaveRequest {
  engineId: string;
  requestId: string;
  /** Blocks of the chunks, in order: chunk i owns blockIds[i * blocksPerChunk ...]. */
  blockIds: ArrayLike<number>;
  chunkHashes: readonly ChunkHash[];
  /** Leading chunks the engine knows are stored; default 0. */
  skipChunks?: number;
  /**
   * On the `monotonicNs` clock: a copy that finishes later is discarded (its chunks count as
   * dropped) and none starts past it. Default: none.
   */
  notAfterNs?: bigint;
  /**
   * A CUDA interprocess event handle (64 bytes) the engine recorded after writing the blocks:
   * the device-to-host copies wait for it on the GPU (engines without CUDA ignore it).
   */
  cudaEvent?: Uint8Array;
  /**
   * A save fence: the save stands while slot `slot` of the engine's registered state file holds
   * `ticket`. Nothing is copied when the word differs before the copy, and nothing is stored
   * when it differs after it (the engine cancelled the save and may have reused the blocks).
   */
  fence?: SaveFence;
}

/** See {@link SaveRequest.fence}. */
export interface SaveFence {
  slot: number;
  ticket: number;
}

/** Chunk counts of a save; they add up to the number of chunk hashes. */
export interface SaveResult {
  saved: number;
  /** Skipped by request or already in the CPU tier. */
  skipped: number;
  /** No room in the CPU tier (counted there), or cleared by a CLEAR that ran during the copy. */
  dropped: number;
}

/** A load before a forward pass: pinned chunks to scatter into the blocks. */
export interface LoadRequest {
  engineId: string;
  requestId: string;
  /** The lookup whose pins cover the chunks (held by `holdLookup` or still in the storage manager). */
  lookupId: string;
  /**
   * Destination blocks, aligned with the chunks like {@link SaveRequest.blockIds}, less the
   * `skipBlocks` leading blocks of the first chunk.
   */
  blockIds: ArrayLike<number>;
  chunkHashes: readonly ChunkHash[];
  /**
   * Leading blocks of the first chunk the engine already holds (its prefix cache ended inside
   * that chunk): they are not written and not in `blockIds`. 0..blocksPerChunk-1; default 0.
   */
  skipBlocks?: number;
  /** Chunks not started by this time (on the `now` clock, ms) are reported invalid. */
  deadlineMs?: number;
  /** Chunks not started by this time (on the `monotonicNs` clock) are reported invalid. */
  notAfterNs?: bigint;
  /** Slot of the registered state file to set to DONE or FAILED. */
  stateSlot?: number;
  /**
   * A layer-wise load: the chunks are copied layer by layer (every chunk's first layer, then the
   * next, ...) and slot `progressSlot` of the registered state file is set to the number of
   * leading layers in place after each, so the engine computes a layer while later ones load.
   * The slot ends at the layer count only when every chunk loaded; a load cut short leaves it
   * where it stopped (the completion word says FAILED and every block is invalid).
   */
  progressSlot?: number;
  /** In-process completion word (element 0), set with `Atomics.store` and notified. */
  stateWord?: Int32Array;
}

/** The reply to a load (vLLM's load-failure recovery reads `invalidBlockIds`). */
export interface LoadResult {
  loadedTokens: number;
  /** Blocks not written with valid KV: those of the first chunk that failed and every later chunk. */
  invalidBlockIds: number[];
}

/** {@link DataPlane.stats}: a JSON-friendly snapshot of the data plane. */
export interface DataPlaneStats {
  /** Engines registered now. */
  engines: number;
  /** Requests with state (held lookups or loads under way) now. */
  requests: number;
  /** Lookups held for a later LOAD now. */
  heldLookups: number;
  /** Chunks the write-through to lower tiers dropped since start. */
  writeThroughDropped: number;
  /** SAVEs handled (answered or failed) since start. */
  saves: number;
  /** LOADs handled since start. */
  loads: number;
  /** SAVEs cut short by their not-after time (nothing stored). */
  lateSaves: number;
  /** SAVEs their engine cancelled through the save fence before they were stored (nothing stored). */
  cancelledSaves: number;
  /** LOADs cut short by their not-after time (the chunks from there on invalid). */
  lateLoads: number;
  /** LOADs copied layer by layer (`progressSlot`). */
  layerwiseLoads: number;
  /** LOADs assembled from chunks saved at another TP size (other ranks' head shards). */
  crossTpLoads: number;
}
