import { kvBytesPerToken, type PlannedModel } from './models.ts';
import type { PlanRow } from './planner.ts';
import { formatTable } from './report.ts';

/**
 * The planner's lines on "never slower than recomputing": the engine's prefill rate every
 * lookup carried (in tokens/s and as the read bandwidth a tier must beat), and per configuration
 * what the sidecars decided about each tier below host memory. Nothing when no lookup decided.
 */
export function ruleLines(
  rows: readonly PlanRow[],
  planned: PlannedModel,
  prefillTokensPerSec: number,
): string[] {
  const body: string[][] = [];
  for (const row of rows)
    for (const [tier, d] of Object.entries(row.report.tierDecisions ?? {}))
      body.push([`  ${row.label}`, tier, int(d.load), int(d.decline), int(d.declinedTokens)]);
  if (body.length === 0) return [];
  const gbps = (prefillTokensPerSec * kvBytesPerToken(planned)) / 1e9;
  return [
    `Never slower than recomputing: every lookup carried the engine's prefill rate, ${int(prefillTokensPerSec)} tokens/s (${gbps.toFixed(2)} GB/s of ${planned.name} KV); a tier below host memory is read only where fetching its hits (the tier's latency, then its bandwidth) beats computing them.`,
    ...formatTable(body, [
      'configuration',
      'tier',
      'lookups loaded',
      'declined',
      'tokens held, declined',
    ]),
    '  declined: fetching could not beat computing, so the tier was not asked or its hits were recomputed ("tokens held" counts only hits it was asked about).',
  ];
}

function int(n: number): string {
  return (Math.round(n) + 0).toLocaleString('en-US');
}
