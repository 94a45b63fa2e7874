import type { ChunkKeyTrace } from '../sim/bounds.ts';
import { renderHitRateChart } from '../sim/chart.ts';
import { kvBytesPerToken } from '../sim/models.ts';
import {
  cheapestReaching,
  lruKnee,
  type PlanRow,
  type PlanShapes,
  servedShares,
} from '../sim/planner.ts';
import type { PlanResult } from '../sim/planner-report.ts';
import { formatDuration, formatPercent, formatSize } from '../sim/report.ts';
import type { SimulateCommandIo } from './simulate-io.ts';
import { oneLine } from './simulate-plan.ts';

/**
 * What the planner concludes: the cheapest configuration reaching the target, and one line of
 * advice computed from the runs shown (so it is true for them), and the sweep's chart.
 */

/** A share of prefill below which a configuration is not worth recommending. */
const WORTH = 0.05;

/** The advice line and the cheapest row reaching the target (when one was given). */
export function adviceLine(
  p: PlanResult,
  trace: ChunkKeyTrace,
  s: PlanShapes,
): { advice: string; cheapest?: PlanRow } {
  const cheapest = p.target === undefined ? undefined : cheapestReaching(p.rows, p.target);
  const extra = cheapest === undefined ? {} : { cheapest };
  if (p.overloaded !== undefined)
    return {
      advice: `Advice: size the engines first — at this rate ${p.overloaded}, so the cache figures above mostly measure queueing and preemption; replay at a rate the engine sustains (a trace: leave --time-scale out) or add engines (--engines).`,
      ...extra,
    };
  const int = (n: number) => Math.round(n).toLocaleString('en-US');
  const best = p.rows.reduce<PlanRow | undefined>(
    (b, r) => (b === undefined || r.gain.savedTokensPerSec > b.gain.savedTokensPerSec ? r : b),
    undefined,
  );
  const what =
    p.rows.length === 1
      ? (p.rows[0]?.label ?? '')
      : `the configurations shown (${p.rows[0]?.label} to ${p.rows.at(-1)?.label})`;
  if (best === undefined || best.gain.savedShare < WORTH) {
    const declined = declinedTiers(p.rows);
    if (declined.length > 0)
      return {
        advice: `Advice: ${what} saved at most ${formatPercent(Math.max(0, best?.gain.savedShare ?? 0))} of prefill: every lookup declined ${declined.join(' and ')}, whose modeled reads (latency, then bandwidth) are slower than the engine computing the same tokens (${int(p.load.prefillTokensPerSec)} tokens/s), so kvtier recomputed instead. Give the tier's real figures (--bandwidth, --latency), or sweep a faster tier (disk, fs).`,
        ...extra,
      };
    const knee = lruKnee(trace);
    const chunk = kvBytesPerToken(s.planned) * s.chunkTokens;
    const most = best === undefined ? 0 : best.gain.savedShare;
    if (knee === undefined)
      return {
        advice: `Advice: ${what} saved at most ${formatPercent(Math.max(0, most))} of prefill, and this workload reuses no prefix: no cache would help it.`,
        ...extra,
      };
    return {
      advice:
        `Advice: ${what} saved at most ${formatPercent(Math.max(0, most))} of prefill: little to buy at these sizes. ` +
        `This workload's reuse lies farther apart: an LRU cache needs ${formatSize(knee.chunks * chunk)} of ${s.planned.name} KV to serve ${formatPercent(knee.share)} ` +
        `(95% of the ${formatPercent(knee.infinite)} any cache could) — sweep a tier that large (disk, fs, s3).`,
      ...extra,
    };
  }
  // The cheapest configuration within 90% of the best saving.
  const good = p.rows
    .filter((r) => r.gain.savedTokensPerSec >= 0.9 * best.gain.savedTokensPerSec)
    .reduce((a, r) => (r.cost < a.cost ? r : a), best);
  const g = good.gain;
  const also =
    good === best
      ? ''
      : `; ${best.label} saves ${int(best.gain.savedTokensPerSec)} for $${int(best.cost)}`;
  const kv = servedShares(good.report).kvtier;
  return {
    advice:
      `Advice: ${good.label} saves ${int(g.savedTokensPerSec)} prompt tokens/s (${formatPercent(g.savedShare)} of prefill; kvtier served ${formatPercent(kv)} of prompt tokens from other requests' prefixes) ` +
      `and moves TTFT p90 from ${formatDuration(g.ttftP90[0])} to ${formatDuration(g.ttftP90[1])}, for about $${int(good.cost)}${also}.`,
    ...extra,
  };
}

/** Writes the sweep's chart as SVG and, beside it, PNG. */
export async function writeChart(
  path: string,
  p: PlanResult,
  io: SimulateCommandIo,
): Promise<void> {
  const tiers = new Set(p.rows.map((r) => r.label.split(' ')[0]));
  const one = tiers.size === 1;
  const tier = [...tiers][0] ?? '';
  const caps = p.rows.map((r, i) => (one ? (r.capacities[tier as 'cpu'] ?? i + 1) : i + 1));
  const svg = renderHitRateChart({
    title: `kvtier against its bounds — ${p.planned.name}, ${p.workload.replace(/^trace:/, '')}`,
    xLabel: one ? `${tier} tier capacity (${p.planned.name} KV)` : 'configuration',
    capacitiesBytes: caps,
    xTicks: p.rows.map((r) => (one ? formatSize(r.capacities[tier as 'cpu'] ?? 0) : r.label)),
    linear: !one,
    series: [
      {
        name: 'kvtier + GPU prefix cache',
        values: p.rows.map((r) => servedShares(r.report).withGpu),
      },
      { name: 'kvtier alone', values: p.rows.map((r) => servedShares(r.report).kvtier) },
      {
        name: 'bound: LRU of tier + GPU',
        values: p.rows.map((r) => r.bounds?.lruWithGpu ?? 0),
        dashed: true,
      },
      {
        name: 'bound: tier behind GPU cache',
        values: p.rows.map((r) => r.bounds?.tierBehindGpu ?? 0),
        dashed: true,
      },
      {
        name: 'bound: infinite cache',
        values: p.rows.map((r) => r.bounds?.infinite ?? 0),
        dashed: true,
      },
    ],
  });
  await io.writeFile(path, svg);
  const png = `${path.replace(/\.svg$/i, '')}.png`;
  try {
    const { renderPng } = await import('../sim/png.ts');
    await io.writeFile(png, await renderPng(svg));
    io.err(`kvtier simulate: chart written to ${path} and ${png}`);
  } catch (err) {
    io.err(`kvtier simulate: chart written to ${path}; no PNG: ${oneLine(err)}`);
  }
}

/** Tiers that every configuration's lookups declined and none loaded from. */
function declinedTiers(rows: readonly PlanRow[]): string[] {
  const out = new Set<string>();
  for (const r of rows)
    for (const [tier, d] of Object.entries(r.report.tierDecisions ?? {}))
      if (d.load === 0 && d.decline > 0) out.add(tier);
  for (const r of rows)
    for (const [tier, d] of Object.entries(r.report.tierDecisions ?? {}))
      if (d.load > 0) out.delete(tier);
  return [...out];
}
