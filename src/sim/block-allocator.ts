import { KvtierError } from '../errors.ts';
import { requireInt } from '../util/validate.ts';
import { KeyIndex } from './key-index.ts';

/** Options of {@link BlockAllocator}. */
export interface BlockAllocatorOptions {
  /** GPU KV blocks, an integer >= 1. */
  numBlocks: number;
}

/** Counters of a {@link BlockAllocator}. */
export interface BlockAllocatorStats {
  /** Blocks referenced by at least one request. */
  usedBlocks: number;
  /** Blocks with no reference (cached or empty). */
  freeBlocks: number;
  /** Blocks that carry a prefix-cache key. */
  cachedBlocks: number;
  /** Cached blocks whose key was dropped because the block was reallocated. */
  evictions: number;
}

/**
 * The engine's paged GPU block pool with its own prefix cache (vLLM's `BlockPool`): blocks are
 * reference counted; a full block may carry a content key under which later requests share it;
 * blocks with no reference sit in a free queue, least recently freed first, and keep their key
 * until they are handed out again (LRU eviction of the prefix cache).
 *
 * A block's key is the 64-bit prefix hash at its last token (`kv-model.ts`, two 32-bit lanes):
 * the first 53 bits key a map (a number, not a string: no allocation per block), the other 11 are
 * kept beside the block and compared on every hit, so two prefixes that share 53 bits are never
 * taken for one another.
 */
export class BlockAllocator {
  readonly numBlocks: number;
  readonly #ref: Int32Array;
  /** Free queue as a doubly linked list; index `numBlocks` is the sentinel. */
  readonly #prev: Int32Array;
  readonly #next: Int32Array;
  /** Each block's map key (NaN: none) and the hash's remaining 11 bits. */
  readonly #keyOf: Float64Array;
  readonly #checkOf: Uint16Array;
  readonly #byKey: KeyIndex;
  #free: number;
  #evictions = 0;

  /** @throws KvtierError `KVT_INVALID_ARGUMENT` on a bad block count. */
  constructor(opts: BlockAllocatorOptions) {
    this.numBlocks = requireInt('numBlocks', opts.numBlocks, 1, 1 << 26);
    const n = this.numBlocks;
    this.#ref = new Int32Array(n);
    this.#prev = new Int32Array(n + 1);
    this.#next = new Int32Array(n + 1);
    this.#keyOf = new Float64Array(n).fill(Number.NaN);
    this.#checkOf = new Uint16Array(n);
    this.#byKey = new KeyIndex(n);
    this.#prev[n] = n;
    this.#next[n] = n;
    for (let b = 0; b < n; b++) this.#append(b);
    this.#free = n;
  }

  /** Blocks with no reference (free queue length). */
  get freeBlocks(): number {
    return this.#free;
  }

  /** Cached blocks whose key was dropped because the block was reallocated, so far. */
  get evictions(): number {
    return this.#evictions;
  }

  /** A snapshot of the counters. */
  stats(): BlockAllocatorStats {
    return {
      usedBlocks: this.numBlocks - this.#free,
      freeBlocks: this.#free,
      cachedBlocks: this.#byKey.size,
      evictions: this.#evictions,
    };
  }

  /**
   * The cached blocks holding the longest run of a prompt's first `blocks` blocks of
   * `blockSize` tokens (`hashes`: the prompt's prefix hashes): their ids, not yet referenced.
   */
  findCached(hashes: Uint32Array, blocks: number, blockSize: number): number[] {
    const out: number[] = [];
    for (let j = 0; j < blocks; j++) {
      const p = (j + 1) * blockSize - 1;
      const b = this.#byKey.get(mapKey(hashes, p));
      if (b < 0 || this.#checkOf[b] !== checkBits(hashes, p)) break;
      out.push(b);
    }
    return out;
  }

  /** Whether `touch(hits)` followed by `allocate(n)` would succeed. */
  canAllocate(hits: readonly number[], n: number): boolean {
    let reclaimed = 0;
    for (const b of hits) if (this.#ref[b] === 0) reclaimed++;
    return n <= this.#free - reclaimed;
  }

  /** References cached blocks (prefix-cache hits); a free one leaves the free queue. */
  touch(blocks: readonly number[]): void {
    for (const b of blocks) {
      this.#check(b);
      if (this.#ref[b] === 0) {
        this.#unlink(b);
        this.#free--;
      }
      this.#ref[b]!++;
    }
  }

  /**
   * Takes `n` blocks from the head of the free queue (least recently freed), dropping any cache
   * key they carried. Returns null, taking nothing, when fewer than `n` are free.
   */
  allocate(n: number): number[] | null {
    if (n > this.#free) return null;
    const out: number[] = [];
    const s = this.numBlocks;
    for (let i = 0; i < n; i++) {
      const b = this.#next[s]!;
      this.#unlink(b);
      this.#free--;
      const key = this.#keyOf[b]!;
      if (!Number.isNaN(key)) {
        this.#byKey.delete(key);
        this.#keyOf[b] = Number.NaN;
        this.#evictions++;
      }
      this.#ref[b] = 1;
      out.push(b);
    }
    return out;
  }

  /**
   * Drops one reference on each block. Blocks that reach zero join the free queue in reverse
   * order, so a request's tail blocks (least likely to be shared) are reused first.
   * @throws KvtierError `KVT_INTERNAL` on a block that is not referenced (a double free).
   */
  free(blocks: readonly number[]): void {
    for (let i = blocks.length - 1; i >= 0; i--) {
      const b = blocks[i]!;
      this.#check(b);
      if (this.#ref[b]! <= 0)
        throw new KvtierError('KVT_INTERNAL', `block ${b} freed but not referenced`);
      if (--this.#ref[b]! === 0) {
        this.#append(b);
        this.#free++;
      }
    }
  }

  /**
   * Publishes a full block under the prefix hash at position `lastPos` of `hashes` (its last
   * token); the first block cached under a key keeps it.
   */
  cache(block: number, hashes: Uint32Array, lastPos: number): void {
    this.#check(block);
    const key = mapKey(hashes, lastPos);
    if (!Number.isNaN(this.#keyOf[block]!) || !this.#byKey.setIfAbsent(key, block)) return;
    this.#keyOf[block] = key;
    this.#checkOf[block] = checkBits(hashes, lastPos);
  }

  /** Forgets every cache key (vLLM `reset_prefix_cache`); references are untouched. */
  reset(): void {
    this.#byKey.clear();
    this.#keyOf.fill(Number.NaN);
  }

  #check(b: number): void {
    if (!Number.isInteger(b) || b < 0 || b >= this.numBlocks)
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `block id must be an integer in [0, ${this.numBlocks - 1}], got ${b}`,
      );
  }

  #append(b: number): void {
    const s = this.numBlocks;
    const last = this.#prev[s]!;
    this.#next[last] = b;
    this.#prev[b] = last;
    this.#next[b] = s;
    this.#prev[s] = b;
  }

  #unlink(b: number): void {
    const p = this.#prev[b]!;
    const n = this.#next[b]!;
    this.#next[p] = n;
    this.#prev[n] = p;
  }
}

/** The first 53 bits of the 64-bit prefix hash at `p`, as a number (exact in a double). */
export function mapKey(hashes: Uint32Array, p: number): number {
  return hashes[2 * p]! * 2 ** 21 + (hashes[2 * p + 1]! >>> 11);
}

function checkBits(hashes: Uint32Array, p: number): number {
  return hashes[2 * p + 1]! & 0x7ff;
}
