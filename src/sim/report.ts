import { formatBytes } from '../util/bytes.ts';
import type { SimReport } from './types.ts';

/**
 * Text and JSON renderings of a simulator run. Times in a {@link SimReport} are either measured
 * (wall time, load times) or modeled (TTFT); the text says which, so nobody mistakes the TTFT
 * model for a measurement of a real engine.
 */

/** Tokens kvtier served (every tier), summed. */
export function kvtierTokens(report: SimReport): number {
  let n = 0;
  for (const v of Object.values(report.tokens.byTier)) n += v;
  return n;
}

/** Tokens of a preempted request's own prefix found again (GPU prefix cache and kvtier). */
export function selfReuseTokens(report: SimReport): number {
  const s = report.tokens.selfReuse;
  return s === undefined ? 0 : s.gpu + s.kvtier;
}

/**
 * Every source of prompt tokens summed: GPU prefix cache, each kvtier tier, self-reuse,
 * recomputed and unserved. Equals the prompt tokens of a run whose accounting adds up.
 */
export function sourceTokens(report: SimReport): number {
  const t = report.tokens;
  return (
    t.gpuPrefixCache + kvtierTokens(report) + selfReuseTokens(report) + t.recomputed + t.unserved
  );
}

/**
 * Hit rate of kvtier: tokens kvtier served (all tiers) / prompt tokens, in [0, 1]; 0 when the
 * workload had no prompt tokens.
 */
export function hitRate(report: SimReport): number {
  return ratio(kvtierTokens(report), report.promptTokens);
}

/**
 * Hit rate including the engine's own GPU prefix cache: (GPU prefix cache + kvtier) tokens /
 * prompt tokens, in [0, 1]; 0 when the workload had no prompt tokens.
 */
export function hitRateWithGpu(report: SimReport): number {
  return ratio(report.tokens.gpuPrefixCache + kvtierTokens(report), report.promptTokens);
}

/** A report as JSON-ready data: the report itself plus both hit rates. */
export interface SimReportJson extends SimReport {
  /** {@link hitRate}, in [0, 1]. */
  hitRate: number;
  /** {@link hitRateWithGpu}, in [0, 1]. */
  hitRateWithGpu: number;
}

/** The report with its hit rates, ready for `JSON.stringify`. */
export function reportToJson(report: SimReport): SimReportJson {
  return { ...report, hitRate: hitRate(report), hitRateWithGpu: hitRateWithGpu(report) };
}

/**
 * Formats a size in binary units with three significant digits: "512 MiB", "7.45 GiB",
 * "1.5 TiB", "32 GiB" (whole numbers without decimals).
 */
export function formatSize(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let v = bytes;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  const digits =
    Number.isInteger(v) || i === 0 ? 0 : Math.abs(v) < 10 ? 2 : Math.abs(v) < 100 ? 1 : 0;
  return `${Number(v.toFixed(digits))} ${units[i]}`;
}

/** Formats a duration in ms: "0.4 ms", "523 ms", "5.27 s", "2.4 min". */
export function formatDuration(ms: number): string {
  if (!Number.isFinite(ms)) return 'n/a';
  if (ms < 10) return `${Number(ms.toFixed(1))} ms`;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 100_000) return `${Number((ms / 1000).toFixed(ms < 10_000 ? 2 : 1))} s`;
  return `${Number((ms / 60_000).toFixed(1))} min`;
}

/** Formats a fraction in [0, 1] as a percentage with one decimal, e.g. 0.4567 → "45.7%". */
export function formatPercent(fraction: number): string {
  return `${(fraction * 100).toFixed(1)}%`;
}

/**
 * Renders a multi-section, human-readable report: workload and requests, prompt tokens, tokens by
 * source (GPU prefix cache, each kvtier tier, recomputed) with percentages, bytes moved, pending
 * lookups, verification (mismatches listed), failures and how they were handled, the modeled
 * TTFT, and the measured wall time. Lines are separated by `\n`, with no trailing newline.
 */
export function formatReport(report: SimReport): string {
  const p = report.promptTokens;
  const pct = (n: number) => formatPercent(ratio(n, p));
  const tierRows: string[][] = Object.entries(report.tokens.byTier).map(([tier, n]) => [
    `  kvtier tier "${tier}"`,
    fmtInt(n),
    pct(n),
  ]);
  const lines: string[] = [
    `kvtier simulation report — workload ${report.workload}`,
    '',
    'Requests',
    ...table([
      ['  requests', fmtInt(report.requests)],
      ['  finished', fmtInt(report.finished)],
      ['  failed', fmtInt(report.failed)],
      ['  engine steps', fmtInt(report.steps)],
    ]),
    '',
    'Prompt tokens',
    ...table([['  total', fmtInt(p)]]),
    '',
    'Tokens served, by source (% of prompt tokens)',
    ...table([
      [
        '  GPU prefix cache',
        fmtInt(report.tokens.gpuPrefixCache),
        pct(report.tokens.gpuPrefixCache),
      ],
      ...(tierRows.length > 0 ? tierRows : [['  kvtier (no tier served any)', '0', pct(0)]]),
      ['  recomputed', fmtInt(report.tokens.recomputed), pct(report.tokens.recomputed)],
      [
        '  unserved (failed or aborted first)',
        fmtInt(report.tokens.unserved ?? 0),
        pct(report.tokens.unserved ?? 0),
      ],
    ]),
    '  each prompt token counted once, by the admission that completed its prefill',
    ...(report.preemption === undefined
      ? []
      : [
          `  preemption (not in the sources above): ${fmtInt(report.preemption.preemptions)} preemptions; ${fmtInt(report.preemption.recomputedTokens)} prompt tokens recomputed again (${pct(report.preemption.recomputedTokens)}), ${fmtInt(report.preemption.reloadedTokens)} loaded again`,
        ]),
    `  hit rate: kvtier ${formatPercent(hitRate(report))}, kvtier + GPU prefix cache ${formatPercent(hitRateWithGpu(report))}`,
    '',
    'Bytes moved by kvtier',
    ...table([
      ['  saved (engine → kvtier)', fmtBytes(report.bytes.saved)],
      ['  loaded (kvtier → engine)', fmtBytes(report.bytes.loaded)],
    ]),
    '',
    'Pending lookups (answered null: still loading, asked again next step)',
    ...table([
      ['  lookups', fmtInt(report.pendingLookups.lookups)],
      ['  steps waited', fmtInt(report.pendingLookups.stepsWaited)],
    ]),
    '',
    'Verification (every loaded block against recomputation)',
    ...table([
      ['  verified blocks', fmtInt(report.verifiedBlocks)],
      ['  mismatched blocks', fmtInt(report.mismatchedBlocks)],
    ]),
    ...mismatchLines(report),
    '',
    'Failures and how they were handled',
    ...table([
      ['  invalid blocks reported by loads', fmtInt(report.failures.invalidBlocks)],
      ['  recomputed after a failed load', fmtInt(report.failures.recomputedAfterFailure)],
      ['  requests failed (policy "fail")', fmtInt(report.failures.failedRequests)],
    ]),
    ...(report.failures.faultsInjected.length === 0
      ? ['  faults injected: none']
      : ['  faults injected:', ...report.failures.faultsInjected.map((f) => `    - ${f}`)]),
    '',
    `Time to first token (MODELED${report.model === undefined ? '' : ` for ${report.model.name}`}: prefill of the recomputed tokens and loads at tier bandwidths, no queueing; not a measurement of a real engine)`,
    ...table([
      ['  modeled TTFT p50', fmtMs(report.modeledTtftMs.p50)],
      ['  modeled TTFT p90', fmtMs(report.modeledTtftMs.p90)],
      ['  modeled TTFT mean', fmtMs(report.modeledTtftMs.mean)],
    ]),
    '',
    `Wall time (measured): ${fmtMs(report.wallMs)}`,
  ];
  return lines.join('\n');
}

function mismatchLines(report: SimReport): string[] {
  if (report.mismatches.length === 0) return [];
  const shown = report.mismatches.map(
    (m) => `    request ${m.requestId}, block ${m.block}, layer ${m.layer}`,
  );
  const more = report.mismatchedBlocks - report.mismatches.length;
  return [
    '  mismatches:',
    ...shown,
    ...(more > 0 ? [`    … and ${fmtInt(more)} more not listed`] : []),
  ];
}

/**
 * Lays out rows as aligned columns: the first column left-aligned, the others right-aligned,
 * separated by two spaces. With `headers`, a header row and a dashed rule come first.
 * @returns one string per line.
 */
export function formatTable(
  rows: readonly (readonly string[])[],
  headers?: readonly string[],
): string[] {
  return table(rows, headers);
}

function table(rows: readonly (readonly string[])[], headers?: readonly string[]): string[] {
  const all = headers === undefined ? rows : [headers, ...rows];
  const cols = Math.max(0, ...all.map((r) => r.length));
  const widths = Array.from({ length: cols }, (_, i) =>
    Math.max(...all.map((r) => (r[i] ?? '').length)),
  );
  const render = (r: readonly string[]) =>
    r
      .map((c, i) => (i === 0 ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0)))
      .join('  ')
      .trimEnd();
  const out = all.map(render);
  if (headers !== undefined) out.splice(1, 0, widths.map((w) => '-'.repeat(w)).join('  '));
  return out;
}

function ratio(n: number, d: number): number {
  return d > 0 ? n / d : 0;
}

function fmtInt(n: number): string {
  return Number.isFinite(n) ? Math.round(n).toLocaleString('en-US') : String(n);
}

function fmtBytes(n: number): string {
  return n < 1024 ? `${fmtInt(n)} B` : `${formatBytes(n)} (${fmtInt(n)} B)`;
}

function fmtMs(ms: number): string {
  if (!Number.isFinite(ms)) return 'n/a';
  return ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(1)} ms`;
}
