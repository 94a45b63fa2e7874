import { formatBytes } from '../config/bytes.ts';
import { kvBytesPerToken, type PlannedModel } from './models.ts';
import type { BoundedRow } from './planner.ts';
import { formatPercent, formatTable, hitRateWithGpu, kvtierTokens } from './report.ts';
import { ttftCheck } from './ttft-model.ts';
import type { SimReport } from './types.ts';

/**
 * The planner's text: a run's sizes in the planned model's bytes, the bounds beside kvtier's
 * share, the modeled TTFT with and without kvtier and the TTFT model's check; and the sweep table.
 */

/** What {@link formatPlannerLines} prints besides the report. */
export interface PlannerLinesOptions {
  planned: PlannedModel;
  /** CPU tier capacity in the planned model's bytes. */
  cpuBytes: number;
  /** LRU (same capacity) and infinite-cache hit rates of the workload's chunk keys. */
  bounds: { lru: number; infinite: number };
  /** Formats a capacity, e.g. "4 GiB". */
  fmt: (bytes: number) => string;
}

/** The planner section of a single run's text report; one string per line. */
export function formatPlannerLines(r: SimReport, o: PlannerLinesOptions): string[] {
  const m = o.planned;
  const bpt = kvBytesPerToken(m);
  const chunkTokens = r.model?.chunkTokens ?? 256;
  const gpuTokens = r.model?.gpuCacheTokens ?? 0;
  const t = r.modeledTtftMs;
  const w = r.modeledTtftWithoutKvtierMs;
  const ms = (v: number) => (v >= 1000 ? `${(v / 1000).toFixed(2)} s` : `${v.toFixed(0)} ms`);
  const lines = [
    `Capacity plan — ${m.name}: ${formatBytes(bpt)} of KV per token, ${formatBytes(bpt * chunkTokens)} per ${chunkTokens}-token chunk`,
    ...formatTable([
      ['  GPU KV cache', o.fmt(gpuTokens * bpt), `${gpuTokens.toLocaleString('en-US')} tokens`],
      [
        '  CPU tier',
        o.fmt(o.cpuBytes),
        `${Math.floor(o.cpuBytes / (bpt * chunkTokens)).toLocaleString('en-US')} chunks`,
      ],
      ...(r.modelBytes === undefined
        ? []
        : [
            ['  saved to kvtier', formatBytes(r.modelBytes.saved), `of ${m.name} KV`],
            ['  loaded from kvtier', formatBytes(r.modelBytes.loaded), `of ${m.name} KV`],
          ]),
    ]),
    `  (the bytes that moved and were verified are a ${r.model?.verificationBytesPerToken ?? 512}-byte-per-token verification model's, chunk for chunk)`,
    '',
    "Share of prompt tokens against bounds from the workload's chunk keys (no engine)",
    ...formatTable([
      ['  kvtier alone', formatPercent(share(kvtierTokens(r), r))],
      ['  kvtier + GPU prefix cache', formatPercent(hitRateWithGpu(r))],
      [`  LRU cache of ${o.fmt(o.cpuBytes)}`, formatPercent(o.bounds.lru)],
      ['  infinite cache', formatPercent(o.bounds.infinite)],
    ]),
  ];
  if (w !== undefined) {
    lines.push(
      '',
      `Modeled TTFT of ${m.name} (MODELED: prefill FLOPs and tier bandwidths, no queueing; src/sim/ttft-model.ts)`,
      ...formatTable(
        [
          ['  with kvtier', ms(t.p50), ms(t.p90), ms(t.mean)],
          ['  without kvtier', ms(w.p50), ms(w.p90), ms(w.mean)],
        ],
        ['', 'p50', 'p90', 'mean'],
      ),
      `  ${ttftCheck(m).line}`,
    );
  }
  return lines;
}

/** The sweep table: one row per capacity, every share in % of prompt tokens. */
export function sweepTable(
  tier: string,
  rows: readonly BoundedRow[],
  planned: PlannedModel,
  fmt: (bytes: number) => string,
): string[] {
  const headers = [
    `${tier} tier (${planned.name})`,
    'chunks',
    'kvtier',
    'GPU cache',
    'kvtier+GPU',
    'LRU',
    'LRU +GPU',
    'infinite',
    'recomputed',
    'unserved',
    'preempt. recompute',
    'mismatched',
  ];
  const body = rows.map(({ report: r, capacityBytes, chunks, lru, lruWithGpu, infinite }) => [
    fmt(capacityBytes),
    chunks.toLocaleString('en-US'),
    formatPercent(share(kvtierTokens(r), r)),
    formatPercent(share(r.tokens.gpuPrefixCache, r)),
    formatPercent(hitRateWithGpu(r)),
    formatPercent(lru),
    formatPercent(lruWithGpu),
    formatPercent(infinite),
    formatPercent(share(r.tokens.recomputed, r)),
    formatPercent(share(r.tokens.unserved, r)),
    formatPercent(share(r.preemption?.recomputedTokens ?? 0, r)),
    String(r.mismatchedBlocks),
  ]);
  const first = rows[0]?.report;
  const notes =
    first === undefined
      ? []
      : [
          `${first.requests.toLocaleString('en-US')} requests, ${first.promptTokens.toLocaleString('en-US')} prompt tokens; GPU KV cache ${fmt((first.model?.gpuCacheTokens ?? 0) * kvBytesPerToken(planned))}. ` +
            'Shares of prompt tokens, each counted once (kvtier + GPU cache + recomputed + unserved = 100%); ' +
            'LRU, LRU +GPU, infinite: chunk caches of the tier capacity, of the tier plus the GPU cache, and without bound, on the same chunk keys in arrival order (no engine); ' +
            'preempt. recompute: prompt tokens computed again because of preemption (not in the 100%).',
        ];
  return [...formatTable(body, headers), ...notes];
}

function share(n: number, r: SimReport): number {
  return r.promptTokens > 0 ? n / r.promptTokens : 0;
}
