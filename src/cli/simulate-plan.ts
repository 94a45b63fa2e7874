import { parseArgs } from 'node:util';
import { parseBytes } from '../config/bytes.ts';
import { isKvtierError } from '../errors.ts';
import {
  DEFAULT_MODEL,
  MODEL_PRESETS,
  modelPreset,
  type PlannedModel,
  readModelConfig,
} from '../sim/models.ts';
import type {
  SimEngineOptions,
  SimFaults,
  SimModel,
  SimTierConfig,
  Workload,
} from '../sim/types.ts';
import { longDocQa, multiRoundQa, traceReplay } from '../sim/workloads.ts';

/** What `kvtier simulate` hands the engine for one run (the engine's `runSimulation` options). */
export interface SimulationRunOptions {
  workload: Workload;
  model?: Partial<SimModel>;
  engine?: Partial<SimEngineOptions>;
  /** The model the run is planned for (capacities below are already converted from its bytes). */
  planned?: PlannedModel;
  /** Capacity of the sidecar's CPU tier in bytes (verification model); the engine's default when absent. */
  cpuBytes?: number;
  /** Tiers below the CPU tier, in order. */
  lowerTiers?: SimTierConfig[];
  faults?: SimFaults;
  /** Stops and restarts the run's own Redis server (given with `--fault redis-outage`). */
  hooks?: { killRedis(): Promise<void>; restartRedis(): Promise<void> };
  /** A fresh directory the run may write to (removed afterwards). */
  workDir?: string;
  /** Whether waits for kvtier advance the modeled clock (the command passes false: a virtual clock). */
  waitsAdvanceClock?: boolean;
  signal?: AbortSignal;
}

/**
 * Flags of `kvtier simulate`: the usage text, and the parser that turns argv into a {@link Plan}
 * (or a one-line {@link UsageError}).
 */

/** CPU tier capacity when --cpu is not given, in the planned model's bytes. */
export const DEFAULT_CPU = '32GiB';
/** GPU KV cache when neither --gpu-memory nor --gpu-blocks is given (planned model's bytes). */
export const DEFAULT_GPU = '32GiB';

/**
 * The default run (no --workload): users in rounds over a shared system prompt, with a GPU cache
 * smaller than their histories, so kvtier has work to do.
 */
export const TEACH = Object.freeze({
  workload: Object.freeze({
    users: 8,
    rounds: 4,
    systemPromptTokens: 2048,
    questionTokens: 256,
    answerTokens: 512,
  }) as {
    users?: number;
    rounds?: number;
    systemPromptTokens?: number;
    questionTokens?: number;
    answerTokens?: number;
  },
  cpu: '1GiB',
  gpu: '1GiB',
});

/** Fault names `--fault` accepts, each optionally `@STEP`. */
export const FAULT_NAMES = [
  'redis-outage',
  'sidecar-restart',
  'corrupt',
  'deadline',
  'evict',
] as const;

/** Engine step a fault fires at when `--fault NAME` gives no `@STEP`. */
export const DEFAULT_FAULT_STEP = 5;

/** Usage text of `kvtier simulate`. */
export const SIMULATE_COMMAND_USAGE = `Usage: kvtier simulate [--workload multi-round|long-doc|trace] [options]

A capacity planner: drives a real kvtier sidecar with a simulated vLLM-like engine, verifies
every loaded KV block against recomputation, and reports where prompt tokens came from, for a
real model's KV sizes. With no flags it runs a small multi-round workload whose working set does
not fit the GPU cache, and says what kvtier served and what host memory would serve more.

Capacities (--cpu, --disk, --sweep, --gpu-memory) are in the planned model's KV bytes. The bytes
that move and are verified are a small verification model's (512 B per token), chunk for chunk:
tokens and hit rates are the same, bytes and modeled times are the planned model's.

Workloads:
  --workload multi-round   users share a system prompt; each round resends the user's history
      --users N --rounds N --system-tokens N --question-tokens N --answer-tokens N
      --interval-ms X      ms between a user's rounds (default 1000)
  --workload long-doc      each document read once, then query rounds (document + query)
      --documents N --document-tokens N --queries N --query-tokens N --output-tokens N
      --interval-ms X      ms between requests (default 1000)
  --workload trace         replay a Mooncake JSONL trace
      --trace FILE [--limit N] [--time-scale X] [--max-input-tokens N]
  --seed N                 seed of every synthetic token (default 0)

Model:
  --model NAME             ${Object.keys(MODEL_PRESETS).join(', ')}
                           (default ${DEFAULT_MODEL})
  --model-config FILE      a Hugging Face config.json instead (layers, KV heads, head dim, dtype,
                           MLA rank)

Tiers and engine:
  --cpu SIZE               CPU tier capacity, e.g. 32G (default ${DEFAULT_CPU}; ${TEACH.cpu} with no --workload)
  --disk SIZE              add a local disk tier of SIZE (in a temporary directory)
  --redis URL              add a Redis tier (a fresh key prefix per run)
  --fault redis-outage starts a private redis-server per run instead (REDIS_SERVER or PATH)
  --gpu-memory SIZE        the engine's GPU KV cache (default ${DEFAULT_GPU}; ${TEACH.gpu} with no --workload)
  --gpu-blocks N           the same in blocks of 16 tokens, instead of --gpu-memory
  --chunk-size N           tokens per stored chunk (default 256)
  --policy recompute|fail  what to do with blocks that failed to load (default recompute)
  --no-partial-chunks      claim only from chunk boundaries: an engine prefix that ends inside
                           a stored chunk then recomputes the rest of it (for comparison)
  --fault NAME[@STEP]      inject a fault (repeatable): ${FAULT_NAMES.join(', ')}

Output:
  --json                   print JSON instead of text
  --sweep cpu=SIZES|disk=SIZES   e.g. cpu=8G,32G,128G: one run per capacity, a table with the
                           LRU and infinite-cache bounds of the same workload
  --chart FILE.svg         with --sweep: write the chart as SVG, and as PNG beside it
  --help                   print this text

Exit status: 0 when every run had 0 mismatched blocks, 1 otherwise, 2 on bad flags.`;

/** A bad flag: the command prints its message and exits 2. */
export class UsageError extends Error {}

const WORKLOAD_FLAGS = {
  'multi-round': [
    'users',
    'rounds',
    'system-tokens',
    'question-tokens',
    'answer-tokens',
    'interval-ms',
  ],
  'long-doc': [
    'documents',
    'document-tokens',
    'queries',
    'query-tokens',
    'output-tokens',
    'interval-ms',
  ],
  trace: ['trace', 'limit', 'time-scale', 'max-input-tokens'],
} as const;
type WorkloadKind = keyof typeof WORKLOAD_FLAGS;

const STRING_FLAGS = [
  'workload',
  'model',
  'model-config',
  'gpu-memory',
  'seed',
  'cpu',
  'disk',
  'redis',
  'chunk-size',
  'gpu-blocks',
  'policy',
  'sweep',
  'chart',
  ...Object.values(WORKLOAD_FLAGS).flat(),
] as const;

/** What the flags ask for; sizes are in the planned model's bytes. */
export interface Plan {
  load: (signal?: AbortSignal) => Promise<Workload>;
  loadModel: () => Promise<PlannedModel>;
  /** The run options the flags fix (no tier capacities: those depend on the model). */
  base: Omit<SimulationRunOptions, 'workload' | 'workDir' | 'signal' | 'cpuBytes'>;
  /** The default teaching run (no --workload). */
  teach: boolean;
  cpuBytes: number;
  /** GPU KV memory, unless `base.engine.numGpuBlocks` came from --gpu-blocks. */
  gpuMemoryBytes: number | undefined;
  diskBytes: number | undefined;
  redisUrl: string | undefined;
  sweep: { tier: 'cpu' | 'disk'; capacitiesBytes: number[] } | undefined;
  chart: string | undefined;
  json: boolean;
}

/**
 * Parses the flags.
 * @throws UsageError for a bad flag (one line, the flag and what is allowed).
 */
export function parsePlan(argv: string[]): Plan | 'help' {
  let values: Record<string, string | string[] | boolean | undefined>;
  try {
    ({ values } = parseArgs({
      args: argv,
      strict: true,
      allowPositionals: false,
      options: {
        ...Object.fromEntries(STRING_FLAGS.map((f) => [f, { type: 'string' as const }])),
        fault: { type: 'string', multiple: true },
        json: { type: 'boolean' },
        'no-partial-chunks': { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
      },
    }));
  } catch (err) {
    // parseArgs spreads its hint over several lines; keep it, on one line.
    throw new UsageError(oneLine(err).replace(/\s*\n\s*/g, ' '));
  }
  if (values.help === true) return 'help';
  const str = (f: string) => values[f] as string | undefined;

  const teach = str('workload') === undefined;
  const kind = str('workload') ?? 'multi-round';
  if (!(kind in WORKLOAD_FLAGS)) {
    throw new UsageError(
      `--workload must be multi-round, long-doc or trace, got ${JSON.stringify(kind)}`,
    );
  }
  for (const [other, flags] of Object.entries(WORKLOAD_FLAGS)) {
    if (other === kind) continue;
    for (const f of flags) {
      if (
        values[f] !== undefined &&
        !(WORKLOAD_FLAGS[kind as WorkloadKind] as readonly string[]).includes(f)
      ) {
        throw new UsageError(`--${f} applies to --workload ${other}, not ${kind}`);
      }
    }
  }
  const int = (f: string, min: number) => intFlag(f, str(f), min);
  const seed = int('seed', 0);
  let load: Plan['load'];
  if (kind === 'multi-round') {
    const t = teach ? TEACH.workload : {};
    const opts = {
      users: int('users', 1) ?? t.users,
      rounds: int('rounds', 1) ?? t.rounds,
      systemPromptTokens: int('system-tokens', 0) ?? t.systemPromptTokens,
      questionTokens: int('question-tokens', 1) ?? t.questionTokens,
      answerTokens: int('answer-tokens', 1) ?? t.answerTokens,
      roundIntervalMs: numberFlag('interval-ms', str('interval-ms')),
      seed,
    };
    load = async () => multiRoundQa(opts);
  } else if (kind === 'long-doc') {
    const opts = {
      documents: int('documents', 1),
      documentTokens: int('document-tokens', 1),
      queriesPerDocument: int('queries', 0),
      queryTokens: int('query-tokens', 1),
      outputTokens: int('output-tokens', 1),
      requestIntervalMs: numberFlag('interval-ms', str('interval-ms')),
      seed,
    };
    load = async () => longDocQa(opts);
  } else {
    const path = str('trace');
    if (path === undefined) throw new UsageError('--workload trace needs --trace FILE');
    const timeScale = numberFlag('time-scale', str('time-scale'));
    const opts = {
      path,
      limit: int('limit', 1),
      timeScale,
      maxInputTokens: int('max-input-tokens', 1),
      seed,
    };
    load = (signal) =>
      traceReplay(opts, signal === undefined ? {} : { signal }).catch((err: unknown) => {
        if (isKvtierError(err)) throw err;
        throw new Error(`cannot read trace ${path}: ${oneLine(err)}`);
      });
  }

  const base: Plan['base'] = {};
  const cpu = sizeFlag('cpu', str('cpu'));
  const chunkSize = int('chunk-size', 1);
  if (chunkSize !== undefined) base.model = { chunkSize };
  const engine: Partial<SimEngineOptions> = {};
  const gpuBlocks = int('gpu-blocks', 1);
  if (gpuBlocks !== undefined) engine.numGpuBlocks = gpuBlocks;
  const gpuMemory = sizeFlag('gpu-memory', str('gpu-memory'));
  if (gpuBlocks !== undefined && gpuMemory !== undefined) {
    throw new UsageError('--gpu-memory and --gpu-blocks both size the GPU cache; give one');
  }
  const modelName = str('model');
  const modelConfig = str('model-config');
  if (modelName !== undefined && modelConfig !== undefined) {
    throw new UsageError('--model and --model-config both name the model; give one');
  }
  let loadModel: Plan['loadModel'];
  if (modelConfig !== undefined) loadModel = () => readModelConfig(modelConfig);
  else {
    let m: PlannedModel;
    try {
      m = modelPreset(modelName ?? DEFAULT_MODEL);
    } catch (err) {
      throw new UsageError(oneLine(err));
    }
    loadModel = async () => m;
  }
  const policy = str('policy');
  if (policy !== undefined) {
    if (policy !== 'recompute' && policy !== 'fail') {
      throw new UsageError(`--policy must be recompute or fail, got ${JSON.stringify(policy)}`);
    }
    engine.kvLoadFailurePolicy = policy;
  }
  if (values['no-partial-chunks'] === true) engine.partialChunkLoads = false;
  if (Object.keys(engine).length > 0) base.engine = engine;
  const faults = parseFaults((values.fault as string[] | undefined) ?? []);
  if (faults !== undefined) base.faults = faults;

  const sweep = parseSweep(str('sweep'));
  const diskBytes = sizeFlag('disk', str('disk'));
  if (sweep?.tier === 'cpu' && cpu !== undefined) {
    throw new UsageError('--cpu and --sweep cpu=... both set the CPU tier capacity; give one');
  }
  if (sweep !== undefined && sweep.capacitiesBytes.length > 12) {
    throw new UsageError('--sweep takes at most 12 capacities');
  }
  if (sweep?.tier === 'disk' && diskBytes !== undefined) {
    throw new UsageError('--disk and --sweep disk=... both set the disk tier capacity; give one');
  }
  if (
    faults?.corruptChunks !== undefined &&
    diskBytes === undefined &&
    sweep?.tier !== 'disk' &&
    str('redis') === undefined &&
    faults.redisOutage === undefined
  ) {
    throw new UsageError(
      '--fault corrupt damages chunks on the lowest tier: add --disk SIZE or --redis URL',
    );
  }
  if (faults?.redisOutage !== undefined && str('redis') !== undefined) {
    throw new UsageError(
      '--fault redis-outage runs its own Redis server (it must kill it); drop --redis',
    );
  }
  const chart = str('chart');
  if (chart !== undefined && sweep === undefined) {
    throw new UsageError('--chart FILE needs --sweep cpu=...|disk=...');
  }
  return {
    load,
    loadModel,
    base,
    teach,
    cpuBytes: cpu ?? parseBytes('cpu', teach ? TEACH.cpu : DEFAULT_CPU),
    gpuMemoryBytes:
      gpuBlocks !== undefined
        ? undefined
        : (gpuMemory ?? parseBytes('gpu-memory', teach ? TEACH.gpu : DEFAULT_GPU)),
    diskBytes,
    redisUrl: str('redis'),
    sweep,
    chart,
    json: values.json === true,
  };
}

function parseFaults(specs: readonly string[]): SimFaults | undefined {
  if (specs.length === 0) return undefined;
  const faults: SimFaults = {};
  for (const spec of specs) {
    const [name, at] = spec.split('@', 2) as [string, string | undefined];
    if (!(FAULT_NAMES as readonly string[]).includes(name)) {
      throw new UsageError(
        `--fault must be one of ${FAULT_NAMES.join(', ')} (optionally @STEP), got ${JSON.stringify(spec)}`,
      );
    }
    const step = at === undefined ? DEFAULT_FAULT_STEP : (intFlag('fault', at, 1) as number);
    if (name === 'redis-outage') faults.redisOutage = { atStep: step, forSteps: 5 };
    else if (name === 'sidecar-restart') faults.sidecarRestartAtStep = step;
    else if (name === 'corrupt') faults.corruptChunks = { atStep: step, count: 2 };
    else if (name === 'deadline') faults.lookupDeadlineAtStep = step;
    else faults.evictBetweenLookupAndLoadAtStep = step;
  }
  return faults;
}

function parseSweep(raw: string | undefined): Plan['sweep'] {
  if (raw === undefined) return undefined;
  const m = /^(cpu|disk)=(.+)$/.exec(raw);
  if (m === null) {
    throw new UsageError(
      `--sweep must look like cpu=8G,32G,128G or disk=64G,256G, got ${JSON.stringify(raw)}`,
    );
  }
  const tier = m[1] as 'cpu' | 'disk';
  const sizes = (m[2] as string).split(',').map((v) => sizeFlag('sweep', v.trim()) as number);
  if (sizes.some((s) => s === 0)) throw new UsageError('--sweep capacities must be > 0');
  const capacitiesBytes = [...new Set(sizes)].sort((a, b) => a - b);
  return { tier, capacitiesBytes };
}

function intFlag(flag: string, raw: string | undefined, min: number): number | undefined {
  if (raw === undefined) return undefined;
  const n = Number(raw);
  if (!/^[0-9]+$/.test(raw) || !Number.isSafeInteger(n) || n < min) {
    throw new UsageError(`--${flag} must be an integer >= ${min}, got ${JSON.stringify(raw)}`);
  }
  return n;
}

function numberFlag(flag: string, raw: string | undefined): number | undefined {
  if (raw === undefined) return undefined;
  const n = Number(raw);
  if (raw.trim() === '' || !Number.isFinite(n) || n < 0) {
    throw new UsageError(`--${flag} must be a number >= 0, got ${JSON.stringify(raw)}`);
  }
  return n;
}

function sizeFlag(flag: string, raw: string | undefined): number | undefined {
  if (raw === undefined) return undefined;
  try {
    return parseBytes(`--${flag}`, raw);
  } catch (err) {
    throw new UsageError(oneLine(err));
  }
}

/** The first line of an error's message. */
export function oneLine(err: unknown): string {
  const msg = err instanceof Error ? err.message : String(err);
  return msg.split('\n', 1)[0] ?? msg;
}
