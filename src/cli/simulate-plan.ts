import { parseArgs } from 'node:util';
import { DEFAULT_MODEL, modelPreset, type PlannedModel, readModelConfig } from '../sim/models.ts';
import type { Target } from '../sim/planner.ts';
import { ROUTERS, type RouterKind } from '../sim/router.ts';
import type { PlannerTier, TierModelOverrides } from '../sim/tier-models.ts';
import type { SimEngineOptions, SimFaults, SimModel } from '../sim/types.ts';
import type { WorkloadSpec } from '../sim/workload-spec.ts';
import { parseBytes, tryParseBytes } from '../util/bytes.ts';
import {
  intFlag,
  numberFlag,
  oneLine,
  parseFaults,
  parseSweeps,
  parseTarget,
  type Sweep,
  sizeFlag,
  tierOverrides,
  UsageError,
} from './simulate-flags.ts';
import { DEFAULT_CPU, DEFAULT_UTILIZATION, TEACH } from './simulate-usage.ts';

export {
  DEFAULT_FAULT_STEP,
  FAULT_NAMES,
  oneLine,
  type Sweep,
  UsageError,
} from './simulate-flags.ts';
export { DEFAULT_CPU, SIMULATE_COMMAND_USAGE, TEACH } from './simulate-usage.ts';

/**
 * The flags of `kvtier simulate` turned into a {@link Plan} (or a one-line {@link UsageError}).
 * Values are parsed in `simulate-flags.ts`; the usage text is `simulate-usage.ts`.
 */

/** What the flags ask for; sizes are in the planned model's bytes. */
export interface Plan {
  /** The workload at its own timing (a trace at time scale 1). */
  workloadSpec: WorkloadSpec;
  /** The default teaching run (no --workload). */
  teach: boolean;
  /** `--time-scale` (traces); undefined: the sustainable rate for traces, 1 otherwise. */
  timeScale: number | undefined;
  /** Utilisation of the engine without kvtier the sustainable rate aims at. */
  utilization: number;
  loadModel: () => Promise<PlannedModel>;
  /** Verification model overrides (`--chunk-size`) and engine options (blocks, policy...). */
  model: Partial<SimModel>;
  engine: Partial<SimEngineOptions>;
  gpu: { name?: string; gpusPerEngine?: number; mfu?: number };
  /** `--gpu-memory`; undefined: the GPU's default (1 GiB for the teaching run) unless `engine.numGpuBlocks`. */
  gpuMemoryBytes: number | undefined;
  /** Base capacity of each tier in the run (cpu always). */
  tiers: Partial<Record<PlannerTier, number>> & { cpu: number };
  /** A Redis server to use instead of a private one (no capacity of ours). */
  redisUrl: string | undefined;
  sweeps: Sweep[];
  engines: number;
  /**
   * `--peers`: each configuration also runs with node-local tiers and a peer tier over the
   * fleet's sidecars (a fleet without a shared store).
   */
  peers: boolean;
  router: RouterKind;
  tierModels: TierModelOverrides;
  target: Target | undefined;
  faults: SimFaults | undefined;
  chart: string | undefined;
  json: boolean;
  workers: number | undefined;
}

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
  trace: ['trace', 'limit', 'time-scale', 'max-input-tokens', 'utilization'],
} as const;
type WorkloadKind = keyof typeof WORKLOAD_FLAGS;

const STRING_FLAGS = [
  'workload',
  'model',
  'model-config',
  'gpu',
  'gpus-per-engine',
  'mfu',
  'gpu-memory',
  'seed',
  'cpu',
  'disk',
  'fs',
  's3',
  'redis',
  'chunk-size',
  'gpu-blocks',
  'policy',
  'chart',
  'target',
  'engines',
  'router',
  'workers',
  ...Object.values(WORKLOAD_FLAGS).flat(),
] as const;
const LIST_FLAGS = ['fault', 'sweep', 'bandwidth', 'latency', 'price'] as const;

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
        ...Object.fromEntries(
          LIST_FLAGS.map((f) => [f, { type: 'string' as const, multiple: true }]),
        ),
        json: { type: 'boolean' },
        peers: { type: 'boolean' },
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
  const list = (f: string) => (values[f] as string[] | undefined) ?? [];
  const int = (f: string, min: number) => intFlag(f, str(f), min);

  const teach = str('workload') === undefined;
  const kind = str('workload') ?? 'multi-round';
  if (!(kind in WORKLOAD_FLAGS)) {
    throw new UsageError(
      `--workload must be multi-round, long-doc or trace, got ${JSON.stringify(kind)}`,
    );
  }
  for (const [other, flags] of Object.entries(WORKLOAD_FLAGS)) {
    if (other === kind) continue;
    for (const f of flags)
      if (
        values[f] !== undefined &&
        !(WORKLOAD_FLAGS[kind as WorkloadKind] as readonly string[]).includes(f)
      )
        throw new UsageError(`--${f} applies to --workload ${other}, not ${kind}`);
  }
  const workloadSpec = workloadOf(kind as WorkloadKind, teach, str, int);
  const utilization = numberFlag('utilization', str('utilization'), true) ?? DEFAULT_UTILIZATION;
  if (utilization > 1) throw new UsageError(`--utilization must be in (0, 1], got ${utilization}`);
  const timeScale = numberFlag('time-scale', str('time-scale'));
  if (timeScale !== undefined && values.utilization !== undefined)
    throw new UsageError('--time-scale and --utilization both set the replay rate; give one');

  const model: Partial<SimModel> = {};
  const chunkSize = int('chunk-size', 1);
  if (chunkSize !== undefined) model.chunkSize = chunkSize;
  const engine: Partial<SimEngineOptions> = {};
  const gpuBlocks = int('gpu-blocks', 1);
  if (gpuBlocks !== undefined) engine.numGpuBlocks = gpuBlocks;
  const gpuMemory = sizeFlag('gpu-memory', str('gpu-memory'));
  if (gpuBlocks !== undefined && gpuMemory !== undefined)
    throw new UsageError('--gpu-memory and --gpu-blocks both size the GPU cache; give one');
  const policy = str('policy');
  if (policy !== undefined) {
    if (policy !== 'recompute' && policy !== 'fail')
      throw new UsageError(`--policy must be recompute or fail, got ${JSON.stringify(policy)}`);
    engine.kvLoadFailurePolicy = policy;
  }
  if (values['no-partial-chunks'] === true) engine.partialChunkLoads = false;

  const gpu: Plan['gpu'] = {};
  if (str('gpu') !== undefined) gpu.name = str('gpu') as string;
  const gpus = int('gpus-per-engine', 1);
  if (gpus !== undefined) gpu.gpusPerEngine = gpus;
  const mfu = numberFlag('mfu', str('mfu'), true);
  if (mfu !== undefined) {
    if (mfu > 1) throw new UsageError(`--mfu must be in (0, 1], got ${mfu}`);
    gpu.mfu = mfu;
  }

  const loadModel = modelLoader(str('model'), str('model-config'));
  const sweeps = parseSweeps(list('sweep'));
  const tiers = tiersOf(str, teach, sweeps);
  const redis = str('redis');
  const redisUrl = redis !== undefined && tryParseBytes(redis) === undefined ? redis : undefined;
  if (redisUrl !== undefined && !/^rediss?:\/\//.test(redisUrl))
    throw new UsageError(`--redis must be a size or a redis:// URL, got ${JSON.stringify(redis)}`);
  if (redisUrl !== undefined && sweeps.some((s) => s.tier === 'redis'))
    throw new UsageError(
      '--sweep redis=... runs private Redis servers of each size; drop --redis URL',
    );
  const configs = sweeps.reduce((n, s) => n + s.capacitiesBytes.length, 0);
  if (configs > 12)
    throw new UsageError(`--sweep takes at most 12 capacities in all, got ${configs}`);

  const engines = int('engines', 1) ?? 1;
  if (engines > 64) throw new UsageError(`--engines must be 1..64, got ${engines}`);
  const router = str('router') ?? 'round-robin';
  if (!(ROUTERS as readonly string[]).includes(router))
    throw new UsageError(
      `--router must be one of ${ROUTERS.join(', ')}, got ${JSON.stringify(router)}`,
    );
  if (str('router') !== undefined && engines === 1)
    throw new UsageError('--router needs --engines N with N >= 2');

  const peers = values.peers === true;
  if (peers && engines === 1) throw new UsageError('--peers needs --engines N with N >= 2');

  const faults = parseFaults(list('fault'));
  if (faults !== undefined && engines > 1)
    throw new UsageError('--fault applies to one engine; drop --engines');
  const lower = (['disk', 'fs', 'redis'] as const).some(
    (t) => tiers[t] !== undefined || sweeps.some((s) => s.tier === t),
  );
  if (faults?.corruptChunks !== undefined && !lower && redisUrl === undefined)
    throw new UsageError(
      '--fault corrupt damages chunks on the lowest tier: add --disk SIZE, --fs SIZE or --redis',
    );
  if (faults?.redisOutage !== undefined && redisUrl !== undefined)
    throw new UsageError(
      '--fault redis-outage runs its own Redis server (it must kill it); drop --redis URL',
    );
  const chart = str('chart');
  if (chart !== undefined && sweeps.length === 0)
    throw new UsageError('--chart FILE needs --sweep TIER=SIZES');
  const workers = int('workers', 1);
  return {
    workloadSpec,
    teach,
    timeScale,
    utilization,
    loadModel,
    model,
    engine,
    gpu,
    gpuMemoryBytes:
      gpuMemory ?? (teach && gpuBlocks === undefined ? parseBytes('gpu', TEACH.gpu) : undefined),
    tiers,
    redisUrl,
    sweeps,
    engines,
    peers,
    router: router as RouterKind,
    tierModels: tierOverrides(list('bandwidth'), list('latency'), list('price')),
    target: parseTarget(str('target')),
    faults,
    chart,
    json: values.json === true,
    workers,
  };
}

function workloadOf(
  kind: WorkloadKind,
  teach: boolean,
  str: (f: string) => string | undefined,
  int: (f: string, min: number) => number | undefined,
): WorkloadSpec {
  const seed = int('seed', 0);
  const defined = <T extends object>(o: T): T =>
    Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as T;
  if (kind === 'multi-round') {
    const t = teach ? TEACH.workload : {};
    return {
      kind,
      options: defined({
        users: int('users', 1) ?? t.users,
        rounds: int('rounds', 1) ?? t.rounds,
        systemPromptTokens: int('system-tokens', 0) ?? t.systemPromptTokens,
        questionTokens: int('question-tokens', 1) ?? t.questionTokens,
        answerTokens: int('answer-tokens', 1) ?? t.answerTokens,
        roundIntervalMs: numberFlag('interval-ms', str('interval-ms')),
        seed,
      }),
    };
  }
  if (kind === 'long-doc')
    return {
      kind,
      options: defined({
        documents: int('documents', 1),
        documentTokens: int('document-tokens', 1),
        queriesPerDocument: int('queries', 0),
        queryTokens: int('query-tokens', 1),
        outputTokens: int('output-tokens', 1),
        requestIntervalMs: numberFlag('interval-ms', str('interval-ms')),
        seed,
      }),
    };
  const path = str('trace');
  if (path === undefined) throw new UsageError('--workload trace needs --trace FILE');
  return {
    kind,
    options: defined({
      path,
      limit: int('limit', 1),
      maxInputTokens: int('max-input-tokens', 1),
      seed,
      timeScale: 1,
    }),
  };
}

function modelLoader(name: string | undefined, config: string | undefined): Plan['loadModel'] {
  if (name !== undefined && config !== undefined)
    throw new UsageError('--model and --model-config both name the model; give one');
  if (config !== undefined) return () => readModelConfig(config);
  let m: PlannedModel;
  try {
    m = modelPreset(name ?? DEFAULT_MODEL);
  } catch (err) {
    throw new UsageError(oneLine(err));
  }
  return async () => m;
}

function tiersOf(
  str: (f: string) => string | undefined,
  teach: boolean,
  sweeps: readonly Sweep[],
): Plan['tiers'] {
  const cpu = sizeFlag('cpu', str('cpu'));
  const tiers: Plan['tiers'] = { cpu: cpu ?? parseBytes('cpu', teach ? TEACH.cpu : DEFAULT_CPU) };
  for (const t of ['disk', 'fs', 's3'] as const) {
    const v = sizeFlag(t, str(t));
    if (v !== undefined) tiers[t] = v;
  }
  const redis = str('redis');
  if (redis !== undefined && tryParseBytes(redis) !== undefined) tiers.redis = tryParseBytes(redis);
  for (const s of sweeps) {
    const given = s.tier === 'redis' ? tiers.redis : s.tier === 'cpu' ? cpu : tiers[s.tier];
    if (given !== undefined)
      throw new UsageError(
        `--${s.tier} and --sweep ${s.tier}=... both set the ${s.tier} tier; give one`,
      );
  }
  for (const [t, v] of Object.entries(tiers))
    if (v === 0) throw new UsageError(`--${t} must be > 0`);
  return tiers;
}
