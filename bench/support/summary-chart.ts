/**
 * The SVG chart of `npm run bench`'s summary: one horizontal bar per figure with a target, its
 * length the figure's share of its target (1.0 = exactly on target, longer = better), a whisker
 * from the worst to the best round, green when the median meets the target and red when not.
 * Rendered to PNG with the simulator's resvg helper (src/sim/png.ts).
 */
import type { TargetOp } from './figures.ts';

export interface ChartBar {
  label: string;
  op: TargetOp;
  target: number;
  median: number;
  min: number;
  max: number;
  met: boolean;
}

/** How far a value stands toward its target: 1 on target, above 1 better, below worse. */
export function score(op: TargetOp, target: number, value: number): number {
  if (op === '>=') return target === 0 ? 1 : value / target;
  return value <= 0 ? 10 : target / value;
}

const CAP = 2.5;
const ROW = 18;
const LEFT = 330;
const RIGHT = 40;
const TOP = 70;

export function renderSummaryChart(title: string, bars: readonly ChartBar[]): string {
  const width = 1000;
  const height = TOP + bars.length * ROW + 60;
  const plotW = width - LEFT - RIGHT;
  const px = (s: number) => LEFT + (Math.min(CAP, Math.max(0, s)) / CAP) * plotW;
  const bottom = TOP + bars.length * ROW;
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="sans-serif" font-size="11">`,
    `<rect x="0" y="0" width="${width}" height="${height}" fill="#ffffff"/>`,
    `<text x="${width / 2}" y="24" text-anchor="middle" font-size="15" font-weight="bold">${esc(title)}</text>`,
    `<text x="${width / 2}" y="44" text-anchor="middle">bar: median share of target (1 = on target, right = better; capped at ${CAP}); whisker: worst to best round</text>`,
  ];
  for (let t = 0; t <= CAP; t += 0.5) {
    const x = fmt(px(t));
    out.push(
      `<line x1="${x}" y1="${TOP - 6}" x2="${x}" y2="${bottom}" stroke="${t === 1 ? '#333333' : '#dddddd'}"${t === 1 ? ' stroke-width="2"' : ''}/>`,
      `<text x="${x}" y="${bottom + 16}" text-anchor="middle">${t.toFixed(1)}</text>`,
    );
  }
  out.push(
    `<text x="${fmt(px(1))}" y="${TOP - 10}" text-anchor="middle" font-weight="bold">target</text>`,
    `<text x="${LEFT + plotW / 2}" y="${bottom + 36}" text-anchor="middle">share of target</text>`,
  );
  for (const [i, b] of bars.entries()) {
    const y = TOP + i * ROW;
    const s = score(b.op, b.target, b.median);
    const lo = score(b.op, b.target, b.op === '>=' ? b.min : b.max);
    const hi = score(b.op, b.target, b.op === '>=' ? b.max : b.min);
    const color = b.met ? '#2ca02c' : '#d62728';
    const cy = y + ROW / 2;
    out.push(
      `<text x="${LEFT - 8}" y="${cy}" text-anchor="end" dominant-baseline="middle">${esc(b.label)}</text>`,
      `<rect x="${LEFT}" y="${y + 3}" width="${fmt(px(s) - LEFT)}" height="${ROW - 6}" fill="${color}" fill-opacity="0.75"><title>${esc(`${b.label}: ${b.median.toPrecision(3)} (target ${b.op} ${b.target})`)}</title></rect>`,
      `<line x1="${fmt(px(lo))}" y1="${cy}" x2="${fmt(px(hi))}" y2="${cy}" stroke="#000000"/>`,
      `<line x1="${fmt(px(lo))}" y1="${cy - 4}" x2="${fmt(px(lo))}" y2="${cy + 4}" stroke="#000000"/>`,
      `<line x1="${fmt(px(hi))}" y1="${cy - 4}" x2="${fmt(px(hi))}" y2="${cy + 4}" stroke="#000000"/>`,
    );
  }
  out.push('</svg>');
  return `${out.join('\n')}\n`;
}

function fmt(n: number): string {
  return String(Math.round(n * 10) / 10);
}

function esc(s: string): string {
  return s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}
