import type { CopyEngine, CopyOptions, CopySurface } from './copy-engine-types.ts';
import { chunkOpSlots, type KvLayout, writeChunkOps } from './kv-layout.ts';

/**
 * How the data plane cuts a save or load into copy batches: consecutive chunks grouped up to a
 * byte bound, a few groups in flight at once, so the planning and issuing of one group overlaps
 * the copies of the previous one, and one batch's fixed cost (a stream, a kernel launch, a pool
 * thread hop) is paid per group instead of per chunk.
 */

/** Payload bytes of one copy group; a single larger chunk forms a group of its own. */
export const COPY_GROUP_BYTES = 128 * 1024 * 1024;
/** Copy groups in flight at once. */
export const COPY_GROUPS_IN_FLIGHT = 2;

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
 * asks `stop()`; once that says so, or a group fails, nothing more is issued. Resolves after every
 * issued group has settled, so no copy outlives the call (pins and pages it touches stay valid
 * until then).
 */
export async function runWindowed<G>(
  groups: readonly G[],
  run: (group: G, index: number) => Promise<void>,
  opts: { window?: number; stop?: () => boolean } = {},
): Promise<WindowedOutcome> {
  const window = Math.max(1, opts.window ?? COPY_GROUPS_IN_FLIGHT);
  const inFlight: Promise<unknown>[] = [];
  let completed = 0;
  let failed = false;
  let error: unknown;
  // Each settled group advances `completed` only while every group before it completed.
  const results: Array<boolean | undefined> = [];
  const advance = () => {
    while (results[completed] === true) completed++;
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
  const outcome = await runWindowed(
    groups,
    ([a, b]) => {
      const surfaces: CopySurface[] = [...eng.surfaces];
      let slots = 0;
      for (let i = a; i < b; i++) slots += chunkOpSlots(eng.layout, items[i]!.ids.length);
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
        );
      }
      return opts.copy === undefined
        ? copy.copy(surfaces, ops)
        : copy.copy(surfaces, ops, opts.copy);
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
