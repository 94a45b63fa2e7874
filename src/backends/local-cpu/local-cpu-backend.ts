import { abortedError, closedError, KvtierError } from '../../errors.ts';
import { chunkHashesFromPacked } from '../../hashing/chunk-hash.ts';
import { requireInt } from '../../util/validate.ts';
import { type ArenaBlock, HostArena } from '../arena/host-arena.ts';
import { copyHostBytes } from '../arena/host-copy.ts';
import { startPrefault } from '../arena/host-prefault.ts';
import { checkChunk } from '../core/chunk-check.ts';
import { pinPresent } from '../core/index-ops.ts';
import type {
  BackendCapabilities,
  BackendContext,
  BackendFactory,
  BackendHealth,
  BackendStats,
  Chunk,
  ChunkHash,
  ChunkReservation,
  ContainsOptions,
  GetOptions,
  HostMemoryTier,
  NamespaceId,
  PackedHostIndex,
  PutOptions,
  PutOutcome,
  RemovalListener,
  ReserveOutcome,
} from '../core/types.ts';
import { boundedNamespaceUsage } from '../core/types.ts';
import { RecencyList } from '../index/recency-list.ts';
import { type CpuEntry, CpuIndex, deleteIn, newCpuEntry, packedView } from './local-cpu-index.ts';
import {
  type LocalCpuOptions,
  localCpuOptionsFromConfig,
  resolveLocalCpuOptions,
} from './local-cpu-options.ts';

/** Re-exported for code that imported it from here; the port's type lives in `types.ts`. */
export type { ChunkReservation } from '../core/types.ts';
export type { LocalCpuOptions, ResolvedLocalCpuOptions } from './local-cpu-options.ts';
export { resolveLocalCpuOptions } from './local-cpu-options.ts';

type Entry = CpuEntry;

/**
 * Copies removed while pinned, per key, awaiting their free. Unpins are charged to orphans
 * first; the copies are freed only when no pin at all remains on the key, because a pin does
 * not say which copy its holder read.
 */
interface OrphanGroup {
  readonly entries: Entry[];
  pins: number;
}

/**
 * The CPU tier: chunks copied into a {@link HostArena}, indexed by namespace and hash, evicted
 * least-recently-used first. Pinned
 * chunks are never evicted or freed while pinned; stores never wait (they evict unpinned chunks
 * or are dropped and counted). Chunks returned by `batchedGet`
 * are views into the arena (valid while pinned, or until the caller yields). A `put` of a chunk
 * over 4 MiB copies it off the event loop (src/backends/arena/host-copy.ts): its data must not change
 * until the put settles.
 */
export class LocalCpuBackend implements HostMemoryTier {
  readonly name: string;
  readonly kind = 'local-cpu';
  readonly capabilities: BackendCapabilities;

  #arena: HostArena | null;
  readonly #index = new CpuIndex();
  readonly packedIndex: PackedHostIndex = {
    contains: (ns, packed, from, count, pin) => this.#containsPacked(ns, packed, from, count, pin),
    unpin: (ns, packed, from, count) => this.#unpinPacked(ns, packed, from, count),
    containsPinned: (ns, packed, from, count, handles) =>
      this.#containsPacked(ns, packed, from, count, true, handles as Entry[]),
    unpinHandles: (handles, from, count) => this.#unpinEntries(handles as Entry[], from, count),
  };
  /**
   * Recency of unpinned live entries only, so eviction is a plain pop. Intrusive (links in the
   * entries): a lookup pins and later unpins every chunk it counts, and a general-purpose LRU
   * map made those two moves the largest cost of a 512-chunk lookup.
   */
  readonly #lru = new RecencyList<Entry>();
  readonly #orphans = new Map<NamespaceId, Map<ChunkHash, OrphanGroup>>();
  #chunks = 0;
  #pinnedLive = 0;
  #orphanChunks = 0;
  #evictableBytes = 0;
  #evictions = 0;
  #droppedPuts = 0;
  #closing: Promise<void> | null = null;
  #onRemoved: RemovalListener | undefined;
  readonly #prefault: ReturnType<typeof startPrefault>;

  /** @throws KvtierError `KVT_INVALID_ARGUMENT` on bad options. */
  constructor(options: LocalCpuOptions, ctx: BackendContext = { name: 'local-cpu' }) {
    const arena = new HostArena({
      ...resolveLocalCpuOptions(options),
      ...(options.allocateSlab !== undefined ? { allocateSlab: options.allocateSlab } : {}),
    });
    this.#arena = arena;
    this.#prefault = startPrefault(arena, options, ctx.log);
    this.name = ctx.name;
    this.capabilities = Object.freeze({
      pinning: true,
      hostMemory: true,
      persistent: false,
      shared: false,
      evicts: true,
      maxChunkBytes: arena.maxBlockBytes,
    });
  }

  async batchedContains(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: ContainsOptions = {},
  ): Promise<number> {
    this.#open(opts.signal, 'contains');
    // The lookup hot path: one index lookup per chunk, no closures or arrays; with `pin`,
    // exactly the counted prefix is pinned (a pinned entry leaves the LRU, so no touch).
    const space = this.#index.space(ns);
    if (space === undefined) return 0;
    const pin = opts.pin === true;
    let k = 0;
    for (; k < hashes.length; k++) {
      const e = space.get(hashes[k]!);
      if (e === undefined) break;
      if (pin) this.#pinEntry(e);
      else this.#touch(e);
    }
    return k;
  }

  #containsPacked(
    ns: NamespaceId,
    packed: Uint8Array,
    from: number,
    count: number,
    pin: boolean,
    pinned?: Entry[],
  ): number {
    this.#open(undefined, 'contains');
    const dv = packedView(packed, from, count);
    const index = this.#index;
    let k = 0;
    for (; k < count; k++) {
      const e = index.find(ns, dv, k * 32);
      if (e === undefined) break;
      if (pin) {
        this.#pinEntry(e);
        pinned?.push(e);
      } else this.#touch(e);
    }
    return k;
  }

  /**
   * Releases a pin on each of `entries[from, from + count)`. A pinned entry stays indexed until
   * its last pin goes unless it was removed meanwhile, which leaves an orphan: with none about,
   * every entry pinned is still the live one of its key and is released directly; else false
   * (the caller releases by hash, where orphans are charged first).
   */
  #unpinEntries(entries: readonly Entry[], from: number, count: number): boolean {
    this.#open(undefined, 'unpin');
    if (this.#orphanChunks > 0) return false;
    for (let i = from; i < from + count; i++) {
      const e = entries[i]!;
      if (e.pins === 0) continue;
      e.pins--;
      if (e.pins === 0) {
        this.#pinnedLive--;
        this.#lruAdd(e);
      }
    }
    return true;
  }

  #unpinPacked(ns: NamespaceId, packed: Uint8Array, from: number, count: number): void {
    // Orphans are keyed by hex (rare: a chunk removed while pinned); let `unpin` sort them out.
    if (this.#orphanChunks > 0) {
      this.unpin(ns, chunkHashesFromPacked(packed.subarray(from * 32, (from + count) * 32)));
      return;
    }
    this.#open(undefined, 'unpin');
    const dv = packedView(packed, from, count);
    for (let k = 0; k < count; k++) {
      const live = this.#index.find(ns, dv, k * 32);
      if (live === undefined || live.pins === 0) continue;
      live.pins--;
      if (live.pins === 0) {
        this.#pinnedLive--;
        this.#lruAdd(live);
      }
    }
  }

  async batchedGet(
    ns: NamespaceId,
    hashes: readonly ChunkHash[],
    opts: GetOptions = {},
  ): Promise<Map<ChunkHash, Chunk | null>> {
    this.#open(opts.signal, 'get');
    const out = new Map<ChunkHash, Chunk | null>();
    for (const hash of hashes) {
      const e = this.#lookup(ns, hash);
      if (e === undefined) {
        out.set(hash, null);
        continue;
      }
      this.#touch(e);
      out.set(hash, { tokens: e.tokens, data: e.block.view });
    }
    return out;
  }

  async put(
    ns: NamespaceId,
    hash: ChunkHash,
    chunk: Chunk,
    opts: PutOptions = {},
  ): Promise<PutOutcome> {
    this.#open(opts.signal, 'put');
    checkChunk(chunk);
    const pin = opts.pin === true;
    if (this.#existing(ns, hash, pin)) return 'exists';
    const block = this.#allocate(chunk.data.byteLength);
    if (block === null) return 'dropped';
    const copying = copyHostBytes(chunk.data, block.view);
    if (copying !== undefined) {
      // A large chunk is copied off the event loop; its pages stay allocated but unindexed
      // meanwhile, so nothing can evict or read them half-written.
      try {
        await copying;
      } catch (err) {
        this.#arena?.free(block);
        throw err;
      }
      const arena = this.#arena;
      if (this.#closing !== null || arena === null) throw closedError(`backend ${this.name}`);
      if (this.#existing(ns, hash, pin)) {
        arena.free(block);
        return 'exists';
      }
    }
    this.#store(ns, hash, block, chunk.tokens, pin);
    return 'stored';
  }

  /**
   * Reserves arena room for a chunk that the caller writes in place (e.g. a gather from a KV
   * cache), evicting like `put`. Never waits.
   * @returns a reservation; `'exists'` when the key is already stored (nothing reserved, the
   *   chunk is touched); or `'dropped'` (counted) when there is no room.
   * @throws KvtierError `KVT_CLOSED` after close; `KVT_INVALID_ARGUMENT` on bad sizes.
   */
  reserve(ns: NamespaceId, hash: ChunkHash, bytes: number, tokens: number): ReserveOutcome {
    this.#open(undefined, 'reserve');
    requireInt('bytes', bytes, 0);
    requireInt('tokens', tokens, 0);
    if (this.#existing(ns, hash, false)) return 'exists';
    const block = this.#allocate(bytes);
    if (block === null) return 'dropped';
    let settled = false;
    const settle = (): HostArena | null => {
      if (settled) throw new KvtierError('KVT_INTERNAL', 'chunk reservation already settled');
      settled = true;
      return this.#arena;
    };
    const reservation: ChunkReservation = {
      view: block.view,
      commit: (opts = {}) => {
        const arena = settle();
        if (arena === null) throw closedError(`backend ${this.name}`);
        const pin = opts.pin === true;
        if (this.#existing(ns, hash, pin)) {
          arena.free(block);
          return 'exists';
        }
        this.#store(ns, hash, block, tokens, pin);
        return 'stored';
      },
      abort: () => {
        settle()?.free(block);
      },
    };
    return reservation;
  }

  async remove(ns: NamespaceId, hashes: readonly ChunkHash[]): Promise<number> {
    this.#open(undefined, 'remove');
    let removed = 0;
    for (const hash of hashes) {
      const e = this.#lookup(ns, hash);
      if (e === undefined) continue;
      this.#drop(e);
      removed++;
    }
    return removed;
  }

  pin(ns: NamespaceId, hashes: readonly ChunkHash[]): number {
    this.#open(undefined, 'pin');
    return pinPresent(
      hashes,
      (h) => this.#lookup(ns, h),
      (e) => this.#pinEntry(e),
    );
  }

  unpin(ns: NamespaceId, hashes: readonly ChunkHash[]): void {
    const arena = this.#open(undefined, 'unpin');
    const space = this.#index.space(ns);
    // Orphans are rare (a chunk removed while pinned): skip their map when there are none.
    const orphans = this.#orphanChunks === 0 ? undefined : this.#orphans.get(ns);
    for (const hash of hashes) {
      const group = orphans?.get(hash);
      const live = space?.get(hash);
      if (group !== undefined && group.pins > 0) group.pins--;
      else if (live !== undefined && live.pins > 0) {
        live.pins--;
        if (live.pins === 0) {
          this.#pinnedLive--;
          this.#lruAdd(live);
        }
      } else continue;
      if (group !== undefined && group.pins === 0 && (live === undefined || live.pins === 0)) {
        for (const e of group.entries) arena.free(e.block);
        this.#orphanChunks -= group.entries.length;
        deleteIn(this.#orphans, ns, hash);
      }
    }
  }

  async clear(ns?: NamespaceId): Promise<void> {
    this.#open(undefined, 'clear');
    const spaces = this.#index.spaces(ns);
    for (const space of spaces) {
      if (space === undefined) continue;
      for (const e of [...space.values()]) this.#drop(e);
    }
  }

  /** Hears of every chunk evicted to make room (not of `remove` or `clear`). */
  setRemovalListener(listener: RemovalListener | undefined): void {
    this.#onRemoved = listener;
  }

  /** The chunks indexed now (removed chunks still pinned are not). */
  *listChunks(ns?: NamespaceId): Generator<readonly [NamespaceId, ChunkHash]> {
    for (const space of this.#index.spaces(ns))
      if (space !== undefined) for (const e of space.values()) yield [e.ns, e.hash];
  }

  /** Counters; `bytesUsed` counts whole pages, including removed chunks awaiting their unpin. */
  stats(): BackendStats {
    const arena = this.#open(undefined, 'stats');
    return {
      chunks: this.#chunks,
      bytesUsed: arena.usedBytes,
      capacityBytes: arena.capacityBytes,
      pinnedChunks: this.#pinnedLive + this.#orphanChunks,
      evictions: this.#evictions,
      droppedPuts: this.#droppedPuts,
      ...(this.#prefault && { prefaultedBytes: this.#prefault.state().bytes }),
      ...boundedNamespaceUsage(this.#usageByNamespace()),
    };
  }

  /** Chunks and page bytes per namespace of the chunks indexed now. */
  #usageByNamespace(): Map<NamespaceId, { chunks: number; bytes: number }> {
    const out = new Map<NamespaceId, { chunks: number; bytes: number }>();
    for (const space of this.#index.spaces()) {
      if (space === undefined || space.size === 0) continue;
      let bytes = 0;
      let ns: NamespaceId | undefined;
      for (const e of space.values()) {
        ns = e.ns;
        bytes += e.block.bytes;
      }
      out.set(ns!, { chunks: space.size, bytes });
    }
    return out;
  }

  health(): BackendHealth {
    this.#open(undefined, 'health');
    return 'up';
  }

  /** Drops the index and the arena; views already handed out stay readable (never reused). */
  close(): Promise<void> {
    this.#closing ??= Promise.resolve(this.#prefault?.stop()).then(() => {
      this.#arena = null;
      this.#index.clear();
      this.#orphans.clear();
      this.#lru.clear();
    });
    return this.#closing;
  }

  #open(signal: AbortSignal | undefined, op: string): HostArena {
    if (this.#closing !== null || this.#arena === null) throw closedError(`backend ${this.name}`);
    if (signal?.aborted === true) throw abortedError(signal, `${this.name} ${op}`);
    return this.#arena;
  }

  #lookup(ns: NamespaceId, hash: ChunkHash): Entry | undefined {
    return this.#index.get(ns, hash);
  }

  /** Handles a put or commit of a key already stored: pin or touch; true if it existed. */
  #existing(ns: NamespaceId, hash: ChunkHash, pin: boolean): boolean {
    const e = this.#lookup(ns, hash);
    if (e === undefined) return false;
    if (pin) this.#pinEntry(e);
    else this.#touch(e);
    return true;
  }

  #store(ns: NamespaceId, hash: ChunkHash, block: ArenaBlock, tokens: number, pin: boolean): void {
    const e = newCpuEntry(ns, hash, block, tokens);
    this.#index.add(e);
    this.#chunks++;
    if (pin) {
      e.pins = 1;
      this.#pinnedLive++;
    } else this.#lruAdd(e);
  }

  /** Allocates, evicting unpinned chunks LRU-first; null (counted as a drop) if impossible. */
  #allocate(bytes: number): ArenaBlock | null {
    const arena = this.#arena!;
    if (bytes > arena.maxBlockBytes) {
      this.#droppedPuts++;
      return null;
    }
    // Evicting cannot help when even all unpinned data would not make room.
    if (arena.freeBytes + this.#evictableBytes < arena.pagesFor(bytes) * arena.pageBytes) {
      this.#droppedPuts++;
      return null;
    }
    for (;;) {
      const block = arena.allocate(bytes);
      if (block !== null) return block;
      const victim = this.#lru.popLeastRecent();
      if (victim === undefined) {
        this.#droppedPuts++;
        return null;
      }
      this.#evicted(victim);
    }
  }

  /** Frees an entry taken off the LRU by eviction. */
  #evicted(e: Entry): void {
    const arena = this.#arena!;
    this.#evictableBytes -= e.block.pages * arena.pageBytes;
    this.#unindex(e);
    arena.free(e.block);
    this.#evictions++;
    this.#onRemoved?.(e.ns, e.hash, 'evicted');
  }

  /** Removes a live entry from the index; frees it now, or on its key's last unpin. */
  #drop(e: Entry): void {
    this.#unindex(e);
    if (e.pins === 0) {
      this.#lruRemove(e);
      this.#arena!.free(e.block);
      return;
    }
    this.#pinnedLive--;
    let space = this.#orphans.get(e.ns);
    if (space === undefined) {
      space = new Map();
      this.#orphans.set(e.ns, space);
    }
    let group = space.get(e.hash);
    if (group === undefined) {
      group = { entries: [], pins: 0 };
      space.set(e.hash, group);
    }
    group.entries.push(e);
    group.pins += e.pins;
    e.pins = 0;
    this.#orphanChunks++;
  }

  #unindex(e: Entry): void {
    this.#index.delete(e);
    this.#chunks--;
  }

  #pinEntry(e: Entry): void {
    if (e.pins === 0) {
      this.#lruRemove(e);
      this.#pinnedLive++;
    }
    e.pins++;
  }

  #touch(e: Entry): void {
    if (e.pins === 0) this.#lru.touch(e);
  }

  #lruAdd(e: Entry): void {
    if (!e.listed) this.#evictableBytes += e.block.pages * this.#arena!.pageBytes;
    this.#lru.touch(e);
  }

  #lruRemove(e: Entry): void {
    if (this.#lru.remove(e)) this.#evictableBytes -= e.block.pages * this.#arena!.pageBytes;
  }
}

/**
 * The factory of {@link LocalCpuBackend}s whose arenas take slabs from `allocateSlab` (default
 * Node buffers). @throws `KVT_CONFIG` on bad options.
 */
export function localCpuFactory(allocateSlab?: (bytes: number) => Uint8Array): BackendFactory {
  return async (options, ctx) =>
    new LocalCpuBackend(
      {
        ...localCpuOptionsFromConfig(options, ctx.name),
        ...(allocateSlab !== undefined ? { allocateSlab } : {}),
      },
      ctx,
    );
}

/** Builds a {@link LocalCpuBackend} from config options. @throws `KVT_CONFIG` on bad options. */
export const createLocalCpuBackend: BackendFactory = localCpuFactory();
