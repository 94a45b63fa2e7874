/**
 * Runs the Python package's tests (python/tests, pytest) once and reports every pytest case as
 * a node:test test, one suite per Python module, so `npm test` counts them in its summary: a
 * pytest failure is a failed test here (with pytest's message), a pytest skip a skipped one
 * (with its reason). The twin of vLLM's engine loop (python/tests/vllm_twin) needs PyTorch and
 * runs from twin.test.ts; the runs under vLLM's own code (python/tests/vllm_real) need vLLM and
 * run from vllm.test.ts.
 *
 * Only Debian's interpreter is used (/usr/bin/python3 with python3-zmq, python3-msgpack,
 * python3-numpy and python3-pytest); without them this file fails with one line saying what to
 * install.
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { describe, it } from 'node:test';
import { runProcess, runPytestSuites } from '../support/pytest-run.ts';

export { type PytestCase, parseJunitXml } from '../support/pytest-run.ts';

const PYTHON = '/usr/bin/python3';
const INSTALL_HINT = 'apt-get install python3-zmq python3-msgpack python3-numpy python3-pytest';
/** A hung pytest run fails after this long instead of holding CI. */
const PYTEST_TIMEOUT_MS = 15 * 60_000;

async function prerequisites(): Promise<string | null> {
  if (!existsSync(PYTHON)) return `${PYTHON} not found: ${INSTALL_HINT}`;
  const probe = await runProcess(
    PYTHON,
    [
      '-c',
      'import importlib.util as u, sys; m=[n for n in ("zmq","msgpack","numpy","pytest") if u.find_spec(n) is None]; print(",".join(m)); sys.exit(1 if m else 0)',
    ],
    60_000,
  );
  if (probe.code === 0) return null;
  const missing = probe.output.trim().split('\n').pop() ?? '?';
  return `${PYTHON} lacks the Python modules ${missing}: ${INSTALL_HINT}`;
}

const missing = await prerequisites();
if (missing !== null) {
  describe('python tests (pytest)', () => {
    it('Python prerequisites are installed', () => {
      assert.fail(missing);
    });
  });
} else {
  const res = await runPytestSuites({
    python: PYTHON,
    args: [
      'python/tests',
      '--ignore=python/tests/vllm_twin',
      '--ignore=python/tests/vllm_real',
      '-q',
      '-p',
      'no:cacheprovider',
      '-rfEs',
    ],
    timeoutMs: PYTEST_TIMEOUT_MS,
    label: 'pytest python/tests',
  });
  // Figures some tests print for the record (python/tests/test_router_events.py), each listed
  // with what it must say once the events have propagated: full agreement, events published.
  const figures = res.output.split('\n').filter((l) => l.startsWith('router events: '));
  describe('pytest figures', () => {
    for (const line of figures)
      it(line, () => {
        const settled = line.split('(one engine step')[0]!;
        for (const [, got, of] of settled.matchAll(/(\d+)\/(\d+)/g))
          assert.equal(got, of, `after propagation: ${line}`);
        const published = /(\d+) events in/.exec(line);
        if (published !== null) assert.ok(Number(published[1]) > 0, line);
      });
  });
}
