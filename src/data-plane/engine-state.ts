/**
 * The data plane's per-engine state and how a registration's surfaces are opened: every KV file
 * or CUDA IPC allocation once, then a check that each region fits in what was opened.
 */
import { KvtierError } from '../errors.ts';
import type { PinnedLookup } from '../storage-manager/storage-types.ts';
import type { CopyEngine, DeviceSurface } from './copy-engine-types.ts';
import { resolveCudaDevice } from './device-uuid.ts';
import { checkRegionsFit, type KvLayout } from './kv-layout.ts';

/** One engine request: the lookups whose pins it holds, and its loads in flight. */
export interface RequestState {
  readonly held: Map<string, PinnedLookup>;
  active: number;
  finished: boolean;
}

/** A registered engine: its layout, opened surfaces and requests. */
export interface EngineState {
  readonly layout: KvLayout;
  readonly surfaces: DeviceSurface[];
  readonly regionSurface: number[];
  readonly stateSurface: DeviceSurface | null;
  readonly requests: Map<string, RequestState>;
  readonly inflight: Set<Promise<unknown>>;
  lastSeenMs: number;
  gone: boolean;
}

/** The surfaces of a registration, as {@link EngineState} keeps them. */
export interface OpenedSurfaces {
  readonly surfaces: DeviceSurface[];
  /** Surface index of each region of the layout. */
  readonly regionSurface: number[];
  readonly stateSurface: DeviceSurface | null;
}

/**
 * The CUDA device a layout's registration is opened on (-1 for the host device).
 * @throws KvtierError `KVT_CONFIG` for the cuda device without a CUDA copy engine;
 *   `KVT_INVALID_ARGUMENT` for a `deviceUuid` the copy engine does not see.
 */
export function cudaDeviceFor(copy: CopyEngine, layout: KvLayout): number {
  if (layout.device !== 'cuda') return -1;
  if (copy.openCuda === undefined)
    throw new KvtierError(
      'KVT_CONFIG',
      'the cuda device needs the native copy engine (CUDA build on a GPU machine)',
    );
  return resolveCudaDevice(layout.deviceUuid, copy.cudaDevices?.() ?? []);
}

/**
 * Opens every file (or IPC allocation) of a layout once and checks that each region fits; on
 * failure closes what it opened.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for an unopenable file or a region beyond its file.
 */
export async function openSurfaces(
  copy: CopyEngine,
  layout: KvLayout,
  cudaDevice: number,
): Promise<OpenedSurfaces> {
  const opened = new Map<string, number>();
  const surfaces: DeviceSurface[] = [];
  const sizes = new Map<string, number>();
  const openOne = async (key: string, make: () => Promise<DeviceSurface>): Promise<number> => {
    let idx = opened.get(key);
    if (idx === undefined) {
      const s = await make();
      idx = surfaces.push(s) - 1;
      opened.set(key, idx);
      sizes.set(key, s.sizeBytes);
    }
    return idx;
  };
  const openFile = (path: string) =>
    copy.openFile(path).catch((err: unknown) => {
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `registration: cannot open ${path}: ${(err as Error).message}`,
        { cause: err },
      );
    });
  try {
    const regionSurface: number[] = [];
    for (const r of layout.regions) {
      const loc = r.location;
      regionSurface.push(
        loc.device === 'host'
          ? await openOne(loc.path, () => openFile(loc.path))
          : await openOne(`cuda:${loc.ipcHandle}`, () =>
              copy.openCuda!(loc.ipcHandle, loc.allocationBytes, cudaDevice),
            ),
      );
    }
    const sf = layout.stateFile;
    const stateIdx = sf === null ? -1 : await openOne(sf.path, () => openFile(sf.path));
    checkRegionsFit(layout, (p) => sizes.get(p) ?? 0);
    return { surfaces, regionSurface, stateSurface: stateIdx < 0 ? null : surfaces[stateIdx]! };
  } catch (err) {
    await Promise.all(surfaces.map((s) => s.close()));
    throw err;
  }
}
