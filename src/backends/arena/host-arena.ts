import { KvtierError } from '../../errors.ts';
import { describe, requireInt } from '../../util/validate.ts';

/** Largest slab: Node typed arrays stop at 4 GiB, and 1 GiB keeps a failed allocation cheap. */
export const MAX_SLAB_BYTES = 1024 * 1024 * 1024;

/** Default page size in bytes (64 KiB). */
export const DEFAULT_PAGE_BYTES = 64 * 1024;

/** Smallest page size in bytes (4 KiB). */
export const MIN_PAGE_BYTES = 4 * 1024;

/** Options of a {@link HostArena}. */
export interface HostArenaOptions {
  /** Hard bound on host memory in bytes; rounded down to whole pages; at least one page. */
  capacityBytes: number;
  /**
   * Where slabs come from; must return exactly `bytes`. Default: Node buffers. The sidecar passes
   * the native addon's page-aligned slabs when the addon is built (`native/host-slabs.ts`).
   */
  allocateSlab?: (bytes: number) => Uint8Array;
  /** Page size in bytes: a power of two >= 4096. Default 65536 (64 KiB). */
  pageBytes?: number;
  /**
   * Slab size in bytes: a multiple of `pageBytes`, at most 1 GiB. Default: 1 GiB or the
   * capacity, whichever is smaller. Clamped to the capacity. A block never spans slabs.
   */
  slabBytes?: number;
}

/** Options after defaults and validation. */
export interface ResolvedHostArenaOptions {
  readonly capacityBytes: number;
  readonly pageBytes: number;
  readonly slabBytes: number;
}

/**
 * Applies defaults and validates.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the bad option and what is allowed.
 */
export function resolveHostArenaOptions(options: HostArenaOptions): ResolvedHostArenaOptions {
  if (typeof options !== 'object' || options === null) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `host arena options must be an object, got ${describe(options)}`,
    );
  }
  const pageBytes = requireInt(
    'pageBytes',
    options.pageBytes ?? DEFAULT_PAGE_BYTES,
    MIN_PAGE_BYTES,
    MAX_SLAB_BYTES,
  );
  if ((pageBytes & (pageBytes - 1)) !== 0) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `pageBytes must be a power of two >= ${MIN_PAGE_BYTES}, got ${pageBytes}`,
    );
  }
  if (typeof options.capacityBytes === 'number' && options.capacityBytes < pageBytes) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `capacityBytes must be at least one page (${pageBytes} bytes), got ${options.capacityBytes}`,
    );
  }
  const rawCapacity = requireInt('capacityBytes', options.capacityBytes, pageBytes);
  const capacityBytes = Math.floor(rawCapacity / pageBytes) * pageBytes;
  let slabBytes = Math.min(MAX_SLAB_BYTES, capacityBytes);
  if (options.slabBytes !== undefined) {
    slabBytes = requireInt('slabBytes', options.slabBytes, pageBytes, MAX_SLAB_BYTES);
    if (slabBytes % pageBytes !== 0) {
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `slabBytes must be a multiple of pageBytes (${pageBytes}), got ${slabBytes}`,
      );
    }
  }
  return { capacityBytes, pageBytes, slabBytes: Math.min(slabBytes, capacityBytes) };
}

/**
 * A run of contiguous pages handed out by {@link HostArena.allocate}. Owned by whoever
 * allocated it until passed to {@link HostArena.free}; the view must not be used after that.
 */
export interface ArenaBlock {
  /** The block's bytes: exactly the requested length. Contents are unspecified on allocation. */
  readonly view: Uint8Array;
  /** Requested length in bytes. */
  readonly bytes: number;
  /** Pages the block occupies (at least one). */
  readonly pages: number;
}

interface FreeRun {
  start: number;
  length: number;
}

interface Slab {
  readonly memory: Uint8Array;
  readonly pages: number;
  /** Free runs sorted by start page, never adjacent (coalesced on free). */
  readonly runs: FreeRun[];
  freePages: number;
}

class Block implements ArenaBlock {
  constructor(
    readonly view: Uint8Array,
    readonly bytes: number,
    readonly pages: number,
    readonly slab: Slab,
    readonly start: number,
  ) {}
}

/**
 * A fixed host arena with a hard byte bound: slabs (allocated lazily, one `Buffer` each) cut
 * into pages. `allocate` hands out contiguous pages within one slab or returns `null`; it never
 * waits and never exceeds `capacityBytes`.
 *
 * Allocation is address-ordered first fit over a sorted free-run list per slab, with
 * coalescing on free: simple, and low-fragmentation when most blocks have one size (chunks).
 * The surface is kept to allocate/free/view so that a native arena can replace the internals.
 */
export class HostArena {
  /** Hard bound in bytes (whole pages). */
  readonly capacityBytes: number;
  /** Page size in bytes. */
  readonly pageBytes: number;
  /** Largest block in bytes: the slab size. */
  readonly maxBlockBytes: number;

  readonly #slabPages: number;
  readonly #totalPages: number;
  readonly #allocateSlab: (bytes: number) => Uint8Array;
  readonly #slabs: Slab[] = [];
  readonly #live = new Set<Block>();
  #reservedPages = 0;
  #usedPages = 0;

  /** @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options. */
  constructor(options: HostArenaOptions) {
    const o = resolveHostArenaOptions(options);
    this.capacityBytes = o.capacityBytes;
    this.pageBytes = o.pageBytes;
    this.maxBlockBytes = o.slabBytes;
    this.#slabPages = o.slabBytes / o.pageBytes;
    this.#totalPages = o.capacityBytes / o.pageBytes;
    this.#allocateSlab = options.allocateSlab ?? ((bytes) => Buffer.allocUnsafeSlow(bytes));
  }

  /** Bytes in allocated pages (pages x pageBytes). */
  get usedBytes(): number {
    return this.#usedPages * this.pageBytes;
  }

  /** Bytes not in allocated pages; may be fragmented across slabs. */
  get freeBytes(): number {
    return this.capacityBytes - this.usedBytes;
  }

  /** Bytes of slabs allocated from the host so far (grows lazily up to `capacityBytes`). */
  get reservedBytes(): number {
    return this.#reservedPages * this.pageBytes;
  }

  /** Number of live blocks. */
  get blockCount(): number {
    return this.#live.size;
  }

  /** Total pages of the arena (capacityBytes / pageBytes). */
  get totalPages(): number {
    return this.#totalPages;
  }

  /** Number of slabs allocated so far. */
  get slabCount(): number {
    return this.#slabs.length;
  }

  /** The memory of slab `i` (0 <= i < slabCount), e.g. to pre-fault it; never to write to. */
  slab(i: number): Uint8Array {
    return this.#slabs[i]!.memory;
  }

  /**
   * Allocates the next slab ahead of need (all its pages free), up to `capacityBytes`.
   * @returns its memory, or null when every slab is already allocated.
   */
  reserveSlab(): Uint8Array | null {
    return this.#reservedPages < this.#totalPages ? this.#growSlab(1)!.memory : null;
  }

  /** Pages a block of `bytes` occupies (at least one). */
  pagesFor(bytes: number): number {
    return Math.max(1, Math.ceil(bytes / this.pageBytes));
  }

  /**
   * Allocates a block of `bytes` on contiguous pages of one slab; never waits.
   * @returns the block, or `null` when no slab has a free run that long.
   * @throws KvtierError `KVT_INVALID_ARGUMENT` if `bytes` is not a non-negative integer;
   *   `KVT_TOO_LARGE` if it exceeds `maxBlockBytes` (it could never fit).
   */
  allocate(bytes: number): ArenaBlock | null {
    requireInt('bytes', bytes, 0);
    if (bytes > this.maxBlockBytes) {
      throw new KvtierError(
        'KVT_TOO_LARGE',
        `cannot allocate ${bytes} bytes: the largest block is ${this.maxBlockBytes} bytes`,
      );
    }
    const pages = this.pagesFor(bytes);
    for (const slab of this.#slabs) {
      if (slab.freePages < pages) continue;
      const start = takeFirstFit(slab, pages);
      if (start !== -1) return this.#issue(slab, start, pages, bytes);
    }
    const slab = this.#growSlab(pages);
    if (slab === null) return null;
    const start = takeFirstFit(slab, pages);
    return start === -1 ? null : this.#issue(slab, start, pages, bytes);
  }

  /**
   * Returns a block's pages to the arena; its view must not be used afterwards.
   * @throws KvtierError `KVT_INTERNAL` if the block is not live in this arena (double free or a
   *   block of another arena); the arena is left unchanged.
   */
  free(block: ArenaBlock): void {
    if (!(block instanceof Block) || !this.#live.delete(block)) {
      throw new KvtierError(
        'KVT_INTERNAL',
        'host arena: free of a block that is not live here (double free or foreign block)',
      );
    }
    giveBack(block.slab, block.start, block.pages);
    this.#usedPages -= block.pages;
  }

  #issue(slab: Slab, start: number, pages: number, bytes: number): Block {
    const offset = slab.memory.byteOffset + start * this.pageBytes;
    const view = new Uint8Array(slab.memory.buffer, offset, bytes);
    const block = new Block(view, bytes, pages, slab, start);
    this.#live.add(block);
    this.#usedPages += pages;
    return block;
  }

  /** Adds a slab if the bound allows one that can hold `pages`; otherwise null. */
  #growSlab(pages: number): Slab | null {
    const slabPages = Math.min(this.#slabPages, this.#totalPages - this.#reservedPages);
    if (slabPages < pages) return null;
    const memory = this.#allocateSlab(slabPages * this.pageBytes);
    const slab: Slab = {
      memory,
      pages: slabPages,
      runs: [{ start: 0, length: slabPages }],
      freePages: slabPages,
    };
    this.#slabs.push(slab);
    this.#reservedPages += slabPages;
    return slab;
  }
}

/** Carves `pages` from the first run long enough; returns the start page or -1. */
function takeFirstFit(slab: Slab, pages: number): number {
  const runs = slab.runs;
  for (let i = 0; i < runs.length; i++) {
    const run = runs[i]!;
    if (run.length < pages) continue;
    const start = run.start;
    if (run.length === pages) runs.splice(i, 1);
    else {
      run.start += pages;
      run.length -= pages;
    }
    slab.freePages -= pages;
    return start;
  }
  return -1;
}

/** Inserts a freed run in order and merges it with adjacent free runs. */
function giveBack(slab: Slab, start: number, pages: number): void {
  const runs = slab.runs;
  let lo = 0;
  let hi = runs.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (runs[mid]!.start < start) lo = mid + 1;
    else hi = mid;
  }
  const prev = lo > 0 ? runs[lo - 1] : undefined;
  const next = runs[lo];
  const joinsPrev = prev !== undefined && prev.start + prev.length === start;
  const joinsNext = next !== undefined && start + pages === next.start;
  if (joinsPrev && joinsNext) {
    prev.length += pages + next.length;
    runs.splice(lo, 1);
  } else if (joinsPrev) {
    prev.length += pages;
  } else if (joinsNext) {
    next.start = start;
    next.length += pages;
  } else {
    runs.splice(lo, 0, { start, length: pages });
  }
  slab.freePages += pages;
}
