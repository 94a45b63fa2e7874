/**
 * The GPU check as it travels to a GPU machine (docs/gpu-check.md): scripts/gpu-bundle.sh builds
 * the bundle from this checkout (Node from the npm registry, the bundled sidecar and driver,
 * zeromq's prebuilds, the addon and its nvcc self-test) within its 50 MiB, and
 * scripts/gpu-check.sh --cpu runs every step of the check but the CUDA calls from that bundle:
 * the unpacked Node, the sidecar started from the bundle, the registration built by
 * kvtier_vllm.kv_caches from numpy arrays in shared memory, SAVE / LOOKUP / LOAD through the
 * TypeScript clients in the driver, every loaded block compared.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { REPO_ROOT } from '../support/fixtures.ts';

const LIMIT = 50 * 1024 * 1024;
const work = mkdtempSync(join(tmpdir(), 'kvtier-gpu-check-test-'));
after(() => rmSync(work, { recursive: true, force: true }));
const bundle = join(work, 'bundle');
const report = join(work, 'report');

function run(args: string[], timeoutMs: number) {
  const res = spawnSync('bash', args, {
    cwd: REPO_ROOT,
    encoding: 'utf8',
    timeout: timeoutMs,
    env: { ...process.env, OUT: '' },
  });
  const output = `${res.stdout ?? ''}${res.stderr ?? ''}`;
  return { status: res.status, output };
}

describe('GPU check bundle and its host dry run', { timeout: 900_000 }, () => {
  it('builds the bundle within 50 MiB and says what is in it', () => {
    const res = run(['scripts/gpu-bundle.sh', '--out', bundle], 600_000);
    assert.equal(res.status, 0, res.output);
    const manifest = JSON.parse(readFileSync(join(bundle, 'manifest.json'), 'utf8'));
    const sizes = ['node.xz', 'kvtier.tar.xz'].map((f) => statSync(join(bundle, f)).size);
    assert.equal(manifest.bytes.total, sizes[0]! + sizes[1]!);
    assert.ok(manifest.bytes.total <= LIMIT, `bundle is ${manifest.bytes.total} bytes`);
    assert.match(manifest.node, /^v24\./);
    assert.match(res.output, /gpu-bundle: .* MiB \(limit 50 MiB/, 'the size is printed');
    // Node is the bulk of it; the rest must stay small.
    assert.ok(sizes[1]! < 8 * 1024 * 1024, `kvtier.tar.xz is ${sizes[1]} bytes`);
  });

  it('runs every step but the CUDA calls with --cpu from the bundle, every block exact', () => {
    assert.ok(existsSync(join(bundle, 'manifest.json')), 'the bundle was built');
    const res = run(
      ['scripts/gpu-check.sh', '--cpu', '--bundle', bundle, '--out', report],
      300_000,
    );
    assert.equal(res.status, 0, res.output);
    const r = JSON.parse(readFileSync(join(report, 'gpu-report.json'), 'utf8'));
    assert.equal(r.mode, 'cpu');
    assert.equal(r.ok, true, JSON.stringify(r.failures));
    // The sidecar as the CUDA image runs it: no config, its chunks and epoch on the volume.
    const image = JSON.parse(readFileSync(join(report, 'image-run.json'), 'utf8'));
    assert.equal(image.ok, true, JSON.stringify(image.failures));
    assert.equal(image.config, 'defaults (no config file)');
    assert.deepEqual(
      r.layouts.map((l: { layout: string }) => l.layout),
      ['flash_attn', 'flash_attn_hnd', 'flashinfer', 'mla'],
    );
    for (const l of r.layouts) {
      assert.equal(l.mismatchedBlocks, 0, l.layout);
      assert.equal(l.invalidBlocks, 0, l.layout);
      assert.equal(l.loadedTokens, l.chunks * 256, l.layout);
      assert.ok(l.blocksCompared > 0, l.layout);
    }
    assert.equal(r.copyEngine.kind, 'native', 'the sidecar from the bundle loaded the addon');
    assert.equal(typeof r.copyEngine.cuda.reason, 'string');
    assert.ok(r.bandwidth.lookupDuringLoad.samples > 0, 'lookups ran during the load');
    assert.equal(r.pinnedAtEnd, 0);
    assert.equal(r.sidecarExit, 0);
  });
});
