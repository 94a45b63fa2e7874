// Child process for bench/lookup.ts: a kvtier sidecar on an ephemeral port, LocalCPU only.
import { defaultConfig } from '../../src/config/config.ts';
import { Sidecar } from '../../src/sidecar.ts';
import { createLogger } from '../../src/util/log.ts';
import { watchLoop } from './loop-stall.ts';

const config = defaultConfig();
config.listen = 'tcp://127.0.0.1:*';
config.metrics = null;
// Every lookup here stays answered and pinned until the lookup registry (storage.maxLookups)
// evicts it, as no LOAD follows: room for a full registry of 512-chunk lookups (~84 KB each).
config.storage.maxLookupBytes = 1024 ** 3;
config.tiers = [{ name: 'cpu', type: 'local-cpu', options: { capacityBytes: 256 * 1024 * 1024 } }];
const sidecar = await Sidecar.start({
  config,
  processMetrics: false,
  log: createLogger('bench', { level: 'warn' }),
});
watchLoop('lookup-sidecar');
process.stdout.write(`ready ${sidecar.server.endpoint}\n`);
process.stdin.resume();
process.stdin.on('end', () => void sidecar.close().then(() => process.exit(0)));
