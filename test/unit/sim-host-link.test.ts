/**
 * The planner's host links against the GPU check's reports they come from: every figure equals
 * its report's field to the digits kept, and every preset's link is what `host-link.ts` says it
 * is built from, so a new measurement cannot leave the presets behind silently.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { GPU_PRESETS } from '../../src/sim/gpu.ts';
import {
  H100_HOST_LINK,
  H200_HOST_LINK,
  MEASURED_HOST_LINK,
  PCIE_GEN4_HOST_LINK,
} from '../../src/sim/host-link.ts';
import { REPO_ROOT } from '../support/fixtures.ts';

function field(file: string, dotted: string): number {
  let v: unknown = JSON.parse(readFileSync(`${REPO_ROOT}/${file}`, 'utf8'));
  for (const k of dotted.split('.')) v = (v as Record<string, unknown>)[k];
  assert.equal(typeof v, 'number', `${file} ${dotted}`);
  return v as number;
}

describe('planner host links', () => {
  it("equal the GPU check's reports, field for field", () => {
    for (const [name, f] of Object.entries(MEASURED_HOST_LINK))
      assert.equal(f.value.toFixed(f.digits), field(f.file, f.field).toFixed(f.digits), name);
  });

  it('the H200 is its measured load, the same as torch H2D × the load ratio of that run', () => {
    const m = MEASURED_HOST_LINK;
    assert.equal(GPU_PRESETS.h200?.hostLinkBytesPerSec, m.h200LoadGBps.value * 1e9);
    const torch = field(m.h200LoadRatio.file, 'bandwidth.torchH2dGBps');
    const ratio = field(m.h200LoadRatio.file, m.h200LoadRatio.field);
    assert.ok(
      Math.abs((torch * ratio) / field(m.h200LoadGBps.file, m.h200LoadGBps.field) - 1) < 1e-9,
    );
    assert.equal(GPU_PRESETS.h200?.hostLinkSource, H200_HOST_LINK.source);
    assert.match(H200_HOST_LINK.source, /bench\/results\/gpu-h200\.json bandwidth\.loadGBps/);
  });

  it("the H100 is torch's H2D measured on it × the H200's load ratio; Gen4 GPUs half of it", () => {
    const m = MEASURED_HOST_LINK;
    assert.equal(
      GPU_PRESETS.h100?.hostLinkBytesPerSec,
      m.h100TorchH2dGBps.value * 1e9 * m.h200LoadRatio.value,
    );
    assert.equal((H100_HOST_LINK.bytesPerSec / 1e9).toFixed(1), '51.2');
    assert.match(H100_HOST_LINK.source, /gpu-h100\.json bandwidth\.torchH2dGBps/);
    assert.match(H100_HOST_LINK.source, /gpu-h200\.json bandwidth\.loadRatio/);
    for (const g of ['a100', 'l40s']) {
      assert.equal(GPU_PRESETS[g]?.hostLinkBytesPerSec, H100_HOST_LINK.bytesPerSec / 2, g);
      assert.match(GPU_PRESETS[g]?.hostLinkSource ?? '', /^not measured/, g);
    }
    assert.equal(PCIE_GEN4_HOST_LINK.kind, 'derived');
  });
});
