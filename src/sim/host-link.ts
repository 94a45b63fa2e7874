/**
 * The host links of the planner's GPU presets: how fast kvtier loads KV from pinned host memory
 * into a GPU. They come from kvtier's GPU check (`docs/gpu-check.md`), each figure with the
 * report and field it was read from; a test reads those reports and keeps the figures equal to
 * them (to the digits given here), so a new measurement cannot leave the presets behind silently.
 */

/** One measured figure and where it was read. */
export interface MeasuredFigure {
  /** The figure, rounded as `docs/gpu-check.md` quotes it. */
  value: number;
  /** The report, relative to the repository root. */
  file: string;
  /** The field of the report, dotted. */
  field: string;
  /** Decimal places `value` keeps. */
  digits: number;
}

/** The GPU check's figures the presets' host links are built from. */
export const MEASURED_HOST_LINK = Object.freeze({
  /**
   * kvtier's LOAD of 4 GiB of 32 KiB blocks in random order on an H200 (PCIe Gen5 x16), with
   * the current load grouping, GB/s.
   */
  h200LoadGBps: Object.freeze({
    value: 50.0,
    file: 'bench/results/gpu-h200.json',
    field: 'bandwidth.loadGBps',
    digits: 1,
  }),
  /** The same load over torch's pinned contiguous host-to-device copy, same run. */
  h200LoadRatio: Object.freeze({
    value: 0.93,
    file: 'bench/results/gpu-h200.json',
    field: 'bandwidth.loadRatio',
    digits: 2,
  }),
  /**
   * torch's pinned contiguous host-to-device copy on an H100 (PCIe Gen5 x16), GB/s. kvtier's own
   * load in that report (`bandwidth.loadGBps`, ratio 0.73) predates the current load grouping.
   */
  h100TorchH2dGBps: Object.freeze({
    value: 55.1,
    file: 'bench/results/gpu-h100.json',
    field: 'bandwidth.torchH2dGBps',
    digits: 1,
  }),
} satisfies Record<string, MeasuredFigure>);

/** A preset's host link, bytes/s, and how it was obtained. */
export interface HostLink {
  bytesPerSec: number;
  /** `measured` where kvtier's load was measured on that GPU with the current code. */
  kind: 'measured' | 'derived';
  /** How, in words, for reports and docs. */
  source: string;
}

const M = MEASURED_HOST_LINK;

/** The H200's: kvtier's load measured on it. */
export const H200_HOST_LINK: Readonly<HostLink> = Object.freeze({
  bytesPerSec: M.h200LoadGBps.value * 1e9,
  kind: 'measured',
  source: `kvtier's load measured on an H200 (${M.h200LoadGBps.file} ${M.h200LoadGBps.field})`,
});

/** The H100's: torch's host-to-device copy measured on it, times kvtier's load ratio on the H200. */
export const H100_HOST_LINK: Readonly<HostLink> = Object.freeze({
  bytesPerSec: M.h100TorchH2dGBps.value * 1e9 * M.h200LoadRatio.value,
  kind: 'derived',
  source:
    `torch's host-to-device copy on an H100 (${M.h100TorchH2dGBps.file} ${M.h100TorchH2dGBps.field}) ` +
    `× kvtier's load ratio on an H200 (${M.h200LoadRatio.file} ${M.h200LoadRatio.field})`,
});

/** PCIe Gen4 x16 GPUs' (not measured): half the H100's Gen5 x16 link, as Gen4 has half its bandwidth. */
export const PCIE_GEN4_HOST_LINK: Readonly<HostLink> = Object.freeze({
  bytesPerSec: H100_HOST_LINK.bytesPerSec / 2,
  kind: 'derived',
  source: "not measured: half the H100's, as PCIe Gen4 x16 has half Gen5 x16's bandwidth",
});
