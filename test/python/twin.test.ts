/**
 * Runs the twin of vLLM's engine loop (python/tests/vllm_twin: the two modelled vLLM revisions
 * whose code the tests cannot run, their fault scenarios and seeded random runs) with pytest in a
 * virtual environment that has PyTorch, pyzmq, numpy, pytest and transformers. What does not
 * depend on the revision runs under vLLM's own code (vllm.test.ts). The environment is
 * made once and cached outside the repository (python/tests/vllm_twin/venv.py); where it cannot
 * be made (no package index reachable, no venv module), the twin is skipped with the reason. The
 * random run's counts are printed as diagnostics.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { runProcess, runPytestSuites } from '../support/pytest-run.ts';

/** Making the environment the first time installs PyTorch (minutes on a busy machine). */
const VENV_TIMEOUT_MS = 20 * 60_000;
const TWIN_TIMEOUT_MS = 15 * 60_000;

/** Interpreters that may make the environment, in order (the first that succeeds is used). */
function candidates(): string[] {
  const out = [process.env.KVTIER_TWIN_PYTHON, 'python3.11', 'python3', '/usr/bin/python3'];
  return [...new Set(out.filter((p): p is string => p !== undefined && p !== ''))];
}

async function twinPython(): Promise<{ python?: string; reasons: string[] }> {
  const reasons: string[] = [];
  for (const candidate of candidates()) {
    const res = await runProcess(candidate, ['python/tests/vllm_twin/venv.py'], VENV_TIMEOUT_MS);
    const last = res.output.trim().split('\n').pop() ?? '';
    if (res.code === 0 && last !== '') return { python: last, reasons };
    reasons.push(`${candidate}: ${last || `exited with ${res.code ?? res.signal}`}`);
  }
  return { reasons };
}

const found = await twinPython();
if (found.python === undefined) {
  const reason = `no environment for the vLLM twin: ${found.reasons.join('; ')}`;
  describe('pytest python/tests/vllm_twin', () => {
    it('the vLLM twin', { skip: reason }, () => {});
  });
} else {
  const res = await runPytestSuites({
    python: found.python,
    args: ['python/tests/vllm_twin', '-q', '-p', 'no:cacheprovider', '-rfEs'],
    timeoutMs: TWIN_TIMEOUT_MS,
    label: 'pytest python/tests/vllm_twin',
  });
  const counts = res.output.split('\n').filter((l) => l.startsWith('twin random run'));
  describe('twin random run', () => {
    it('every seed reported its counts', (t) => {
      for (const line of counts) t.diagnostic(line);
      assert.equal(counts.length, 3, `three seeds, got:\n${counts.join('\n')}`);
    });
  });
}
