import { isAbsolute } from 'node:path';
import { KvtierError } from '../errors.ts';
import {
  bytesPerToken,
  deriveNamespace,
  kvHeadsPerRank,
  MAX_PP_SIZE,
  type Namespace,
  type NamespaceSpec,
} from '../namespace/namespace.ts';
import {
  describe,
  requireBoolean,
  requireInt,
  requireOneOf,
  requireString,
} from '../util/validate.ts';
import { normalizeDeviceUuid } from './device-uuid.ts';

/**
 * KV cache registration and address math (design decision 6, docs/architecture.md).
 *
 * Chunk payload layout (layout version 1), independent of the engine's block ids and strides:
 * regions in registration order (layer 0 K, layer 0 V, layer 1 K, ...; MLA: one latent region per
 * layer), and within a region the chunk's blocks in chunk order, each block contributing exactly
 * `blockSize * bytesPerTokenPerLayer` bytes (stride padding is not stored). So a chunk of `n`
 * blocks is `regions * n * blockBytes` bytes, and block `j` of region `r` starts at
 * `(r * n + j) * blockBytes`. A chunk saved from one block table loads into any other.
 *
 * Within a block the stored bytes are always token-major (NHD: `[blockSize, heads, headDim]`),
 * whatever order the engine's tensors hold them in. An engine whose blocks are head-major (HND:
 * `[heads, blockSize, headDim]`, `blockLayout: 'HND'`) has its blocks reordered on copy, one
 * `headDim`-wide segment per token and head, so NHD and HND engines (FlashAttention, FlashInfer,
 * Triton or CPU attention, in either order) derive the same namespace and share chunks. The
 * in-block order is therefore not part of the namespace.
 */

/** Where the engine's KV cache lives. */
export type KvDeviceKind = 'host' | 'cuda';

/**
 * In-block byte order of the engine's KV tensors: `NHD` token-major
 * (`[blockSize, heads, headDim]`), `HND` head-major (`[heads, blockSize, headDim]`).
 */
export type KvBlockLayout = 'NHD' | 'HND';

/** Bytes of one CUDA IPC memory handle (`cudaIpcMemHandle_t`). */
export const CUDA_IPC_HANDLE_BYTES = 64;

/** One K, V or latent region: block `b` lives at `offsetBytes + b * blockStrideBytes`. */
export interface KvRegionSpec {
  /** Host device: absolute path of the shared-memory file holding the region. */
  path?: string;
  /** CUDA device: the allocation's IPC handle, 128 hex digits. */
  ipcHandle?: string;
  /** CUDA device: size of the IPC allocation in bytes (what the region is checked against). */
  allocationBytes?: number;
  /** Byte offset of block 0 within the file or allocation. */
  offsetBytes: number;
}

/** One attention layer: K and V, or for MLA only `k` (the latent). */
export interface KvLayerSpec {
  k: KvRegionSpec;
  v?: KvRegionSpec;
}

/** A small file of 4-byte completion words the engine maps and polls (see `DataPlane.load`). */
export interface KvStateFileSpec {
  /** Absolute path; the file must hold at least `slots * 4` bytes. */
  path: string;
  slots: number;
}

/** What the worker sends once to register its KV caches. */
export interface KvRegistration {
  engineId: string;
  device: KvDeviceKind;
  /**
   * `cuda` only: the UUID of the GPU holding the KV cache, `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`
   * (hex in any case, `GPU-` prefix optional). The sidecar opens the handles and issues the copies
   * on the device with that UUID among those it sees. May be omitted only when the sidecar sees
   * exactly one GPU.
   */
  deviceUuid?: string;
  modelId: string;
  /** KV element type, e.g. `bfloat16` (aliases as in `normalizeDtype`). */
  dtype: string;
  /** KV heads of the whole model (per-rank heads are derived), or latents per layer for MLA. */
  numKvHeads: number;
  headDim: number;
  tpSize: number;
  tpRank: number;
  mla: boolean;
  /** Pipeline-parallel stages, 1..1024; default 1. With more than 1 they enter the namespace. */
  ppSize?: number;
  /** This stage, 0..ppSize-1; default 0. */
  ppRank?: number;
  /** Index in the model of this stage's first layer; default 0 (and 0 when ppSize is 1). */
  ppFirstLayer?: number;
  /** Blocks in each region. */
  numBlocks: number;
  /** Tokens per engine block. */
  blockSize: number;
  /** Distance between consecutive blocks of one region, bytes; >= blockSize * bytesPerTokenPerLayer. */
  blockStrideBytes: number;
  /** Bytes of K (and of V) per token per layer on this rank; derived when omitted, checked when given. */
  bytesPerTokenPerLayer?: number;
  /** Tokens per stored chunk; a multiple of blockSize. Default 256. */
  chunkSize?: number;
  /** Stored-form layout version that enters the namespace; default 1. */
  layoutVersion?: number;
  /**
   * In-block order of the engine's K and V blocks; default `NHD`. Does not enter the namespace:
   * HND blocks are reordered to the stored (NHD) form on copy. Must be `NHD` (or absent) for MLA.
   */
  blockLayout?: KvBlockLayout;
  /** One entry per layer, in model order. */
  layers: KvLayerSpec[];
  stateFile?: KvStateFileSpec;
}

/** Where a region's bytes are: a host file or a CUDA allocation. */
export type KvLocation =
  | { readonly device: 'host'; readonly path: string }
  | { readonly device: 'cuda'; readonly ipcHandle: string; readonly allocationBytes: number };

/** A validated region, in payload order. */
export interface KvRegion {
  readonly layer: number;
  readonly kind: 'k' | 'v' | 'latent';
  readonly location: KvLocation;
  readonly offsetBytes: number;
  /** Bytes from block 0's start to the end of the last block: (numBlocks - 1) * stride + blockBytes. */
  readonly extentBytes: number;
}

/** A validated registration with everything derived. */
export interface KvLayout {
  readonly engineId: string;
  readonly device: KvDeviceKind;
  /** Canonical `GPU-...` UUID (lowercase) of a cuda registration that named one; else null. */
  readonly deviceUuid: string | null;
  readonly namespace: Namespace;
  readonly numLayers: number;
  readonly numBlocks: number;
  readonly blockSize: number;
  readonly chunkSize: number;
  readonly blocksPerChunk: number;
  readonly blockStrideBytes: number;
  readonly bytesPerTokenPerLayer: number;
  /** Stored bytes of one block of one region: blockSize * bytesPerTokenPerLayer. */
  readonly blockBytes: number;
  /**
   * In-block order the copies translate from and to. `HND` only when it differs from the stored
   * order (several heads per rank and several tokens per block); otherwise `NHD`.
   */
  readonly blockLayout: KvBlockLayout;
  /** K (or V) heads per rank (MLA: latents per layer). */
  readonly headsPerRank: number;
  /** Bytes of one head of one token: bytesPerTokenPerLayer / headsPerRank. */
  readonly headBytes: number;
  readonly regions: readonly KvRegion[];
  readonly stateFile: Readonly<KvStateFileSpec> | null;
}

const DEFAULT_CHUNK_SIZE = 256;
const IPC_HANDLE = /^[0-9a-f]{128}$/;

function invalid(message: string): KvtierError {
  return new KvtierError('KVT_INVALID_ARGUMENT', message);
}

function requirePath(name: string, value: unknown): string {
  const p = requireString(name, value, { nonEmpty: true });
  if (!isAbsolute(p)) throw invalid(`${name} must be an absolute path, got ${describe(value)}`);
  return p;
}

/**
 * Validates a registration and derives its namespace and layout. File and allocation sizes are
 * checked separately by {@link checkRegionsFit} once the regions are opened.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the first bad field and what is allowed.
 */
export function resolveKvRegistration(reg: KvRegistration): KvLayout {
  if (typeof reg !== 'object' || reg === null)
    throw invalid(`registration must be an object, got ${describe(reg)}`);
  const engineId = requireString('registration.engineId', reg.engineId, { nonEmpty: true });
  if (engineId.length > 256) throw invalid('registration.engineId must be at most 256 characters');
  const device = requireOneOf('registration.device', reg.device, ['host', 'cuda'] as const);
  let deviceUuid: string | null = null;
  if (reg.deviceUuid !== undefined) {
    if (device !== 'cuda')
      throw invalid(
        `registration.deviceUuid is for the cuda device, got device ${describe(device)}`,
      );
    deviceUuid = normalizeDeviceUuid('registration.deviceUuid', reg.deviceUuid);
  }
  if (!Array.isArray(reg.layers) || reg.layers.length === 0)
    throw invalid(
      `registration.layers must be a non-empty array, got ${describe(reg.layers as unknown)}`,
    );
  const mla = requireBoolean('registration.mla', reg.mla);
  const blockSize = requireInt('registration.blockSize', reg.blockSize, 1, 1 << 20);
  const ppSize = requireInt('registration.ppSize', reg.ppSize ?? 1, 1, MAX_PP_SIZE);
  const ppRank = requireInt('registration.ppRank', reg.ppRank ?? 0, 0, ppSize - 1);
  const ppFirstLayer = requireInt('registration.ppFirstLayer', reg.ppFirstLayer ?? 0, 0);
  if (ppSize === 1 && ppFirstLayer !== 0)
    throw invalid(
      `registration.ppFirstLayer must be 0 without pipeline parallelism (ppSize 1), got ${ppFirstLayer}`,
    );
  const spec: NamespaceSpec = {
    modelId: reg.modelId,
    dtype: reg.dtype,
    numLayers: reg.layers.length,
    numKvHeads: reg.numKvHeads,
    headDim: reg.headDim,
    blockSize,
    tpSize: reg.tpSize,
    tpRank: reg.tpRank,
    mla,
    layoutVersion: reg.layoutVersion ?? 1,
    ppSize,
    ppRank,
    ppFirstLayer,
  };
  const namespace = deriveNamespace(spec);
  const requested = requireOneOf('registration.blockLayout', reg.blockLayout ?? 'NHD', [
    'NHD',
    'HND',
  ] as const);
  if (mla && requested !== 'NHD')
    throw invalid(
      'registration.blockLayout must be NHD (or absent) for MLA: a latent has no heads',
    );
  const headsPerRank = kvHeadsPerRank(spec);
  const regionsPerLayer = mla ? 1 : 2;
  const derived = bytesPerToken(spec) / (reg.layers.length * regionsPerLayer);
  const bytesPerTokenPerLayer =
    reg.bytesPerTokenPerLayer === undefined
      ? derived
      : requireInt('registration.bytesPerTokenPerLayer', reg.bytesPerTokenPerLayer, 1);
  if (bytesPerTokenPerLayer !== derived)
    throw invalid(
      `registration.bytesPerTokenPerLayer is ${bytesPerTokenPerLayer} but the model shape gives ${derived} (heads per rank * headDim * dtype bytes)`,
    );
  const numBlocks = requireInt('registration.numBlocks', reg.numBlocks, 1, 2 ** 31 - 1);
  const blockBytes = blockSize * bytesPerTokenPerLayer;
  const blockStrideBytes = requireInt('registration.blockStrideBytes', reg.blockStrideBytes, 1);
  if (blockStrideBytes < blockBytes)
    throw invalid(
      `registration.blockStrideBytes must be >= blockSize * bytesPerTokenPerLayer = ${blockBytes}, got ${blockStrideBytes}`,
    );
  const chunkSize = requireInt(
    'registration.chunkSize',
    reg.chunkSize ?? DEFAULT_CHUNK_SIZE,
    1,
    1 << 24,
  );
  if (chunkSize % blockSize !== 0)
    throw invalid(
      `registration.chunkSize must be a multiple of blockSize (${blockSize}), got ${chunkSize}`,
    );
  // One head or one token per block: both orders are the same bytes.
  const blockLayout: KvBlockLayout =
    requested === 'HND' && headsPerRank > 1 && blockSize > 1 ? 'HND' : 'NHD';
  const extentBytes = (numBlocks - 1) * blockStrideBytes + blockBytes;
  if (!Number.isSafeInteger(extentBytes))
    throw invalid('registration.numBlocks * blockStrideBytes is too large');
  const regions: KvRegion[] = [];
  reg.layers.forEach((layer, l) => {
    const name = `registration.layers[${l}]`;
    if (typeof layer !== 'object' || layer === null)
      throw invalid(`${name} must be an object, got ${describe(layer)}`);
    if (mla && layer.v !== undefined)
      throw invalid(`${name}.v must be absent for MLA (one latent region per layer)`);
    if (!mla && layer.v === undefined) throw invalid(`${name}.v is required (K and V regions)`);
    regions.push(region(`${name}.k`, device, layer.k, l, mla ? 'latent' : 'k', extentBytes));
    if (!mla) regions.push(region(`${name}.v`, device, layer.v, l, 'v', extentBytes));
  });
  let stateFile: KvStateFileSpec | null = null;
  if (reg.stateFile !== undefined) {
    const sf = reg.stateFile;
    if (typeof sf !== 'object' || sf === null)
      throw invalid(`registration.stateFile must be an object, got ${describe(sf)}`);
    stateFile = Object.freeze({
      path: requirePath('registration.stateFile.path', sf.path),
      slots: requireInt('registration.stateFile.slots', sf.slots, 1, 1 << 24),
    });
  }
  return Object.freeze({
    engineId,
    device,
    deviceUuid,
    namespace,
    numLayers: reg.layers.length,
    numBlocks,
    blockSize,
    chunkSize,
    blocksPerChunk: chunkSize / blockSize,
    blockStrideBytes,
    bytesPerTokenPerLayer,
    blockBytes,
    blockLayout,
    headsPerRank,
    headBytes: bytesPerTokenPerLayer / headsPerRank,
    regions: Object.freeze(regions),
    stateFile,
  });
}

function region(
  name: string,
  device: KvDeviceKind,
  spec: KvRegionSpec | undefined,
  layer: number,
  kind: KvRegion['kind'],
  extentBytes: number,
): KvRegion {
  if (typeof spec !== 'object' || spec === null)
    throw invalid(`${name} must be an object, got ${describe(spec)}`);
  const offsetBytes = requireInt(`${name}.offsetBytes`, spec.offsetBytes, 0);
  let location: KvLocation;
  if (device === 'host') {
    if (spec.ipcHandle !== undefined) throw invalid(`${name}.ipcHandle is for the cuda device`);
    location = { device, path: requirePath(`${name}.path`, spec.path) };
  } else {
    if (spec.path !== undefined) throw invalid(`${name}.path is for the host device`);
    const handle = requireString(`${name}.ipcHandle`, spec.ipcHandle, { nonEmpty: true });
    if (!IPC_HANDLE.test(handle))
      throw invalid(
        `${name}.ipcHandle must be ${CUDA_IPC_HANDLE_BYTES} bytes as ${CUDA_IPC_HANDLE_BYTES * 2} lowercase hex digits, got ${describe(handle)}`,
      );
    const allocationBytes = requireInt(`${name}.allocationBytes`, spec.allocationBytes, 1);
    location = { device, ipcHandle: handle, allocationBytes };
  }
  return Object.freeze({ layer, kind, location, offsetBytes, extentBytes });
}

/**
 * Checks that every region lies inside its file or allocation:
 * `offsetBytes + (numBlocks - 1) * blockStrideBytes + blockBytes <= size`. The last block's
 * stride padding is not required, so layouts that interleave K and V within one stride fit.
 * @param sizeOf size in bytes of a host file (by path); unused for cuda regions.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the region and the sizes.
 */
export function checkRegionsFit(layout: KvLayout, sizeOf: (path: string) => number): void {
  layout.regions.forEach((r) => {
    const size =
      r.location.device === 'host' ? sizeOf(r.location.path) : r.location.allocationBytes;
    const end = r.offsetBytes + r.extentBytes;
    if (end > size) {
      const where = r.location.device === 'host' ? `file ${r.location.path}` : 'the IPC allocation';
      throw invalid(
        `registration.layers[${r.layer}].${r.kind === 'latent' ? 'k' : r.kind}: offsetBytes ${r.offsetBytes} + ${layout.numBlocks} blocks at stride ${layout.blockStrideBytes} ends at byte ${end}, beyond ${where} (${size} bytes)`,
      );
    }
  });
  const sf = layout.stateFile;
  if (sf !== null && sf.slots * 4 > sizeOf(sf.path))
    throw invalid(
      `registration.stateFile: ${sf.slots} slots need ${sf.slots * 4} bytes, file ${sf.path} has ${sizeOf(sf.path)}`,
    );
}

/** Byte offset of block `blockId` of region `regionIndex` in its file or allocation. */
export function blockOffset(layout: KvLayout, regionIndex: number, blockId: number): number {
  return layout.regions[regionIndex]!.offsetBytes + blockId * layout.blockStrideBytes;
}

/** Payload bytes of a chunk of `blocks` blocks. */
export function chunkPayloadBytes(layout: KvLayout, blocks: number): number {
  return layout.regions.length * blocks * layout.blockBytes;
}

/** Offset within a chunk payload of block `j` (of `blocks`) of region `regionIndex`. */
export function payloadOffset(
  layout: KvLayout,
  regionIndex: number,
  j: number,
  blocks: number,
): number {
  return (regionIndex * blocks + j) * layout.blockBytes;
}

/**
 * Splits a block table over chunks: chunk `i` owns blocks `[i * blocksPerChunk, ...)`; only the
 * last chunk may have fewer blocks. With `skipBlocks = s` the first `s` blocks of the first chunk
 * are absent from `blockIds` (the engine holds them already), so chunk 0 gets the first
 * `blocksPerChunk - s` ids and every later chunk's range moves down by `s`. Validates ids
 * against `numBlocks` in one pass.
 * @returns the block ids of each chunk, as views into one `Uint32Array`: `blockIds` itself when
 *   it is one (as decoded from the wire), else one copy of it.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` when counts do not match, an id is out of range, or
 *   `skipBlocks` is not in `0..blocksPerChunk - 1` (or is > 0 with no chunks).
 */
export function splitBlocks(
  layout: KvLayout,
  blockIds: ArrayLike<number>,
  chunks: number,
  what: string,
  skipBlocks = 0,
): Uint32Array[] {
  const per = layout.blocksPerChunk;
  const s = requireInt(`${what}.skipBlocks`, skipBlocks, 0, per - 1);
  if (s > 0 && chunks === 0) throw invalid(`${what}: skipBlocks is ${s} but there are no chunks`);
  const n = blockIds.length;
  // At least one block to write once there is a chunk: M = 0 with N = 1 and s > 0 loads nothing.
  const lo = chunks === 0 ? 0 : Math.max(1, (chunks - 1) * per + 1 - s);
  const hi = chunks === 0 ? 0 : chunks * per - s;
  if (n < lo || n > hi)
    throw invalid(
      `${what}: ${chunks} chunks of ${per} blocks${s > 0 ? ` skipping ${s}` : ''} need ${chunks === 0 ? 0 : `${lo}..${hi}`} block ids, got ${n}`,
    );
  const given = blockIds instanceof Uint32Array;
  const ids = given ? blockIds : new Uint32Array(n);
  const max = layout.numBlocks - 1;
  for (let k = 0; k < n; k++) {
    const id = blockIds[k]!;
    // The message is built only for a bad id: this loop runs once per block of every save and load.
    if (!(Number.isInteger(id) && id >= 0 && id <= max))
      requireInt(`${what}.blockIds[${k}]`, id, 0, max);
    if (!given) ids[k] = id;
  }
  const out: Uint32Array[] = [];
  for (let i = 0; i < chunks; i++)
    out.push(ids.subarray(i === 0 ? 0 : i * per - s, Math.min(n, (i + 1) * per - s)));
  return out;
}

/**
 * The op form an op table is written in: `plain` 5-tuples
 * `[src, srcOffset, dst, dstOffset, length]`, or `strided` 8-tuples
 * `[src, srcOffset, dst, dstOffset, length, count, srcStride, dstStride]` (`count` pieces, each
 * side advancing by its stride), for copy engines that take them (`CopyEngine.copyStrided`).
 */
export type CopyOpForm = 'plain' | 'strided';

/** Numbers per op of each {@link CopyOpForm}. */
export const OP_WIDTH: Readonly<Record<CopyOpForm, number>> = { plain: 5, strided: 8 };

/**
 * Copy ops of one block of one region: 1; for HND blocks one per token and head in the plain
 * form; in the strided form, one per head (of `blockSize` pieces) for a gather and one per token
 * (of `heads` pieces) for a scatter, the larger of the two when `direction` is not given.
 */
export function opsPerBlock(
  layout: KvLayout,
  form: CopyOpForm = 'plain',
  direction?: 'gather' | 'scatter',
): number {
  if (layout.blockLayout !== 'HND') return 1;
  const { blockSize: bs, headsPerRank: heads } = layout;
  if (form === 'plain') return bs * heads;
  return direction === 'gather' ? heads : direction === 'scatter' ? bs : Math.max(bs, heads);
}

/**
 * Number of slots {@link writeRegionOps} fills for `blocks` copied blocks of one region (in the
 * strided form without `direction`: at most that many).
 */
export function regionOpSlots(
  layout: KvLayout,
  blocks: number,
  form: CopyOpForm = 'plain',
  direction?: 'gather' | 'scatter',
): number {
  return OP_WIDTH[form] * opsPerBlock(layout, form, direction) * blocks;
}

/** Number of slots {@link writeChunkOps} fills for a chunk of `blocks` copied blocks. */
export function chunkOpSlots(
  layout: KvLayout,
  blocks: number,
  form: CopyOpForm = 'plain',
  direction?: 'gather' | 'scatter',
): number {
  return layout.regions.length * regionOpSlots(layout, blocks, form, direction);
}

/**
 * Writes the copy ops of one chunk into `out` from slot `at`, in `form` (default 5-tuples
 * `[src, srcOffset, dst, dstOffset, length]`: the copy engine's op table, filled in place), and
 * returns the slot after the last one written ({@link chunkOpSlots} later).
 * `gather` copies blocks into the payload, `scatter` the payload into blocks.
 * @param regionSurface surface index of each region; @param payload surface index of the payload.
 * @param skipBlocks leading blocks of the chunk that are not copied: `blockIds[j]` is the chunk's
 *   block `skipBlocks + j`, in a payload of `skipBlocks + blockIds.length` blocks. Default 0.
 */
export function writeChunkOps(
  out: Float64Array,
  at: number,
  layout: KvLayout,
  direction: 'gather' | 'scatter',
  blockIds: ArrayLike<number>,
  regionSurface: readonly number[],
  payload: number,
  payloadBase = 0,
  skipBlocks = 0,
  form: CopyOpForm = 'plain',
): number {
  let o = at;
  for (let r = 0; r < layout.regions.length; r++)
    o = writeRegionOps(
      out,
      o,
      layout,
      direction,
      blockIds,
      r,
      regionSurface[r]!,
      payload,
      skipBlocks,
      payloadBase,
      form,
    );
  return o;
}

/**
 * {@link writeChunkOps} for region `r` alone ({@link regionOpSlots} slots): a layer-wise load
 * writes every chunk's regions of one layer before the next layer's. An NHD block is one op; an
 * HND block moves token `t` of head `h` between `(h * blockSize + t) * headBytes` in the engine's
 * block and `(t * heads + h) * headBytes` in the payload: in the plain form one op of `headBytes`
 * per token and head, in payload order; in the strided form a gather has one op per head
 * (`blockSize` pieces, contiguous in the block, `heads * headBytes` apart in the payload) and a
 * scatter one per token (`heads` pieces, contiguous in the payload, `blockSize * headBytes` apart
 * in the block).
 */
export function writeRegionOps(
  out: Float64Array,
  at: number,
  layout: KvLayout,
  direction: 'gather' | 'scatter',
  blockIds: ArrayLike<number>,
  r: number,
  surface: number,
  payload: number,
  skipBlocks = 0,
  payloadBase = 0,
  form: CopyOpForm = 'plain',
): number {
  const n = skipBlocks + blockIds.length;
  const gather = direction === 'gather';
  if (layout.blockLayout === 'HND')
    return (form === 'strided' ? writeHndStridedOps : writeHndOps)(
      out,
      at,
      layout,
      gather,
      blockIds,
      r,
      surface,
      payload,
      skipBlocks,
      n,
      payloadBase,
    );
  const len = layout.blockBytes;
  const strided = form === 'strided';
  let o = at;
  for (let j = 0; j < blockIds.length; j++) {
    const dev = blockOffset(layout, r, blockIds[j]!);
    const pay = payloadBase + payloadOffset(layout, r, skipBlocks + j, n);
    out[o] = gather ? surface : payload;
    out[o + 1] = gather ? dev : pay;
    out[o + 2] = gather ? payload : surface;
    out[o + 3] = gather ? pay : dev;
    out[o + 4] = len;
    if (strided) {
      out[o + 5] = 1;
      out[o + 6] = len;
      out[o + 7] = len;
      o += 8;
    } else o += 5;
  }
  return o;
}

function writeHndOps(
  out: Float64Array,
  at: number,
  layout: KvLayout,
  gather: boolean,
  blockIds: ArrayLike<number>,
  r: number,
  surface: number,
  payload: number,
  skipBlocks: number,
  n: number,
  payloadBase: number,
): number {
  const { blockSize: bs, headsPerRank: heads, headBytes: len } = layout;
  const src = gather ? surface : payload;
  const dst = gather ? payload : surface;
  let o = at;
  for (let j = 0; j < blockIds.length; j++) {
    const dev = blockOffset(layout, r, blockIds[j]!);
    let pay = payloadBase + payloadOffset(layout, r, skipBlocks + j, n);
    for (let t = 0; t < bs; t++) {
      for (let h = 0; h < heads; h++) {
        const d = dev + (h * bs + t) * len;
        out[o] = src;
        out[o + 1] = gather ? d : pay;
        out[o + 2] = dst;
        out[o + 3] = gather ? pay : d;
        out[o + 4] = len;
        o += 5;
        pay += len;
      }
    }
  }
  return o;
}

// Each strided op reads one contiguous stretch and writes its pieces apart (reading pieces apart
// measured 2-2.5x slower): a gather reads one head of the block per op, a scatter one token's row
// of the payload.
function writeHndStridedOps(
  out: Float64Array,
  at: number,
  layout: KvLayout,
  gather: boolean,
  blockIds: ArrayLike<number>,
  r: number,
  surface: number,
  payload: number,
  skipBlocks: number,
  n: number,
  payloadBase: number,
): number {
  const { blockSize: bs, headsPerRank: heads, headBytes: len } = layout;
  const headRun = bs * len;
  const tokenRow = heads * len;
  let o = at;
  for (let j = 0; j < blockIds.length; j++) {
    const dev = blockOffset(layout, r, blockIds[j]!);
    const pay = payloadBase + payloadOffset(layout, r, skipBlocks + j, n);
    if (gather)
      for (let h = 0; h < heads; h++) {
        out[o] = surface;
        out[o + 1] = dev + h * headRun;
        out[o + 2] = payload;
        out[o + 3] = pay + h * len;
        out[o + 4] = len;
        out[o + 5] = bs;
        out[o + 6] = len;
        out[o + 7] = tokenRow;
        o += 8;
      }
    else
      for (let t = 0; t < bs; t++) {
        out[o] = payload;
        out[o + 1] = pay + t * tokenRow;
        out[o + 2] = surface;
        out[o + 3] = dev + t * len;
        out[o + 4] = len;
        out[o + 5] = heads;
        out[o + 6] = len;
        out[o + 7] = headRun;
        o += 8;
      }
  }
  return o;
}

/** The layers of a layout in payload order: `[first region, end region)` of each. */
export function layerRegions(layout: KvLayout): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  for (let r = 0; r < layout.regions.length; r++) {
    const last = out.at(-1);
    if (last !== undefined && layout.regions[last[0]]!.layer === layout.regions[r]!.layer)
      last[1] = r + 1;
    else out.push([r, r + 1]);
  }
  return out;
}
