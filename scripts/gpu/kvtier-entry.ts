// Entry of the sidecar as one bundled file (scripts/gpu-bundle.sh): the `kvtier` command without
// the dist/ lookup of bin/kvtier.js.
import { main } from '../../src/cli/main.ts';

process.exitCode = await main(process.argv.slice(2));
