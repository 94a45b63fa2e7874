import type { KvFile } from './engine-io.ts';
import { fillKv } from './kv-model.ts';

/**
 * The engine's forward pass and load check on its KV file: writes the deterministic model's bytes
 * of computed tokens, and compares a loaded block with what recomputation would have written.
 */
export class KvChecker {
  readonly #kv: KvFile;
  readonly #blockSize: number;
  readonly #expected: Uint8Array;
  readonly #actual: Uint8Array;

  constructor(kv: KvFile, blockSize: number) {
    this.#kv = kv;
    this.#blockSize = blockSize;
    this.#expected = new Uint8Array(kv.blockBytes);
    this.#actual = new Uint8Array(kv.blockBytes);
  }

  /** Writes the KV of prompt positions `[start, end)` into the request's blocks (`blocks[p / blockSize]`). */
  write(hashes: Uint32Array, blocks: readonly number[], start: number, end: number): void {
    const bs = this.#blockSize;
    const bptl = this.#kv.shape.bytesPerTokenPerLayer;
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
    const bs = this.#blockSize;
    const bptl = this.#kv.shape.bytesPerTokenPerLayer;
    for (let layer = 0; layer < this.#kv.shape.numLayers; layer++)
      for (const kind of [0, 1] as const) {
        fillKv(hashes, blockPos * bs, (blockPos + 1) * bs, layer, kind, bptl, this.#expected);
        this.#kv.read(blockId, 2 * layer + kind, this.#actual);
        if (Buffer.compare(this.#expected, this.#actual) !== 0) return layer;
      }
    return -1;
  }
}
