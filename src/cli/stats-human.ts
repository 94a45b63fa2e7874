/**
 * `kvtier stats --human`: the STATS and PING answers as a table a person reads, in the spirit of
 * Redis' INFO: per tier its health, chunks, bytes, fill, hit rate and evictions; per namespace
 * its chunks and bytes in each tier.
 */
import { formatBytes } from '../util/bytes.ts';

interface TierStats {
  name?: string;
  kind?: string;
  health?: string;
  chunks?: number;
  bytesUsed?: number;
  capacityBytes?: number | null;
  evictions?: number;
  namespaces?: Record<string, { chunks: number; bytes: number }>;
  namespacesOmitted?: { namespaces: number; chunks: number; bytes: number };
}

interface PingTier {
  name?: string;
  path?: string;
  hitChunks?: number;
  lookedUpChunks?: number;
}

const pad = (s: string, n: number) => s.padEnd(n);
const lpad = (s: string, n: number) => s.padStart(n);

/** Lines of `--human` for a STATS answer and the PING answer of the same sidecar. */
export function humanStats(
  stats: Record<string, unknown>,
  ping: Record<string, unknown>,
  endpoint: string,
): string[] {
  const tiers = (stats.tiers as TierStats[] | undefined) ?? [];
  const pingTiers = new Map(((ping.tiers as PingTier[] | undefined) ?? []).map((t) => [t.name, t]));
  const out: string[] = [];
  const uptime = typeof ping.uptimeMs === 'number' ? `, up ${formatDuration(ping.uptimeMs)}` : '';
  out.push(
    `kvtier ${String(ping.version ?? '?')} at ${endpoint}${uptime}, epoch ${String(stats.epoch ?? ping.epoch ?? '?')}`,
  );
  if (typeof ping.config === 'string') out.push(`config: ${ping.config}`);
  out.push('');
  const head = ['tier', 'type', 'health', 'chunks', 'bytes', 'fill', 'hit rate', 'evictions'];
  const rows = tiers.map((t) => {
    const p = pingTiers.get(t.name);
    const fill =
      typeof t.capacityBytes === 'number' && t.capacityBytes > 0 && t.bytesUsed !== undefined
        ? `${((100 * t.bytesUsed) / t.capacityBytes).toFixed(1)}% of ${formatBytes(t.capacityBytes)}`
        : 'unbounded';
    const rate =
      p?.lookedUpChunks !== undefined && p.lookedUpChunks > 0
        ? `${((100 * (p.hitChunks ?? 0)) / p.lookedUpChunks).toFixed(1)}% of ${p.lookedUpChunks}`
        : '-';
    return [
      String(t.name ?? '?'),
      String(t.kind ?? '?'),
      String(t.health ?? '?'),
      String(t.chunks ?? '-'),
      t.bytesUsed === undefined ? '-' : formatBytes(t.bytesUsed),
      fill,
      rate,
      String(t.evictions ?? '-'),
    ];
  });
  out.push(...table(head, rows, [3, 4, 7]));
  for (const t of tiers) {
    const path = pingTiers.get(t.name)?.path;
    if (path !== undefined) out.push(`  ${t.name}: ${path}`);
  }
  const byNs = new Map<string, Map<string, { chunks: number; bytes: number }>>();
  for (const t of tiers)
    for (const [ns, u] of Object.entries(t.namespaces ?? {})) {
      const m = byNs.get(ns) ?? new Map();
      m.set(String(t.name), u);
      byNs.set(ns, m);
    }
  out.push('');
  if (byNs.size === 0) out.push('namespaces: none stored');
  else {
    const names = tiers.map((t) => String(t.name));
    const nsRows = [...byNs.entries()]
      .sort((a, b) => total(b[1]) - total(a[1]))
      .map(([ns, m]) => [
        ns,
        ...names.map((n) => {
          const u = m.get(n);
          return u === undefined ? '-' : `${u.chunks} / ${formatBytes(u.bytes)}`;
        }),
      ]);
    out.push(
      ...table(
        ['namespace (chunks / bytes)', ...names],
        nsRows,
        names.map((_, i) => i + 1),
      ),
    );
    for (const t of tiers)
      if (t.namespacesOmitted !== undefined && t.namespacesOmitted.namespaces > 0)
        out.push(
          `  ${t.name}: ${t.namespacesOmitted.namespaces} more namespaces, ${t.namespacesOmitted.chunks} chunks, ${formatBytes(t.namespacesOmitted.bytes)}`,
        );
  }
  const lookups = stats.lookups as Record<string, number> | undefined;
  const wt = stats.writeThrough as Record<string, number> | undefined;
  out.push('');
  if (lookups !== undefined)
    out.push(
      `lookups: ${lookups.ongoing ?? 0} running, ${lookups.done ?? 0} answered and held, ${lookups.refusedTotal ?? 0} refused`,
    );
  if (wt !== undefined)
    out.push(
      `write-through: ${wt.depth ?? 0} queued (${formatBytes(wt.bytes ?? 0)}), ${wt.dropped ?? 0} dropped`,
    );
  return out;
}

function total(m: Map<string, { bytes: number }>): number {
  let n = 0;
  for (const u of m.values()) n += u.bytes;
  return n;
}

function table(head: string[], rows: string[][], right: number[]): string[] {
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (right.includes(i) ? lpad(c, widths[i]!) : pad(c, widths[i]!)))
      .join('  ')
      .trimEnd();
  return [line(head), ...rows.map(line)];
}

function formatDuration(ms: number): string {
  const s = Math.floor(ms / 1000);
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.floor(s / 60)} min`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}
