import { describeEngine, type EngineSpeed } from './gpu.ts';
import { kvBytesPerToken, type PlannedModel } from './models.ts';
import {
  boundFlags,
  type Gain,
  type OfferedLoad,
  type PlanRow,
  servedShares,
  type Target,
} from './planner.ts';
import { ruleLines } from './planner-rule.ts';
import {
  formatDuration as dur,
  formatSize,
  formatTable,
  kvtierTokens,
  formatPercent as pct,
} from './report.ts';
import type { RouterKind } from './router.ts';
import type { SimReport } from './types.ts';

/**
 * The planner's text: load first (and an overload warning at the top), the gain over the same
 * engine without kvtier, where prompt tokens came from, the bounds beside each figure with the
 * figures above a bound flagged, a sweep's table, a fleet's tables, the cheapest configuration
 * reaching a target, the calibration and the host link, and one line of advice.
 */

/** Everything a plan's text shows. */
export interface PlanResult {
  workload: string;
  planned: PlannedModel;
  speed: EngineSpeed;
  engines: number;
  router?: RouterKind;
  /** Offered load at the replay's rate (per engine share in `offeredShare`). */
  load: OfferedLoad;
  replay: { scale: number; how: 'given' | 'sustainable' | 'own'; target?: number };
  overloaded?: string | undefined;
  /** The run without kvtier every gain is measured against. */
  off: SimReport;
  /** One per configuration (kvtier on; in a fleet, the shared tiers). */
  rows: PlanRow[];
  /** A fleet's node-local counterparts of `rows`, same order. */
  nodeLocal?: PlanRow[];
  /** With `--peers`: node-local tiers and a peer tier over the fleet's sidecars, same order. */
  peers?: PlanRow[];
  /** Whether the configurations come from `--sweep`. */
  sweep: boolean;
  target?: Target | undefined;
  cheapest?: PlanRow | undefined;
  /** The MFU's calibration (`calibrationLine` in `ttft-model.ts`). */
  calibration: string;
  /** The measured host link's load beside the published one (`hostLinkLine` in `ttft-model.ts`). */
  hostLink: string;
  advice: string;
}

/** The plan's text, one string per line. */
export function formatPlan(p: PlanResult): string[] {
  const out: string[] = [];
  const first = p.rows[0];
  out.push(
    `kvtier simulate — ${p.workload.replace(/^trace:/, 'trace ')}, ${p.off.requests.toLocaleString('en-US')} requests, ${p.engines > 1 ? `${p.engines} engines (${p.router}), ` : ''}${p.planned.name}`,
  );
  if (p.overloaded !== undefined)
    out.push(
      `OVERLOADED: ${p.overloaded}. Queueing dominates TTFT and preemption decides the cache figures; replay slower (--time-scale) or add engines (--engines).`,
    );
  out.push('', ...loadLines(p));
  if (!p.sweep && p.engines === 1 && first !== undefined) out.push('', ...singleLines(p, first));
  else out.push('', ...tableLines(p));
  if (p.engines > 1) out.push('', ...fleetLines(p));
  const rule = ruleLines(
    [
      ...(p.nodeLocal ?? []).map((r) => ({ ...r, label: `${r.label}, node-local` })),
      ...(p.peers ?? []).map((r) => ({ ...r, label: `${r.label}, peers` })),
      ...p.rows,
    ],
    p.planned,
    p.load.prefillTokensPerSec,
  );
  if (rule.length > 0) out.push('', ...rule);
  out.push(
    '',
    `Calibration (the MFU reproduces the published prefill by construction; not a check): ${p.calibration}`,
    `Host link (measured, not a calibration): ${p.hostLink}`,
  );
  if (p.target !== undefined) out.push(targetLine(p));
  out.push(p.advice);
  return out;
}

function loadLines(p: PlanResult): string[] {
  const l = p.load;
  const c = l.capacity;
  const how =
    p.replay.how === 'sustainable'
      ? `chosen for requests at ${Math.round(100 * (p.replay.target ?? 0.8))}% of the engine's capacity`
      : p.replay.how === 'given'
        ? 'given by --time-scale'
        : "the workload's own timing";
  const rows: [string, string][] = [
    ['  engine', describeEngine(p.planned, p.speed)],
    [
      '  capacity',
      `${num(c.requestsPerSec)} requests/s${p.engines > 1 ? ' per engine' : ''}: a mean request costs ${dur(1000 * c.prefillSeconds)} of prefill (no cache) + ${dur(1000 * c.decodeSeconds)} of decode (batches of ${c.batch}, what its KV cache holds)`,
    ],
    ['  replay', `time scale ${fmtScale(p.replay.scale)} (${how}), ${dur(l.spanMs)} of arrivals`],
    [
      '  offered',
      `${num(l.requestsPerSec)} requests/s = ${Math.round(100 * l.rho)}% of ${p.engines > 1 ? `${p.engines} engines'` : "the engine's"} capacity; ${int(l.offeredTokensPerSec)} prompt tokens/s (prefill rate ${int(l.prefillTokensPerSec)} per engine)`,
    ],
  ];
  const runs: [string, SimReport][] = [['kvtier off', p.off]];
  if (!p.sweep && p.rows[0] !== undefined) runs.push(['kvtier on', p.rows[0].report]);
  const cols = runs.map(([name, r]) => [
    `  ${name}`,
    pct(r.timeline?.utilization ?? 0),
    int(r.preemption?.preemptions ?? 0),
    `${dur(r.timeline?.queueMs.p50 ?? 0)} / ${dur(r.timeline?.queueMs.p90 ?? 0)}`,
    `${dur(r.modeledTtftMs.p50)} / ${dur(r.modeledTtftMs.p90)}`,
  ]);
  return [
    'Load (MODELED engine and clock; see docs/simulate.md)',
    ...keyValues(rows),
    ...formatTable(cols, [
      '',
      'GPU busy',
      'preemptions',
      'queueing p50 / p90',
      'TTFT p50 / p90 (queueing included)',
    ]),
  ];
}

function singleLines(p: PlanResult, row: PlanRow): string[] {
  const r = row.report;
  const g = row.gain;
  const lines = [
    'Gain over the same engine without kvtier (same requests, same seed)',
    ...gainRows(g),
  ];
  const share = (x: SimReport, n: number) => pct(n / Math.max(1, x.promptTokens));
  const tiers = [
    ...new Set([...Object.keys(p.off.tokens.byTier), ...Object.keys(r.tokens.byTier)]),
  ];
  const src = (x: SimReport) => [
    share(x, x.tokens.gpuPrefixCache),
    ...tiers.map((t) => (x.kvtier === false ? '—' : share(x, x.tokens.byTier[t] ?? 0))),
    share(x, x.tokens.selfReuse?.gpu ?? 0),
    x.kvtier === false ? '—' : share(x, x.tokens.selfReuse?.kvtier ?? 0),
    share(x, x.tokens.recomputed),
    share(x, x.tokens.unserved),
    share(x, x.preemption?.recomputedTokens ?? 0),
  ];
  const names = [
    "  GPU prefix cache, other requests' prefixes",
    ...tiers.map((t) => `  kvtier tier "${t}", other requests' prefixes`),
    '  own prefix after preemption: GPU cache',
    '  own prefix after preemption: kvtier',
    '  recomputed',
    '  unserved (failed or aborted first)',
    '  preemption recomputed again (not in the 100%)',
  ];
  const a = src(p.off);
  const b = src(r);
  lines.push(
    '',
    ...formatTable(
      names.map((n, i) => [n, a[i] as string, b[i] as string]),
      ['Where prompt tokens came from (each once)', 'kvtier off', 'kvtier on'],
    ),
  );
  if (row.bounds !== undefined) lines.push('', ...boundLines([row]));
  const m = r.model;
  const bpt = kvBytesPerToken(p.planned);
  const chunk = bpt * (m?.chunkTokens ?? 256);
  const caps = Object.entries(row.capacities).map(
    ([t, b]) =>
      `${t} tier ${formatSize(b)} (${int(Math.floor(b / chunk))} chunks of ${formatSize(chunk)})`,
  );
  lines.push(
    '',
    `Capacity: GPU KV cache ${formatSize((m?.gpuCacheTokens ?? 0) * bpt)} (${int(m?.gpuCacheTokens ?? 0)} tokens; running requests held ${pct(((r.timeline?.meanBlocksInUse ?? 0) * 16) / Math.max(1, m?.gpuCacheTokens ?? 0))} of it while the GPU computed); ${caps.join('; ')}.`,
    verifyLine(r),
  );
  return lines;
}

function gainRows(g: Gain): string[] {
  const change = (a: number, b: number) =>
    a > 0 ? ` (${b <= a ? '−' : '+'}${Math.round((100 * Math.abs(b - a)) / a)}%)` : '';
  return keyValues([
    [
      '  prefill saved',
      `${int(g.savedTokensPerSec)} prompt tokens/s (${pct(g.savedShare)} of prompt tokens no longer computed)`,
    ],
    [
      '  TTFT p50',
      `${dur(g.ttftP50[0])} → ${dur(g.ttftP50[1])}${change(g.ttftP50[0], g.ttftP50[1])}`,
    ],
    [
      '  TTFT p90',
      `${dur(g.ttftP90[0])} → ${dur(g.ttftP90[1])}${change(g.ttftP90[0], g.ttftP90[1])}`,
    ],
    ['  GPU busy', `${dur(g.busyMs[0])} → ${dur(g.busyMs[1])}`],
  ]);
}

function boundLines(rows: readonly PlanRow[]): string[] {
  const out = [
    "Against bounds (the workload's chunk keys in arrival order, no engine; self-reuse left out)",
  ];
  for (const row of rows) {
    const b = row.bounds;
    if (b === undefined) continue;
    const s = servedShares(row.report);
    out.push(
      ...keyValues([
        [
          '  kvtier alone',
          `${pct(s.kvtier)}   bound: an LRU tier behind the run's own GPU cache, ${pct(b.tierBehindGpu)}`,
        ],
        [
          '  kvtier + GPU cache',
          `${pct(s.withGpu)}   bounds: one LRU cache of tier + GPU, ${pct(b.lruWithGpu)}; an infinite cache, ${pct(b.infinite)}`,
        ],
        ['  (reference', `an LRU cache of the tier alone, ${pct(b.lru)})`],
      ]),
      ...row.flags.map((f) => `  ABOVE ITS BOUND: ${f}`),
    );
  }
  if (rows.some((r) => r.flags.length > 0))
    out.push(
      '  A figure above its bound comes from the engine, not the cache: requests served out of arrival order, GPU blocks finer than chunks, partial-chunk loads.',
    );
  return out;
}

function tableLines(p: PlanResult): string[] {
  const lower = (r: SimReport) =>
    Object.entries(r.tokens.byTier).reduce((n, [t, v]) => n + (t === 'cpu' ? 0 : v), 0) /
    Math.max(1, r.promptTokens);
  const anyLower = p.rows.some((r) => Object.keys(r.capacities).some((t) => t !== 'cpu'));
  const headers = [
    'configuration',
    'kvtier',
    ...(anyLower ? ['below CPU'] : []),
    '+GPU',
    'self-reuse',
    'bound: tier>GPU',
    'LRU+GPU',
    'infinite',
    'saved tok/s',
    'TTFT p50',
    'TTFT p90',
    'busy',
    'cost',
  ];
  const off = p.off;
  const offS = servedShares(off);
  const body: string[][] = [
    [
      'kvtier off',
      '—',
      ...(anyLower ? ['—'] : []),
      pct(offS.withGpu),
      pct((off.tokens.selfReuse?.gpu ?? 0) / Math.max(1, off.promptTokens)),
      '',
      '',
      '',
      '—',
      dur(off.modeledTtftMs.p50),
      dur(off.modeledTtftMs.p90),
      pct(off.timeline?.utilization ?? 0),
      '—',
    ],
  ];
  for (const row of p.rows) {
    const s = servedShares(row.report);
    const flagged = (f: RegExp) => (row.flags.some((x) => f.test(x)) ? '!' : '');
    const b = row.bounds;
    body.push([
      row.label,
      `${pct(s.kvtier)}${flagged(/^kvtier alone/)}`,
      ...(anyLower ? [pct(lower(row.report))] : []),
      `${pct(s.withGpu)}${flagged(/^kvtier \+ GPU/)}`,
      pct(selfShare(row.report)),
      b === undefined ? '' : pct(b.tierBehindGpu),
      b === undefined ? '' : pct(b.lruWithGpu),
      b === undefined ? '' : pct(b.infinite),
      int(row.gain.savedTokensPerSec),
      dur(row.report.modeledTtftMs.p50),
      dur(row.report.modeledTtftMs.p90),
      pct(row.report.timeline?.utilization ?? 0),
      `$${int(row.cost)}`,
    ]);
  }
  const mism = p.rows.reduce((n, r) => n + r.report.mismatchedBlocks, 0);
  const verified = p.rows.reduce((n, r) => n + r.report.verifiedBlocks, 0);
  const flags = p.rows.flatMap((r) => r.flags.map((f) => `  ! ${r.label}: ${f}`));
  return [
    ...formatTable(body, headers),
    ...flags,
    `Shares of prompt tokens; kvtier (${anyLower ? 'below CPU: from the tiers under host memory' : 'all tiers'}) and +GPU count other requests' prefixes, self-reuse a preempted request's own prefix found again (each token once: kvtier + GPU + self-reuse + recomputed + unserved = 100%). Bounds: an LRU tier of the configuration's largest capacity behind the run's own GPU cache, one LRU cache of tier + GPU capacity, an infinite cache (! = above its bound). saved: prompt tokens/s the engine no longer computed over the run without kvtier. TTFT includes queueing; with kvtier on, a new request also waits one engine step for its lookup, which moves TTFT even when kvtier serves nothing (a request skipped for a step lets the ones behind it in). cost: rough 3-year cost of the tiers.`,
    `Verified ${int(verified)} loaded blocks byte for byte: ${int(mism)} mismatched.`,
  ];
}

function fleetLines(p: PlanResult): string[] {
  const out: string[] = [];
  const local = p.nodeLocal ?? [];
  const peers = p.peers ?? [];
  const body: string[][] = [];
  for (const [i, row] of p.rows.entries()) {
    const l = local[i];
    for (const [name, r] of [
      [`${row.label}, node-local`, l],
      [`${row.label}, peers`, peers[i]],
      [`${row.label}, shared`, row],
    ] as const) {
      if (r === undefined) continue;
      const rep = r.report;
      body.push([
        name,
        pct(servedShares(rep).kvtier),
        pct((rep.crossNodeTokens ?? 0) / Math.max(1, rep.promptTokens)),
        int(r.gain.savedTokensPerSec),
        dur(rep.modeledTtftMs.p50),
        dur(rep.modeledTtftMs.p90),
        pct(rep.timeline?.utilization ?? 0),
        int(rep.verifiedBlocks),
        int(rep.mismatchedBlocks),
      ]);
    }
  }
  out.push(
    `Fleet: ${p.engines} engines, router ${p.router}; node-local: each engine its own 1/${p.engines} of the fs, redis and s3 tiers; ${peers.length > 0 ? 'peers: node-local, and a peer tier over the sidecars (each chunk homed on one; no store of its own); ' : ''}shared: one store for all`,
    ...formatTable(body, [
      'configuration',
      'kvtier',
      'cross-node',
      'saved tok/s',
      'TTFT p50',
      'TTFT p90',
      'busy',
      'verified',
      'mismatched',
    ]),
  );
  for (const [i, row] of p.rows.entries()) {
    const l = local[i];
    if (l !== undefined) {
      const add = row.gain.savedTokensPerSec - l.gain.savedTokensPerSec;
      out.push(
        `  ${row.label}: the shared tier adds ${int(add)} prompt tokens/s saved over node-local tiers; cross-node hits: ${int(row.report.crossNodeTokens ?? 0)} tokens loaded from chunks another engine computed.`,
      );
      const q = peers[i];
      if (q !== undefined)
        out.push(
          `  ${row.label}: the peer tier adds ${int(q.gain.savedTokensPerSec - l.gain.savedTokensPerSec)} prompt tokens/s saved over node-local tiers; cross-node hits: ${int(q.report.crossNodeTokens ?? 0)} tokens; ${int(q.report.tokens.byTier.peer ?? 0)} tokens read from another sidecar (the chunk's home, whichever engine computed it).`,
        );
    }
  }
  const per = p.rows[0]?.report.engines ?? [];
  if (per.length > 0)
    out.push(
      '',
      `Per engine (${p.rows[0]?.label}, shared)`,
      ...formatTable(
        per.map((e, i) => [
          `  engine ${i}`,
          int(e.requests),
          int(e.promptTokens),
          pct(servedShares(e).kvtier),
          pct((e.crossNodeTokens ?? 0) / Math.max(1, e.promptTokens)),
          dur(e.modeledTtftMs.p50),
          dur(e.modeledTtftMs.p90),
          pct(e.timeline?.utilization ?? 0),
        ]),
        ['', 'requests', 'prompt tokens', 'kvtier', 'cross-node', 'TTFT p50', 'TTFT p90', 'busy'],
      ),
    );
  return out;
}

function targetLine(p: PlanResult): string {
  const t = p.target as Target;
  const goal =
    t.kind === 'saved'
      ? `${int(t.tokensPerSec)} prompt tokens/s saved`
      : t.kind === 'share'
        ? `${pct(t.fraction)} of prompt tokens saved`
        : `${t.kind === 'ttft-p50' ? 'TTFT p50' : 'TTFT p90'} ≤ ${dur(t.ms)}`;
  const c = p.cheapest;
  if (c === undefined) return `Target ${goal}: no configuration shown reaches it.`;
  return `Target ${goal}: the cheapest configuration reaching it is ${c.label} ($${int(c.cost)}): ${int(c.gain.savedTokensPerSec)} tokens/s saved, TTFT p50 ${dur(c.gain.ttftP50[1])}, p90 ${dur(c.gain.ttftP90[1])}.`;
}

function verifyLine(r: SimReport): string {
  const mb = r.modelBytes;
  return `Moved: ${formatSize(mb?.saved ?? 0)} saved to kvtier, ${formatSize(mb?.loaded ?? 0)} loaded (${r.model?.name ?? 'planned model'} KV); ${int(r.verifiedBlocks)} loaded blocks verified byte for byte, ${int(r.mismatchedBlocks)} mismatched.`;
}

/** Self-reuse tokens as a share of prompt tokens. */
export function selfShare(r: SimReport): number {
  const s = r.tokens.selfReuse;
  return s === undefined ? 0 : (s.gpu + s.kvtier) / Math.max(1, r.promptTokens);
}

/** kvtier's share of prompt tokens, self-reuse included (what it served in all). */
export function kvtierAllShare(r: SimReport): number {
  return (kvtierTokens(r) + (r.tokens.selfReuse?.kvtier ?? 0)) / Math.max(1, r.promptTokens);
}

function int(n: number): string {
  // `+ 0` turns the -0 a small negative rounds to into 0.
  return Number.isFinite(n) ? (Math.round(n) + 0).toLocaleString('en-US') : String(n);
}

function num(n: number): string {
  return n >= 100 ? int(n) : n >= 10 ? n.toFixed(1) : n.toPrecision(2);
}

function fmtScale(s: number): string {
  return s >= 10 ? s.toFixed(1) : s >= 1 ? s.toFixed(2) : s.toPrecision(2);
}

/** Flags for a row: re-exported for the command, which attaches them. */
export { boundFlags };

/** Label and value lines, the values aligned after the longest label. */
function keyValues(rows: readonly (readonly [string, string])[]): string[] {
  const w = Math.max(...rows.map(([k]) => k.length));
  return rows.map(([k, v]) => `${k.padEnd(w)}  ${v}`);
}
