import { KvtierError } from '../errors.ts';
import { formatBytes } from '../util/bytes.ts';
import { requireInt, requireString } from '../util/validate.ts';

/**
 * A dependency-free SVG line chart of hit rate against tier capacity, for capacity sweeps: one
 * line per series, a labelled point per sweep value, axes with units, a title and a legend.
 */

/** One line of the chart. */
export interface ChartSeries {
  /** Legend text, e.g. "kvtier". */
  name: string;
  /** Hit rates in [0, 1], one per capacity, in the order of `capacitiesBytes`. */
  values: readonly number[];
  /** Draw a dashed line (bounds and references); default solid. */
  dashed?: boolean;
}

/** Options of {@link renderHitRateChart}. */
export interface HitRateChartOptions {
  /** Chart title. */
  title: string;
  /** What was swept, e.g. "CPU tier capacity"; the axis label adds the unit. */
  xLabel: string;
  /** The swept capacities in bytes (> 0 for a log axis), one per point. */
  capacitiesBytes: readonly number[];
  /** The lines; at least one. */
  series: readonly ChartSeries[];
  /**
   * Tick labels, one per capacity (e.g. the capacity in a model's GiB); default the capacity
   * formatted in bytes. With labels given, the axis label is `xLabel` as is.
   */
  xTicks?: readonly string[];
  /** Equally spaced points in the given order (categories), instead of a capacity axis. */
  linear?: boolean;
  /** Image width in px; default 800. */
  widthPx?: number;
  /** Image height in px; default 480. */
  heightPx?: number;
}

/** The defaults of {@link HitRateChartOptions}, in one place. */
export const HIT_RATE_CHART_DEFAULTS = Object.freeze({ widthPx: 800, heightPx: 480 });

const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd'];
const MARGIN = { left: 80, right: 64, top: 84, bottom: 70 };
/** Vertical room of one value label, px (12 px text and a gap). */
const LABEL_PITCH = 14;
/** Width of one character of a value label, px (an upper bound for 12 px sans-serif digits). */
export const LABEL_CHAR_PX = 7;

/**
 * Renders the chart as a standalone SVG document. Points are placed in capacity order on a
 * logarithmic x axis (capacities are usually swept by factors), or a linear one when a capacity
 * is 0; the y axis runs from 0% to 100% of prompt tokens, or to the next 10% above the highest
 * point when that is at most 50% (ticks every 10%), so that close lines stay apart.
 * @throws KvtierError `KVT_INVALID_ARGUMENT` when there are no capacities or series, a capacity
 *   is negative or not finite, or a series does not hold one finite value per capacity.
 */
export function renderHitRateChart(opts: HitRateChartOptions): string {
  const title = requireString('title', opts.title);
  const xLabel = requireString('xLabel', opts.xLabel);
  const width = requireInt('widthPx', opts.widthPx ?? HIT_RATE_CHART_DEFAULTS.widthPx, 200, 10_000);
  const height = requireInt(
    'heightPx',
    opts.heightPx ?? HIT_RATE_CHART_DEFAULTS.heightPx,
    150,
    10_000,
  );
  const caps = opts.capacitiesBytes;
  if (caps.length === 0) invalid('capacitiesBytes must hold at least one capacity');
  for (const [i, c] of caps.entries()) {
    if (!Number.isFinite(c) || c < 0) {
      invalid(`capacitiesBytes[${i}] must be a finite number >= 0, got ${c}`);
    }
  }
  if (opts.series.length === 0) invalid('series must hold at least one series');
  if (opts.xTicks !== undefined && opts.xTicks.length !== caps.length)
    invalid(`xTicks must hold one label per capacity (${caps.length}), got ${opts.xTicks.length}`);
  const tick = (i: number) => opts.xTicks?.[i] ?? formatCapacity(caps[i] as number);
  for (const s of opts.series) {
    if (s.values.length !== caps.length || !s.values.every(Number.isFinite)) {
      invalid(
        `series "${s.name}" must hold one finite value per capacity (${caps.length}), got ${s.values.length}`,
      );
    }
  }

  const order = caps.map((_, i) => i);
  if (opts.linear !== true) order.sort((a, b) => (caps[a] as number) - (caps[b] as number));
  const log = opts.linear !== true && caps.every((c) => c > 0);
  const xs = caps.map((c, i) => (opts.linear === true ? i : log ? Math.log2(c) : c));
  const xMin = Math.min(...xs);
  const xMax = Math.max(...xs);
  const plotW = width - MARGIN.left - MARGIN.right;
  const plotH = height - MARGIN.top - MARGIN.bottom;
  // Points sit inside the axes so the first one does not hide on the y axis.
  const inset = Math.min(40, plotW / 10);
  const px = (i: number) =>
    MARGIN.left +
    (xMax === xMin
      ? plotW / 2
      : inset + (((xs[i] as number) - xMin) / (xMax - xMin)) * (plotW - 2 * inset));
  const top = Math.max(...opts.series.flatMap((s) => s.values));
  const yMax = top <= 0.45 ? Math.ceil((top + 0.05) * 10) / 10 : 1;
  const yStep = yMax < 1 ? 10 : 20;
  const py = (v: number) => MARGIN.top + (1 - Math.min(yMax, Math.max(0, v)) / yMax) * plotH;
  const bottom = MARGIN.top + plotH;
  const right = MARGIN.left + plotW;

  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="12">`,
    `<rect x="0" y="0" width="${width}" height="${height}" fill="#ffffff"/>`,
    `<text x="${width / 2}" y="28" text-anchor="middle" font-size="16" font-weight="bold">${esc(title)}</text>`,
  ];
  // Horizontal grid and y ticks every 20%.
  for (let pctTick = 0; pctTick <= Math.round(yMax * 100); pctTick += yStep) {
    const y = fmt(py(pctTick / 100));
    out.push(
      `<line x1="${MARGIN.left}" y1="${y}" x2="${right}" y2="${y}" stroke="#dddddd"/>`,
      `<text x="${MARGIN.left - 8}" y="${y}" text-anchor="end" dominant-baseline="middle">${pctTick}%</text>`,
    );
  }
  // One x tick per swept capacity.
  for (const i of order) {
    const x = fmt(px(i));
    out.push(
      `<line x1="${x}" y1="${bottom}" x2="${x}" y2="${bottom + 5}" stroke="#333333"/>`,
      `<text x="${x}" y="${bottom + 20}" text-anchor="middle">${esc(tick(i))}</text>`,
    );
  }
  out.push(
    `<line x1="${MARGIN.left}" y1="${bottom}" x2="${right}" y2="${bottom}" stroke="#333333"/>`,
    `<line x1="${MARGIN.left}" y1="${MARGIN.top}" x2="${MARGIN.left}" y2="${bottom}" stroke="#333333"/>`,
    `<text x="${MARGIN.left + plotW / 2}" y="${height - 20}" text-anchor="middle">${esc(opts.xTicks === undefined ? `${xLabel} (bytes${log ? ', log scale' : ''})` : `${xLabel}${log ? ' (log scale)' : ''}`)}</text>`,
    `<text x="20" y="${MARGIN.top + plotH / 2}" text-anchor="middle" transform="rotate(-90 20 ${MARGIN.top + plotH / 2})">hit rate (% of prompt tokens)</text>`,
  );
  for (const [k, s] of opts.series.entries()) {
    const color = COLORS[k % COLORS.length] as string;
    const pts = order.map((i) => `${fmt(px(i))},${fmt(py(s.values[i] as number))}`);
    const dash = s.dashed === true ? ' stroke-dasharray="6 4"' : '';
    out.push(
      `<polyline fill="none" stroke="${color}" stroke-width="2"${dash} points="${pts.join(' ')}"><title>${esc(s.name)}</title></polyline>`,
    );
    for (const i of order) {
      const v = s.values[i] as number;
      const label = `${(v * 100).toFixed(1)}%`;
      out.push(
        `<circle cx="${fmt(px(i))}" cy="${fmt(py(v))}" r="4" fill="${color}"><title>${esc(`${s.name}: ${label} at ${tick(i)}`)}</title></circle>`,
      );
    }
    // Legend in rows of two under the title, above the 100% line.
    const lx = MARGIN.left + (k % 2) * 260;
    const ly = 42 + Math.floor(k / 2) * 16;
    out.push(
      `<line x1="${lx}" y1="${ly}" x2="${lx + 20}" y2="${ly}" stroke="${color}" stroke-width="2"${dash}/>`,
      `<text x="${lx + 26}" y="${ly}" dominant-baseline="middle">${esc(s.name)}</text>`,
    );
  }
  // Value labels right of their points, stacked per capacity so that none overlaps another.
  for (const i of order) {
    const labels = opts.series
      .map((s, k) => ({ k, y: py(s.values[i] as number), v: s.values[i] as number }))
      .sort((a, b) => a.y - b.y || a.k - b.k);
    const ys = stack(
      labels.map((l) => l.y + 4),
      MARGIN.top + 8,
      bottom,
    );
    for (const [j, l] of labels.entries()) {
      const text = `${(l.v * 100).toFixed(1)}%`;
      const x = px(i) + 8;
      const y = ys[j] as number;
      out.push(
        // A white backing keeps a label readable where a line runs under it.
        `<rect x="${fmt(x - 1)}" y="${fmt(y - 10)}" width="${text.length * LABEL_CHAR_PX + 2}" height="13" fill="#ffffff" fill-opacity="0.85"/>`,
        `<text class="value" x="${fmt(x)}" y="${fmt(y)}" fill="${COLORS[l.k % COLORS.length]}">${text}</text>`,
      );
    }
  }
  out.push('</svg>');
  return `${out.join('\n')}\n`;
}

/**
 * Baselines as close to `want` (ascending) as they can be with at least {@link LABEL_PITCH}
 * between neighbours, kept within `[top, bottom]` when there is room.
 */
function stack(want: readonly number[], top: number, bottom: number): number[] {
  const ys = [...want];
  for (let j = 0; j < ys.length; j++) {
    const lo = j === 0 ? top : (ys[j - 1] as number) + LABEL_PITCH;
    ys[j] = Math.max(ys[j] as number, lo);
  }
  for (let j = ys.length - 1; j >= 0; j--) {
    const hi = j === ys.length - 1 ? bottom : (ys[j + 1] as number) - LABEL_PITCH;
    ys[j] = Math.min(ys[j] as number, hi);
  }
  return ys;
}

/**
 * Formats a capacity the way an operator typed it: binary units (e.g. "256 MiB") when it is a
 * whole number of them, else decimal units (e.g. "64 MB") when it is a round decimal size, else
 * binary units with one decimal.
 */
export function formatCapacity(bytes: number): string {
  const binary = formatBytes(bytes);
  if (/^\d+ /.test(binary)) return binary;
  for (const [unit, size] of [
    ['TB', 1e12],
    ['GB', 1e9],
    ['MB', 1e6],
    ['kB', 1e3],
  ] as const) {
    if (bytes >= size && Number.isInteger((bytes * 10) / size)) return `${bytes / size} ${unit}`;
  }
  return binary;
}

function invalid(msg: string): never {
  throw new KvtierError('KVT_INVALID_ARGUMENT', msg);
}

function fmt(n: number): string {
  return String(Math.round(n * 10) / 10);
}

function esc(s: string): string {
  return s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}
