import type { Chunk, ChunkHash } from '../backends/core/types.ts';
import { type HeadCover, headCovers, kvHeadRange } from '../namespace/namespace.ts';
import type { Logger } from '../util/log.ts';
import type { CopyEngine, CopySurface } from './copy-engine-types.ts';
import {
  COPY_GROUPS_IN_FLIGHT,
  groupByBytes,
  LOAD_GROUP_BYTES,
  runWindowed,
} from './copy-groups.ts';
import { blockOffset, type KvLayout } from './kv-layout.ts';

/**
 * Loading chunks saved at another tensor-parallel size (docs/architecture.md, "KV across TP
 * sizes"). A rank's chunk holds the KV heads `[s0, s1)` of the rank that saved it, in the stored
 * form (token-major within each block: `[blockSize, s1 - s0, headDim]`). A loading rank that holds
 * heads `[a, b)` reads, for each chunk, every saved shard that overlaps its heads and copies the
 * overlap: per block and token one op of `(overlap heads) * headBytes` into an NHD block, or one
 * op per head into an HND block. A rank at TP 1 gathers the two shards a TP 2 engine saved; a
 * rank at TP 4 reads half the heads of one of them.
 */

/** One saved shard of a chunk, as the loader copies from it. */
export interface ShardPart {
  /** The shard's payload in host memory (pinned by the load's lookup). */
  payload: Uint8Array;
  /** First KV head of the model the shard holds. */
  start: number;
  /** One past its last KV head. */
  end: number;
}

/** One chunk of a cross-TP load: its blocks, the shards it is assembled from, blocks skipped. */
export interface ShardChunkCopy {
  ids: Uint32Array;
  parts: readonly ShardPart[];
  /** Leading blocks of the chunk not copied (`ids` leaves them out); default 0. */
  skip?: number;
}

/** Where one engine's regions are among the copy surfaces (as `copyChunks` takes it). */
export interface ShardEngine {
  readonly layout: KvLayout;
  readonly surfaces: readonly CopySurface[];
  readonly regionSurface: readonly number[];
}

const COVERS = new WeakMap<KvLayout, readonly HeadCover[]>();
const RANGES = new WeakMap<KvLayout, readonly [number, number]>();

/** The engine's own KV heads `[a, b)` (cached per layout). */
export function ownHeads(layout: KvLayout): readonly [number, number] {
  let r = RANGES.get(layout);
  if (r === undefined) {
    r = kvHeadRange(layout.namespace.spec);
    RANGES.set(layout, r);
  }
  return r;
}

/**
 * The cover of `layout`'s heads whose shard namespaces are all among `namespaces` (the pinned
 * lookup's), the one with fewest shards first; undefined when none is (or for MLA).
 */
export function coverAmong(layout: KvLayout, namespaces: readonly string[]): HeadCover | undefined {
  let covers = COVERS.get(layout);
  if (covers === undefined) {
    covers = headCovers(layout.namespace.spec);
    COVERS.set(layout, covers);
  }
  return covers.find((c) => c.shards.every((s) => namespaces.includes(s.namespace.id)));
}

/** Stored payload bytes of a chunk of `blocks` blocks saved by a rank holding `heads` heads. */
export function shardPayloadBytes(layout: KvLayout, blocks: number, heads: number): number {
  return layout.regions.length * blocks * layout.blockSize * heads * layout.headBytes;
}

/** Slots {@link writeShardOps} may fill for `blocks` blocks of one region and `overlap` heads. */
export function shardRegionOpSlots(layout: KvLayout, blocks: number, overlap: number): number {
  const perToken = layout.blockLayout === 'HND' ? overlap : 1;
  return 5 * blocks * layout.blockSize * perToken;
}

/**
 * Writes the ops scattering the overlap of shard `[s0, s1)` with the engine's heads into region
 * `r` of the blocks `blockIds` (the chunk's blocks `skipBlocks..`, of `skipBlocks +
 * blockIds.length`), as 5-tuples `[src, srcOffset, dst, dstOffset, length]` from slot `at`, and
 * returns the slot after the last one written. Token `t` of head `h` is read at
 * `(r * n + j) * blockSize * (s1 - s0) * headBytes + (t * (s1 - s0) + h - s0) * headBytes` in the
 * shard's payload and written at `(t * heads + h - a) * headBytes` of an NHD block or
 * `((h - a) * blockSize + t) * headBytes` of an HND one. Ops that continue the previous one in
 * both source and destination are merged into it.
 */
export function writeShardOps(
  out: Float64Array,
  at: number,
  layout: KvLayout,
  blockIds: ArrayLike<number>,
  r: number,
  surface: number,
  payload: number,
  shard: { start: number; end: number },
  skipBlocks = 0,
): number {
  const [a, b] = ownHeads(layout);
  const lo = Math.max(a, shard.start);
  const hi = Math.min(b, shard.end);
  if (lo >= hi) return at;
  const { blockSize: bs, headBytes: hb } = layout;
  const heads = b - a;
  const srcHeads = shard.end - shard.start;
  const srcBlockBytes = bs * srcHeads * hb;
  const n = skipBlocks + blockIds.length;
  const hnd = layout.blockLayout === 'HND';
  let o = at;
  const emit = (src: number, dst: number, len: number) => {
    if (o > at) {
      const p = o - 5;
      if (out[p + 1]! + out[p + 4]! === src && out[p + 3]! + out[p + 4]! === dst) {
        out[p + 4]! += len;
        return;
      }
    }
    out[o] = payload;
    out[o + 1] = src;
    out[o + 2] = surface;
    out[o + 3] = dst;
    out[o + 4] = len;
    o += 5;
  };
  for (let j = 0; j < blockIds.length; j++) {
    const dev = blockOffset(layout, r, blockIds[j]!);
    const base = (r * n + skipBlocks + j) * srcBlockBytes;
    for (let t = 0; t < bs; t++) {
      const src = base + (t * srcHeads + lo - shard.start) * hb;
      if (!hnd) emit(src, dev + (t * heads + lo - a) * hb, (hi - lo) * hb);
      else
        for (let h = lo; h < hi; h++) emit(src + (h - lo) * hb, dev + ((h - a) * bs + t) * hb, hb);
    }
  }
  return o;
}

/** Reads a namespace's chunks from host memory (the storage manager's `hostChunks`). */
export type HostChunksOf = (
  ns: string,
  hashes: ChunkHash[],
) => Promise<ReadonlyMap<ChunkHash, Chunk | null>>;

/**
 * The leading chunks of a load that every shard of `cover` holds, in host memory and of the
 * size the layout gives for its heads, each as the parts to copy from; stops at the first chunk
 * that is not ready, gone, or malformed (logged).
 */
export async function loadableShards(
  hostChunks: HostChunksOf,
  layout: KvLayout,
  cover: HeadCover,
  hashes: readonly ChunkHash[],
  chunks: readonly Uint32Array[],
  skipBlocks: number,
  ready: ReadonlySet<ChunkHash>,
  log: Logger,
): Promise<ShardChunkCopy[]> {
  let n = 0;
  while (n < hashes.length && ready.has(hashes[n]!)) n++;
  if (n === 0) return [];
  const wanted = hashes.slice(0, n);
  const found = await Promise.all(cover.shards.map((s) => hostChunks(s.namespace.id, wanted)));
  const out: ShardChunkCopy[] = [];
  for (let i = 0; i < n; i++) {
    const blocks = (i === 0 ? skipBlocks : 0) + chunks[i]!.length;
    const parts: ShardPart[] = [];
    for (let k = 0; k < cover.shards.length; k++) {
      const shard = cover.shards[k]!;
      const chunk = found[k]!.get(hashes[i]!);
      if (chunk == null) return out;
      const bytes = shardPayloadBytes(layout, blocks, shard.end - shard.start);
      if (chunk.tokens !== blocks * layout.blockSize || chunk.data.byteLength !== bytes) {
        log.warn('stored shard does not match the layout; reported invalid', {
          hash: hashes[i],
          namespace: shard.namespace.label,
          tokens: chunk.tokens,
          bytes: chunk.data.byteLength,
        });
        return out;
      }
      parts.push({ payload: chunk.data, start: shard.start, end: shard.end });
    }
    out.push(i === 0 ? { ids: chunks[i]!, parts, skip: skipBlocks } : { ids: chunks[i]!, parts });
  }
  return out;
}

/**
 * Scatters cross-TP chunks into the engine's blocks in groups of up to `groupBytes` of payload,
 * at most `inFlight` groups at a time.
 * @returns how many leading chunks were copied, the first failure, and the time it took (ms).
 */
export async function scatterShards(
  copy: CopyEngine,
  eng: ShardEngine,
  items: readonly ShardChunkCopy[],
  opts: { groupBytes?: number; inFlight?: number; stop?: () => boolean } = {},
): Promise<{ copied: number; error?: unknown; ms: number }> {
  const t0 = performance.now();
  const { layout } = eng;
  const [a, b] = ownHeads(layout);
  const groups = groupByBytes(
    items.map((c) => c.parts.reduce((sum, p) => sum + p.payload.byteLength, 0)),
    opts.groupBytes ?? LOAD_GROUP_BYTES,
  );
  const outcome = await runWindowed(
    groups,
    ([g0, g1]) => {
      const surfaces: CopySurface[] = [...eng.surfaces];
      let slots = 0;
      for (let i = g0; i < g1; i++)
        for (const p of items[i]!.parts) {
          const overlap = Math.min(b, p.end) - Math.max(a, p.start);
          slots +=
            layout.regions.length * shardRegionOpSlots(layout, items[i]!.ids.length, overlap);
        }
      const table = new Float64Array(slots);
      let at = 0;
      for (let i = g0; i < g1; i++) {
        const c = items[i]!;
        for (const p of c.parts) {
          const payload = surfaces.push(p.payload) - 1;
          for (let r = 0; r < layout.regions.length; r++)
            at = writeShardOps(
              table,
              at,
              layout,
              c.ids,
              r,
              eng.regionSurface[r]!,
              payload,
              p,
              c.skip ?? 0,
            );
        }
      }
      return copy.copy(surfaces, table.subarray(0, at));
    },
    {
      window: opts.inFlight ?? COPY_GROUPS_IN_FLIGHT,
      ...(opts.stop !== undefined ? { stop: opts.stop } : {}),
    },
  );
  const copied = outcome.completed === 0 ? 0 : groups[outcome.completed - 1]![1];
  const ms = performance.now() - t0;
  return outcome.error !== undefined ? { copied, error: outcome.error, ms } : { copied, ms };
}
