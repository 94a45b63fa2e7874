/**
 * The data plane's small pieces: request checks and the load completion word (see
 * `DataPlane.load`), kept apart from its save and load paths.
 */
import type { Chunk, ChunkHash } from '../backends/core/types.ts';
import { KvtierError } from '../errors.ts';
import type { Logger } from '../util/log.ts';
import { describe } from '../util/validate.ts';
import type { CopyEngine, DeviceSurface } from './copy-engine-types.ts';
import {
  LOAD_STATE,
  type LoadRequest,
  type LoadResult,
  type SaveFence,
} from './data-plane-types.ts';
import type { EngineState } from './engine-state.ts';
import { chunkPayloadBytes, type KvLayout } from './kv-layout.ts';

/**
 * Sets a load's completion word: `DONE` when every chunk loaded, else `FAILED` (also when the
 * load threw, `result` undefined). In-process `stateWord` (stored and notified), and slot
 * `stateSlot` of the registered state file (written through the copy engine; a failed write is
 * logged, never thrown).
 */
export async function writeLoadState(
  copy: CopyEngine,
  log: Logger,
  file: DeviceSurface | null | undefined,
  req: LoadRequest,
  result: LoadResult | undefined,
): Promise<void> {
  const ok = result !== undefined && result.invalidBlockIds.length === 0;
  const value = ok ? LOAD_STATE.DONE : LOAD_STATE.FAILED;
  if (req.stateWord instanceof Int32Array && req.stateWord.length > 0) {
    Atomics.store(req.stateWord, 0, value);
    if (req.stateWord.buffer instanceof SharedArrayBuffer) Atomics.notify(req.stateWord, 0);
  }
  const slot = req.stateSlot;
  if (file == null || !Number.isInteger(slot) || slot! < 0 || slot! * 4 + 4 > file.sizeBytes)
    return;
  try {
    await writeStateWord(copy, file, slot! * 4, value);
  } catch (err) {
    log.warn('could not write the load state word', { engineId: req.engineId, slot, err });
  }
}

/**
 * Writes the little-endian 32-bit `value` at byte `offset` of a state file: at once into a host
 * mapping, else through the copy engine.
 */
function writeStateWord(
  copy: CopyEngine,
  file: DeviceSurface,
  offset: number,
  value: number,
): void | Promise<void> {
  if (file.writeWord !== undefined) return file.writeWord(offset, value);
  const word = new Uint8Array(4);
  new DataView(word.buffer).setUint32(0, value >>> 0, true);
  return copy.copy([word, file], Float64Array.of(0, 0, 1, offset, 4));
}

/**
 * Writes a layer-wise load's progress (layers in place) to slot `slot` of the state file, one
 * write after another so a later count never lands before an earlier one (`flush` waits for
 * the last). A failed write is logged once, never thrown.
 */
export function progressWriter(
  copy: CopyEngine,
  log: Logger,
  file: DeviceSurface | null,
  slot: number,
): { write(layers: number): void; flush(): Promise<void> } {
  let chain = Promise.resolve();
  let warned = false;
  const failed = (err: unknown) => {
    if (!warned) log.warn('could not write the load progress word', { slot, err });
    warned = true;
  };
  return {
    write(layers) {
      if (file === null) return;
      chain = chain.then(() => writeStateWord(copy, file, slot * 4, layers)).catch(failed);
    },
    flush: () => chain,
  };
}

/** A SAVE's fence word, read from the engine's state file (see `SaveRequest.fence`). */
export interface FenceWord {
  /** Whether the word still holds the ticket (the engine still wants the save). */
  stands(): Promise<boolean>;
  /** True when a read that needs no waiting shows the save cancelled (false when it cannot tell). */
  cancelledNow(): boolean;
}

/**
 * The fence of a SAVE on its engine's state file.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` without a state file, or for a slot past its end.
 */
export function saveFence(copy: CopyEngine, eng: EngineState, fence: SaveFence): FenceWord {
  const file = eng.stateSurface;
  const slots = eng.layout.stateFile?.slots ?? 0;
  if (file === null || !Number.isInteger(fence.slot) || fence.slot < 0 || fence.slot >= slots)
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `save.fenceSlot ${fence.slot} names no slot of the registered state file (${slots} slots)`,
    );
  const offset = fence.slot * 4;
  const ticket = fence.ticket >>> 0;
  return {
    async stands() {
      return (await readStateWord(copy, file, offset)) === ticket;
    },
    cancelledNow() {
      const word = file.readWord?.(offset);
      return word !== undefined && word !== ticket;
    },
  };
}

/** The little-endian u32 at `offset` of a state file: directly where mapped, else by a copy. */
async function readStateWord(
  copy: CopyEngine,
  file: DeviceSurface,
  offset: number,
): Promise<number> {
  const direct = file.readWord?.(offset);
  if (direct !== undefined) return direct;
  const word = new Uint8Array(4);
  await copy.copy([file, word], Float64Array.of(0, offset, 1, 0, 4));
  return new DataView(word.buffer).getUint32(0, true);
}

/** The hashes themselves were validated where they entered (a `ChunkHash` is never re-checked). */
export function checkHashes(hashes: readonly ChunkHash[], what: string): readonly ChunkHash[] {
  if (!Array.isArray(hashes))
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `${what}.chunkHashes must be an array, got ${describe(hashes)}`,
    );
  return hashes;
}

export function hasRepeat(chunks: readonly Uint32Array[]): boolean {
  const seen = new Set<number>();
  for (const c of chunks)
    for (const id of c) {
      if (seen.has(id)) return true;
      seen.add(id);
    }
  return false;
}

/**
 * The chunks a LOAD can copy: every one up to the first that is not pinned (`ready`), gone from
 * host memory (`found`), or does not match the layout for its blocks (logged). Only the first
 * chunk may start with `skipBlocks` blocks the engine already holds.
 */
export function loadablePrefix(
  layout: KvLayout,
  hashes: readonly ChunkHash[],
  chunks: readonly Uint32Array[],
  skipBlocks: number,
  ready: ReadonlySet<ChunkHash>,
  found: ReadonlyMap<ChunkHash, Chunk | null>,
  log: Logger,
): Chunk[] {
  const loadable: Chunk[] = [];
  for (let i = 0; i < hashes.length; i++) {
    const hash = hashes[i]!;
    const chunk = ready.has(hash) ? found.get(hash) : undefined;
    if (chunk == null) break;
    const blocks = (i === 0 ? skipBlocks : 0) + chunks[i]!.length;
    if (
      chunk.tokens !== blocks * layout.blockSize ||
      chunk.data.byteLength !== chunkPayloadBytes(layout, blocks)
    ) {
      log.warn('stored chunk does not match the layout; reported invalid', {
        hash,
        tokens: chunk.tokens,
        bytes: chunk.data.byteLength,
      });
      break;
    }
    loadable.push(chunk);
  }
  return loadable;
}
