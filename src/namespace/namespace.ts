import { createHash } from 'node:crypto';
import { KvtierError } from '../errors.ts';
import { describe, requireBoolean, requireInt, requireString } from '../util/validate.ts';

/**
 * Namespaces (design decision 2, docs/architecture.md). Every stored chunk belongs to a namespace
 * that captures everything that changes its bytes. The id is derived from the engine's
 * configuration, never typed by hand, so two engines share KV exactly when their KV bytes are
 * interchangeable. The canonical encoding is specified in docs/protocol.md section 9.2; changing
 * it is a protocol change.
 */

/**
 * Version tag: the first line of the canonical encoding. v2 keys a rank's chunks by the KV heads
 * it holds instead of its tensor-parallel size and rank (v1), so no v1 id is ever derived again
 * and chunks stored under v1 are never read as v2 ones.
 */
export const NAMESPACE_ENCODING_TAG = 'kvtier-ns/v2';

/** Length of a namespace id in lowercase hex digits (16 bytes). */
export const NAMESPACE_ID_HEX_LENGTH = 32;

/** Longest accepted model id, in UTF-16 code units. */
export const MAX_MODEL_ID_LENGTH = 512;

/** What determines a chunk's bytes. Every field is validated by {@link deriveNamespace}. */
export interface NamespaceSpec {
  /** Model identity, e.g. `meta-llama/Meta-Llama-3-8B`; compared byte for byte (case matters). */
  modelId: string;
  /** KV cache element type; aliases such as `bf16`, `fp16`, `torch.float16` are normalised. */
  dtype: string;
  /** Number of attention layers whose KV is stored. */
  numLayers: number;
  /**
   * KV heads of the model as a whole (its config's `num_key_value_heads`), not per rank. For MLA,
   * the number of latent vectors per layer (1 for DeepSeek-style models).
   */
  numKvHeads: number;
  /** Elements per head; for MLA the latent width (e.g. 576 = 512 + 64 rope). */
  headDim: number;
  /** Engine KV block size in tokens. */
  blockSize: number;
  /**
   * Tensor-parallel world size. Enters the id only through the KV heads the rank holds
   * ({@link kvHeadRange}); ignored when `mla` is set.
   */
  tpSize: number;
  /** This rank in [0, tpSize); enters the id only through {@link kvHeadRange}. */
  tpRank: number;
  /** Multi-head latent attention: every rank holds the same latent, so KV is rank-agnostic. */
  mla: boolean;
  /** Version of the in-page KV layout, an integer >= 1. */
  layoutVersion: number;
  /**
   * Pipeline-parallel world size, 1..1024; default 1 (no pipeline parallelism, and the id is the
   * same as for a spec without the pp fields). When > 1, `numLayers` is this stage's layer count.
   */
  ppSize?: number;
  /** This pipeline stage in [0, ppSize); default 0. Enters the id only when `ppSize` > 1. */
  ppRank?: number;
  /**
   * Index in the model of this stage's first layer, an integer >= 0; default 0, and must be 0 when
   * `ppSize` is 1. Enters the id only when `ppSize` > 1.
   */
  ppFirstLayer?: number;
}

/** A derived namespace. */
export interface Namespace {
  /** 32 lowercase hex digits: the first 16 bytes of SHA-256 of the canonical encoding. */
  id: string;
  /**
   * Human-readable summary for logs and metrics, e.g. `llama-3-8b/bfloat16/L32/H8x128/B16/h0-4/v1`
   * (KV heads 0..3 of 8), `.../mla/v1` for MLA, or with pipeline parallelism
   * `.../h0-4/pp4r1@L8/v1` (stage 1 of 4, first layer 8).
   */
  label: string;
  /**
   * The validated spec with `dtype` in canonical spelling and `ppSize`, `ppRank`, `ppFirstLayer`
   * filled in with their defaults (frozen).
   */
  spec: Readonly<NamespaceSpec>;
}

/** Canonical dtype names and their element size in bytes. */
export const DTYPE_BYTES: Readonly<Record<CanonicalDtype, number>> = Object.freeze({
  float32: 4,
  float16: 2,
  bfloat16: 2,
  float8_e4m3: 1,
  float8_e5m2: 1,
  int8: 1,
  uint8: 1,
});

/** The dtype spellings a namespace id is computed from. */
export type CanonicalDtype =
  | 'float32'
  | 'float16'
  | 'bfloat16'
  | 'float8_e4m3'
  | 'float8_e5m2'
  | 'int8'
  | 'uint8';

// `fp8` is vLLM's name for e4m3. The AMD `float8_e4m3fnuz` encoding differs bit for bit from
// e4m3fn, so it is deliberately not an alias: sharing would corrupt KV.
const DTYPE_ALIASES: ReadonlyMap<string, CanonicalDtype> = new Map<string, CanonicalDtype>([
  ['float32', 'float32'],
  ['fp32', 'float32'],
  ['f32', 'float32'],
  ['float', 'float32'],
  ['float16', 'float16'],
  ['fp16', 'float16'],
  ['f16', 'float16'],
  ['half', 'float16'],
  ['bfloat16', 'bfloat16'],
  ['bf16', 'bfloat16'],
  ['float8_e4m3', 'float8_e4m3'],
  ['float8_e4m3fn', 'float8_e4m3'],
  ['fp8', 'float8_e4m3'],
  ['fp8_e4m3', 'float8_e4m3'],
  ['e4m3', 'float8_e4m3'],
  ['float8_e5m2', 'float8_e5m2'],
  ['fp8_e5m2', 'float8_e5m2'],
  ['e5m2', 'float8_e5m2'],
  ['int8', 'int8'],
  ['uint8', 'uint8'],
]);

const NAMESPACE_ID = /^[0-9a-f]{32}$/;
// Control characters would let a model id forge extra `key=value` lines in the encoding.
// biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point
const CONTROL = /[\u0000-\u001f\u007f]/;
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
const MAX_DIM = 1 << 20;
const MAX_LAYERS = 100_000;

/** Largest accepted pipeline-parallel world size. */
export const MAX_PP_SIZE = 1024;

/**
 * Maps a dtype spelling to its canonical name. Case-insensitive; a `torch.` prefix is accepted.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for an unknown dtype (including `auto`, which must be
 *   resolved to the actual KV dtype before deriving a namespace).
 */
export function normalizeDtype(dtype: unknown, name = 'dtype'): CanonicalDtype {
  const raw = requireString(name, dtype, { nonEmpty: true });
  let key = raw.trim().toLowerCase();
  if (key.startsWith('torch.')) key = key.slice('torch.'.length);
  const canonical = DTYPE_ALIASES.get(key);
  if (canonical === undefined) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `${name} must be one of ${Object.keys(DTYPE_BYTES).join(', ')} (or an alias such as bf16, fp16, half, fp8), got ${describe(dtype)}`,
    );
  }
  return canonical;
}

/**
 * Validates a spec and returns a frozen copy with the dtype normalised.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the first bad field and what is allowed.
 */
export function normalizeNamespaceSpec(spec: NamespaceSpec): Readonly<NamespaceSpec> {
  if (typeof spec !== 'object' || spec === null) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `namespace spec must be an object, got ${describe(spec)}`,
    );
  }
  const modelId = requireModelId(spec.modelId);
  const dtype = normalizeDtype(spec.dtype, 'namespace.dtype');
  const numLayers = requireInt('namespace.numLayers', spec.numLayers, 1, MAX_LAYERS);
  const numKvHeads = requireInt('namespace.numKvHeads', spec.numKvHeads, 1, MAX_DIM);
  const headDim = requireInt('namespace.headDim', spec.headDim, 1, MAX_DIM);
  const blockSize = requireInt('namespace.blockSize', spec.blockSize, 1, MAX_DIM);
  const mla = requireBoolean('namespace.mla', spec.mla);
  const tpSize = requireInt('namespace.tpSize', spec.tpSize, 1, 65_536);
  const tpRank = requireInt('namespace.tpRank', spec.tpRank, 0, tpSize - 1);
  const layoutVersion = requireInt('namespace.layoutVersion', spec.layoutVersion, 1, 65_535);
  const ppSize = requireInt('namespace.ppSize', spec.ppSize ?? 1, 1, MAX_PP_SIZE);
  const ppRank = requireInt('namespace.ppRank', spec.ppRank ?? 0, 0, ppSize - 1);
  const ppFirstLayer = requireInt('namespace.ppFirstLayer', spec.ppFirstLayer ?? 0, 0, MAX_LAYERS);
  if (ppSize === 1 && ppFirstLayer !== 0) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `namespace.ppFirstLayer must be 0 when namespace.ppSize is 1 (the only stage starts at layer 0), got ${ppFirstLayer}`,
    );
  }
  if (!mla && numKvHeads % tpSize !== 0 && tpSize % numKvHeads !== 0) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `namespace.numKvHeads (${numKvHeads}) and namespace.tpSize (${tpSize}) must divide one another (heads are split or replicated across ranks)`,
    );
  }
  return Object.freeze({
    modelId,
    dtype,
    numLayers,
    numKvHeads,
    headDim,
    blockSize,
    tpSize,
    tpRank,
    mla,
    layoutVersion,
    ppSize,
    ppRank,
    ppFirstLayer,
  });
}

function requireModelId(value: unknown): string {
  const s = requireString('namespace.modelId', value, { nonEmpty: true });
  let problem: string | undefined;
  if (s.length > MAX_MODEL_ID_LENGTH) problem = `at most ${MAX_MODEL_ID_LENGTH} characters`;
  else if (s.trim() !== s) problem = 'without leading or trailing whitespace';
  else if (CONTROL.test(s)) problem = 'without control characters';
  else if (LONE_SURROGATE.test(s)) problem = 'well-formed Unicode (no lone surrogates)';
  if (problem !== undefined) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `namespace.modelId must be ${problem}, got ${describe(value)}`,
    );
  }
  return s;
}

/**
 * The KV heads `[start, end)` of the model that a rank holds: `numKvHeads / tpSize` consecutive
 * heads from `tpRank * numKvHeads / tpSize`, or, when there are fewer heads than ranks, the one
 * head `floor(tpRank * numKvHeads / tpSize)` (vLLM replicates each head on `tpSize / numKvHeads`
 * consecutive ranks). For MLA every rank holds all of them: `[0, numKvHeads)`.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for an invalid spec.
 */
export function kvHeadRange(spec: NamespaceSpec): readonly [number, number] {
  const s = normalizeNamespaceSpec(spec);
  return headRangeOf(s);
}

function headRangeOf(s: Readonly<NamespaceSpec>): readonly [number, number] {
  if (s.mla) return [0, s.numKvHeads];
  if (s.tpSize >= s.numKvHeads) {
    const h = Math.floor((s.tpRank * s.numKvHeads) / s.tpSize);
    return [h, h + 1];
  }
  const per = s.numKvHeads / s.tpSize;
  return [s.tpRank * per, (s.tpRank + 1) * per];
}

/**
 * The canonical encoding the id is the hash of: UTF-8 lines, each ending in `\n`, in this order:
 * the tag, then `model_id`, `dtype`, `num_layers`, `num_kv_heads`, `head_dim`, `block_size`,
 * `mla` (0|1), `kv_head_start`, `kv_head_end` (the rank's {@link kvHeadRange}; both `*` when
 * MLA), `layout_version`, as `key=value` with decimal integers; when `ppSize` > 1, three more
 * lines follow: `pp_size`, `pp_rank`, `pp_first_layer` (kept with MLA too). The tensor-parallel
 * size and rank enter only through the heads, so ranks of engines at different TP sizes that hold
 * the same heads share chunks. Exposed so other implementations can compare bytes.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for an invalid spec.
 */
export function canonicalNamespaceEncoding(spec: NamespaceSpec): string {
  const s = normalizeNamespaceSpec(spec);
  return encode(s, headRangeOf(s));
}

function encode(s: Readonly<NamespaceSpec>, heads: readonly [number, number]): string {
  const lines = [
    NAMESPACE_ENCODING_TAG,
    `model_id=${s.modelId}`,
    `dtype=${s.dtype}`,
    `num_layers=${s.numLayers}`,
    `num_kv_heads=${s.numKvHeads}`,
    `head_dim=${s.headDim}`,
    `block_size=${s.blockSize}`,
    `mla=${s.mla ? 1 : 0}`,
    `kv_head_start=${s.mla ? '*' : heads[0]}`,
    `kv_head_end=${s.mla ? '*' : heads[1]}`,
    `layout_version=${s.layoutVersion}`,
  ];
  if ((s.ppSize ?? 1) > 1) {
    lines.push(`pp_size=${s.ppSize}`, `pp_rank=${s.ppRank}`, `pp_first_layer=${s.ppFirstLayer}`);
  }
  return `${lines.join('\n')}\n`;
}

/**
 * Derives the namespace of a spec. The id holds the KV heads of the rank ({@link kvHeadRange}),
 * not its TP size and rank: the ranks of an engine have one namespace each, and a rank of an
 * engine at another TP size that holds the same heads has the same one (so do the replicas of a
 * head when there are more ranks than heads). For MLA specs every rank of the model shares one
 * namespace. Pipeline stages (`ppSize` > 1) always have their own namespaces, MLA or not.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for an invalid spec.
 */
export function deriveNamespace(spec: NamespaceSpec): Namespace {
  const s = normalizeNamespaceSpec(spec);
  return derive(s, headRangeOf(s));
}

function derive(s: Readonly<NamespaceSpec>, heads: readonly [number, number]): Namespace {
  const id = createHash('sha256')
    .update(encode(s, heads), 'utf8')
    .digest()
    .subarray(0, NAMESPACE_ID_HEX_LENGTH / 2)
    .toString('hex');
  let parallel = s.mla ? 'mla' : `h${heads[0]}-${heads[1]}`;
  if ((s.ppSize ?? 1) > 1) parallel += `/pp${s.ppSize}r${s.ppRank}@L${s.ppFirstLayer}`;
  const label = `${s.modelId}/${s.dtype}/L${s.numLayers}/H${s.numKvHeads}x${s.headDim}/B${s.blockSize}/${parallel}/v${s.layoutVersion}`;
  return Object.freeze({ id, label, spec: s });
}

/** True when `s` is a namespace id: exactly 32 lowercase hex digits. */
export function isNamespaceId(s: unknown): s is string {
  return typeof s === 'string' && NAMESPACE_ID.test(s);
}

/**
 * Returns `s` when it is a namespace id.
 * @param name what the value is, for the message (e.g. `lookup.namespace`).
 * @throws KvtierError `KVT_INVALID_ARGUMENT` otherwise.
 */
export function requireNamespaceId(name: string, s: unknown): string {
  if (!isNamespaceId(s)) {
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `${name} must be a namespace id (${NAMESPACE_ID_HEX_LENGTH} lowercase hex digits), got ${describe(s)}`,
    );
  }
  return s;
}

/**
 * KV heads one rank holds: heads are split across ranks, or replicated when there are fewer heads
 * than ranks (as vLLM does). For MLA, every rank holds all `numKvHeads` latents.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for an invalid spec.
 */
export function kvHeadsPerRank(spec: NamespaceSpec): number {
  const s = normalizeNamespaceSpec(spec);
  return s.mla ? s.numKvHeads : Math.max(1, s.numKvHeads / s.tpSize);
}

/**
 * Bytes of KV one rank stores per token over all layers: K and V
 * (`2 * numLayers * kvHeadsPerRank * headDim * dtypeBytes`), or for MLA one latent per layer
 * (`numLayers * numKvHeads * headDim * dtypeBytes`). Multiply by the chunk size for chunk bytes.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for an invalid spec.
 */
export function bytesPerToken(spec: NamespaceSpec): number {
  const s = normalizeNamespaceSpec(spec);
  const elem = DTYPE_BYTES[s.dtype as CanonicalDtype];
  const perLayer = s.mla ? s.numKvHeads * s.headDim : 2 * kvHeadsPerRank(s) * s.headDim;
  return s.numLayers * perLayer * elem;
}

/** The chunks of one head range: the namespace of the ranks that hold heads `[start, end)`. */
export interface HeadShard {
  readonly start: number;
  readonly end: number;
  readonly namespace: Namespace;
}

/**
 * One way to assemble a rank's KV heads from chunks saved at another TP size: the shards of
 * `width` heads (what each rank of an engine at TP `numKvHeads / width` holds) that overlap the
 * rank's {@link kvHeadRange}, in head order. A chunk loads from a cover when every shard of it
 * holds the chunk.
 */
export interface HeadCover {
  /** Heads per shard. */
  readonly width: number;
  readonly shards: readonly HeadShard[];
}

/**
 * Every way a rank can assemble its KV heads from other ranks' chunks: for each other divisor
 * `width` of `numKvHeads` (each TP size an engine of the model can run at, up to one head per
 * rank), the shards of that width that overlap the rank's heads. Ordered by the number of shards
 * (fewest objects to read first), then by width. Empty for MLA (every rank holds the same latent).
 * The rank's own namespace is not among them.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` for an invalid spec.
 */
export function headCovers(spec: NamespaceSpec): HeadCover[] {
  const s = normalizeNamespaceSpec(spec);
  if (s.mla) return [];
  const [a, b] = headRangeOf(s);
  const out: HeadCover[] = [];
  for (let width = 1; width <= s.numKvHeads; width++) {
    if (s.numKvHeads % width !== 0 || width === b - a) continue;
    const shards: HeadShard[] = [];
    for (let start = Math.floor(a / width) * width; start < b; start += width)
      shards.push(
        Object.freeze({ start, end: start + width, namespace: derive(s, [start, start + width]) }),
      );
    out.push(Object.freeze({ width, shards: Object.freeze(shards) }));
  }
  out.sort((x, y) => x.shards.length - y.shards.length || x.width - y.width);
  return out;
}
