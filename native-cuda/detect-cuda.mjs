#!/usr/bin/env node
// Called by binding.gyp at configure time.
//   node detect-cuda.mjs home  -> the CUDA toolkit root to build against, or '' to build host-only
//   node detect-cuda.mjs skip  -> 0 (CUDA found), 1 (nvcc not found), 2 (KVTIER_NO_CUDA set)
// The CUDA part is built when nvcc is found and the toolkit has the static runtime.
import { spawnSync } from 'node:child_process';
import { existsSync, realpathSync } from 'node:fs';
import { delimiter, dirname, join } from 'node:path';

function disabled() {
  const v = process.env.KVTIER_NO_CUDA;
  return v !== undefined && v !== '' && v !== '0';
}

function findNvcc() {
  for (const env of ['CUDA_HOME', 'CUDA_PATH']) {
    const home = process.env[env];
    if (home && existsSync(join(home, 'bin', 'nvcc'))) return join(home, 'bin', 'nvcc');
  }
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    if (dir && existsSync(join(dir, 'nvcc'))) return join(dir, 'nvcc');
  }
  return existsSync('/usr/local/cuda/bin/nvcc') ? '/usr/local/cuda/bin/nvcc' : null;
}

function usable(home) {
  return (
    existsSync(join(home, 'include', 'cuda_runtime_api.h')) &&
    existsSync(join(home, 'lib64', 'libcudart_static.a'))
  );
}

// nvcc is often a wrapper script; its dry run names the real bin directory (_HERE_).
function toolkitHome(nvcc) {
  const candidates = [];
  const dry = spawnSync(nvcc, ['--dryrun', '-c', '-x', 'cu', '/dev/null', '-o', '/dev/null'], {
    encoding: 'utf8',
  });
  const here = /_HERE_=(.*)/.exec(`${dry.stdout ?? ''}${dry.stderr ?? ''}`)?.[1]?.trim();
  if (here) candidates.push(dirname(here));
  candidates.push(dirname(dirname(realpathSync(nvcc))), '/usr/local/cuda');
  return candidates.find(usable) ?? null;
}

const mode = process.argv[2] ?? 'home';
let home = null;
let skip = 2;
if (!disabled()) {
  const nvcc = findNvcc();
  home = nvcc === null ? null : toolkitHome(nvcc);
  skip = home === null ? 1 : 0;
}
process.stdout.write(mode === 'skip' ? String(skip) : (home ?? ''));
