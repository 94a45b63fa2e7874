// Records every module URL a process resolves, one per line, in the file KVTIER_TRACE_MODULES
// names: `node --import ./test/support/module-trace.mjs ...` (test/integration/cli-startup.test.ts).
import { register } from 'node:module';

register('./module-trace-hooks.mjs', import.meta.url);
