import { readFile } from 'node:fs/promises';
import { KvtierError } from '../errors.ts';
import { describe } from '../util/validate.ts';

/**
 * The models a capacity plan is made for. The simulator moves and verifies the bytes of a small
 * verification model (see `SIM_MODEL_DEFAULTS`); every capacity, byte count and time it reports is
 * computed for the planned model below from its KV shape: tokens are what both share.
 */

/** KV shape and size of a real model, as its Hugging Face `config.json` gives it. */
export interface PlannedModel {
  /** Display name, e.g. "Llama-3.1-8B". */
  name: string;
  /** `num_hidden_layers`. */
  numLayers: number;
  /** `num_key_value_heads` (MLA: 1, the latent is shared by every head). */
  numKvHeads: number;
  /** Per-head dim of K and V (MLA: `kv_lora_rank + qk_rope_head_dim`, stored once). */
  headDim: number;
  /** Bytes per KV element (`torch_dtype`: bfloat16 and float16 2, float32 4). */
  dtypeBytes: number;
  /** Multi-head latent attention: one latent vector per token and layer instead of K and V. */
  mla: boolean;
  /** Parameters used per token (MoE: the active ones), for the FLOPs of a step. */
  activeParams: number;
  /** Every parameter (MoE: all experts), for the weights' memory; default `activeParams`. */
  totalParams?: number;
  /** Bytes per weight as served (bf16 2, FP8 1); default 2. */
  weightBytesPerParam?: number;
  /** Width of the attention score and value products per layer (heads x head dim), for the n² term. */
  attentionWidth: number;
  /** Where the numbers come from. */
  source: string;
}

/**
 * KV bytes one token takes in the engine's cache and in every kvtier tier: layers x (K and V) x
 * KV heads x head dim x dtype, or for MLA layers x latent width x dtype.
 */
export function kvBytesPerToken(m: PlannedModel): number {
  const perLayer = m.mla ? m.headDim * m.dtypeBytes : 2 * m.numKvHeads * m.headDim * m.dtypeBytes;
  return m.numLayers * perLayer;
}

const HF = 'https://huggingface.co';

/**
 * Built-in presets, keyed by `--model` name (lower case). Shapes are the public `config.json`
 * values of each model; active parameters from the model cards.
 */
export const MODEL_PRESETS: Readonly<Record<string, Readonly<PlannedModel>>> = Object.freeze({
  'llama-3.1-8b': {
    name: 'Llama-3.1-8B',
    numLayers: 32,
    numKvHeads: 8,
    headDim: 128,
    dtypeBytes: 2,
    mla: false,
    activeParams: 8.03e9,
    attentionWidth: 32 * 128,
    source: `${HF}/meta-llama/Llama-3.1-8B/blob/main/config.json`,
  },
  'llama-3.1-70b': {
    name: 'Llama-3.1-70B',
    numLayers: 80,
    numKvHeads: 8,
    headDim: 128,
    dtypeBytes: 2,
    mla: false,
    activeParams: 70.6e9,
    attentionWidth: 64 * 128,
    source: `${HF}/meta-llama/Llama-3.1-70B/blob/main/config.json`,
  },
  'qwen2.5-7b': {
    name: 'Qwen2.5-7B',
    numLayers: 28,
    numKvHeads: 4,
    headDim: 128,
    dtypeBytes: 2,
    mla: false,
    activeParams: 7.62e9,
    attentionWidth: 28 * 128,
    source: `${HF}/Qwen/Qwen2.5-7B/blob/main/config.json`,
  },
  'mistral-7b': {
    name: 'Mistral-7B-v0.3',
    numLayers: 32,
    numKvHeads: 8,
    headDim: 128,
    dtypeBytes: 2,
    mla: false,
    activeParams: 7.25e9,
    attentionWidth: 32 * 128,
    source: `${HF}/mistralai/Mistral-7B-v0.3/blob/main/config.json`,
  },
  'deepseek-v3': {
    name: 'DeepSeek-V3 (MLA)',
    numLayers: 61,
    numKvHeads: 1,
    // kv_lora_rank 512 + qk_rope_head_dim 64, cached in bf16.
    headDim: 512 + 64,
    dtypeBytes: 2,
    mla: true,
    activeParams: 37e9,
    // 671B parameters, served in the FP8 the checkpoint ships.
    totalParams: 671e9,
    weightBytesPerParam: 1,
    // 128 heads; scores over qk_nope 128 + rope 64, values over v_head_dim 128: mean 160.
    attentionWidth: 128 * 160,
    source: `${HF}/deepseek-ai/DeepSeek-V3/blob/main/config.json`,
  },
});

/** Name of the preset used when no `--model` is given. */
export const DEFAULT_MODEL = 'llama-3.1-8b';

/**
 * The preset called `name` (case-insensitive).
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the presets when there is none.
 */
export function modelPreset(name: string): PlannedModel {
  const m = MODEL_PRESETS[name.toLowerCase()];
  if (m === undefined)
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `--model must be one of ${Object.keys(MODEL_PRESETS).join(', ')}, got ${JSON.stringify(name)} (or give --model-config FILE)`,
    );
  return { ...m };
}

const DTYPE_BYTES: Record<string, number> = {
  bfloat16: 2,
  float16: 2,
  half: 2,
  float32: 4,
  float: 4,
  float8_e4m3fn: 1,
  float8_e5m2: 1,
};

/**
 * Reads a model's KV shape from a Hugging Face `config.json` object (a multimodal config's
 * `text_config` when present): `num_hidden_layers`, `num_key_value_heads` (default
 * `num_attention_heads`), `head_dim` (default `hidden_size / num_attention_heads`),
 * `torch_dtype` (default bfloat16), and for MLA `kv_lora_rank + qk_rope_head_dim`. Active
 * parameters are estimated from `hidden_size`, `intermediate_size` and `vocab_size` (dense
 * models; MoE configs count `num_experts_per_tok` experts of `moe_intermediate_size`).
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the missing or bad field.
 */
export function modelFromHfConfig(config: unknown, name: string): PlannedModel {
  if (typeof config !== 'object' || config === null || Array.isArray(config))
    throw new KvtierError('KVT_INVALID_ARGUMENT', `${name}: expected a JSON object`);
  const outer = config as Record<string, unknown>;
  const c = (
    typeof outer.text_config === 'object' && outer.text_config !== null
      ? { ...outer, ...(outer.text_config as Record<string, unknown>) }
      : outer
  ) as Record<string, unknown>;
  const int = (key: string, fallback?: number): number => {
    const v = c[key] ?? fallback;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 1)
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `${name}: ${key} must be an integer >= 1, got ${describe(c[key])}`,
      );
    return v;
  };
  const numLayers = int('num_hidden_layers');
  const heads = int('num_attention_heads');
  const hidden = int('hidden_size');
  const dtype = String(c.torch_dtype ?? c.dtype ?? 'bfloat16');
  const dtypeBytes = DTYPE_BYTES[dtype];
  if (dtypeBytes === undefined)
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `${name}: torch_dtype must be one of ${Object.keys(DTYPE_BYTES).join(', ')}, got ${JSON.stringify(dtype)}`,
    );
  const mla = c.kv_lora_rank !== undefined && c.kv_lora_rank !== null;
  const headDim = int('head_dim', Math.floor(hidden / heads));
  const numKvHeads = mla ? 1 : int('num_key_value_heads', heads);
  const latent = mla ? int('kv_lora_rank') + int('qk_rope_head_dim') : headDim;
  const vocab = typeof c.vocab_size === 'number' ? c.vocab_size : 0;
  const ffn =
    typeof c.moe_intermediate_size === 'number' && typeof c.num_experts_per_tok === 'number'
      ? c.moe_intermediate_size * (c.num_experts_per_tok + ((c.n_shared_experts as number) ?? 0))
      : typeof c.intermediate_size === 'number'
        ? c.intermediate_size
        : 4 * hidden;
  const attnParams = hidden * heads * headDim * 2 + hidden * numKvHeads * headDim * 2;
  const activeParams = numLayers * (attnParams + 3 * hidden * ffn) + 2 * vocab * hidden;
  const experts = typeof c.n_routed_experts === 'number' ? c.n_routed_experts : c.num_local_experts;
  const totalParams =
    typeof c.moe_intermediate_size === 'number' && typeof experts === 'number'
      ? numLayers * (attnParams + 3 * hidden * c.moe_intermediate_size * experts) +
        2 * vocab * hidden
      : activeParams;
  return {
    name,
    numLayers,
    numKvHeads,
    headDim: latent,
    dtypeBytes,
    mla,
    activeParams,
    totalParams: Math.max(totalParams, activeParams),
    attentionWidth: heads * headDim,
    source: `${name} (config.json)`,
  };
}

/**
 * Reads `path` as a Hugging Face `config.json` (see {@link modelFromHfConfig}).
 * @throws KvtierError `KVT_INVALID_ARGUMENT` when the file is not JSON or lacks a field; the
 *   file system's error when it cannot be read.
 */
export async function readModelConfig(path: string): Promise<PlannedModel> {
  const text = await readFile(path, 'utf8');
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (err) {
    throw new KvtierError('KVT_INVALID_ARGUMENT', `${path}: not valid JSON`, { cause: err });
  }
  const base = path.replace(/\/config\.json$/, '').replace(/^.*\//, '');
  return modelFromHfConfig(v, base === '' ? path : base);
}
