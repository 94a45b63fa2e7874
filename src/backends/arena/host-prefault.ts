/**
 * Pre-faulting a host arena: every slab is reserved up front and its pages committed on the
 * libuv pool in the background, so that the first copies into the CPU tier run at memory speed
 * instead of faulting each page in (about 20x slower on a fresh VM) while the event loop waits.
 */
import { setImmediate as nextTurn } from 'node:timers/promises';
import { loadNative } from '../../native/native-addon.ts';
import type { Logger } from '../../util/log.ts';
import type { HostArena } from './host-arena.ts';

/**
 * Commits the pages `view` covers without changing its bytes; resolves with the bytes covered,
 * or `'unsupported'` when this host cannot (e.g. Linux < 5.14). Must never write to `view`:
 * copies may run into the same memory meanwhile.
 */
export type SlabPrefault = (view: Uint8Array) => Promise<number | 'unsupported'>;

/** Default of {@link PrefaultOptions.prefault}. */
export const DEFAULT_PREFAULT = false;

/** The pre-fault options of a host-memory tier (beside its arena options). */
export interface PrefaultOptions {
  /**
   * Reserve every slab at start and commit its pages in the background (on the libuv pool), so
   * that the first saves do not fault pages in. The process's resident memory is then the whole
   * capacity from the start. Default false: slabs are taken and touched as chunks arrive.
   */
  prefault?: boolean;
  /**
   * How pages are committed (not a config key): default the native addon's
   * `madvise(MADV_POPULATE_WRITE)` when it is loaded; `null` (or no addon): nothing is
   * reserved or pre-faulted (the tier behaves as with `prefault: false`) and a debug line says so.
   */
  prefaultSlab?: SlabPrefault | null;
}

/**
 * Bytes committed per pool task: the kernel holds the process's memory-map lock while it commits
 * them, and on a fresh VM 4 MiB takes a few ms; larger steps held the event loop longer (9 ms at
 * 16 MiB, measured) whenever it needed that lock, and a close waits for the step that runs.
 */
export const PREFAULT_STEP_BYTES = 4 * 1024 * 1024;

/** Where a background pre-fault stands. */
export interface PrefaultState {
  /** Bytes committed so far. */
  readonly bytes: number;
  /** True once it ended: every slab done, unsupported, failed, or closed. */
  readonly done: boolean;
}

/** A background pre-fault of one arena; see {@link startPrefault}. */
export interface ArenaPrefault {
  state(): PrefaultState;
  /** Settles once the pre-fault ended; never rejects. */
  readonly finished: Promise<void>;
  /** Stops after the step that runs (at most {@link PREFAULT_STEP_BYTES}); resolves when it is over. */
  stop(): Promise<void>;
}

/**
 * Starts reserving and pre-faulting `arena`'s slabs in the background when `options.prefault`
 * is true; returns undefined otherwise. One slab is reserved per event-loop turn (with CUDA,
 * pinning a slab commits it on the calling thread) and its pages are committed in
 * {@link PREFAULT_STEP_BYTES} steps, one pool task at a time. A failure (e.g. `ENOMEM`) is
 * logged at warn and ends the pre-fault; the tier keeps working with lazily committed pages.
 */
export function startPrefault(
  arena: HostArena,
  options: PrefaultOptions,
  log: Logger | undefined,
): ArenaPrefault | undefined {
  if (!(options.prefault ?? DEFAULT_PREFAULT)) return undefined;
  const fault = options.prefaultSlab === undefined ? addonPrefault() : options.prefaultSlab;
  let bytes = 0;
  let done = false;
  let stopped = false;
  const run = async (): Promise<void> => {
    if (fault === null) {
      log?.debug('host memory is not pre-faulted: the native addon is not loaded');
      return;
    }
    let supported = true;
    for (let i = 0; supported && !stopped; i++) {
      await nextTurn();
      if (stopped) break;
      const slab = i < arena.slabCount ? arena.slab(i) : arena.reserveSlab();
      if (slab === null) break;
      for (let off = 0; supported && off < slab.byteLength && !stopped; ) {
        const end = Math.min(slab.byteLength, off + PREFAULT_STEP_BYTES);
        const r = await fault(slab.subarray(off, end));
        if (r === 'unsupported') {
          log?.debug('host memory is not pre-faulted: the kernel cannot (Linux >= 5.14 can)');
          supported = false;
        } else bytes += r;
        off = end;
      }
    }
  };
  const finished = run()
    .catch((err: unknown) => {
      log?.warn('pre-faulting host memory failed; pages are committed as chunks arrive', {
        err: err instanceof Error ? err.message : String(err),
      });
    })
    .finally(() => {
      done = true;
    });
  return {
    state: () => ({ bytes, done }),
    finished,
    stop: () => {
      stopped = true;
      return finished;
    },
  };
}

function addonPrefault(): SlabPrefault | null {
  const { addon } = loadNative();
  return addon === null ? null : (view) => addon.prefault(view);
}
