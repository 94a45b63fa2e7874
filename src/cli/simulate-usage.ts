import { DEFAULT_GPU, DEFAULT_MFU, GPU_PRESETS } from '../sim/gpu.ts';
import { DEFAULT_MODEL, MODEL_PRESETS } from '../sim/models.ts';
import { ROUTERS } from '../sim/router.ts';
import { FAULT_NAMES } from './simulate-flags.ts';

/** CPU tier capacity when --cpu is not given, in the planned model's bytes. */
export const DEFAULT_CPU = '32GiB';
/** Utilisation of the engine without kvtier a trace is replayed at by default. */
export const DEFAULT_UTILIZATION = 0.8;

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
  cpu: '4GiB',
  gpu: '1GiB',
});

/** Usage text of `kvtier simulate`. */
export const SIMULATE_COMMAND_USAGE = `Usage: kvtier simulate [--workload multi-round|long-doc|trace] [options]

A capacity planner: drives real kvtier sidecars with modeled vLLM-like engines, verifies every
loaded KV block against recomputation, and reports, for a real model on a modeled GPU: the load the
workload offers, what kvtier gains over the same engine without it (prefill tokens/s saved, TTFT
with queueing), where prompt tokens came from, the bounds each figure is compared with, and
which tier of what size reaches a target for the least money. With no flags it runs a small
multi-round workload whose working set does not fit the GPU cache.

Capacities are in the planned model's KV bytes. The bytes that move and are verified are a small
verification model's (8 B per token), chunk for chunk: tokens and hit rates are the same, bytes
and modeled times are the planned model's. See docs/simulate.md.

Workloads:
  --workload multi-round   users share a system prompt; each round resends the user's history
      --users N --rounds N --system-tokens N --question-tokens N --answer-tokens N
      --interval-ms X      ms between a user's rounds (default 1000)
  --workload long-doc      each document read once, then query rounds (document + query)
      --documents N --document-tokens N --queries N --query-tokens N --output-tokens N
      --interval-ms X      ms between requests (default 1000)
  --workload trace         replay a Mooncake JSONL trace
      --trace FILE [--limit N] [--max-input-tokens N]
      --time-scale X       factor on the trace's arrival times (default: the sustainable rate)
      --utilization U      the sustainable rate keeps the engine without kvtier this busy
                           (default ${DEFAULT_UTILIZATION})
  --seed N                 seed of every synthetic token (default 0)

Model and engine:
  --model NAME             ${Object.keys(MODEL_PRESETS).join(', ')}
                           (default ${DEFAULT_MODEL})
  --model-config FILE      a Hugging Face config.json instead
  --gpu NAME               ${Object.keys(GPU_PRESETS).join(', ')} (default ${DEFAULT_GPU}): FLOPs, memory
                           bandwidth and size, host link
  --gpus-per-engine N      tensor-parallel GPUs per engine (default: the fewest that hold the
                           weights in 60% of their memory)
  --mfu X                  model FLOPs utilisation (default ${DEFAULT_MFU}, a calibration)
  --gpu-memory SIZE        the engine's GPU KV cache (default: 90% of GPU memory less the
                           weights; ${TEACH.gpu} with no --workload)
  --gpu-blocks N           the same in blocks of 16 tokens, instead of --gpu-memory
  --chunk-size N           tokens per stored chunk (default 256)
  --policy recompute|fail  what to do with blocks that failed to load (default recompute)
  --no-partial-chunks      claim only from chunk boundaries (for comparison)
  --fault NAME[@STEP]      inject a fault (repeatable): ${FAULT_NAMES.join(', ')}

Tiers (each run also runs once with kvtier off: the baseline of every gain):
  --cpu SIZE               CPU tier (default ${DEFAULT_CPU}; ${TEACH.cpu} with no --workload)
  --disk SIZE              a local disk tier
  --fs SIZE                a shared filesystem tier
  --redis SIZE|URL         a Redis tier: a private redis-server of that size, or a server's URL
  --s3 SIZE                an object-store tier of that size (S3's bandwidth and latency)
  --sweep TIER=SIZES       one run per size, e.g. cpu=8GiB,32GiB,128GiB or disk=1TiB,4TiB;
                           repeatable, one tier per --sweep; TIER: cpu, disk, fs, redis, s3
  --bandwidth TIER=RATE    a tier's read bandwidth, e.g. disk=6GB/s (default: bench/results)
  --latency TIER=DURATION  the least a load from it takes, e.g. redis=1ms (default: bench/results)
  --price TIER=USD         its cost per GiB over 3 years (defaults: see docs/simulate.md)
  --target GOAL            saved=TOKENS_PER_S, share=PERCENT%, ttft-p50=DURATION or
                           ttft-p90=DURATION: name the cheapest configuration that reaches it

Fleet:
  --engines N              N engines, each with its own GPU cache and CPU and disk tiers; fs,
                           redis and s3 tiers are shared (also run node-local, split N ways)
  --router NAME            ${ROUTERS.join(', ')} (default round-robin)
  --peers                  also run node-local tiers with a peer tier over the engines' sidecars
                           (no shared store; its speed: --bandwidth peer=RATE, --latency peer=...)

Output:
  --json                   print JSON instead of text
  --chart FILE.svg         with --sweep: the chart as SVG, and as PNG beside it
  --workers N              runs at once in worker threads (default: all of a batch, at most 8)
  --help                   print this text

Exit status: 0 when every run had 0 mismatched blocks, 1 otherwise, 2 on bad flags.`;
