// Entry of the sidecar as one bundled file (scripts/gpu-bundle.sh): the `kvtier` command without
// the dist/ lookup of bin/kvtier.js.
import { main } from '../../src/cli/main.ts';

// As bin/kvtier.js: a wider libuv pool for device copies (the bundle runs on Node 24).
if (
  process.env.UV_THREADPOOL_SIZE === undefined &&
  Number(process.versions.node.split('.')[0]) >= 24
)
  process.env.UV_THREADPOOL_SIZE = '16';

process.exitCode = await main(process.argv.slice(2));
