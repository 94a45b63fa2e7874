import { KvtierError } from '../errors.ts';
import {
  describe,
  requireBoolean,
  requireInt,
  requireNumber,
  requireOneOf,
  requireString,
} from '../util/validate.ts';
import type { SimEngineOptions, SimModel, SimTierConfig, Workload } from './types.ts';

/** Model defaults: a small Llama-like shape so a run moves little memory. */
export const SIM_MODEL_DEFAULTS: Readonly<SimModel> = Object.freeze({
  numLayers: 4,
  numKvHeads: 2,
  headDim: 16,
  blockSize: 16,
  chunkSize: 256,
});

/** Engine defaults (see `SimEngineOptions`). */
export const SIM_ENGINE_DEFAULTS: Readonly<SimEngineOptions> = Object.freeze({
  numGpuBlocks: 4096,
  maxTokensPerStep: 8192,
  maxRunning: 64,
  prefillTokensPerSec: 20_000,
  kvLoadFailurePolicy: 'recompute',
  lookupTimeoutMs: 2000,
  partialChunkLoads: true,
  neverSlower: false,
});

/** Default CPU tier capacity: 256 MiB. */
export const SIM_DEFAULT_CPU_BYTES = 256 * 1024 * 1024;

/** Resolved options of a run. */
export interface ResolvedSimOptions {
  model: SimModel;
  engine: SimEngineOptions;
  cpuBytes: number;
  lowerTiers: SimTierConfig[];
  timeScale: number;
  waitsAdvanceClock: boolean;
}

/**
 * Applies defaults and validates the options of `runSimulation`.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` naming the first bad option and what is allowed.
 */
export function resolveSimOptions(opts: {
  workload: Workload;
  model?: Partial<SimModel>;
  engine?: Partial<SimEngineOptions>;
  cpuBytes?: number;
  lowerTiers?: SimTierConfig[];
  timeScale?: number;
  waitsAdvanceClock?: boolean;
}): ResolvedSimOptions {
  const w = opts.workload;
  if (typeof w !== 'object' || w === null || !Array.isArray(w.requests))
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `workload must be { name, requests: SimRequest[] }, got ${describe(w)}`,
    );
  requireString('workload.name', w.name);
  const ids = new Set<string>();
  w.requests.forEach((r, i) => {
    requireString(`workload.requests[${i}].id`, r?.id, { nonEmpty: true });
    if (ids.has(r.id))
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `workload.requests[${i}].id ${r.id} is not unique`,
      );
    ids.add(r.id);
    requireNumber(`workload.requests[${i}].arrivalMs`, r.arrivalMs, 0);
    if (!(r.promptTokens instanceof Uint32Array) || r.promptTokens.length === 0)
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `workload.requests[${i}].promptTokens must be a non-empty Uint32Array`,
      );
    requireInt(`workload.requests[${i}].outputTokens`, r.outputTokens, 0);
  });
  const m = { ...SIM_MODEL_DEFAULTS, ...opts.model };
  const model: SimModel = {
    numLayers: requireInt('model.numLayers', m.numLayers, 1, 1024),
    numKvHeads: requireInt('model.numKvHeads', m.numKvHeads, 1, 4096),
    headDim: requireInt('model.headDim', m.headDim, 1, 65536),
    blockSize: requireInt('model.blockSize', m.blockSize, 1, 65536),
    chunkSize: requireInt('model.chunkSize', m.chunkSize, 1, 1 << 20),
  };
  if ((model.numKvHeads * model.headDim) % 2 !== 0)
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `model.numKvHeads * model.headDim must be even (bf16 KV is written in 4-byte words), got ${model.numKvHeads * model.headDim}`,
    );
  if (model.chunkSize % model.blockSize !== 0)
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `model.chunkSize must be a multiple of model.blockSize (${model.blockSize}), got ${model.chunkSize}`,
    );
  const e = { ...SIM_ENGINE_DEFAULTS, ...opts.engine };
  const engine: SimEngineOptions = {
    numGpuBlocks: requireInt('engine.numGpuBlocks', e.numGpuBlocks, 1, 1 << 24),
    maxTokensPerStep: requireInt('engine.maxTokensPerStep', e.maxTokensPerStep, 1),
    maxRunning: requireInt('engine.maxRunning', e.maxRunning, 1),
    prefillTokensPerSec: requireNumber('engine.prefillTokensPerSec', e.prefillTokensPerSec, 1),
    kvLoadFailurePolicy: requireOneOf('engine.kvLoadFailurePolicy', e.kvLoadFailurePolicy, [
      'recompute',
      'fail',
    ] as const),
    lookupTimeoutMs: requireInt('engine.lookupTimeoutMs', e.lookupTimeoutMs, 1),
    partialChunkLoads: requireBoolean('engine.partialChunkLoads', e.partialChunkLoads),
    neverSlower: requireBoolean('engine.neverSlower', e.neverSlower),
  };
  const cpuBytes = requireInt('cpuBytes', opts.cpuBytes ?? SIM_DEFAULT_CPU_BYTES, 1);
  const lowerTiers = opts.lowerTiers ?? [];
  if (!Array.isArray(lowerTiers))
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `lowerTiers must be an array, got ${describe(lowerTiers)}`,
    );
  const names = new Set(['cpu']);
  lowerTiers.forEach((t, i) => {
    const name = requireString(`lowerTiers[${i}].name`, t?.name, { nonEmpty: true });
    if (names.has(name))
      throw new KvtierError(
        'KVT_INVALID_ARGUMENT',
        `lowerTiers[${i}].name "${name}" is taken (the CPU tier is "cpu")`,
      );
    names.add(name);
    requireString(`lowerTiers[${i}].type`, t.type, { nonEmpty: true });
    if (typeof t.options !== 'object' || t.options === null)
      throw new KvtierError('KVT_INVALID_ARGUMENT', `lowerTiers[${i}].options must be an object`);
  });
  const timeScale = requireNumber('timeScale', opts.timeScale ?? 0, 0);
  const waitsAdvanceClock = opts.waitsAdvanceClock ?? true;
  if (typeof waitsAdvanceClock !== 'boolean')
    throw new KvtierError(
      'KVT_INVALID_ARGUMENT',
      `waitsAdvanceClock must be a boolean, got ${describe(waitsAdvanceClock)}`,
    );
  return { model, engine, cpuBytes, lowerTiers, timeScale, waitsAdvanceClock };
}
