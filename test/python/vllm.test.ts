/**
 * kvtier under vLLM's own code (`npm run test:vllm`, also part of `npm test`). In the
 * environment python/tests/vllm_real/env.py makes from the vendored vLLM source (cached outside
 * the repository; built offline from this machine's package indexes), it runs:
 *
 * 1. vLLM's own CPU-runnable connector unit tests (scheduler and connector lifecycle, load-failure
 *    recovery, invalid blocks, the offloading connector, the output aggregator, the KV cache
 *    layout, ...): the baseline that the environment is vLLM's;
 * 2. kvtier's connector under vLLM's real `Scheduler` and `AsyncScheduler`, its worker side built
 *    by `ensure_kv_transfer_initialized` and called through `KVConnectorModelRunnerMixin`, tensor
 *    parallel 2, against real sidecars (python/tests/vllm_real), and the adapter's check against
 *    vLLM's base class (python/tests/test_connector.py).
 *
 * Where no such environment can be made (no vLLM tarball, no package index), the whole file is
 * one skipped test whose reason says why. A closing line prints `N passed, N failed`.
 */
import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import { ROOT, runProcess, runPytestSuites } from '../support/pytest-run.ts';

/** Making the environment the first time installs PyTorch and vLLM's dependencies. */
const ENV_TIMEOUT_MS = 20 * 60_000;
const RUN_TIMEOUT_MS = 20 * 60_000;

/** vLLM's connector unit tests that run on CPU (paths in vLLM's tree). */
export const UPSTREAM_TESTS = [
  'test_kv_connector_lifecycle.py',
  'test_kv_load_failure_recovery.py',
  'test_invalid_blocks_correctness.py',
  'test_offloading_connector.py',
  'offloading_connector',
  'test_output_aggregator.py',
  'test_kv_cache_layout.py',
  'test_remote_decode_lifecycle.py',
  'test_remote_prefill_lifecycle.py',
  'test_error_propagation.py',
  'test_cache_pollution_prevention.py',
  'test_config.py',
  'test_multi_connector.py',
  'test_scheduler_kv_connector_override.py',
  'test_tp_mapping.py',
  'test_decode_bench_connector.py',
].map((f) => `tests/v1/kv_connector/unit/${f}`);

interface VllmEnv {
  python: string;
  src: string;
  hf_home: string;
  commit: string;
  cached: boolean;
}

/** Interpreters that may make the environment, in order (the first that succeeds is used). */
function candidates(): string[] {
  const out = [process.env.KVTIER_VLLM_PYTHON, 'python3.11', 'python3'];
  return [...new Set(out.filter((p): p is string => p !== undefined && p !== ''))];
}

async function vllmEnv(): Promise<{ env?: VllmEnv; reasons: string[] }> {
  const reasons: string[] = [];
  for (const candidate of candidates()) {
    const res = await runProcess(candidate, ['python/tests/vllm_real/env.py'], ENV_TIMEOUT_MS);
    const last = res.output.trim().split('\n').pop() ?? '';
    if (res.code === 0 && last.startsWith('{'))
      return { env: JSON.parse(last) as VllmEnv, reasons };
    reasons.push(`${candidate}: ${last || `exited with ${res.code ?? res.signal}`}`);
  }
  return { reasons };
}

/**
 * Set (to the reason) where the same checkout already ran this file in this run: .ci/run runs
 * it in its Node 20 pass only (vLLM's code is Python; the sidecar under Node 24 is the rest of
 * the suite's), and says so here.
 */
const ranElsewhere = process.env.KVTIER_VLLM_TESTS_RAN;
const found = ranElsewhere ? { reasons: [] } : await vllmEnv();
if (ranElsewhere) {
  describe('kvtier under vLLM', () => {
    it('vLLM environment', { skip: ranElsewhere }, () => {});
  });
} else if (found.env === undefined) {
  const reason = `no environment with vLLM's own code here: ${found.reasons.join('; ')}`;
  describe('kvtier under vLLM', () => {
    it('vLLM environment', { skip: reason }, () => {});
  });
} else {
  const env = found.env;
  const short = env.commit.slice(0, 8);
  const pyEnv = { HF_HOME: env.hf_home, HF_HUB_OFFLINE: '1', TRANSFORMERS_OFFLINE: '1' };
  const counts = { passed: 0, failed: 0, skipped: 0 };
  const tally = (output: string): void => {
    // pytest's closing line, e.g. "2 failed, 132 passed, 4 skipped, 14 warnings in 49.60s".
    const last =
      output
        .split('\n')
        .reverse()
        .find((l) => / in [\d.]+s/.test(l)) ?? '';
    for (const k of ['passed', 'failed', 'skipped'] as const) {
      const m = new RegExp(`(\\d+) ${k}`).exec(last);
      if (m !== null) counts[k] += Number(m[1]);
    }
    const errors = /(\d+) errors?\b/.exec(last);
    if (errors !== null) counts.failed += Number(errors[1]);
  };
  const upstream = await runPytestSuites({
    python: env.python,
    cwd: env.src,
    args: [
      ...UPSTREAM_TESTS,
      '-q',
      '-p',
      'no:cacheprovider',
      '-p',
      'kvtier_upstream_skips',
      '-rfEs',
    ],
    env: { ...pyEnv, PYTHONPATH: `${ROOT}python/tests/vllm_real/plugins` },
    timeoutMs: RUN_TIMEOUT_MS,
    label: `vLLM ${short}: its own connector unit tests`,
    moduleName: (path) => `vLLM ${short} ${path}`,
  });
  tally(upstream.output);
  const ours = await runPytestSuites({
    python: env.python,
    args: [
      'python/tests/vllm_real',
      'python/tests/test_connector.py',
      '-q',
      '-p',
      'no:cacheprovider',
      '-rfEs',
    ],
    env: pyEnv,
    timeoutMs: RUN_TIMEOUT_MS,
    label: `kvtier's connector under vLLM ${short}`,
  });
  tally(ours.output);
  const figures = ours.output.split('\n').filter((l) => l.startsWith('vllm run:'));
  const routers = ours.output.split('\n').filter((l) => l.startsWith('router consumers:'));
  describe(`kvtier under vLLM ${short}`, () => {
    it('seeded random runs reported their counts', (t) => {
      for (const line of figures) t.diagnostic(line);
      assert.ok(figures.length >= 3, `three seeds at least, got:\n${figures.join('\n')}`);
    });
    it("Dynamo's and llm-d's indexers reported their agreement per phase", (t) => {
      for (const line of routers) t.diagnostic(line);
      assert.ok(routers.length >= 4, `four phases, got:\n${routers.join('\n')}`);
    });
  });
  after(() => {
    console.log(
      `vLLM ${env.commit} (${env.cached ? 'cached environment' : 'environment built now'}): ` +
        `${counts.passed} passed, ${counts.failed} failed, ${counts.skipped} skipped`,
    );
  });
}
