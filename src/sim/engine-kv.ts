import type { KvFile } from './engine-io.ts';
import type { Req, SchedulerCounters } from './engine-scheduler-types.ts';
import { fillKv, fillKvWords, kvWordsEqual } from './kv-model.ts';

/**
 * The engine's forward pass and load check on its KV file: writes the deterministic model's bytes
 * of computed tokens, and compares a loaded block with what recomputation would have written.
 */
export class KvChecker {
  readonly #kv: KvFile;
  /** Tokens per engine block. */
  readonly blockSize: number;
  readonly #expected: Uint8Array;
  readonly #actual: Uint8Array;

  constructor(kv: KvFile, blockSize: number) {
    this.#kv = kv;
    this.blockSize = blockSize;
    this.#expected = new Uint8Array(kv.blockBytes);
    this.#actual = new Uint8Array(kv.blockBytes);
  }

  /** Word offset of token `tokenInBlock` of block `blockId` in region `region` of the file. */
  #wordAt(blockId: number, region: number, tokenInBlock: number): number {
    const k = this.#kv;
    return (
      (region * k.regionBytes +
        blockId * k.blockBytes +
        tokenInBlock * k.shape.bytesPerTokenPerLayer) >>>
      2
    );
  }

  /** Writes the KV of prompt positions `[start, end)` into the request's blocks (`blocks[p / blockSize]`). */
  write(hashes: Uint32Array, blocks: readonly number[], start: number, end: number): void {
    const bs = this.blockSize;
    const bptl = this.#kv.shape.bytesPerTokenPerLayer;
    const w32 = this.#kv.words();
    if (w32 !== undefined) {
      // Straight into the mapped file, a word at a time: no copy, no view per call.
      const words = bptl >>> 2;
      for (let p = start; p < end; ) {
        const j = Math.floor(p / bs);
        const stop = Math.min(end, (j + 1) * bs);
        for (let region = 0; region < 2 * this.#kv.shape.numLayers; region++) {
          const at = this.#wordAt(blocks[j]!, region, p - j * bs);
          fillKvWords(hashes, p, stop, region >> 1, (region & 1) as 0 | 1, words, w32, at);
        }
        p = stop;
      }
      return;
    }
    for (let p = start; p < end; ) {
      const j = Math.floor(p / bs);
      const stop = Math.min(end, (j + 1) * bs);
      const out = this.#expected.subarray(0, (stop - p) * bptl);
      for (let layer = 0; layer < this.#kv.shape.numLayers; layer++)
        for (const kind of [0, 1] as const) {
          fillKv(hashes, p, stop, layer, kind, bptl, out);
          this.#kv.write(blocks[j]!, 2 * layer + kind, p - j * bs, out);
        }
      p = stop;
    }
  }

  /**
   * Checks block `blockId` against positions of block `blockPos` of the prompt: returns -1 when
   * every layer's K and V are byte-exact, else the first layer that differs.
   */
  verify(hashes: Uint32Array, blockPos: number, blockId: number): number {
    const bs = this.blockSize;
    const bptl = this.#kv.shape.bytesPerTokenPerLayer;
    const w32 = this.#kv.words();
    if (w32 !== undefined) {
      for (let region = 0; region < 2 * this.#kv.shape.numLayers; region++) {
        const at = this.#wordAt(blockId, region, 0);
        const ok = kvWordsEqual(
          hashes,
          blockPos * bs,
          (blockPos + 1) * bs,
          region >> 1,
          (region & 1) as 0 | 1,
          bptl >>> 2,
          w32,
          at,
        );
        if (!ok) return region >> 1;
      }
      return -1;
    }
    for (let layer = 0; layer < this.#kv.shape.numLayers; layer++)
      for (const kind of [0, 1] as const) {
        fillKv(hashes, blockPos * bs, (blockPos + 1) * bs, layer, kind, bptl, this.#expected);
        this.#kv.read(blockId, 2 * layer + kind, this.#actual);
        if (Buffer.compare(this.#expected, this.#actual) !== 0) return layer;
      }
    return -1;
  }
}

/** Mismatches listed in a report; the rest are only counted. */
const MAX_MISMATCHES = 20;

/**
 * Settles the blocks of a load: the blocks before the first one the worker reported invalid are
 * valid (each removed from `pendingInvalid`), and each valid block is verified against
 * recomputation (counted as verified or mismatched). Returns the number of valid blocks.
 */
export function verifyLoad(
  checker: KvChecker | undefined,
  c: SchedulerCounters,
  r: Req,
  load: { firstToken: number; blocks: readonly number[] },
  pendingInvalid: Set<number>,
): number {
  let valid = load.blocks.length;
  for (let i = 0; i < load.blocks.length; i++) {
    if (pendingInvalid.has(load.blocks[i]!)) {
      valid = Math.min(valid, i);
      pendingInvalid.delete(load.blocks[i]!);
    }
  }
  if (checker === undefined) return valid;
  const firstBlock = load.firstToken / checker.blockSize;
  for (let i = 0; i < valid; i++) {
    const layer = checker.verify(r.hashes, firstBlock + i, load.blocks[i]!);
    if (layer < 0) c.verifiedBlocks++;
    else {
      c.mismatchedBlocks++;
      if (c.mismatches.length < MAX_MISMATCHES)
        c.mismatches.push({ requestId: r.id, block: firstBlock + i, layer });
    }
  }
  return valid;
}
