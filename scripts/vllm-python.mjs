#!/usr/bin/env node
// Runs a Python script in the environment with vLLM's own code (python/tests/vllm_real/env.py
// makes it once, offline, and caches it): `node scripts/vllm-python.mjs SCRIPT [ARGS...]`, with
// the Hugging Face cache that environment holds and the repository's python/ on the path. Where
// the environment cannot be made it says why in one line and exits 3.
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const candidates = [...new Set([process.env.KVTIER_VLLM_PYTHON, 'python3.11', 'python3'])].filter(
  (p) => p !== undefined && p !== '',
);
const reasons = [];
let env;
for (const python of candidates) {
  const res = spawnSync(python, ['python/tests/vllm_real/env.py'], { cwd: root, encoding: 'utf8' });
  const last = (res.stdout ?? '').trim().split('\n').pop() ?? '';
  if (res.status === 0 && last.startsWith('{')) {
    env = JSON.parse(last);
    break;
  }
  reasons.push(`${python}: ${last || res.error?.message || `exited with ${res.status}`}`);
}
if (env === undefined) {
  console.error(`no environment with vLLM's own code here: ${reasons.join('; ')}`);
  process.exit(3);
}
const run = spawnSync(env.python, process.argv.slice(2), {
  cwd: root,
  stdio: 'inherit',
  env: {
    ...process.env,
    HF_HOME: env.hf_home,
    HF_HUB_OFFLINE: '1',
    TRANSFORMERS_OFFLINE: '1',
    PYTHONPATH: `${root}python`,
  },
});
process.exit(run.status ?? 1);
