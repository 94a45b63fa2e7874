import type { CopyEngine, CopyOptions, CopySurface } from './copy-engine-types.ts';
import {
  type CopyOpForm,
  chunkOpSlots,
  type KvLayout,
  layerRegions,
  regionOpSlots,
  writeChunkOps,
  writeRegionOps,
} from './kv-layout.ts';

/**
 * How the data plane cuts a save or load into copy batches: consecutive chunks grouped up to a
 * byte bound, a few groups in flight at once, so the planning and issuing of one group overlaps
 * the copies of the previous one, and one batch's fixed cost (a stream, a kernel launch, a pool
 * thread hop) is paid per group instead of per chunk.
 */

/** Payload bytes of one copy group; a single larger chunk forms a group of its own. */
export const COPY_GROUP_BYTES = 128 * 1024 * 1024;
/** Copy groups of a save in flight at once. */
export const COPY_GROUPS_IN_FLIGHT = 2;
/**
 * Payload bytes of one copy group of a load. Host-to-device batches keep the link busy only with
 * more of them in flight than device-to-host ones (measured on an H200, a 4 GiB load of 32 KiB
 * blocks against torch's contiguous copy: 0.72 with two groups of 128 MiB in flight, 0.90-0.93
 * with eight of 64 MiB, 0.93-0.96 with eight of 32 MiB; saves 0.93 with two of 128 MiB).
 */
export const LOAD_GROUP_BYTES = 32 * 1024 * 1024;

/**
 * Load groups in flight by default: each waits on a libuv pool thread, so half the pool
 * (`UV_THREADPOOL_SIZE`, default 4; `kvtier` sets 16 where Node honours it), 2..8, leaving the
 * rest to the file tiers.
 */
export function defaultLoadGroupsInFlight(env: NodeJS.ProcessEnv = process.env): number {
  const pool = Number(env.UV_THREADPOOL_SIZE);
  const threads = Number.isInteger(pool) && pool > 0 ? pool : 4;
  return Math.max(2, Math.min(8, Math.floor(threads / 2)));
}

/**
 * Tuning overrides from the environment, for measuring on a new host: `KVTIER_COPY_GROUP_BYTES`
 * and `KVTIER_COPY_GROUPS_IN_FLIGHT` (saves), `KVTIER_LOAD_GROUP_BYTES` and
 * `KVTIER_LOAD_GROUPS_IN_FLIGHT` (loads); the data plane validates them.
 */
export function copyGroupingFromEnv(env: NodeJS.ProcessEnv = process.env): {
  copyGroupBytes?: number;
  copyGroupsInFlight?: number;
  loadGroupBytes?: number;
  loadGroupsInFlight?: number;
} {
  const out: ReturnType<typeof copyGroupingFromEnv> = {};
  if (env.KVTIER_COPY_GROUP_BYTES) out.copyGroupBytes = Number(env.KVTIER_COPY_GROUP_BYTES);
  if (env.KVTIER_COPY_GROUPS_IN_FLIGHT)
    out.copyGroupsInFlight = Number(env.KVTIER_COPY_GROUPS_IN_FLIGHT);
  if (env.KVTIER_LOAD_GROUP_BYTES) out.loadGroupBytes = Number(env.KVTIER_LOAD_GROUP_BYTES);
  if (env.KVTIER_LOAD_GROUPS_IN_FLIGHT)
    out.loadGroupsInFlight = Number(env.KVTIER_LOAD_GROUPS_IN_FLIGHT);
  return out;
}

/**
 * Cuts items `[0, sizes.length)` into consecutive `[start, end)` ranges of at most `maxBytes`
 * each (an item larger than that alone).
 */
export function groupByBytes(sizes: readonly number[], maxBytes: number): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  let start = 0;
  let bytes = 0;
  for (let i = 0; i < sizes.length; i++) {
    const n = sizes[i]!;
    if (i > start && bytes + n > maxBytes) {
      out.push([start, i]);
      start = i;
      bytes = 0;
    }
    bytes += n;
  }
  if (start < sizes.length) out.push([start, sizes.length]);
  return out;
}

/** What {@link runWindowed} did. */
export interface WindowedOutcome {
  /** Leading groups that completed, in order: groups after the first failure do not count. */
  completed: number;
  /** The first failure, when a group failed. */
  error?: unknown;
}

/**
 * Runs `run` on each group in order with at most `window` in flight. Before issuing a group it
 * asks `stop()`; once that says so, or a group fails, nothing more is issued. `onAdvance(n)` is
 * called each time the count of leading groups that all completed grows to `n`. Resolves after
 * every issued group has settled, so no copy outlives the call (pins and pages it touches stay
 * valid until then).
 */
export async function runWindowed<G>(
  groups: readonly G[],
  run: (group: G, index: number) => Promise<void>,
  opts: { window?: number; stop?: () => boolean; onAdvance?: (completed: number) => void } = {},
): Promise<WindowedOutcome> {
  const window = Math.max(1, opts.window ?? COPY_GROUPS_IN_FLIGHT);
  const inFlight: Promise<unknown>[] = [];
  let completed = 0;
  let failed = false;
  let error: unknown;
  // Each settled group advances `completed` only while every group before it completed.
  const results: Array<boolean | undefined> = [];
  const advance = () => {
    const before = completed;
    while (results[completed] === true) completed++;
    if (completed > before) opts.onAdvance?.(completed);
  };
  for (let i = 0; i < groups.length; i++) {
    if (failed || opts.stop?.() === true) break;
    if (inFlight.length >= window) await inFlight.shift();
    if (failed || opts.stop?.() === true) break;
    const index = i;
    inFlight.push(
      run(groups[i]!, i).then(
        () => {
          results[index] = true;
          advance();
        },
        (err: unknown) => {
          results[index] = false;
          if (!failed) {
            failed = true;
            error = err;
          }
        },
      ),
    );
  }
  await Promise.all(inFlight);
  return failed ? { completed, error } : { completed };
}

/**
 * The op form a batch of `layout`'s blocks is sent in: strided for HND blocks (one op per head
 * of a block instead of one per token and head) when the engine takes strided ops; else plain.
 */
export function opFormFor(copy: CopyEngine, layout: KvLayout): CopyOpForm {
  return layout.blockLayout === 'HND' && copy.copyStrided !== undefined ? 'strided' : 'plain';
}

/** Sends a batch in `form` to the method that takes it. */
function send(
  copy: CopyEngine,
  form: CopyOpForm,
  surfaces: readonly CopySurface[],
  ops: Float64Array,
  options: CopyOptions | undefined,
): Promise<void> {
  if (form === 'strided') return copy.copyStrided!(surfaces, ops, options);
  return options === undefined ? copy.copy(surfaces, ops) : copy.copy(surfaces, ops, options);
}

/** One chunk of a save or load: its blocks, its payload in host memory, blocks it skips. */
export interface ChunkCopy {
  ids: Uint32Array;
  payload: Uint8Array;
  /** Leading blocks of the chunk not copied (`ids` leaves them out); default 0. */
  skip?: number;
}

/** Where one engine's regions are among the copy surfaces. */
export interface EngineSurfaces {
  readonly layout: KvLayout;
  readonly surfaces: readonly CopySurface[];
  readonly regionSurface: readonly number[];
}

/**
 * Gathers (`save`) or scatters (`load`) chunks in groups of up to `groupBytes` of payload, at most
 * `inFlight` groups at a time ({@link runWindowed}).
 * @returns how many leading chunks were copied, the first failure, and the time it all took (ms).
 */
export async function copyChunks(
  copy: CopyEngine,
  eng: EngineSurfaces,
  direction: 'gather' | 'scatter',
  items: readonly ChunkCopy[],
  opts: {
    groupBytes?: number;
    inFlight?: number;
    stop?: () => boolean;
    /** Passed to every copy of the batch (an engine's CUDA event for a save). */
    copy?: CopyOptions;
  } = {},
): Promise<{ copied: number; error?: unknown; ms: number }> {
  const t0 = performance.now();
  const groups = groupByBytes(
    items.map((c) => c.payload.byteLength),
    opts.groupBytes ?? COPY_GROUP_BYTES,
  );
  const form = opFormFor(copy, eng.layout);
  const outcome = await runWindowed(
    groups,
    ([a, b]) => {
      const surfaces: CopySurface[] = [...eng.surfaces];
      let slots = 0;
      for (let i = a; i < b; i++)
        slots += chunkOpSlots(eng.layout, items[i]!.ids.length, form, direction);
      // The op table is filled in place: block ids go from the decoded Uint32Array straight to it.
      const ops = new Float64Array(slots);
      let at = 0;
      for (let i = a; i < b; i++) {
        const c = items[i]!;
        const payload = surfaces.push(c.payload) - 1;
        at = writeChunkOps(
          ops,
          at,
          eng.layout,
          direction,
          c.ids,
          eng.regionSurface,
          payload,
          0,
          c.skip ?? 0,
          form,
        );
      }
      return send(copy, form, surfaces, ops, opts.copy);
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

/**
 * Scatters chunks layer by layer: every chunk's regions of the first layer, then of the next, in
 * groups of up to `groupBytes` (a layer's blocks may span several groups; a group never holds
 * two layers), at most `inFlight` at a time. `onLayers(n)` is called, in order, each time the
 * leading `n` layers are all in place.
 * @returns the layers copied in full, the first failure, and the time it all took (ms).
 */
export async function scatterLayerwise(
  copy: CopyEngine,
  eng: EngineSurfaces,
  items: readonly ChunkCopy[],
  opts: {
    groupBytes?: number;
    inFlight?: number;
    stop?: () => boolean;
    onLayers?: (layers: number) => void;
  } = {},
): Promise<{ layers: number; error?: unknown; ms: number }> {
  const t0 = performance.now();
  const { layout } = eng;
  const maxBytes = opts.groupBytes ?? LOAD_GROUP_BYTES;
  const form = opFormFor(copy, layout);
  // One group: `[chunk, region]` pairs of one layer, and the layers complete once it is in.
  const groups: Array<{ parts: Array<[number, number]>; layersDone: number }> = [];
  const layers = layerRegions(layout);
  layers.forEach(([ra, rb], l) => {
    let parts: Array<[number, number]> = [];
    let bytes = 0;
    for (let c = 0; c < items.length; c++) {
      for (let r = ra; r < rb; r++) {
        const n = items[c]!.ids.length * layout.blockBytes;
        if (parts.length > 0 && bytes + n > maxBytes) {
          groups.push({ parts, layersDone: l });
          parts = [];
          bytes = 0;
        }
        parts.push([c, r]);
        bytes += n;
      }
    }
    if (parts.length > 0) groups.push({ parts, layersDone: l + 1 });
  });
  let announced = 0;
  const outcome = await runWindowed(
    groups,
    ({ parts }) => {
      const surfaces: CopySurface[] = [...eng.surfaces];
      const payloadSurface = new Map<number, number>();
      let slots = 0;
      for (const [c] of parts)
        slots += regionOpSlots(layout, items[c]!.ids.length, form, 'scatter');
      const ops = new Float64Array(slots);
      let at = 0;
      for (const [c, r] of parts) {
        const item = items[c]!;
        let payload = payloadSurface.get(c);
        if (payload === undefined) {
          payload = surfaces.push(item.payload) - 1;
          payloadSurface.set(c, payload);
        }
        at = writeRegionOps(
          ops,
          at,
          layout,
          'scatter',
          item.ids,
          r,
          eng.regionSurface[r]!,
          payload,
          item.skip ?? 0,
          0,
          form,
        );
      }
      return send(copy, form, surfaces, ops, undefined);
    },
    {
      window: opts.inFlight ?? COPY_GROUPS_IN_FLIGHT,
      ...(opts.stop !== undefined ? { stop: opts.stop } : {}),
      onAdvance: (completed) => {
        const done = groups[completed - 1]!.layersDone;
        if (done > announced) {
          announced = done;
          opts.onLayers?.(done);
        }
      },
    },
  );
  const ms = performance.now() - t0;
  const layersCopied = outcome.completed === 0 ? 0 : groups[outcome.completed - 1]!.layersDone;
  // No chunks: every layer is trivially in place.
  const full = groups.length === 0 ? layers.length : layersCopied;
  return outcome.error !== undefined
    ? { layers: full, error: outcome.error, ms }
    : { layers: full, ms };
}
